"""The rotation edge cases of SPEC 4, through the real intake path on the database."""

from datetime import timedelta

import pytest
from django.utils import timezone

from leads.models import Lead
from rotation import services
from rotation.models import Absence, Membership, RotationState
from tests.conftest import lead_body
from tests.factories import RepFactory

pytestmark = pytest.mark.django_db


def route(api, slug: str, n: int = 1) -> list[int | None]:
    owners = []
    for _ in range(n):
        r = api.post("/api/v1/leads/", lead_body(group=slug), format="json")
        assert r.status_code == 201, r.content
        owners.append(r.json()["owner"]["id"] if r.json()["owner"] else None)
    return owners


def test_strict_order_by_position(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    assert route(api, "g", 6) == [a.id, b.id, c.id, a.id, b.id, c.id]
    assert RotationState.objects.get(group=group).turns == 6


def test_joiner_mid_cycle_is_appended_and_served_this_cycle(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    assert route(api, "g", 1) == [a.id]
    d = RepFactory()
    services.membership_add(group=group, rep=d, actor="test")
    assert Membership.objects.get(rep=d).position == 3
    assert route(api, "g", 5) == [b.id, c.id, d.id, a.id, b.id]


def test_joiner_at_the_end_of_a_cycle_is_next(api, make_group):
    group, (a, b) = make_group(2, slug="g")
    assert route(api, "g", 2) == [a.id, b.id]
    d = RepFactory()
    services.membership_add(group=group, rep=d, actor="test")
    assert route(api, "g", 3) == [d.id, a.id, b.id]


def test_paused_member_is_skipped_without_resetting_and_keeps_its_place(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    assert route(api, "g", 1) == [a.id]
    Membership.objects.filter(group=group, rep=b).update(active=False)
    assert route(api, "g", 3) == [c.id, a.id, c.id]
    Membership.objects.filter(group=group, rep=b).update(active=True)
    # b is back at its old position: the pointer is past c (position 2), so a, then b.
    assert route(api, "g", 3) == [a.id, b.id, c.id]
    skipped = Lead.objects.filter(owner=c).order_by("id").first()
    explanation = skipped.assignments.get().lead.id
    from audit.models import AuditEvent

    ev = AuditEvent.objects.get(type="lead.assigned", lead_id=explanation)
    reasons = {cand["rep"]: cand["reason"] for cand in ev.explanation["candidates"]}
    assert reasons[b.id] == "paused in this group"


def test_out_of_office_and_inactive_reps_are_skipped(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    now = timezone.now()
    Absence.objects.create(rep=a, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    c.active = False
    c.save()
    assert route(api, "g", 3) == [b.id, b.id, b.id]
    from audit.models import AuditEvent

    ev = AuditEvent.objects.filter(type="lead.assigned").last()
    reasons = {cand["rep"]: cand["reason"] for cand in ev.explanation["candidates"]}
    assert reasons[a.id].startswith("out of office until")
    assert reasons[c.id] == "rep inactive"


def test_absence_in_the_future_or_past_does_not_count(api, make_group):
    group, (a, b) = make_group(2, slug="g")
    now = timezone.now()
    Absence.objects.create(rep=a, starts_at=now + timedelta(days=1), ends_at=now + timedelta(days=2))
    Absence.objects.create(rep=a, starts_at=now - timedelta(days=2), ends_at=now - timedelta(days=1))
    assert route(api, "g", 2) == [a.id, b.id]


def test_removed_member_leaves_without_resetting_and_rejoins_as_new(api, make_group):
    group, (a, b, c) = make_group(3, slug="g")
    assert route(api, "g", 2) == [a.id, b.id]
    api.delete(f"/api/v1/groups/g/members/{b.id}/")
    assert RotationState.objects.get(group=group).pointer == 2
    assert route(api, "g", 3) == [c.id, a.id, c.id]
    r = api.post("/api/v1/groups/g/members/", {"rep": b.id}, format="json")
    assert r.status_code == 201 and r.json()["position"] == 3
    assert route(api, "g", 4) == [b.id, a.id, c.id, b.id]


def test_deactivated_rep_keeps_open_leads(api, make_group):
    group, (a, b) = make_group(2, slug="g")
    first = route(api, "g", 1)
    assert first == [a.id]
    api.patch(f"/api/v1/reps/{a.id}/", {"active": False}, format="json")
    assert Lead.objects.get(owner=a).status == "assigned"
    assert route(api, "g", 2) == [b.id, b.id]


def test_all_paused_queues_and_pointer_stays(api, make_group):
    group, reps = make_group(2, slug="g")
    route(api, "g", 1)
    Membership.objects.filter(group=group).update(active=False)
    assert route(api, "g", 1) == [None]
    assert RotationState.objects.get(group=group).pointer == 1


def test_empty_group_queues(api, make_group):
    make_group(0, slug="g")
    r = api.post("/api/v1/leads/", lead_body(group="g"), format="json").json()
    assert r["status"] == "queued" and "no members" in r["queue_reason"]
