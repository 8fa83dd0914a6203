"""Escalations of one group that fall due together are worked off under one rotation lock.

Called directly (the Celery task only wraps `lead_escalate`), on PostgreSQL: the locks and
SKIP LOCKED are the point.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions, scheduling
from leads.models import Assignment, Lead
from rotation.models import Membership, RotationState
from tests.conftest import lead_body
from tests.leads.test_bulk_import import rotation_row_held, row_held

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def overdue_leads(api, slug: str, n: int) -> list[Assignment]:
    """`n` leads posted to the group, their assignments then made overdue, oldest due first."""
    ids = [api.post("/api/v1/leads/", lead_body(group=slug), format="json").json()["id"] for _ in range(n)]
    rows = list(Assignment.objects.filter(lead_id__in=ids).order_by("lead_id"))
    past = timezone.now() - timedelta(seconds=10)
    for i, row in enumerate(rows):
        Assignment.objects.filter(pk=row.pk).update(due_at=past + timedelta(milliseconds=i))
    return rows


def escalated(lead_id: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(lead_id=lead_id, type="lead.escalated"))


def test_one_escalation_takes_the_groups_overdue_backlog_each_explained(api, make_group):
    group, reps = make_group(4, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 6)
    turns = RotationState.objects.get(group=group).turns

    result = actions.lead_escalate(assignment_id=rows[0].pk)

    assert result.outcome == "escalated" and result.backlog == {"escalated": 5}
    for row in rows:
        (event,) = escalated(row.lead_id)
        assert event.actor == "system:sla" and event.explanation["from_rep"] == row.rep_id
        lead = Lead.objects.get(pk=row.lead_id)
        assert lead.owner_id == event.rep_id != row.rep_id and lead.escalations == 1
        assert Assignment.objects.get(pk=row.pk).end_reason == "sla_missed"
    assert RotationState.objects.get(group=group).turns == turns + 6  # one turn per escalation, in order
    # The later timers of the batch find their work done.
    assert [actions.lead_escalate(assignment_id=row.pk).outcome for row in rows[1:]] == ["done"] * 5


def test_the_backlog_is_bounded_and_leaves_what_is_not_due(api, make_group, settings):
    settings.ESCALATION_BATCH = 3
    group, reps = make_group(4, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 5)
    later = api.post("/api/v1/leads/", lead_body(group="burst"), format="json").json()

    result = actions.lead_escalate(assignment_id=rows[0].pk)

    assert result.backlog == {"escalated": 2}
    assert [len(escalated(row.lead_id)) for row in rows] == [1, 1, 1, 0, 0]  # oldest due first
    assert escalated(later["id"]) == []  # not due yet: its own timer will come

    settings.ESCALATION_BATCH = 1  # one escalation per transaction, as without batching
    assert actions.lead_escalate(assignment_id=rows[3].pk).backlog is None
    assert [len(escalated(row.lead_id)) for row in rows] == [1, 1, 1, 1, 0]


def test_a_lead_held_by_another_transaction_is_passed_over(api, make_group):
    group, reps = make_group(3, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 3)
    # An accept of the middle lead, say, still working.
    with row_held(lambda: Lead.objects.select_for_update().get(pk=rows[1].lead_id)):
        started = time.monotonic()
        result = actions.lead_escalate(assignment_id=rows[0].pk)
        assert time.monotonic() - started < 1.5  # SKIP LOCKED: no wait for the held lead
    assert result.outcome == "escalated" and result.backlog == {"skipped": 1, "escalated": 1}
    assert [len(escalated(row.lead_id)) for row in rows] == [1, 0, 1]
    assert Assignment.objects.get(pk=rows[1].pk).ended_at is None  # left to its own timer
    assert actions.lead_escalate(assignment_id=rows[1].pk).outcome == "escalated"


def test_a_settled_timer_does_not_wait_for_the_rotation_lock(api, make_group):
    group, reps = make_group(2, slug="burst", sla_minutes="10")
    (row,) = overdue_leads(api, "burst", 1)
    assert actions.lead_escalate(assignment_id=row.pk).outcome == "escalated"
    not_due = Assignment.objects.get(lead_id=row.lead_id, ended_at__isnull=True)
    with rotation_row_held(group):
        started = time.monotonic()
        assert actions.lead_escalate(assignment_id=row.pk).outcome == "done"  # delivered twice
        result = actions.lead_escalate(assignment_id=not_due.pk)  # woken early
        assert time.monotonic() - started < 0.5
    assert result.outcome == "not_due" and result.due_at == not_due.due_at


def test_the_sweep_counts_what_the_batches_escalated(api, make_group):
    group, reps = make_group(4, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 4)
    tally = actions.escalation_sweep()
    assert tally == {"escalated": 4, "done": 3}  # one batch; the sweep's other three ids found it done
    assert all(len(escalated(row.lead_id)) == 1 for row in rows)


def test_a_backlog_larger_than_a_sweep_pass_is_worked_off_in_one_sweep(api, make_group, settings):
    # 7 overdue, 3 per pass (ESCALATION_SWEEP_BATCH), 2 per lock (ESCALATION_BATCH): another
    # pass while a full one escalated something, not one sweep period per pass.
    settings.ESCALATION_BATCH = 2
    group, reps = make_group(8, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 7)
    tally = actions.escalation_sweep(batch=3)
    assert tally["escalated"] == 7, tally
    assert all(len(escalated(row.lead_id)) == 1 for row in rows)
    assert actions.escalation_sweep(batch=3) == {}


def test_a_sweep_pass_leaves_a_lead_another_transaction_holds_to_the_next_sweep(api, make_group, settings):
    settings.ESCALATION_BATCH = 1
    group, reps = make_group(4, slug="burst", sla_minutes="10")
    rows = overdue_leads(api, "burst", 3)
    with row_held(lambda: Lead.objects.select_for_update().get(pk=rows[0].lead_id)):
        tally = actions.escalation_sweep(batch=1)
    # Passed over once (SKIP LOCKED), not tried again pass after pass.
    assert tally == {"skipped": 1, "escalated": 2}, tally
    assert actions.escalation_sweep(batch=1) == {"escalated": 1}


def test_a_busy_group_costs_the_sweep_one_lock_wait_not_one_per_overdue_lead(api, make_group, settings, monkeypatch):
    """A hot group whose rotation stays held past the lock timeout: the sweep waits for it once
    and goes on to the other groups' overdue assignments; the next sweep looks at it again."""
    from leads import routing

    settings.ROUTING_LOCK_TIMEOUT_MS = 200
    hot, _ = make_group(3, slug="hot", sla_minutes="10")
    make_group(3, slug="calm", sla_minutes="10")
    held = overdue_leads(api, "hot", 4)
    (later,) = overdue_leads(api, "calm", 1)  # due after the hot group's four
    waits: list[int] = []
    lock = routing.lock_rotation

    def counted(group_id: int):
        waits.append(group_id)
        return lock(group_id)

    monkeypatch.setattr(routing, "lock_rotation", counted)
    with rotation_row_held(hot):
        tally = actions.escalation_sweep()
    assert tally == {"busy": 4, "escalated": 1}
    assert waits.count(hot.id) == 1
    assert len(escalated(later.lead_id)) == 1 and not any(escalated(row.lead_id) for row in held)
    assert actions.escalation_sweep() == {"escalated": 4, "done": 3}  # free again: the next sweep


