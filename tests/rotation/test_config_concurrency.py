"""Configuration written by several requests at once, on real PostgreSQL with real threads.

Each test holds a lock the requests need until every one of them waits on it, so that they
all pass validation before any of them writes: the race is made to happen, not hoped for.
"""

import threading
import time

import pytest
from django.db import connection, transaction

from audit.models import AuditEvent
from leads.models import Lead
from rotation import services
from rotation.models import Group, Membership, RotationState
from tests.conftest import lead_body
from tests.factories import GroupFactory, RepFactory, api_client_with
from tests.leads.test_concurrency import http_client

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


def waiting_on_locks() -> int:
    """Sessions waiting on a lock, seen from inside a transaction (whose view of
    pg_stat_activity is otherwise taken once and kept)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_clear_snapshot(), (SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database())"
        )
        return cursor.fetchone()[1]


def racing(requests, hold) -> list[int]:
    """Runs `requests` (callables returning a response) in threads while `hold` (a callable
    taking the lock) is held in this thread, releases it once all of them wait, and returns
    their status codes. A 500 is raised in its thread by Django's test client: a failure."""
    statuses: list[int] = []
    errors: list[BaseException] = []

    def run(request) -> None:
        try:
            statuses.append(request().status_code)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in requests]
    with transaction.atomic():
        hold()
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while waiting_on_locks() < len(threads) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waiting_on_locks() == len(threads), "the requests never all waited on the lock"
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return statuses


def test_moving_the_default_group_at_once_ends_with_one_default():
    old = GroupFactory(slug="old-default", is_default=True)
    groups = [GroupFactory(slug=f"g{i}") for i in range(4)]
    client = http_client(api_client_with(["manage"])[1])

    def make_default(slug: str):
        return lambda: client.patch(f"/api/v1/groups/{slug}/", {"is_default": True}, content_type="application/json")

    # The current default's row, which every move must lock to clear its flag.
    statuses = racing([make_default(g.slug) for g in groups], lambda: Group.objects.select_for_update().get(pk=old.pk))
    assert statuses == [200] * len(groups)
    defaults = list(Group.objects.filter(is_default=True))
    assert len(defaults) == 1 and defaults[0] in groups


def test_the_same_member_added_at_once_is_one_201_and_409s_naming_the_conflict():
    group = GroupFactory(slug="team")
    RotationState.objects.get_or_create(group=group)
    rep = RepFactory()
    client = http_client(api_client_with(["manage"])[1])
    answers = []

    def add():
        answers.append(client.post("/api/v1/groups/team/members/", {"rep": rep.pk}, content_type="application/json"))
        return answers[-1]

    # The rotation row, which appending a member locks to allocate its position.
    statuses = racing([add] * 3, lambda: RotationState.objects.select_for_update().get(group=group))
    assert sorted(statuses) == [201, 409, 409]
    assert Membership.objects.filter(group=group, rep=rep).count() == 1
    for conflict in (r for r in answers if r.status_code == 409):
        assert "at the same time" in conflict.json()["detail"]


