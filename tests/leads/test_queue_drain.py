"""The fallback queue drains itself: in arrival order, through the locked transaction,
triggered after commit by the change that freed capacity (real worker), backed by the sweep."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions, replay
from leads.models import Assignment, Lead
from rotation import services
from rotation.models import Absence, Group, Membership, RotationState, RoutingRule
from tests.celery_worker import wait_for
from tests.conftest import lead_body
from tests.factories import RepFactory


def post(api, **fields) -> dict:
    r = api.post("/api/v1/leads/", lead_body(**fields), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def status(lead: dict) -> str:
    return Lead.objects.get(pk=lead["id"]).status


# --- the service, synchronously --------------------------------------------------------------


@pytest.mark.django_db
def test_drain_routes_in_arrival_order_until_no_eligible_rep(api, make_group):
    group, reps = make_group(2, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    queued = [post(api, group="emea") for _ in range(5)]
    assert all(lead["status"] == "queued" for lead in queued)
    Membership.objects.filter(group=group).update(active=True, max_open=2)
    assert actions.queue_drain(group_id=group.id) == 4
    leads = [Lead.objects.get(pk=lead["id"]) for lead in queued]
    assert [lead.status for lead in leads] == ["assigned"] * 4 + ["queued"]  # oldest first; the last waits
    assert [lead.owner_id for lead in leads[:4]] == [reps[0].id, reps[1].id, reps[0].id, reps[1].id]
    assert RotationState.objects.get(group=group).pointer == 2
    event = AuditEvent.objects.get(lead_id=queued[0]["id"], type="lead.assigned")
    assert event.actor == "system:queue" and event.explanation["trigger"] == "queue_drain"
    assert "no eligible rep" in event.explanation["queued_because"]
    assert actions.queue_drain(group_id=group.id) == 0  # nothing more fits


@pytest.mark.django_db
def test_drain_leaves_leads_that_used_up_their_attempts_to_a_manager(api, make_group):
    group, reps = make_group(3, slug="emea", sla_minutes="1", max_attempts=1)
    lead = post(api, group="emea")
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    assignment = Assignment.objects.get(lead_id=lead["id"])
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "queued"
    assert status(lead) == "queued"
    # Represented as a lead queued at intake is: nobody owns it, so no assignment times.
    shown = api.get(f"/api/v1/leads/{lead['id']}/").json()
    assert (shown["owner"], shown["assigned_at"], shown["accepted_at"], shown["sla_due_at"]) == (None,) * 4
    assert "max_attempts (1) reached" in shown["queue_reason"]
    assert actions.queue_drain(group_id=group.id) == 0
    assert status(lead) == "queued"


@pytest.mark.django_db
def test_escalation_is_idempotent_and_respects_accept(api, make_group):
    group, reps = make_group(3, slug="emea", sla_minutes="1")
    lead = post(api, group="emea")
    assignment = Assignment.objects.get(lead_id=lead["id"])
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "not_due"
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "escalated"
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "done"
    assert actions.escalation_sweep() == {}  # the new assignment is not due
    assert AuditEvent.objects.filter(lead_id=lead["id"], type="lead.escalated").count() == 1
    second = Assignment.objects.get(lead_id=lead["id"], ended_at__isnull=True)
    assert second.rep_id == reps[1].id and second.attempt == 2
    actions.lead_accept(lead_id=lead["id"], rep_id=reps[1].id, actor="test")
    Assignment.objects.filter(pk=second.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=second.id).outcome == "done"
    assert Lead.objects.get(pk=lead["id"]).status == "accepted"


@pytest.mark.django_db
def test_escalation_never_returns_to_a_rep_who_had_the_lead(api, make_group):
    group, reps = make_group(2, slug="emea", sla_minutes="1", max_attempts=5)
    lead = post(api, group="emea")
    for _ in range(2):
        open_one = Assignment.objects.get(lead_id=lead["id"], ended_at__isnull=True)
        Assignment.objects.filter(pk=open_one.pk).update(due_at=timezone.now() - timedelta(seconds=1))
        actions.escalation_sweep()
    stored = Lead.objects.get(pk=lead["id"])
    assert (stored.status, stored.queue_reason) == ("queued", "SLA missed; every rep in 'emea' has had this lead")
    assert [a.rep_id for a in Assignment.objects.filter(lead_id=lead["id"]).order_by("attempt")] == [
        reps[0].id,
        reps[1].id,
    ]


@pytest.mark.django_db
def test_an_escalation_says_the_rep_it_leaves_already_had_the_lead_not_that_it_is_at_its_cap(api, make_group):
    """The rep the lead escalates from still counts it open: at a full cap the explanation
    gave the cap (1/1) as the reason, where the reason is that the rep already had the lead."""
    group, reps = make_group(2, slug="emea", sla_minutes="1")
    Membership.objects.filter(group=group).update(max_open=1)
    lead = post(api, group="emea")
    open_one = Assignment.objects.get(lead_id=lead["id"], ended_at__isnull=True)
    assert open_one.rep_id == reps[0].id
    Assignment.objects.filter(pk=open_one.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()
    event = AuditEvent.objects.get(lead_id=lead["id"], type="lead.escalated")
    left = next(c for c in event.explanation["candidates"] if c["rep"] == reps[0].id)
    assert (left["eligible"], left["reason"]) == (False, "already had this lead")
    assert Lead.objects.get(pk=lead["id"]).owner_id == reps[1].id


@pytest.mark.django_db
def test_auto_pause_is_off_by_default_and_accept_resets_the_count(api, make_group):
    group, reps = make_group(1, slug="emea", sla_minutes="1", max_attempts=1)
    for _ in range(3):
        lead = post(api, group="emea")
        Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
        actions.escalation_sweep()
    member = Membership.objects.get(group=group, rep=reps[0])
    assert member.active and member.consecutive_misses == 3
    group.auto_pause_after_misses = 5
    group.save()
    lead = post(api, group="emea")
    actions.lead_accept(lead_id=lead["id"], rep_id=reps[0].id, actor="test")
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 0


@pytest.mark.django_db
def test_misses_made_while_auto_pause_was_off_do_not_count_once_it_is_on(api, make_group):
    """Turned on at 2 after 3 misses, the member is not paused at its next miss: the run of
    misses starts when the setting does."""
    group, (rep,) = make_group(1, slug="emea", sla_minutes="1", max_attempts=1)
    for _ in range(3):
        _miss(api, "emea")
    member = Membership.objects.get(group=group, rep=rep)
    assert member.active and member.consecutive_misses == 3
    r = api.patch("/api/v1/groups/emea/", {"auto_pause_after_misses": 2}, format="json")
    assert r.status_code == 200
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 0
    _miss(api, "emea")
    member.refresh_from_db()
    assert member.active and member.consecutive_misses == 1
    _miss(api, "emea")
    member.refresh_from_db()
    assert not member.active and member.paused_reason == "auto-paused after 2 consecutive SLA misses"
    # Raised later, the run it counts goes on.
    api.patch(f"/api/v1/groups/emea/members/{rep.pk}/", {"active": True}, format="json")
    api.patch("/api/v1/groups/emea/", {"auto_pause_after_misses": 3}, format="json")
    _miss(api, "emea")
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 1


def _miss(api, group_slug: str) -> None:
    lead = post(api, group=group_slug)
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.escalation_sweep() == {"queued": 1}


@pytest.mark.django_db
def test_a_lead_closed_by_its_due_time_ends_the_run_of_misses(api, make_group):
    group, (rep,) = make_group(1, slug="emea", sla_minutes="10", max_attempts=1, auto_pause_after_misses=3)
    member = Membership.objects.get(group=group, rep=rep)
    _miss(api, "emea")
    _miss(api, "emea")
    handled = post(api, group="emea")  # worked and closed (won) before its SLA, never "accepted"
    assert api.post(f"/api/v1/leads/{handled['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 0
    _miss(api, "emea")  # 1 in a row, not 3: still in the rotation
    member.refresh_from_db()
    assert member.active and member.consecutive_misses == 1


@pytest.mark.django_db
def test_a_lead_settled_after_its_due_time_does_not_end_the_run_of_misses(api, make_group):
    group, (rep,) = make_group(1, slug="emea", sla_minutes="10", max_attempts=1, auto_pause_after_misses=3)
    member = Membership.objects.get(group=group, rep=rep)
    _miss(api, "emea")
    late = post(api, group="emea")  # accepted after its due time, before the timer fired: a miss too
    Assignment.objects.filter(lead_id=late["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.lead_accept(lead_id=late["id"], rep_id=rep.id, actor="test")
    closed = post(api, group="emea")
    Assignment.objects.filter(lead_id=closed["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.lead_close(lead_id=closed["id"], outcome="lost", actor="test")
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 1
    accepted = post(api, group="emea")
    actions.lead_accept(lead_id=accepted["id"], rep_id=rep.id, actor="test")
    _miss(api, "emea")
    actions.lead_close(lead_id=accepted["id"], outcome="won", actor="test")  # accepted long ago: no news
    assert Membership.objects.get(pk=member.pk).consecutive_misses == 1


# --- after commit, on a real worker ----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("celery")
def test_queue_drains_when_a_rep_is_unpaused(api, make_group, celery_worker):
    group, reps = make_group(2, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    queued = [post(api, group="emea") for _ in range(3)]
    assert all(lead["status"] == "queued" for lead in queued)
    r = api.patch(f"/api/v1/groups/emea/members/{reps[1].id}/", {"active": True}, format="json")
    assert r.status_code == 200, r.content
    assert wait_for(lambda: all(status(lead) == "assigned" for lead in queued), timeout=10), celery_worker.log()
    assert {Lead.objects.get(pk=lead["id"]).owner_id for lead in queued} == {reps[1].id}
    times = [AuditEvent.objects.get(lead_id=lead["id"], type="lead.assigned").id for lead in queued]
    assert times == sorted(times)  # arrival order


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("celery")
def test_queue_drains_when_a_rep_returns(api, make_group, celery_worker):
    group, reps = make_group(1, slug="emea")
    now = timezone.now()
    absence = services.absence_add(
        absence=Absence(rep=reps[0], starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)),
        actor="test",
    )
    lead = post(api, group="emea")
    assert lead["status"] == "queued" and "no eligible rep" in lead["queue_reason"]
    services.absence_remove(absence=absence, actor="admin:ops")  # back early
    assert wait_for(lambda: status(lead) == "assigned", timeout=10), celery_worker.log()
    # And a rep re-activated after being deactivated everywhere.
    rep = reps[0]
    rep.active = False
    services.rep_save(rep=rep, actor="test", changed=["active"])
    second = post(api, group="emea")
    assert second["status"] == "queued"
    rep.active = True
    services.rep_save(rep=rep, actor="test", changed=["active"])
    assert wait_for(lambda: status(second) == "assigned", timeout=10), celery_worker.log()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("celery")
def test_closing_a_lead_under_a_cap_drains_the_queue(api, make_group, celery_worker):
    group, reps = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1)
    first = post(api, group="emea")
    waiting = post(api, group="emea")
    assert waiting["status"] == "queued"
    assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "lost"}, format="json").status_code == 200
    assert wait_for(lambda: status(waiting) == "assigned", timeout=10), celery_worker.log()


@pytest.mark.django_db
def test_a_lead_kept_for_its_account_owner_goes_to_the_owner_when_back(api, make_group):
    from rotation.models import Account

    group, reps = make_group(2, slug="emea", owner_match_fallback_to_rotation=False)
    Account.objects.create(domain="bigco.example", owner=reps[1])
    Membership.objects.filter(group=group, rep=reps[1]).update(active=False)
    kept = post(api, group="emea", email="cfo@bigco.example")
    other = post(api, group="emea")
    assert kept["status"] == "queued" and "account owner" in kept["queue_reason"]
    assert other["status"] == "assigned"
    assert actions.queue_drain(group_id=group.id) == 0  # still away: the kept lead waits, nothing stops
    Membership.objects.filter(group=group, rep=reps[1]).update(active=True)
    assert actions.queue_drain(group_id=group.id) == 1
    stored = Lead.objects.get(pk=kept["id"])
    assert stored.owner_id == reps[1].id
    assert Assignment.objects.get(lead_id=kept["id"]).reason == "owner_match"


@pytest.mark.django_db
def test_a_lead_kept_for_its_account_owner_goes_to_the_rotation_once_the_group_falls_back(api, make_group):
    from rotation.models import Account

    group, reps = make_group(2, slug="emea", owner_match_fallback_to_rotation=False)
    Account.objects.create(domain="bigco.example", owner=reps[1])
    Membership.objects.filter(group=group, rep=reps[1]).update(active=False)
    kept = post(api, group="emea", email="cfo@bigco.example")
    assert kept["status"] == "queued"
    r = api.patch("/api/v1/groups/emea/", {"owner_match_fallback_to_rotation": True}, format="json")
    assert r.status_code == 200, r.content
    assert actions.queue_drain(group_id=group.id) == 1
    assert Lead.objects.get(pk=kept["id"]).owner_id == reps[0].id


@pytest.mark.django_db
def test_a_lead_its_account_owner_let_escalate_is_drained_to_another_rep(api, make_group):
    """The owner had the lead and missed its SLA: the escalation looks past the owner (never
    the same rep again), and so does the drain once another rep is free, also in a group
    that keeps leads for their owner. The lead is not kept for an owner who had it."""
    from rotation.models import Account

    group, (a, owner) = make_group(2, slug="emea", sla_minutes="1", owner_match_fallback_to_rotation=False)
    Account.objects.create(domain="bigco.example", owner=owner)
    lead = post(api, group="emea", email="cfo@bigco.example")
    assert lead["owner"]["id"] == owner.id
    Membership.objects.filter(group=group, rep=a).update(active=False)
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    assignment = Assignment.objects.get(lead_id=lead["id"])
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "queued"
    assert "no eligible rep" in Lead.objects.get(pk=lead["id"]).queue_reason
    Membership.objects.filter(group=group, rep=a).update(active=True)
    assert actions.queue_drain(group_id=group.id) == 1
    stored = Lead.objects.get(pk=lead["id"])
    assert (stored.status, stored.owner_id) == ("assigned", a.id)
    event = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned").latest("id")
    assert event.explanation["owner_match"]["owner_skipped"] == "already had this lead"
    assert event.explanation["reason"] == "rotation"
    # A replay of the live configuration takes that turn the same way.
    replayed = replay.routing_replay(since=timezone.now() - timedelta(hours=1), until=timezone.now())
    assert replayed["changed"] == 0, replayed


@pytest.mark.django_db
def test_leads_kept_for_an_owner_never_block_the_leads_behind_them(api, make_group, settings):
    from rotation.models import Account

    settings.QUEUE_DRAIN_BATCH = 3  # fewer than the kept leads: the drain must walk past them
    group, reps = make_group(2, slug="emea", owner_match_fallback_to_rotation=False)
    Account.objects.create(domain="bigco.example", owner=reps[1])
    Membership.objects.filter(group=group).update(active=False)  # nobody free: all queue
    kept = [post(api, group="emea", email=f"person{i}@bigco.example") for i in range(5)]
    behind = post(api, group="emea")
    assert {lead["status"] for lead in [*kept, behind]} == {"queued"}
    Membership.objects.filter(group=group, rep=reps[0]).update(active=True)  # the owner stays away
    assert actions.queue_drain(group_id=group.id) == 1
    assert Lead.objects.get(pk=behind["id"]).owner_id == reps[0].id
    assert Lead.objects.filter(pk__in=[k["id"] for k in kept], status="queued").count() == 5


@pytest.fixture
def drains(monkeypatch):
    """The group ids whose drain was requested after commit (the real callback is swapped out)."""
    from rotation import hooks

    seen: list[int] = []
    monkeypatch.setattr(hooks, "_callbacks", [lambda group_ids, because: seen.extend(group_ids)])
    return seen


@pytest.mark.django_db
def test_changes_that_free_capacity_ask_for_a_drain_after_commit(
    make_group, drains, django_capture_on_commit_callbacks
):
    from tests.factories import RepFactory

    group, reps = make_group(2, slug="emea")
    member = Membership.objects.get(group=group, rep=reps[0])

    def edit(**values):
        for name, value in values.items():
            setattr(member, name, value)
        services.membership_update(membership=member, actor="t", changed=list(values))

    cases = [
        (lambda: edit(max_open=5), True),
        (lambda: edit(max_open=5), False),  # sent again unchanged: nothing freed
        (lambda: edit(position=7), False),
        (lambda: services.membership_add(group=group, rep=RepFactory(), actor="t"), True),
    ]
    for change, expected in cases:
        drains.clear()
        with django_capture_on_commit_callbacks(execute=True):
            change()
        assert drains == ([group.id] if expected else []), change
    member.active = False
    member.paused_reason = "auto-paused after 3 consecutive SLA misses"
    member.save()
    drains.clear()
    member.active = True
    with django_capture_on_commit_callbacks(execute=True):
        services.membership_update(membership=member, actor="t", changed=["active"])
    assert drains == [group.id]
    member.refresh_from_db()
    assert member.paused_reason == "" and member.consecutive_misses == 0
    group.active = False
    services.group_save(group=group, actor="t", changed=["active"])
    drains.clear()
    group.active = True
    with django_capture_on_commit_callbacks(execute=True):
        services.group_save(group=group, actor="t", changed=["active"])
    assert drains == [group.id]


@pytest.mark.django_db
def test_a_rep_whose_hours_now_take_in_the_present_asks_for_a_drain(
    api, make_group, drains, django_capture_on_commit_callbacks
):
    group, (rep,) = make_group(1, slug="emea")
    rep.working_hours = {"sun": [["00:00", "00:01"]]}  # off hours nearly all week
    services.rep_save(rep=rep, actor="t", changed=["working_hours"])
    cases = [
        ({"working_hours": None}, True),  # always available now
        ({"working_hours": None}, False),  # sent again unchanged: nothing freed
        ({"name": "Renamed"}, False),
        ({"working_hours": {"mon": [["09:00", "17:00"]]}}, True),
        ({"timezone": "Asia/Tokyo"}, True),  # the same hours, read on another clock
    ]
    for body, expected in cases:
        drains.clear()
        with django_capture_on_commit_callbacks(execute=True):
            r = api.patch(f"/api/v1/reps/{rep.id}/", body, format="json")
        assert r.status_code == 200, r.content
        assert drains == ([group.id] if expected else []), body


@pytest.mark.django_db
def test_hours_that_begin_before_the_next_arm_run_get_their_drain_at_the_start(
    api, make_group, monkeypatch, django_capture_on_commit_callbacks
):
    """Hours set to begin in a few seconds: `escalation_arm` publishes the drains of hours that
    begin from about 45 s ahead, so this start had none of its own; the queue sweep routed the
    waiting leads up to 30 s late, and a lead arriving first took the place."""
    from datetime import UTC, datetime

    from rotation import hooks

    later: list[tuple[list[int], datetime, str]] = []
    monkeypatch.setattr(hooks, "_later", [lambda group_ids, at, because: later.append((list(group_ids), at, because))])
    group, (rep,) = make_group(1, slug="emea")
    begins = (datetime.now(UTC) + timedelta(seconds=65)).replace(second=0, microsecond=0)  # 5 to 65 s off
    day = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[begins.weekday()]
    with django_capture_on_commit_callbacks(execute=True):
        r = api.patch(
            f"/api/v1/reps/{rep.id}/",
            {"timezone": "UTC", "working_hours": {day: [[f"{begins:%H:%M}", "24:00"]]}},
            format="json",
        )
    assert r.status_code == 200, r.content
    assert later == [([group.id], begins, f"rep {rep.id}'s working hours began (UTC)")]


@pytest.mark.django_db
def test_account_changes_drain_the_groups_that_keep_leads_for_an_owner(
    make_group, drains, django_capture_on_commit_callbacks
):
    """A lead kept queued for an account's owner is free once the account moves to another
    owner or domain, is deleted, or its owner is switched off: the groups that keep such
    leads are drained at once, not at the next backstop sweep."""
    from rotation.models import Account

    keeping, reps = make_group(2, slug="emea", owner_match_fallback_to_rotation=False)
    make_group(1, slug="amer")  # falls back on the rotation: never keeps a lead for an owner
    account = Account.objects.create(domain="bigco.example", owner=reps[1])

    def save(**values):
        for name, value in values.items():
            setattr(account, name, value)
        services.account_save(account=account, actor="t", changed=list(values))

    def switch_off_owner():
        reps[1].active = False
        services.rep_save(rep=reps[1], actor="t", changed=["active"])

    cases = [
        (lambda: save(name="BigCo"), False),
        (lambda: save(owner=reps[0]), True),
        (lambda: save(domain="bigco.test"), True),
        (lambda: save(owner=reps[1]), True),
        (switch_off_owner, True),
        (lambda: services.account_delete(account=account, actor="t"), True),
    ]
    for change, expected in cases:
        drains.clear()
        with django_capture_on_commit_callbacks(execute=True):
            change()
        assert drains == ([keeping.id] if expected else []), change


@pytest.mark.django_db
def test_group_changes_that_free_capacity_ask_for_a_drain(api, make_group, drains, django_capture_on_commit_callbacks):
    group, _ = make_group(1, slug="emea")
    cases = [
        ({"max_attempts": 5}, True),  # leads that used up their attempts may go again
        ({"max_attempts": 5}, False),  # sent again unchanged
        ({"timezone": "Asia/Tokyo"}, True),  # another day boundary: daily caps start again
        ({"name": "EMEA inbound"}, False),
        ({"owner_match_fallback_to_rotation": False}, False),  # leads now wait for their owner
        ({"owner_match_fallback_to_rotation": True}, True),  # those waiting may go to the rotation
        ({"is_default": True}, True),  # the leads queued for want of a default group are its own
        ({"is_default": True}, False),
    ]
    for body, expected in cases:
        drains.clear()
        with django_capture_on_commit_callbacks(execute=True):
            r = api.patch("/api/v1/groups/emea/", body, format="json")
        assert r.status_code == 200, r.content
        assert drains == ([group.id] if expected else []), body


@pytest.mark.django_db
def test_more_attempts_let_a_lead_that_used_them_up_be_drained(api, make_group):
    group, reps = make_group(3, slug="emea", sla_minutes="1", max_attempts=1)
    lead = post(api, group="emea")
    assignment = Assignment.objects.get(lead_id=lead["id"])
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "queued"
    group.max_attempts = 2
    services.group_save(group=group, actor="t", changed=["max_attempts"])
    assert actions.queue_drain(group_id=group.id) == 1
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.status == "assigned" and stored.owner_id != reps[0].id  # never the rep that missed it


@pytest.mark.django_db
def test_the_sweep_routes_leads_no_group_holds_once_there_is_a_default_group(api, make_group):
    """Queued because no rule matched and there was no default group, a lead waits in no
    group's queue: the default group's drains take it once there is one, and nothing touches
    it (no event every sweep) while there is none."""
    group, (rep,) = make_group(1, slug="emea")
    orphan = post(api)
    assert (orphan["status"], orphan["group"]) == ("queued", None)
    assert actions.queue_drain_all() == 0
    assert not AuditEvent.objects.filter(lead_id=orphan["id"], type="lead.rerouted").exists()
    Group.objects.filter(pk=group.pk).update(is_default=True)  # without the drain its save asks for
    actions.queue_drain_all()
    lead = Lead.objects.get(pk=orphan["id"])
    assert (lead.status, lead.group_id, lead.owner_id) == ("assigned", group.id, rep.id)
    event = AuditEvent.objects.get(lead_id=lead.id, type="lead.rerouted")
    assert event.actor == "system:queue" and event.explanation["from_group"] is None
    assert event.explanation["rerouted_because"].startswith("a default group now exists; periodic sweep")


# --- drained by the change itself, before its answer ----------------------------------------


@pytest.fixture
def published(monkeypatch):
    """The drain tasks published for the worker (none runs here: what the worker would do is
    left undone, so only what the change did itself is seen)."""
    from leads import scheduling

    sent: list[int] = []

    def publish(name, *, args, **options):
        if name == scheduling.DRAIN_TASK:
            sent.append(args[0])
        return True

    monkeypatch.setattr(scheduling, "publish", publish)
    return sent


@pytest.mark.django_db(transaction=True)
def test_the_change_that_frees_capacity_routes_the_queue_before_it_answers(api, make_group, published):
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1)
    first = post(api, group="emea")
    waiting = post(api, group="emea")
    assert waiting["status"] == "queued"
    assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    # No worker ran: the close itself routed the lead that waited for the place it freed...
    assert status(waiting) == "assigned" and Lead.objects.get(pk=waiting["id"]).owner_id == rep.id
    assert AuditEvent.objects.get(lead_id=waiting["id"], type="lead.assigned").explanation["trigger"] == "queue_drain"
    # ...so a lead posted right after cannot take it first.
    assert post(api, group="emea")["status"] == "queued"
    assert published == []  # the walk ended here: nothing left for the worker
    # A cap raised over the API: the same, before the answer.
    member = Membership.objects.get(group=group, rep=rep)
    r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"max_open": 3}, format="json")
    assert r.status_code == 200, r.content
    assert Lead.objects.filter(group=group, status="queued").count() == 0
    member.refresh_from_db()
    assert member.max_open == 3


@pytest.mark.django_db(transaction=True)
def test_making_a_group_the_default_routes_the_leads_queued_for_want_of_one(api, make_group, published):
    group, reps = make_group(2, slug="emea")
    RoutingRule.objects.create(
        name="France", priority=1, group=group, conditions=[{"field": "country", "op": "in", "value": ["DE"]}]
    )
    orphans = [post(api, country="FR") for _ in range(3)]
    assert all(lead["status"] == "queued" and lead["group"] is None for lead in orphans)
    RoutingRule.objects.update(conditions=[{"field": "country", "op": "in", "value": ["FR"]}])  # fixed since
    r = api.patch("/api/v1/groups/emea/", {"is_default": True}, format="json")
    assert r.status_code == 200, r.content
    # Before the answer, oldest first, through the rules as they are now and the rotation.
    leads = [Lead.objects.get(pk=lead["id"]) for lead in orphans]
    assert [(lead.status, lead.group_id) for lead in leads] == [("assigned", group.id)] * 3
    assert [lead.owner_id for lead in leads] == [reps[0].id, reps[1].id, reps[0].id]
    event = AuditEvent.objects.get(lead_id=leads[0].id, type="lead.rerouted")
    assert (event.explanation["rule"], event.explanation["group_source"]) == ("France", "rule")  # as now
    because = event.explanation["rerouted_because"]
    assert because.startswith("a default group now exists; group 'emea' changed") and "is_default" in because
    assert published == []


@pytest.mark.django_db(transaction=True)
def test_a_group_made_the_default_over_the_api_takes_the_leads_no_rule_matches(api, make_group, published):
    """The request that makes the group the default read the configuration before its change
    (its token, at the start): the drain it runs once committed routes under the new one."""
    group, reps = make_group(2, slug="emea")
    orphan = post(api, country="BR")
    assert (orphan["status"], orphan["group"]) == ("queued", None)
    r = api.patch("/api/v1/groups/emea/", {"is_default": True}, format="json")
    assert r.status_code == 200, r.content
    lead = Lead.objects.get(pk=orphan["id"])
    assert (lead.status, lead.group_id, lead.owner_id) == ("assigned", group.id, reps[0].id)
    (event,) = AuditEvent.objects.filter(lead_id=lead.id, type="lead.rerouted")
    assert (event.explanation["group_source"], event.explanation["group"]) == ("default", "emea")
    assert published == []


@pytest.mark.django_db(transaction=True)
def test_a_change_that_frees_much_capacity_leaves_the_rest_to_the_worker(api, make_group, published, settings):
    settings.QUEUE_DRAIN_INLINE = 2
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    queued = [post(api, group="emea") for _ in range(5)]
    r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"active": True}, format="json")
    assert r.status_code == 200, r.content
    assert [status(lead) for lead in queued] == ["assigned"] * 2 + ["queued"] * 3  # oldest first
    assert published == [group.id]  # the worker routes the rest
    assert actions.queue_drain(group_id=group.id) == 3


@pytest.mark.django_db(transaction=True)
def test_a_busy_rotation_leaves_the_drain_to_the_worker(api, make_group, published, monkeypatch):
    from leads.routing import RoutingBusy

    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    waiting = post(api, group="emea")

    def busy(**kwargs):
        raise RoutingBusy("held")

    monkeypatch.setattr(actions, "queue_drain_now", busy)
    r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"active": True}, format="json")
    assert r.status_code == 200, r.content  # the change stands; its drain is handed on
    assert status(waiting) == "queued" and published == [group.id]


@pytest.mark.django_db
def test_the_sweep_drains_every_group_past_one_whose_rotation_is_busy(api, make_group, monkeypatch):
    """The backstop sweep walks every group with queued leads: a group whose rotation is held
    past the lock timeout (a hot group) is left to the next sweep, not the end of this one."""
    from leads.routing import RoutingBusy

    busy, _ = make_group(1, slug="hot")
    calm, _ = make_group(1, slug="calm")
    Membership.objects.filter(group__in=[busy, calm]).update(active=False)
    waiting = [post(api, group="hot"), post(api, group="calm")]
    Membership.objects.filter(group__in=[busy, calm]).update(active=True)  # no drain asked: time alone
    drain = actions.queue_drain

    def held(*, group_id, **kwargs):
        if group_id == busy.id:
            raise RoutingBusy("held")
        return drain(group_id=group_id, **kwargs)

    monkeypatch.setattr(actions, "queue_drain", held)
    assert actions.queue_drain_all() == 1
    assert [status(lead) for lead in waiting] == ["queued", "assigned"]


@pytest.mark.django_db
@pytest.mark.parametrize(("max_open", "drained"), [(None, False), (5, True)])
def test_an_escalation_asks_for_a_drain_only_when_it_frees_a_capped_place(
    api, make_group, monkeypatch, max_open, drained
):
    """The rep who missed the SLA has one open lead fewer: that frees a place under a
    max_open cap only. Without one, no drain (it would walk the whole queue for nothing)."""
    from leads import scheduling

    group, reps = make_group(2, slug="emea", sla_minutes="1")
    Membership.objects.filter(group=group).update(max_open=max_open)
    asked: list[list[int]] = []
    monkeypatch.setattr(
        scheduling, "drain_schedule_on_commit", lambda *, group_ids, because: asked.append(list(group_ids))
    )
    lead = post(api, group="emea")
    assignment = Assignment.objects.get(lead_id=lead["id"])
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert actions.lead_escalate(assignment_id=assignment.id).outcome == "escalated"
    assert asked == ([[group.id]] if drained else [])


# --- why each drain happened -----------------------------------------------------------------


def drained_because(lead: dict) -> str:
    event = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned", actor="system:queue").get()
    return event.explanation["drained_because"]


@pytest.mark.django_db
def test_each_drain_says_which_change_freed_the_capacity(
    api, make_group, published, django_capture_on_commit_callbacks
):
    """A manager reading a drained lead's trail learns why it left the queue then: which lead
    was closed or moved, which rep came back, joined, was un-paused or got a higher cap (and
    who did it), or that the periodic sweep found the place."""
    from tests.factories import RepFactory

    group, (rep, other) = make_group(2, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1)
    first, second = post(api, group="emea"), post(api, group="emea")
    ACTOR = AuditEvent.objects.get(lead_id=first["id"], type="lead.received").actor  # the API client's

    waiting = post(api, group="emea")
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/v1/leads/{first['id']}/close/", {"outcome": "won"}, format="json").status_code == 200
    assert drained_because(waiting) == f"lead {first['id']} of rep {rep.id} closed (won, {ACTOR})"

    waiting = post(api, group="emea")
    outsider = RepFactory()
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(f"/api/v1/leads/{second['id']}/reassign/", {"rep": outsider.id, "reason": "vip"}, format="json")
    assert r.status_code == 200, r.content
    assert drained_because(waiting) == f"lead {second['id']} reassigned by hand from rep {other.id} ({ACTOR})"

    waiting = post(api, group="emea")
    with django_capture_on_commit_callbacks(execute=True):
        r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"max_open": 2}, format="json")
    assert r.status_code == 200, r.content
    assert drained_because(waiting) == (f"rep {rep.id}'s membership of group 'emea' changed: max_open 1 → 2 ({ACTOR})")

    Membership.objects.filter(group=group).update(max_open=None, active=False)
    waiting = post(api, group="emea")
    with django_capture_on_commit_callbacks(execute=True):
        r = api.patch(f"/api/v1/groups/emea/members/{other.id}/", {"active": True}, format="json")
    assert r.status_code == 200, r.content
    assert drained_because(waiting) == (
        f"rep {other.id}'s membership of group 'emea' changed: active false → true ({ACTOR})"
    )

    Membership.objects.filter(group=group).update(active=False)
    waiting = post(api, group="emea")
    joiner = RepFactory()
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post("/api/v1/groups/emea/members/", {"rep": joiner.id}, format="json")
    assert r.status_code == 201, r.content
    assert drained_because(waiting) == f"rep {joiner.id} joined group 'emea' ({ACTOR})"

    Membership.objects.filter(group=group).update(active=False)
    Membership.objects.filter(group=group, rep=rep).update(active=True)
    now = timezone.now()
    r = api.post(
        f"/api/v1/reps/{rep.id}/absences/",
        {"starts_at": (now - timedelta(hours=1)).isoformat(), "ends_at": (now + timedelta(days=1)).isoformat()},
        format="json",
    )
    assert r.status_code == 201, r.content
    waiting = post(api, group="emea")
    assert waiting["status"] == "queued"
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/api/v1/reps/{rep.id}/absences/{r.json()['id']}/").status_code == 204
    assert drained_because(waiting) == (
        f"back from out of office: rep {rep.id}'s absence {r.json()['id']} deleted ({ACTOR})"
    )

    Membership.objects.filter(group=group).update(active=False)
    waiting = post(api, group="emea")
    Membership.objects.filter(group=group, rep=rep).update(active=True)  # announced by no write
    assert actions.queue_drain_all() == 1
    assert drained_because(waiting) == actions.QUEUE_SWEEP_BECAUSE


@pytest.mark.django_db
def test_a_drain_after_an_escalation_names_the_lead_and_the_rep_who_missed(
    api, make_group, published, django_capture_on_commit_callbacks
):
    group, (rep, other) = make_group(2, slug="emea", sla_minutes="1")
    Membership.objects.filter(group=group).update(max_open=1)
    missed, _second = post(api, group="emea"), post(api, group="emea")
    waiting = post(api, group="emea")
    assert waiting["status"] == "queued"
    assignment = Assignment.objects.get(lead_id=missed["id"])
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    Membership.objects.filter(group=group, rep=other).update(max_open=2)  # room for the escalated lead
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.lead_escalate(assignment_id=assignment.id).outcome == "escalated"
    assert drained_because(waiting) == (
        f"SLA escalation freed a place under a max_open cap (lead {missed['id']} from rep {rep.id})"
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("celery")
def test_the_workers_drain_for_an_absence_that_runs_out_says_so(api, make_group, celery_worker):
    """No write announces an absence that ends: the drain published for its end, run by the
    worker, carries the why into the trail."""
    group, (rep,) = make_group(1, slug="emea")
    now = timezone.now()
    ends = now + timedelta(seconds=3)
    absence = services.absence_add(
        absence=Absence(rep=rep, starts_at=now - timedelta(hours=1), ends_at=ends), actor="t"
    )
    waiting = post(api, group="emea")
    assert waiting["status"] == "queued"
    assert wait_for(lambda: status(waiting) == "assigned", timeout=15), celery_worker.log()
    assert drained_because(waiting) == (
        f"back from out of office: rep {rep.id}'s absence {absence.pk} ended at {ends.isoformat()}"
    )


@pytest.mark.django_db
def test_a_queued_lead_stepped_over_after_max_attempts_is_raised_says_why_it_still_waits(api, make_group):
    """Queued at max_attempts 1; raised to 2 with only the rep who had it free, the drain steps
    over it: its reason was still "max_attempts (1) reached", which no longer held."""
    group, (rep,) = make_group(1, slug="emea", sla_minutes="1", max_attempts=1)
    _miss(api, "emea")
    lead = Lead.objects.get()
    assert "max_attempts (1) reached" in lead.queue_reason
    assert api.patch("/api/v1/groups/emea/", {"max_attempts": 2}, format="json").status_code == 200
    actions.queue_drain(group_id=group.id)
    lead.refresh_from_db()
    assert lead.status == "queued"
    assert lead.queue_reason == "SLA missed; no eligible rep in 'emea' who has not had this lead"
    assert api.get(f"/api/v1/leads/{lead.id}/").json()["queue_reason"] == lead.queue_reason
    # A reason that still holds (or a manager's) is left as it is.
    Lead.objects.filter(pk=lead.pk).update(queue_reason="parked by a manager")
    actions.queue_drain(group_id=group.id)
    lead.refresh_from_db()
    assert lead.queue_reason == "parked by a manager"


@pytest.mark.django_db
def test_a_queued_leads_count_of_what_keeps_members_out_follows_the_group(
    api, make_group, django_capture_on_commit_callbacks
):
    """The count is read when the lead queues; a drain that still finds nobody says what holds
    the leads now (here: the rep away is back but paused), and leaves a manager's reason be."""
    group, (capped, away) = make_group(2, slug="emea")
    Membership.objects.filter(group=group, rep=capped).update(max_open=0)
    now = timezone.now()
    absence = Absence.objects.create(rep=away, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=1))
    first, parked = post(api, group="emea"), post(api, group="emea")
    assert Lead.objects.get(pk=first["id"]).queue_reason == (
        "no eligible rep in group 'emea' (1 at max_open cap, 1 out of office)"
    )
    Lead.objects.filter(pk=parked["id"]).update(queue_reason="parked by a manager")
    with django_capture_on_commit_callbacks(execute=True):  # the drains the changes ask for
        assert api.patch(f"/api/v1/groups/emea/members/{away.id}/", {"active": False}, format="json").status_code == 200
        assert api.delete(f"/api/v1/reps/{away.id}/absences/{absence.id}/").status_code == 204
    now_reason = "no eligible rep in group 'emea' (1 at max_open cap, 1 paused in this group)"
    assert Lead.objects.get(pk=first["id"]).queue_reason == now_reason
    assert api.get("/api/v1/queue/").json()["results"][0]["queue_reason"] == now_reason
    assert Lead.objects.get(pk=parked["id"]).queue_reason == "parked by a manager"