def test_a_batch_that_frees_capacity_drains_the_queue_once(api, make_group, monkeypatch):
    group, reps = make_group(4, slug="burst", sla_minutes="10")
    Membership.objects.filter(group=group).update(max_open=50)  # each miss frees a place
    rows = overdue_leads(api, "burst", 4)
    drains: list[list[int]] = []
    monkeypatch.setattr(scheduling, "drain_publish", lambda group_ids, because: drains.append(group_ids))
    assert actions.lead_escalate(assignment_id=rows[0].pk).backlog == {"escalated": 3}
    assert drains == [[group.id]]


class _Undo(Exception):
    pass


def _state_after(marker: tuple[int, int], group) -> dict:
    """What escalations leave behind, without times and ids that differ between two runs."""
    from notifications.models import OutboxMessage

    timed = ("late_by_s", "missed_due_at", "sla_due_at")
    audit_from, outbox_from = marker
    return {
        "leads": sorted(
            Lead.objects.values_list("id", "status", "owner_id", "escalations", "queue_reason", "group_id")
        ),
        "assignments": sorted(
            (a.lead_id, a.attempt, a.rep_id, a.reason, a.end_reason, a.ended_at is None, a.due_at is None)
            for a in Assignment.objects.all()
        ),
        "members": sorted(Membership.objects.values_list("rep_id", "consecutive_misses", "active", "paused_reason")),
        "rotation": RotationState.objects.filter(group=group).values_list("pointer", "current_weights", "turns").get(),
        "events": [
            (e.type, e.lead_id, e.rep_id, e.group, e.actor, {k: v for k, v in e.explanation.items() if k not in timed})
            for e in AuditEvent.objects.filter(pk__gt=audit_from).order_by("pk")
        ],
        "outbox": [
            (
                m.event,
                m.lead_id,
                m.group_id,
                m.rep_id,
                {**m.payload, "lead": {k: v for k, v in m.payload["lead"].items() if not k.endswith("_at")}},
            )
            for m in OutboxMessage.objects.filter(pk__gt=outbox_from).order_by("pk")
        ],
    }