@pytest.mark.parametrize("change", ["remove", "append", "delete the group"])
def test_a_member_change_waits_for_a_held_rotation_row_no_longer_than_the_lock_timeout(settings, change):
    """Removing a member, adding one at the end or deleting the group takes the group's
    rotation row. Held past the lock timeout (a long routing transaction, a stuck batch), it
    is a 503 with Retry-After like intake's, never a request that hangs as long as the lock
    does; nothing is written."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group = GroupFactory(slug="g")
    rep, joiner = RepFactory(), RepFactory()
    services.membership_add(group=group, rep=rep, actor="test")
    _client, token = api_client_with(["manage"])
    events = AuditEvent.objects.count()
    outcome: dict = {}

    def request() -> None:
        api = http_client(token)
        started = time.monotonic()
        if change == "remove":
            outcome["response"] = api.delete(f"/api/v1/groups/g/members/{rep.pk}/")
        elif change == "append":
            outcome["response"] = api.post("/api/v1/groups/g/members/", {"rep": joiner.pk}, "application/json")
        else:
            outcome["response"] = api.delete("/api/v1/groups/g/")
        outcome["elapsed"] = time.monotonic() - started
        connection.close()

    with transaction.atomic():
        RotationState.objects.select_for_update().get(group=group)
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(timeout=10)  # the lock is held all this time unless the request gave up
        waited_past_the_timeout = thread.is_alive()
    thread.join(timeout=30)
    assert not waited_past_the_timeout, "the request waited on the rotation row as long as it was held"
    r = outcome["response"]
    assert r.status_code == 503, r.content
    assert r["Retry-After"] == "1" and "retry" in r.json()["detail"]
    assert outcome["elapsed"] < 5
    assert Group.objects.filter(pk=group.pk).exists()
    assert list(Membership.objects.filter(group=group).values_list("rep_id", flat=True)) == [rep.pk]
    assert AuditEvent.objects.count() == events


def test_a_member_removed_in_the_admin_while_the_rotation_row_is_held_is_a_503_to_retry(settings):
    """The admin's group page removes a member through the same service: a rotation row held
    past the lock timeout is a 503 page saying to retry, not a server error; nothing changes."""
    from django.contrib.auth.models import User
    from django.test import Client

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group = GroupFactory(slug="g")
    kept, leaving = RepFactory(), RepFactory()
    services.membership_add(group=group, rep=kept, actor="test")
    services.membership_add(group=group, rep=leaving, actor="test")
    admin = Client(raise_request_exception=False)
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    data: dict = {
        "slug": "g",
        "name": group.name,
        "strategy": group.strategy,
        "active": "on",
        "timezone": "UTC",
        "max_attempts": group.max_attempts,
        "dedup_days": group.dedup_days,
        "memberships-TOTAL_FORMS": 2,
        "memberships-INITIAL_FORMS": 2,
        "memberships-MIN_NUM_FORMS": 0,
        "memberships-MAX_NUM_FORMS": 1000,
        "absences-TOTAL_FORMS": 0,
        "absences-INITIAL_FORMS": 0,
    }
    for i, m in enumerate(Membership.objects.filter(group=group).order_by("position")):
        data.update(
            {
                f"memberships-{i}-id": m.pk,
                f"memberships-{i}-group": group.pk,
                f"memberships-{i}-rep": m.rep_id,
                f"memberships-{i}-position": m.position,
                f"memberships-{i}-weight": 1,
                f"memberships-{i}-active": "on",
            }
        )
    data["memberships-1-DELETE"] = "on"
    events = AuditEvent.objects.count()
    outcome: dict = {}

    def request() -> None:
        outcome["response"] = admin.post(f"/admin/rotation/group/{group.pk}/change/", data)
        connection.close()

    with transaction.atomic():
        RotationState.objects.select_for_update().get(group=group)
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(timeout=10)
        waited_past_the_timeout = thread.is_alive()
    thread.join(timeout=30)
    assert not waited_past_the_timeout
    r = outcome["response"]
    assert r.status_code == 503, r.content[:300]
    assert r["Retry-After"] == "1" and b"retry" in r.content.lower()
    assert Membership.objects.filter(group=group).count() == 2
    assert AuditEvent.objects.count() == events


def while_held(lock, request):
    """Runs `request` in a thread while this thread holds what `lock` (a callable) locks, until
    the request answers or 10 s pass. Returns the response, how long it took and whether it
    was still waiting when the lock was released."""
    outcome: dict = {}

    def run() -> None:
        started = time.monotonic()
        outcome["response"] = request()
        outcome["elapsed"] = time.monotonic() - started
        connection.close()

    with transaction.atomic():
        lock()
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=10)  # the lock is held all this time unless the request gave up
        waited = thread.is_alive()
    thread.join(timeout=30)
    return outcome.get("response"), outcome.get("elapsed"), waited


def while_routing_holds(group: Group, request):
    """`while_held` with `group`'s lock as routing takes it (leads/routing.py, `lock_rotation`:
    the rotation row and the group row, FOR NO KEY UPDATE)."""
    rows = RotationState.objects.select_for_update(no_key=True, of=("self", "group")).select_related("group")
    return while_held(lambda: rows.get(group=group), request)


def superuser_client():
    from django.contrib.auth.models import User
    from django.test import Client

    admin = Client(raise_request_exception=False)
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    return admin


def group_page_form(group: Group, member: Membership, **changes) -> dict:
    """The admin's group page as posted, with its one member's inline row."""
    data = {
        "slug": group.slug,
        "name": group.name,
        "strategy": group.strategy,
        "active": "on",
        "timezone": "UTC",
        "max_attempts": group.max_attempts,
        "dedup_days": group.dedup_days,
        "memberships-TOTAL_FORMS": 1,
        "memberships-INITIAL_FORMS": 1,
        "memberships-MIN_NUM_FORMS": 0,
        "memberships-MAX_NUM_FORMS": 1000,
        "memberships-0-id": member.pk,
        "memberships-0-group": group.pk,
        "memberships-0-rep": member.rep_id,
        "memberships-0-position": member.position,
        "memberships-0-weight": member.weight,
        "memberships-0-active": "on",
    }
    data.update(changes)
    return data


@pytest.mark.parametrize("change", ["rename", "move the default flag"])
def test_a_group_change_waits_for_routing_no_longer_than_the_lock_timeout(settings, change):
    """Routing locks the group's row with its rotation row. A PATCH of the group (its name,
    or the default flag moved away from it) needs that row: held past the lock timeout, it is
    a 503 with Retry-After, nothing written, and the same request succeeds once it is free."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    held = GroupFactory(slug="g", is_default=True)
    GroupFactory(slug="h")
    _client, token = api_client_with(["manage"])
    path, body = ("/api/v1/groups/g/", {"name": "Renamed"})
    if change == "move the default flag":
        path, body = ("/api/v1/groups/h/", {"is_default": True})
    before = (list(Group.objects.order_by("pk").values()), AuditEvent.objects.count())

    def patch():
        return http_client(token).patch(path, body, "application/json")

    r, elapsed, waited = while_routing_holds(held, patch)
    assert not waited, "the request waited on the group's row as long as routing held it"
    assert r.status_code == 503, r.content
    assert r["Retry-After"] == "1" and "retry" in r.json()["detail"]
    assert elapsed < 5
    assert (list(Group.objects.order_by("pk").values()), AuditEvent.objects.count()) == before
    assert patch().status_code == 200
    if change == "rename":
        assert Group.objects.get(slug="g").name == "Renamed"
    else:
        assert list(Group.objects.filter(is_default=True).values_list("slug", flat=True)) == ["h"]