@pytest.mark.django_db
def test_a_queued_leads_no_members_reason_gives_way_once_a_paused_member_joins(
    api, make_group, django_capture_on_commit_callbacks
):
    """Queued with "group has no members", a lead kept that reason after a paused member
    joined: the manager working the queue read that nobody was in the group."""
    group, _ = make_group(0, slug="emea")
    lead = post(api, group="emea")
    assert Lead.objects.get(pk=lead["id"]).queue_reason == "group 'emea' has no members"
    with django_capture_on_commit_callbacks(execute=True):  # the drain the join asks for
        services.membership_add(group=group, rep=RepFactory(), actor="test", active=False)
    stored = Lead.objects.get(pk=lead["id"])
    assert (stored.status, stored.queue_reason) == (
        "queued",
        "no eligible rep in group 'emea' (1 paused in this group)",
    )


@pytest.mark.django_db
def test_a_queued_leads_inactive_group_reason_gives_way_once_the_group_is_active_again(
    api, make_group, django_capture_on_commit_callbacks
):
    """Queued while its group was inactive, a lead still said so after the group was made
    active again with its only member paused: the queue sent the manager to fix the group."""
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    assert api.patch("/api/v1/groups/emea/", {"active": False}, format="json").status_code == 200
    lead = post(api, group="emea")
    assert Lead.objects.get(pk=lead["id"]).queue_reason == "group 'emea' is inactive"
    with django_capture_on_commit_callbacks(execute=True):  # the drain the change asks for
        assert api.patch("/api/v1/groups/emea/", {"active": True}, format="json").status_code == 200
    stored = Lead.objects.get(pk=lead["id"])
    reason = "no eligible rep in group 'emea' (1 paused in this group)"
    assert (stored.status, stored.queue_reason) == ("queued", reason)
    queue = api.get("/api/v1/queue/").json()["results"]
    assert [(q["id"], q["queue_reason"]) for q in queue] == [(lead["id"], reason)]