SCENARIOS: dict[str, dict] = {
    "round robin, attempts run out": {"strategy": "round_robin", "max_attempts": 2, "leads": 12},
    "weighted, caps and auto-pause": {
        "strategy": "weighted",
        "max_attempts": 3,
        "leads": 15,
        "members": {0: {"max_open": 4}},
        "pause": 2,
        "weights": [3, 2, 1, 1],
    },
    "least loaded, a daily cap, a paused member": {
        "strategy": "least_loaded",
        "max_attempts": 4,
        "leads": 14,
        "members": {1: {"max_per_day": 5}, 3: {"active": False}},
    },
    "auto-pause after one miss": {"strategy": "round_robin", "max_attempts": 5, "leads": 10, "pause": 1},
    "inactive group": {"strategy": "round_robin", "max_attempts": 3, "leads": 9, "inactive": True},
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_backlog_escalated_together_ends_exactly_as_one_by_one(api, make_group, settings, name):
    """The backlog is decided in memory and written in one statement per table: it must leave
    every lead, assignment, member, the rotation, the audit trail and the outbox exactly as
    the same escalations run one after the other, each in its own transaction, do."""
    import random

    from django.db import transaction

    from notifications.models import OutboxMessage

    spec = SCENARIOS[name]
    rng = random.Random(name)
    group, reps = make_group(4, slug="burst", sla_minutes="10", strategy=spec["strategy"])
    group.max_attempts, group.auto_pause_after_misses = spec["max_attempts"], spec.get("pause")
    group.save(update_fields=["max_attempts", "auto_pause_after_misses"])
    for i, weight in enumerate(spec.get("weights", [])):
        Membership.objects.filter(group=group, rep=reps[i]).update(weight=weight)
    rows = overdue_leads(api, "burst", spec["leads"])
    # Some leads missed once already (their second attempt is the one now due), one was accepted.
    for row in rows[: len(rows) // 3]:
        settings.ESCALATION_BATCH = 1
        actions.lead_escalate(assignment_id=row.pk)
    actions.lead_accept(lead_id=rows[-1].lead_id, rep_id=rows[-1].rep_id, actor="test")
    for i, fields in spec.get("members", {}).items():
        Membership.objects.filter(group=group, rep=reps[i]).update(**fields)
    if spec.get("inactive"):
        type(group).objects.filter(pk=group.pk).update(active=False)
    due = list(Assignment.objects.filter(ended_at__isnull=True, accepted_at__isnull=True))
    rng.shuffle(due)  # due in another order than posted
    past = timezone.now() - timedelta(seconds=30)
    for i, row in enumerate(due):
        Assignment.objects.filter(pk=row.pk).update(due_at=past + timedelta(milliseconds=i))
    order = list(
        Assignment.objects.filter(ended_at__isnull=True, accepted_at__isnull=True, due_at__lte=timezone.now())
        .order_by("due_at", "pk")
        .values_list("pk", flat=True)
    )
    assert len(order) >= 6
    marker = (
        AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
        OutboxMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
    )

    settings.ESCALATION_BATCH = 1
    with pytest.raises(_Undo), transaction.atomic():
        outcomes = [actions.lead_escalate(assignment_id=pk).outcome for pk in order]
        one_by_one = _state_after(marker, group)
        raise _Undo

    settings.ESCALATION_BATCH = 1000
    result = actions.lead_escalate(assignment_id=order[0])
    together = _state_after(marker, group)

    tally: dict[str, int] = {}
    for outcome in outcomes[1:]:
        tally[outcome] = tally.get(outcome, 0) + 1
    assert (result.outcome, result.backlog) == (outcomes[0], tally)
    assert together == one_by_one
    assert len(together["events"]) >= len(order)