def test_the_admin_group_page_waits_for_routing_no_longer_than_the_lock_timeout(settings):
    """The admin's group page saves the group (its row, which routing locks) with its member
    inlines: held past the lock timeout, a 503 page saying to retry, nothing saved; the same
    form saved afterwards goes through."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group = GroupFactory(slug="g")
    services.membership_add(group=group, rep=RepFactory(), actor="test")
    member = Membership.objects.get(group=group)
    admin = superuser_client()
    data = group_page_form(group, member, name="Renamed", **{"memberships-0-weight": 3})
    before = (
        list(Group.objects.values()),
        list(Membership.objects.values()),
        AuditEvent.objects.count(),
    )

    def save():
        return admin.post(f"/admin/rotation/group/{group.pk}/change/", data)

    r, elapsed, waited = while_routing_holds(group, save)
    assert not waited, "the page waited on the group's row as long as routing held it"
    assert r.status_code == 503, r.content[:300]
    assert r["Retry-After"] == "1" and b"retry" in r.content.lower()
    assert elapsed < 5
    assert (list(Group.objects.values()), list(Membership.objects.values()), AuditEvent.objects.count()) == before
    assert save().status_code == 302
    assert Group.objects.get(pk=group.pk).name == "Renamed"
    assert Membership.objects.get(pk=member.pk).weight == 3


@pytest.mark.parametrize("where", ["api", "admin"])
def test_a_member_edit_waits_for_an_escalation_no_longer_than_the_lock_timeout(settings, where):
    """An escalation locks the member's row (to count the SLA miss, maybe auto-pause it) in
    its routing transaction. A member edit (over the API, or a member inline on the admin's
    group page) needs that row: held past the lock timeout, it is a 503 with Retry-After,
    nothing written, and the same edit goes through once the row is free."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group = GroupFactory(slug="g")
    rep = RepFactory()
    services.membership_add(group=group, rep=rep, actor="test")
    member = Membership.objects.get(group=group)
    if where == "api":
        _client, token = api_client_with(["manage"])

        def edit():
            return http_client(token).patch(f"/api/v1/groups/g/members/{rep.pk}/", {"weight": 3}, "application/json")

    else:
        admin = superuser_client()
        data = group_page_form(group, member, **{"memberships-0-weight": 3})

        def edit():
            return admin.post(f"/admin/rotation/group/{group.pk}/change/", data)

    before = (list(Membership.objects.values()), AuditEvent.objects.count())
    # The member's row, as escalation's `_count_miss` locks it.
    r, elapsed, waited = while_held(lambda: Membership.objects.select_for_update().get(pk=member.pk), edit)
    assert not waited, "the edit waited on the member's row as long as it was held"
    assert r.status_code == 503, r.content[:300]
    assert r["Retry-After"] == "1" and b"retry" in r.content.lower()
    assert elapsed < 5
    assert (list(Membership.objects.values()), AuditEvent.objects.count()) == before
    assert edit().status_code == (200 if where == "api" else 302)
    assert Membership.objects.get(pk=member.pk).weight == 3