@pytest.mark.django_db(transaction=True)
def test_a_drain_waits_for_the_rotation_lock_once_per_chunk_of_leads_not_once_per_lead(
    api, make_group, published, settings
):
    """Under a stream of intake each wait for the lock is a wait behind the stream: the
    change that freed capacity answered after 5 to 10 s when each of its 20 leads waited."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.QUEUE_DRAIN_INLINE = 3 * actions.DRAIN_CHUNK
    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(active=False)
    queued = [post(api, group="emea") for _ in range(2 * actions.DRAIN_CHUNK + 3)]
    with CaptureQueriesContext(connection) as ctx:
        r = api.patch(f"/api/v1/groups/emea/members/{rep.id}/", {"active": True}, format="json")
    assert r.status_code == 200, r.content
    assert [status(lead) for lead in queued] == ["assigned"] * len(queued)
    assert published == []  # all of them before the answer
    locks = [q["sql"] for q in ctx.captured_queries if "FOR NO KEY UPDATE" in q["sql"] and "rotationstate" in q["sql"]]
    # The change's own lock, then one per chunk of the drain's walk (10, 10, 3, the empty end).
    assert len(locks) <= 1 + 3, locks
    events = AuditEvent.objects.filter(type="lead.assigned", lead_id__in=[lead["id"] for lead in queued])
    assert [e.explanation["trigger"] for e in events] == ["queue_drain"] * len(queued)


@pytest.mark.django_db
def test_a_drained_leads_time_in_the_queue_counts_from_when_it_was_queued(api, make_group):
    """`queued_for_s` was the lead's age: the time reps held it before it escalated into the
    queue read as time spent waiting there."""
    group, (rep,) = make_group(1, slug="emea", sla_minutes="30", max_attempts=1)
    lead = post(api, group="emea")
    Lead.objects.filter(pk=lead["id"]).update(created_at=timezone.now() - timedelta(minutes=40))
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()
    assert status(lead) == "queued"
    Group.objects.filter(pk=group.pk).update(max_attempts=2)
    services.membership_add(group=group, rep=RepFactory(), actor="test")
    assert actions.queue_drain(group_id=group.id) == 1
    event = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.assigned").last()
    assert event.explanation["trigger"] == "queue_drain"
    assert 0 <= event.explanation["queued_for_s"] < 60, event.explanation  # not its 40 minutes of age


@pytest.mark.django_db
def test_an_escalation_in_a_group_left_without_members_says_so(api, make_group):
    """ "Every rep has had this lead" where nobody was left in the group at all."""
    group, (rep,) = make_group(1, slug="emea", sla_minutes="30", max_attempts=3)
    lead = post(api, group="emea")
    assert api.delete(f"/api/v1/groups/emea/members/{rep.id}/").status_code == 204
    Assignment.objects.filter(lead_id=lead["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()
    stored = Lead.objects.get(pk=lead["id"])
    assert (stored.status, stored.queue_reason) == ("queued", "SLA missed; group 'emea' has no members")