def test_groups_deleted_together_in_the_admin_are_all_kept_when_one_is_busy(settings):
    """ "Delete selected" on the admin's group list deletes each group through the service,
    which takes its rotation row. One of them held by routing past the lock timeout: the page
    says nothing was saved, and nothing is (no group gone, no audit event, no admin log
    entry); the same deletion goes through once the row is free."""
    from django.contrib.admin.models import LogEntry

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    first, busy = GroupFactory(slug="a"), GroupFactory(slug="b")
    for group in (first, busy):
        services.membership_add(group=group, rep=RepFactory(), actor="test")
    admin = superuser_client()
    before = (list(Group.objects.order_by("pk").values()), AuditEvent.objects.count(), LogEntry.objects.count())

    def delete_both():
        selected = {"action": "delete_selected", "_selected_action": [first.pk, busy.pk], "post": "yes"}
        return admin.post("/admin/rotation/group/", selected)

    r, elapsed, waited = while_routing_holds(busy, delete_both)
    assert not waited
    assert r.status_code == 503, r.content[:300]
    assert r["Retry-After"] == "1" and b"nothing was saved" in r.content
    assert elapsed < 5
    assert (list(Group.objects.order_by("pk").values()), AuditEvent.objects.count(), LogEntry.objects.count()) == before
    assert delete_both().status_code == 302
    assert not Group.objects.filter(pk__in=[first.pk, busy.pk]).exists()


def test_a_rep_edit_waits_for_a_reassign_no_longer_than_the_lock_timeout(settings):
    """A reassign to a rep locks the rep's row first (a deactivation meanwhile is then seen):
    an edit of that rep, its row held past the lock timeout, is a 503 with Retry-After and
    nothing written, and goes through once the row is free."""
    from rotation.models import Rep

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    rep = RepFactory(name="Before")
    _client, token = api_client_with(["manage"])

    def edit():
        return http_client(token).patch(f"/api/v1/reps/{rep.pk}/", {"name": "After"}, "application/json")

    before = AuditEvent.objects.count()
    # The rep's row, as lead_reassign locks it.
    r, elapsed, waited = while_held(lambda: Rep.objects.select_for_update(no_key=True).get(pk=rep.pk), edit)
    assert not waited, "the edit waited on the rep's row as long as it was held"
    assert r.status_code == 503 and r["Retry-After"] == "1", r.content[:300]
    assert elapsed < 5
    assert (Rep.objects.get(pk=rep.pk).name, AuditEvent.objects.count()) == ("Before", before)
    assert edit().status_code == 200
    assert Rep.objects.get(pk=rep.pk).name == "After"


def test_a_group_delete_that_cannot_happen_never_waits_for_routing(settings):
    """A group with leads is kept (409). Finding that out must not take its rotation row: it
    was taken first, and Django's delete then loaded every lead and assignment of the group
    before refusing, seconds for a busy group, during which its intake got 503s."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    _client, token = api_client_with(["intake", "manage"])
    group = GroupFactory(slug="busy")
    services.membership_add(group=group, rep=RepFactory(), actor="test")
    assert http_client(token).post("/api/v1/leads/", lead_body(group="busy"), "application/json").status_code == 201
    before = (Group.objects.count(), Membership.objects.count(), AuditEvent.objects.count())

    r, _elapsed, waited = while_routing_holds(group, lambda: http_client(token).delete("/api/v1/groups/busy/"))
    assert not waited
    assert r.status_code == 409, r.content  # not a 503: it never asked for the rotation row
    assert r.json()["detail"].startswith("The group has leads and assignments;")
    assert (Group.objects.count(), Membership.objects.count(), AuditEvent.objects.count()) == before


def deletes_at_once(path: str, hold, n: int = 4) -> list[int]:
    client = http_client(api_client_with(["manage"])[1])
    return racing([lambda: client.delete(path)] * n, hold)


def test_a_group_deleted_by_several_requests_at_once_is_deleted_once_and_audited_once():
    group = GroupFactory(slug="going")
    RotationState.objects.get_or_create(group=group)
    # The rotation row, which a delete takes first.
    statuses = deletes_at_once(
        "/api/v1/groups/going/", lambda: RotationState.objects.select_for_update().get(group=group)
    )
    assert sorted(statuses) == [204, 404, 404, 404]
    assert not Group.objects.filter(slug="going").exists()
    deleted = AuditEvent.objects.filter(type="group.changed", explanation__action="deleted", group="going")
    assert deleted.count() == 1


def test_a_member_removed_by_several_requests_at_once_is_removed_once_and_audited_once():
    group = GroupFactory(slug="team")
    RotationState.objects.get_or_create(group=group)
    rep = RepFactory()
    services.membership_add(group=group, rep=rep, actor="test")
    statuses = deletes_at_once(
        f"/api/v1/groups/team/members/{rep.pk}/", lambda: RotationState.objects.select_for_update().get(group=group)
    )
    assert sorted(statuses) == [204, 404, 404, 404]
    removed = AuditEvent.objects.filter(type="membership.changed", explanation__action="removed", rep_id=rep.pk)
    assert removed.count() == 1
    assert removed.get().explanation["before"]["id"] is not None


def test_an_absence_or_a_rule_deleted_by_several_requests_at_once_is_deleted_once_and_audited_once():
    from datetime import timedelta

    from django.utils import timezone

    from rotation.models import Absence, RoutingRule

    group, rep = GroupFactory(slug="emea"), RepFactory()
    now = timezone.now()
    absence = Absence.objects.create(rep=rep, starts_at=now, ends_at=now + timedelta(days=1))
    rule = services.rule_save(
        rule=RoutingRule(
            name="France", priority=1, conditions=[{"field": "country", "op": "equals", "value": "FR"}], group=group
        ),
        actor="test",
    )
    statuses = deletes_at_once(
        f"/api/v1/reps/{rep.pk}/absences/{absence.pk}/", lambda: Absence.objects.select_for_update().get(pk=absence.pk)
    )
    assert sorted(statuses) == [204, 404, 404, 404]
    assert AuditEvent.objects.filter(type="absence.changed", explanation__action="deleted").count() == 1
    statuses = deletes_at_once(
        f"/api/v1/rules/{rule.pk}/", lambda: RoutingRule.objects.select_for_update().get(pk=rule.pk)
    )
    assert sorted(statuses) == [204, 404, 404, 404]
    assert AuditEvent.objects.filter(type="rule.changed", explanation__action="deleted").count() == 1


def test_groups_made_at_once_with_one_slug_in_different_cases_are_one_group():
    """Each request finds no group of that slug in any case; the database keeps one of them."""
    client = http_client(api_client_with(["manage"])[1])
    answers = []

    def make(slug: str):
        def post():
            body = {"slug": slug, "name": slug, "strategy": "round_robin"}
            answers.append(client.post("/api/v1/groups/", body, content_type="application/json"))
            return answers[-1]

        return post

    def hold():
        # A group of that slug made and deleted again, uncommitted: the requests pass
        # validation, then wait on the slug's index entry until this transaction ends.
        Group.objects.create(slug="wave", name="held").delete()

    statuses = racing([make("Wave"), make("WAVE"), make("wAve")], hold)
    assert sorted(statuses) == [201, 409, 409]
    assert Group.objects.filter(slug__iexact="wave").count() == 1


def test_a_rep_deleted_while_a_lead_is_routed_to_its_group_never_costs_the_lead():
    """The deletion takes the rep's groups' rotation rows before the rep's: routing that would
    have read the member before the deletion committed, and given it the lead, waits and routes
    to the members left. It read the member, then its lead's foreign key waited on the deleted
    rep and failed: a 409 for a good lead."""
    group = GroupFactory(slug="leaving")
    gone, stays = RepFactory(), RepFactory()
    for rep in (gone, stays):
        services.membership_add(group=group, rep=rep, actor="test")
    client = http_client(api_client_with(["intake"])[1])
    body = lead_body(group="leaving")

    statuses = racing(
        [lambda: client.post("/api/v1/leads/", body, content_type="application/json")],
        lambda: services.rep_delete(rep=gone, actor="test"),  # `gone` is next in turn
    )
    assert statuses == [201]
    (lead,) = Lead.objects.all()
    assert lead.owner_id == stays.pk


def test_a_reassign_to_a_rep_being_deleted_waits_and_is_refused_by_name():
    """A reassign takes the rep's row after the rotation row and the lead's, as routing does:
    against a deletion (rotation rows, then the rep's) neither waits on the other in a cycle."""
    group = GroupFactory(slug="pool")
    holder, target = RepFactory(), RepFactory()
    services.membership_add(group=group, rep=holder, actor="test")
    client = http_client(api_client_with(["intake", "manage"])[1])
    lead = client.post("/api/v1/leads/", lead_body(group="pool"), content_type="application/json").json()
    reassign = client.post  # the target is no member: its deletion takes no rotation row
    target_id = target.pk  # the deletion empties target.pk

    statuses = racing(
        [
            lambda: reassign(
                f"/api/v1/leads/{lead['id']}/reassign/",
                {"rep": target_id, "reason": "x"},
                content_type="application/json",
            )
        ],
        lambda: services.rep_delete(rep=target, actor="test"),
    )
    assert statuses == [400]
    assert Lead.objects.get(pk=lead["id"]).owner_id == holder.pk
