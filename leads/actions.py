"""What happens to a lead after intake: escalation, accept, reassign, reroute, close, edit, and
the fallback queue's drain. Each is one short transaction through the routing steps of
`leads/routing.py`, and each writes its audit event with an explanation.

Lock order, as everywhere: the group's rotation row, then the lead row. Whatever is read to
decide (the open assignment, eligibility, caps) is read *after* both locks, so a decision is
never made from a stale snapshot: an accept that commits just before its timer fires wins,
and a timer delivered twice (or the timer and the sweep together) escalates once.
Accept, close and edit change no rotation state and take only the lead row's lock (an edit of
the email takes the old and the new address's intake locks first, as intake takes them; a
reassign locks the rep's row first).

Side effects (SLA timers, queue drains) are published after commit (`leads/scheduling.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Event, audit_record_bulk, audit_record_many
from notifications.models import OutboxMessage
from notifications.services import outbox_announce_many_on_commit
from rotation.eligibility import MemberFacts, eligibility, reasons_counted, working_hours_starts
from rotation.models import Absence, Group, Membership, Rep, RotationState
from routing_project import metrics
from routing_project.bulkdb import objects_create, objects_update
from routing_project.db import set_lock_timeout

from . import notify, ownership, routing, scheduling
from .models import DEDUP_STATUSES, OPEN_STATUSES, Assignment, Lead, LeadStatus

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEAD_ROUTING_FIELDS = [
    "status",
    "owner",
    "group",
    "assigned_at",
    "accepted_at",
    "sla_due_at",
    "queue_reason",
    "escalations",
    "closed_at",
    "outcome",
]
CONTACT_FIELDS = ("email", "first_name", "last_name", "company", "phone")
# What PATCH (and the admin's lead page) may edit: the contact fields and the facts rules read.
# A lead whose facts changed stays where it is until a reroute moves it.
SCALAR_FACTS = ("country", "region", "source", "product", "score", "company_size")
EDITABLE_FIELDS = (*CONTACT_FIELDS, *SCALAR_FACTS, "attributes")


class LeadConflict(Exception):
    """The lead is not in a state that allows the action (409)."""


class ActionRejected(Exception):
    """The request names something that cannot be used (400), e.g. an unknown rep."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass
class EscalationResult:
    outcome: str  # "escalated", "queued", "not_due", "done" (nothing left to do), "skipped", "gone"
    due_at: datetime | None = None
    lead_id: int | None = None
    # The other overdue assignments of the group escalated under the same lock, by outcome.
    backlog: dict[str, int] | None = None
    frees_capacity: bool = False  # the rep who missed was under a max_open cap
    from_rep: int | None = None  # the rep who missed (escalated or queued)


# --- the transaction and the locks -----------------------------------------------------------


class _LeadMoved(Exception):
    """The lead changed (its group, its address) between the read that chose the locks and its
    row lock: the transaction starts over, its locks released, rather than take the right lock
    now with the lead's row held (against the lock order)."""


def _in_transaction(fn: Callable[[], T]) -> T:
    """Runs `fn` in one transaction with the routing lock timeout; retries deadlocks and
    serialization failures like intake does; a lock held too long is RoutingBusy (503)."""
    attempts = settings.ROUTING_MAX_RETRIES + 1
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                set_lock_timeout()
                return fn()
        except _LeadMoved:
            continue  # at once: the move that caused it has committed
        except Exception as exc:
            if routing.is_lock_timeout(exc):
                raise routing.RoutingBusy() from exc
            if routing.is_retryable(exc) and attempt + 1 < attempts:
                logger.warning("lead action transaction retried after %s", routing.sqlstate(exc))
                time.sleep(0.01 * (attempt + 1))
                continue
            raise
    raise routing.RoutingBusy()


def _lock_lead(lead_id: int, *, skip_locked: bool = False) -> Lead | None:
    """The lead's row lock (always taken after any rotation row lock)."""
    qs = Lead.objects.select_for_update(of=("self",), skip_locked=skip_locked).select_related("group", "owner")
    return qs.filter(pk=lead_id).first()


def _lock_lead_and_group(lead_id: int) -> tuple[Lead, RotationState | None]:
    """The rotation row of the lead's group, then the lead row: the one lock order.

    The group is read before the lock; if a concurrent reroute moved the lead meanwhile, the
    transaction starts over (`_LeadMoved`): locking the new group's rotation row now, with
    the lead's row held, would take the two locks in the other order."""
    row = Lead.objects.filter(pk=lead_id).values_list("group_id", flat=True)
    if not row:
        raise Lead.DoesNotExist(f"no lead {lead_id}")
    group_id = row[0]
    state = routing.lock_rotation(group_id) if group_id is not None else None
    lead = _lock_lead(lead_id)
    if lead is None:
        raise Lead.DoesNotExist(f"no lead {lead_id}")
    if lead.group_id != group_id:
        raise _LeadMoved()
    return lead, state


def _open_assignment(lead: Lead) -> Assignment | None:
    # Assignments of a lead are only written under its row lock: read after taking it.
    return Assignment.objects.filter(lead=lead, ended_at__isnull=True).first()


def _end(assignment: Assignment | None, now: datetime, reason: str) -> None:
    if assignment is None:
        return
    assignment.ended_at = now
    assignment.end_reason = reason
    assignment.save(update_fields=["ended_at", "end_reason"])
    if reason != "sla_missed" and assignment.accepted_at is None:  # an escalation counts its own
        _breach_count_if_late(assignment, now)


def _breach_count_if_late(assignment: Assignment, now: datetime) -> None:
    """An assignment settled (accepted, moved or closed) past its due time without having been
    accepted by then missed its SLA, as the dashboard counts it, escalated or not (a timer
    that came late, a worker that was down). Counted once committed."""
    if assignment.due_at is None or assignment.group_id is None or now <= assignment.due_at:
        return
    group_id = assignment.group_id

    def record() -> None:  # the group's slug read after commit, not under the lead's locks
        slug = Group.objects.filter(pk=group_id).values_list("slug", flat=True).first()
        metrics.sla_breach_recorded(group=slug)

    transaction.on_commit(record, robust=True)


def _miss_run_ends_if_in_time(assignment: Assignment, now: datetime) -> None:
    """The lead was dealt with by its due time (accepted, or closed while still its rep's and
    unaccepted): the rep's run of consecutive SLA misses in the group is over. Past its due
    time the SLA was missed (as the dashboard counts it), escalated or not: the run goes on."""
    if assignment.group_id is None or (assignment.due_at is not None and now > assignment.due_at):
        return
    Membership.objects.filter(group_id=assignment.group_id, rep_id=assignment.rep_id).update(consecutive_misses=0)


def _assign(
    lead: Lead,
    *,
    rep_id: int,
    group: Group | None,
    reason: str,
    now: datetime,
    over_cap: bool = False,
    last_attempt: int | None = None,
) -> Assignment:
    """A new open assignment and the lead's new owner; its SLA timer is published on commit.
    `last_attempt`: the lead's highest attempt so far, when the caller has read it (under the
    lead's lock)."""
    due = routing.sla_due(group, now) if group is not None else None
    # The rep it moves away from (a reassignment, a reroute), told so by e-mail.
    from_rep = lead.owner_id if lead.status in OPEN_STATUSES and lead.owner_id != rep_id else None
    last = last_attempt
    if last is None:
        last = Assignment.objects.filter(lead=lead).order_by("-attempt").values_list("attempt", flat=True).first()
    assignment = Assignment.objects.create(
        lead=lead,
        rep_id=rep_id,
        group=group,
        attempt=(last or 0) + 1,
        reason=reason,
        started_at=now,
        due_at=due,
        over_cap=over_cap,
    )
    lead.status, lead.owner_id = LeadStatus.ASSIGNED, rep_id
    lead.assigned_at, lead.accepted_at, lead.sla_due_at, lead.queue_reason = now, None, due, ""
    scheduling.timer_schedule_on_commit(assignment_id=assignment.id, due_at=due, group_id=assignment.group_id)
    # Webhook and e-mail to the new owner: an outbox row in this transaction, sent after commit.
    event = "lead.escalated" if reason == Assignment.Reason.ESCALATION else "lead.assigned"
    notify.lead_notify(lead=lead, event=event, reason=reason, attempt=assignment.attempt, at=now, group=group)
    if from_rep is not None:
        notify.lead_notify_moved_away(lead=lead, rep_id=from_rep, why=_MOVED_BY.get(reason, _MOVED), at=now)
    return assignment


_MOVED = "it was given to another rep"
_MOVED_BY = {
    Assignment.Reason.MANUAL: "a manager gave it to another rep",
    Assignment.Reason.REROUTE: "it was routed again, to another rep",
    ownership.OWNER_MATCH: "it was routed again, to its account's owner",
}


def _queue(lead: Lead, reason: str) -> None:
    """Into the fallback queue: no owner, so no time of its assignment or acceptance either (as
    a lead queued at intake has none; the assignments keep the history)."""
    lead.status, lead.owner_id, lead.queue_reason = LeadStatus.QUEUED, None, reason
    lead.assigned_at = lead.accepted_at = lead.sla_due_at = None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _facts_of(facts: Iterable[MemberFacts], rep_id: int) -> MemberFacts | None:
    return next((f for f in facts if f.rep_id == rep_id), None)


# --- escalation ------------------------------------------------------------------------------


def lead_escalate(*, assignment_id: int, actor: str = "system:sla", skip_locked: bool = False) -> EscalationResult:
    """Escalates one assignment if, under the locks, it is still open, unaccepted and due.

    Safe to run any number of times, from the timer and the sweep at once: the first run ends
    the assignment; every later run finds it ended and does nothing. `skip_locked` (the sweep)
    passes over a lead another transaction is working on; the next sweep looks again.
    """
    row = (
        Assignment.objects.filter(pk=assignment_id)
        .values_list("lead_id", "group_id", "ended_at", "accepted_at", "due_at")
        .first()
    )
    if row is None:
        return EscalationResult("gone")
    lead_id, group_id, ended_at, accepted_at, due_at = row
    # Settled without a lock: an ended or accepted assignment never opens again, so a timer
    # delivered twice, or one whose assignment a batch below already escalated, costs one read
    # and does not queue behind the group's rotation lock.
    if ended_at is not None or accepted_at is not None or due_at is None:
        return EscalationResult("done", lead_id=lead_id)
    if due_at > timezone.now():
        return EscalationResult("not_due", due_at=due_at, lead_id=lead_id)
    return _in_transaction(lambda: _escalate_with_backlog(assignment_id, lead_id, group_id, actor, skip_locked))


def _escalate_with_backlog(
    assignment_id: int, lead_id: int, group_id: int | None, actor: str, skip_locked: bool
) -> EscalationResult:
    """Escalates the assignment, then, under the same rotation lock, the group's other overdue
    assignments (at most `ESCALATION_BATCH` - 1, oldest due first). When many assignments of
    one group come due together (a burst of leads, an import), one transaction escalates a
    backlog instead of each timer queueing behind the others for the rotation lock and a
    commit of its own: the group keeps up with its due times. The backlog is decided in
    memory, in order, exactly as one escalation after the other (each with its own
    explanation and audit event), and written in one statement per table
    (`_escalate_many_locked`); a lead another transaction holds is passed over (its timer or
    the sweep takes it), and a failure rolls the backlog back, the first escalation kept."""
    state = routing.lock_rotation(group_id) if group_id is not None else None
    result = _escalate_locked(assignment_id, lead_id, state, actor, skip_locked)
    if state is None or result.outcome not in ("escalated", "queued"):
        return result
    drain = [result] if result.frees_capacity else []
    if settings.ESCALATION_BATCH > 1:
        result, drain = _escalate_backlog(state, result, actor, exclude=assignment_id, drain=drain)
    if drain:
        freed = ", ".join(f"lead {r.lead_id} from rep {r.from_rep}" for r in drain)
        because = f"SLA escalation freed a place under a max_open cap ({freed})"
        scheduling.drain_schedule_on_commit(group_ids=[state.group_id], because=because)
    return result


def _escalate_backlog(
    state: RotationState, result: EscalationResult, actor: str, *, exclude: int, drain: list[EscalationResult]
) -> tuple[EscalationResult, list[EscalationResult]]:
    others = list(
        Assignment.objects.filter(
            group_id=state.group_id,
            ended_at__isnull=True,
            accepted_at__isnull=True,
            due_at__isnull=False,
            due_at__lte=timezone.now(),
        )
        .exclude(pk=exclude)
        .order_by("due_at", "pk")
        .values_list("pk", "lead_id")[: settings.ESCALATION_BATCH - 1]
    )
    if not others:
        return replace(result, backlog={}), drain
    tally: dict[str, int] = {}
    try:
        with transaction.atomic():
            leads = {
                lead.pk: lead
                for lead in Lead.objects.select_for_update(of=("self",), skip_locked=True)
                .select_related("group", "owner")
                .filter(pk__in=[lead_id for _, lead_id in others])
            }
            results = _escalate_many_locked(
                [(assignment_id, leads.get(lead_id), lead_id) for assignment_id, lead_id in others], state, actor
            )
    except Exception:
        # Nothing of the backlog is kept (its savepoint rolled back) and `state` may have moved
        # in memory with it: the leads' own timers, or the sweep, escalate them.
        logger.warning("escalation backlog of group %s not escalated", state.group_id, exc_info=True)
        return replace(result, backlog={}), drain
    for other in results:
        tally[other.outcome] = tally.get(other.outcome, 0) + 1
        if other.frees_capacity:
            drain = [*drain, other]
    return replace(result, backlog=tally), drain


def _escalate_locked(
    assignment_id: int, lead_id: int, state: RotationState | None, actor: str, skip_locked: bool
) -> EscalationResult:
    """One escalation, the group's rotation row (`state`) locked by the caller."""
    lead = _lock_lead(lead_id, skip_locked=skip_locked)
    if state is None:  # no group, no SLA: nothing to escalate to
        return EscalationResult("skipped" if lead is None else "done", lead_id=lead_id)
    [result] = _escalate_many_locked([(assignment_id, lead, lead_id)], state, actor)
    return result


@dataclass
class _Miss:
    """A member's consecutive SLA misses, counted in memory over a set of escalations."""

    member: Membership
    fields: set[str]


def _escalate_many_locked(
    items: list[tuple[int, Lead | None, int]], state: RotationState, actor: str
) -> list[EscalationResult]:
    """Escalates each (assignment id, its lead locked or None if another transaction holds
    it, lead id), in order, under the group's rotation lock (`state`) held by the caller:
    exactly as one after the other, each in its own transaction, would (the eligibility,
    counts, caps, pauses and rotation each decision sees include the ones before it), but
    read once and written in one statement per table: a burst of due assignments escalates
    in a few round trips, not a dozen per lead."""
    group = state.group
    now = timezone.now()
    # The truth, read under the locks: a lead's assignments change only under its lock.
    assignments = Assignment.objects.in_bulk([a for a, lead, _ in items if lead is not None])
    results: list[EscalationResult | None] = []
    due: list[tuple[Assignment, Lead]] = []  # their due_at is set and past
    for assignment_id, lead, lead_id in items:
        assignment = assignments.get(assignment_id)
        if lead is None:
            results.append(EscalationResult("skipped", lead_id=lead_id))
        elif assignment is None or assignment.ended_at or assignment.accepted_at or assignment.due_at is None:
            results.append(EscalationResult("done", lead_id=lead_id))
        elif group.sla_minutes is None:
            _sla_removed(lead, assignment, actor)
            results.append(EscalationResult("done", lead_id=lead_id))
        elif assignment.due_at > now:
            results.append(EscalationResult("not_due", due_at=assignment.due_at, lead_id=lead_id))
        else:
            results.append(None)
            due.append((assignment, lead))
    if not due:
        return [r for r in results if r is not None]

    # An attempt is an assignment of the lead in this group, by the rotation or by hand; the
    # misses are those that ran out their SLA (the ones escalated here included).
    ending = {assignment.pk for assignment, _ in due}
    history: dict[int, list[tuple[int | None, str, int, int]]] = {}
    for pk, lead_id, group_id, end_reason, rep_id, attempt in Assignment.objects.filter(
        lead_id__in=[lead.pk for _, lead in due]
    ).values_list("pk", "lead_id", "group_id", "end_reason", "rep_id", "attempt"):
        reason = "sla_missed" if pk in ending else end_reason
        history.setdefault(lead_id, []).append((group_id, reason, rep_id, attempt))
    # The members who missed, locked by their keys in one order (no join with the group's row:
    # the model's ordering would lock that too, FOR UPDATE, where routing holds it FOR NO KEY
    # UPDATE).
    misses = {
        m.rep_id: _Miss(m, set())
        for m in Membership.objects.select_for_update(of=("self",))
        .filter(group=group, rep_id__in={a.rep_id for a, _ in due})
        .order_by("pk")
    }
    # Eligibility, read once after the locks, then kept up to date in memory as each
    # escalation moves a lead (the open and today counts) or pauses a member.
    facts = routing.member_facts(group, now) if group.active else []
    moved = False
    ended: list[int] = []
    new_assignments: list[Assignment] = []
    outbox: list[Any] = []
    events: list[Event] = []
    counted: dict[str, int] = {}
    by_lead: dict[int, EscalationResult] = {}
    for assignment, lead in due:
        ended.append(assignment.pk)
        missed_rep = assignment.rep_id
        auto_paused: list[Event] = []
        paused, frees_capacity = _count_miss(group, misses.get(missed_rep), lead.id, actor, auto_paused)
        if paused:
            _facts_paused(facts, misses[missed_rep].member)
        in_group = [end_reason for group_id, end_reason, _, _ in history[lead.pk] if group_id == group.id]
        attempts, missed_count = len(in_group), in_group.count("sla_missed")
        had = {rep_id for _, _, rep_id, _ in history[lead.pk]}
        explanation: dict[str, Any] = {
            "group": group.slug,
            "strategy": group.strategy,
            "from_rep": missed_rep,
            "missed_attempt": assignment.attempt,
            "missed_due_at": _iso(assignment.due_at),
            "late_by_s": round((now - (assignment.due_at or now)).total_seconds(), 3),
            "attempts_in_group": attempts,
            "sla_misses_in_group": missed_count,
            "max_attempts": group.max_attempts,
            "excluded": sorted(had),
            "trigger": "sweep" if actor == "system:sweep" else "timer",
        }
        if paused:
            explanation["auto_paused"] = missed_rep
        lead.escalations += 1
        new: Assignment | None = None
        if not group.active:
            _queue(lead, f"SLA missed and group '{group.slug}' is inactive")
        elif attempts >= group.max_attempts:
            missed_text = "SLA missed once" if missed_count == 1 else f"SLA missed {missed_count} times"
            given = f"{attempts} assignments there" if attempts > 1 else "1 assignment there"
            _queue(lead, f"{missed_text}; max_attempts ({group.max_attempts}) reached in '{group.slug}' ({given})")
        else:
            decision = routing.decide(
                strategy=group.strategy,
                pointer=state.pointer,
                current_weights=state.current_weights or {},
                facts=facts,
                now=now,
                exclude=had,
            )
            explanation.update(decision.explanation())
            if decision.rep_id is None:
                _queue(lead, f"SLA missed; {_none_left(group, decision.candidates)}")
            else:
                new = Assignment(
                    lead=lead,
                    rep_id=decision.rep_id,
                    group=group,
                    attempt=max(attempt for *_, attempt in history[lead.pk]) + 1,
                    reason=Assignment.Reason.ESCALATION,
                    started_at=now,
                    due_at=routing.sla_due(group, now),
                    over_cap=False,
                )
                new_assignments.append(new)
                history[lead.pk].append((group.id, "", new.rep_id, new.attempt))
                lead.status, lead.owner_id = LeadStatus.ASSIGNED, decision.rep_id
                lead.assigned_at, lead.accepted_at, lead.sla_due_at, lead.queue_reason = now, None, new.due_at, ""
                moved = routing.advance_apply(state, decision) or moved
                _facts_moved(facts, decision.rep_id, open=1, assigned_today=1)
                explanation.update({"to_rep": new.rep_id, "attempt": new.attempt, "sla_due_at": _iso(new.due_at)})
        outbox.append(
            notify.lead_moved_away_message(
                lead=lead,
                rep_id=missed_rep,
                why="it was not accepted by its due time, and "
                + ("went to another rep" if new is not None else "went to the fallback queue"),
                at=now,
            )
        )
        if new is None:
            explanation.update({"to_rep": None, "queued": True, "queue_reason": lead.queue_reason})
            # The group's webhooks hear of it too (owner null): the CRM must not go on showing
            # the rep who missed the SLA as the owner. No e-mail: nobody owns it.
            outbox.append(
                notify.lead_outbox_message(
                    lead=lead, event="lead.escalated", reason="queued", attempt=assignment.attempt, at=now, group=group
                )
            )
        else:
            # Webhook and e-mail to the new owner.
            outbox.append(
                notify.lead_outbox_message(
                    lead=lead,
                    event="lead.escalated",
                    reason=Assignment.Reason.ESCALATION,
                    attempt=new.attempt,
                    at=now,
                    group=group,
                )
            )
        # Read by the next decision as a fresh read would find it: this lead no longer the
        # missed rep's (one escalation's own read still counted it: its lead was saved after).
        _facts_moved(facts, missed_rep, open=-1)
        rep = new.rep_id if new is not None else None
        events.append(Event(AuditEvent.Type.LEAD_ESCALATED, actor, lead.id, group.slug, rep, explanation))
        events.extend(auto_paused)
        outcome, counted_as = ("escalated", "reassigned") if new is not None else ("queued", "queued")
        counted[counted_as] = counted.get(counted_as, 0) + 1
        by_lead[lead.pk] = EscalationResult(
            outcome, lead_id=lead.id, frees_capacity=frees_capacity, from_rep=missed_rep
        )
        logger.info("lead %s escalated from rep %s to %s", lead.id, missed_rep, rep or "the queue")

    # The writes, one statement per table, in the order one escalation writes them.
    Assignment.objects.filter(pk__in=ended).update(ended_at=now, end_reason="sla_missed")
    for miss in misses.values():
        if miss.fields:
            miss.member.save(update_fields=sorted(miss.fields))
    objects_create(Assignment, new_assignments)
    objects_update(Lead, [lead for _, lead in due], LEAD_ROUTING_FIELDS)
    if moved:
        routing.advance_write(state)
    objects_create(OutboxMessage, outbox)
    outbox_announce_many_on_commit([m.id for m in outbox])
    audit_record_bulk(events=events)
    if len(new_assignments) == 1:
        first = new_assignments[0]
        scheduling.timer_schedule_on_commit(assignment_id=first.id, due_at=first.due_at, group_id=first.group_id)
    else:
        scheduling.batch_timer_schedule_on_commit(timers=[(a.group_id, a.due_at) for a in new_assignments])
    slug = group.slug
    transaction.on_commit(lambda: _escalations_counted(slug, counted))
    return [r if r is not None else by_lead[lead_id] for r, (_, _, lead_id) in zip(results, items, strict=True)]


def _sla_removed(lead: Lead, assignment: Assignment, actor: str) -> None:
    """The group's SLA was removed after this assignment was made: nobody in the group is held
    to a deadline any more, so the lead stays with its rep and the due time goes (the sweep no
    longer finds it). A new SLA applies to the assignments made after it."""
    due = assignment.due_at
    assignment.due_at = None
    assignment.save(update_fields=["due_at"])
    lead.sla_due_at = None
    lead.save(update_fields=["sla_due_at"])
    audit_record_many(
        events=[
            Event(
                AuditEvent.Type.LEAD_CHANGED,
                actor,
                lead.id,
                lead.group.slug if lead.group else "",
                assignment.rep_id,
                {
                    "fields": ["sla_due_at"],
                    "moved": False,
                    "because": "the group's SLA was removed; the lead stays with its rep",
                    "attempt": assignment.attempt,
                    "before": {"sla_due_at": _iso(due)},
                },
            )
        ]
    )


def _escalation_counted(group: str, outcome: str) -> None:
    """Every escalation is an SLA missed; counted once committed (a rollback counts nothing)."""
    metrics.sla_breach_recorded(group=group)
    metrics.escalation_recorded(group=group, outcome=outcome)


def _count_miss(group: Group, miss: _Miss | None, lead_id: int, actor: str, events: list[Event]) -> tuple[bool, bool]:
    """Counts a consecutive SLA miss of the member (locked by the caller; None: no longer a
    member) in memory; pauses it at the group's threshold (if set). Returns whether it paused
    the member, and whether the lead it loses frees capacity (a `max_open` cap, the member
    still taking leads)."""
    if miss is None:
        return False, False
    member = miss.member
    member.consecutive_misses += 1
    miss.fields.add("consecutive_misses")
    threshold = group.auto_pause_after_misses
    paused = bool(threshold) and member.active and member.consecutive_misses >= (threshold or 0)
    if paused:
        member.active = False
        misses = (
            "1 SLA miss" if member.consecutive_misses == 1 else f"{member.consecutive_misses} consecutive SLA misses"
        )
        member.paused_reason = f"auto-paused after {misses}"
        miss.fields.update(("active", "paused_reason"))
        events.append(
            Event(
                AuditEvent.Type.MEMBERSHIP_CHANGED,
                actor,
                None,
                group.slug,
                member.rep_id,
                {
                    "action": "auto_paused",
                    "consecutive_misses": member.consecutive_misses,
                    "auto_pause_after_misses": threshold,
                    "last_missed_lead": lead_id,
                    "changes": {"active": False, "paused_reason": member.paused_reason},
                },
            )
        )
    return paused, member.max_open is not None and not paused


def _facts_moved(facts: list[MemberFacts], rep_id: int, **changes: int) -> None:
    """Keeps `facts` as a fresh read would find them after an escalation: `open` and
    `assigned_today` moved by the given amounts."""
    for i, f in enumerate(facts):
        if f.rep_id == rep_id:
            facts[i] = replace(f, **{name: getattr(f, name) + by for name, by in changes.items()})
            return


def _facts_paused(facts: list[MemberFacts], member: Membership) -> None:
    for i, f in enumerate(facts):
        if f.rep_id == member.rep_id:
            facts[i] = replace(f, member_active=member.active, paused_reason=member.paused_reason)
            return


def _escalations_counted(group: str, outcomes: Mapping[str, int]) -> None:
    """Every escalation is an SLA missed; counted once committed (a rollback counts nothing)."""
    for outcome, n in outcomes.items():
        for _ in range(n):
            _escalation_counted(group, outcome)


def escalation_sweep(
    *, batch: int | None = None, now: datetime | None = None, actor: str = "system:sweep"
) -> dict[str, int]:
    """The safety net: escalates every overdue, open, unaccepted assignment (timer lost,
    broker down, worker killed). The scan uses the partial index `assignment_open_due_idx`;
    each escalation then locks in the usual order and skips leads another transaction holds
    (SKIP LOCKED): the timer or another sweep is already on it, and the next sweep looks again.
    With `actor="system:sla"` it is the timer of a bulk import's batch (`scheduling.
    batch_timer_schedule_on_commit`), whose assignments share their due time.
    """
    now = now or timezone.now()
    limit = batch or settings.ESCALATION_SWEEP_BATCH
    tally: dict[str, int] = {}
    busy: set[int] = set()
    passed: set[int] = set()  # failed or held by another transaction: the next sweep's
    # Another pass while a full one made progress: a backlog larger than a pass (a burst
    # of 600 due together) is worked off in this sweep, not one sweep period per pass. Within
    # the sweep's own period: the next sweep then takes over.
    stop_at = time.monotonic() + settings.ESCALATION_SWEEP_EVERY_S
    while True:
        rows = list(
            Assignment.objects.filter(
                ended_at__isnull=True, accepted_at__isnull=True, due_at__isnull=False, due_at__lte=now
            )
            .exclude(pk__in=passed)
            .order_by("due_at")
            .values_list("id", "group_id")[:limit]
        )
        before = (tally.get("escalated", 0) + tally.get("queued", 0), len(passed))
        _sweep_pass(rows, actor, tally, busy, passed)
        # Progress: something escalated, or rows the next pass will not see again.
        progress = (tally.get("escalated", 0) + tally.get("queued", 0), len(passed)) != before
        if len(rows) < limit or not progress or time.monotonic() >= stop_at:
            return tally


def _sweep_pass(
    rows: Sequence[tuple[int, int | None]], actor: str, tally: dict[str, int], busy: set[int], passed: set[int]
) -> None:
    for assignment_id, group_id in rows:
        if group_id in busy:
            # Its rotation stayed held past the lock timeout a moment ago: a hot group costs
            # the sweep one wait, not one per overdue assignment, and the other groups' due
            # escalations are not held up behind it. The next sweep looks at it again.
            tally["busy"] = tally.get("busy", 0) + 1
            continue
        try:
            result = lead_escalate(assignment_id=assignment_id, actor=actor, skip_locked=True)
            outcome = result.outcome
            for other, n in (result.backlog or {}).items():
                tally[other] = tally.get(other, 0) + n
        except routing.RoutingBusy:
            if group_id is not None:
                busy.add(group_id)
            outcome = "busy"
        except Exception:
            # One assignment that cannot be escalated must not hold back the others: logged
            # with its traceback, tried again by the next sweep.
            logger.exception("escalation of assignment %s failed", assignment_id)
            outcome = "failed"
        if outcome in ("failed", "skipped"):
            passed.add(assignment_id)
        tally[outcome] = tally.get(outcome, 0) + 1


def escalate_group_due(*, group_id: int, until: datetime, actor: str = "system:sla") -> dict[str, int]:
    """The SLA timer of a group's slice (`scheduling.slice_publish`): escalates the group's
    assignments overdue and due by `until` (the slice's end), oldest due first, each with its
    backlog under one lock (`lead_escalate`), as their own timers would have one by one. Those
    due after `until` are later slices'. Woken before the slice's assignments are due (this
    host's clock behind the publisher's), it publishes itself again for the first of them."""
    open_due = Assignment.objects.filter(
        group_id=group_id, ended_at__isnull=True, accepted_at__isnull=True, due_at__isnull=False
    )
    tally: dict[str, int] = {}
    seen: list[int] = []  # taken once each: one another transaction holds is the sweep's
    while True:
        now = timezone.now()
        first = (
            open_due.filter(due_at__lte=min(now, until))
            .exclude(pk__in=seen)
            .order_by("due_at")
            .values_list("id", flat=True)
            .first()
        )
        if first is None:
            break
        seen.append(first)
        try:
            result = lead_escalate(assignment_id=first, actor=actor)
        except routing.RoutingBusy:
            raise  # the task tries again in a moment
        except Exception:
            logger.exception("escalation of assignment %s failed", first)
            tally["failed"] = tally.get("failed", 0) + 1
            continue
        tally[result.outcome] = tally.get(result.outcome, 0) + 1
        for other, n in (result.backlog or {}).items():
            tally[other] = tally.get(other, 0) + n
    early = open_due.filter(due_at__gt=now, due_at__lte=until).order_by("due_at").values_list("due_at", flat=True)
    first_due = early.first()
    if first_due is not None:
        scheduling.publish(
            scheduling.ESCALATE_GROUP_TASK,
            args=[group_id, until.isoformat()],
            eta=first_due,
            expires=first_due + timedelta(hours=1),
        )
    return tally


def escalation_arm(*, now: datetime | None = None) -> int:
    """Publishes the timers of assignments that have come within the timer horizon.

    Runs every `ESCALATION_ARM_EVERY_S`; its window (horizon - period - overlap, horizon]
    meets the previous run's, so every assignment is published once or twice (harmless:
    escalation is idempotent) and never more than a horizon ahead of its due time. At most
    `ESCALATION_ARM_MAX` per run: what a worker holds in memory stays bounded.
    """
    now = now or timezone.now()
    horizon = settings.ESCALATION_TIMER_HORIZON_S
    low = now + timedelta(seconds=horizon - settings.ESCALATION_ARM_EVERY_S - settings.ESCALATION_ARM_OVERLAP_S)
    high = now + timedelta(seconds=horizon)
    rows = (
        Assignment.objects.filter(
            ended_at__isnull=True, accepted_at__isnull=True, due_at__gt=max(low, now), due_at__lte=high
        )
        .order_by("due_at")
        .values_list("id", "due_at", "group_id")[: settings.ESCALATION_ARM_MAX]
    )
    published = 0
    for assignment_id, due_at, group_id in rows:
        if due_at is None:
            continue
        # The group's timer for the slice, published once for all its assignments due in it.
        if group_id is not None and scheduling.slice_publish(group_id=group_id, due_at=due_at):
            published += 1
            continue
        if not scheduling.publish(
            scheduling.ESCALATE_TASK, args=[assignment_id], eta=due_at, expires=due_at + timedelta(hours=1)
        ):
            return published  # the broker is down: the sweep escalates these on time anyway
        published += 1
    return published + _drains_arm(low=max(low, now), high=high)


def _absence_ended_because(*, rep_ids: Iterable[int], ends_at: datetime) -> str:
    """Why a drain published for the end of an absence runs, for its audit events."""
    ids = sorted(rep_ids)
    who = f"rep {ids[0]}" if len(ids) == 1 else "reps " + ", ".join(str(r) for r in ids)
    return f"back from out of office: the absence of {who} ended at {ends_at.isoformat()}"


def _drains_arm(*, low: datetime, high: datetime) -> int:
    """An absence that runs out is announced by no write, yet frees its rep: the drain of each
    of the rep's groups is published for the moment it ends (in the same window as the
    timers), so the queue's leads get the rep before a lead that arrives later (the queue
    sweep is only the safety net). The same for working hours that begin and a new day's
    daily caps (`_time_frees_capacity`)."""
    still_away = Absence.objects.filter(  # another absence covers the end: not back yet
        rep_id=OuterRef("rep_id"), starts_at__lte=OuterRef("ends_at"), ends_at__gt=OuterRef("ends_at")
    )
    ending = (
        Absence.objects.filter(ends_at__gt=low, ends_at__lte=high)
        .exclude(Exists(still_away))
        .values_list("rep_id", "ends_at")
    )
    ends = list(ending)
    groups_of: dict[int, list[int]] = {}
    for rep_id, group_id in Membership.objects.filter(rep_id__in={r for r, _ in ends}).values_list(
        "rep_id", "group_id"
    ):
        groups_of.setdefault(rep_id, []).append(group_id)
    # Each end of each group: two reps back at different times, two drains.
    drains: dict[tuple[int, datetime], set[int]] = {}
    for rep_id, ends_at in ends:
        for group_id in groups_of.get(rep_id, []):
            drains.setdefault((group_id, ends_at), set()).add(rep_id)
    reasons = {key: _absence_ended_because(rep_ids=rep_ids, ends_at=key[1]) for key, rep_ids in drains.items()}
    for key, because in _time_frees_capacity(low=low, high=high).items():
        reasons[key] = f"{reasons[key]}; {because}" if key in reasons else because
    published = 0
    for (group_id, freed_at), because in sorted(reasons.items()):
        at = freed_at + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)
        args = [group_id, because]
        if not scheduling.publish(scheduling.DRAIN_TASK, args=args, eta=at, expires=at + timedelta(hours=1)):
            break
        published += 1
    return published


def _time_frees_capacity(*, low: datetime, high: datetime) -> dict[tuple[int, datetime], str]:
    """Like an absence's end, time alone frees reps when their working hours begin and, for a
    member under a `max_per_day` cap, when the group's day begins (its count starts again):
    the drain of each such group at each such moment in (low, high], and why. Without it, the
    first lead to arrive then would take the place before the leads queued overnight."""
    drains: dict[tuple[int, datetime], list[str]] = {}
    members = (
        Membership.objects.filter(active=True, rep__active=True, group__active=True)
        .filter(Q(rep__working_hours__isnull=False) | Q(max_per_day__isnull=False))
        .order_by("group_id", "position")
        .values_list(
            "group_id", "group__slug", "group__timezone", "rep_id", "rep__timezone", "rep__working_hours", "max_per_day"
        )
    )
    for group_id, slug, group_tz, rep_id, rep_tz, hours, max_per_day in members:
        try:
            starts = working_hours_starts(hours, rep_tz, low, high)
        except (ValueError, TypeError, AttributeError, KeyError):
            starts = []  # unreadable hours: the rep is never eligible (rotation/eligibility.py)
        for at in starts:
            drains.setdefault((group_id, at), []).append(f"rep {rep_id}'s working hours began ({rep_tz})")
        if max_per_day is not None:
            midnight = routing.day_start(high, group_tz)
            if low < midnight <= high:
                why = f"a new day began in group '{slug}' ({group_tz}): max_per_day caps count afresh"
                if why not in drains.get((group_id, midnight), []):
                    drains.setdefault((group_id, midnight), []).append(why)
    return {key: "; ".join(whys) for key, whys in drains.items()}


# --- the manager's actions -------------------------------------------------------------------


def lead_accept(*, lead_id: int, rep_id: int, actor: str) -> Lead:
    """The owner accepts: the SLA stops. 409 when `rep_id` is not the current owner (the
    lead escalated first, was moved, or is queued or closed). Accepting twice is a no-op."""

    def body() -> Lead:
        lead = _lock_lead(lead_id)
        if lead is None:
            raise Lead.DoesNotExist(f"no lead {lead_id}")
        if lead.status == LeadStatus.CLOSED:  # it keeps the rep who worked it as its owner
            raise LeadConflict(f"Lead {lead_id} is closed ({lead.outcome}): there is nothing to accept.")
        if lead.status not in OPEN_STATUSES or lead.owner_id != rep_id:
            raise LeadConflict(
                f"Rep {rep_id} is not the current owner of lead {lead_id} (status '{lead.status}')"
                f"{_why_no_longer(lead_id, rep_id)}."
            )
        if lead.status == LeadStatus.ACCEPTED:
            return lead
        now = timezone.now()
        assignment = _open_assignment(lead)
        if assignment is not None:
            assignment.accepted_at = now
            assignment.save(update_fields=["accepted_at"])
            _breach_count_if_late(assignment, now)
        lead.status, lead.accepted_at = LeadStatus.ACCEPTED, now
        lead.save(update_fields=["status", "accepted_at"])
        if assignment is not None:
            _miss_run_ends_if_in_time(assignment, now)
        due = assignment.due_at if assignment else None
        # The group's webhooks hear of it (the CRM shows the lead taken); no e-mail.
        notify.lead_notify(
            lead=lead, event="lead.accepted", reason="accepted", attempt=assignment.attempt if assignment else 0, at=now
        )
        audit_record_many(
            events=[
                Event(
                    AuditEvent.Type.LEAD_ACCEPTED,
                    actor,
                    lead.id,
                    lead.group.slug if lead.group else "",
                    rep_id,
                    {
                        "attempt": assignment.attempt if assignment else None,
                        "sla_due_at": _iso(due),
                        "seconds_before_due": round((due - now).total_seconds(), 3) if due else None,
                    },
                )
            ]
        )
        return lead

    return _in_transaction(body)


_ENDED_BECAUSE = {
    "sla_missed": "it escalated when the SLA was missed",
    "reassigned": "a manager reassigned it",
    "rerouted": "it was routed again",
}


def _why_no_longer(lead_id: int, rep_id: int) -> str:
    """How the rep's last hold on the lead ended, as the refusal of its accept says it: a rep
    told only "not the current owner" could not tell an escalation from a mistake."""
    ended = (
        Assignment.objects.filter(lead_id=lead_id, rep_id=rep_id, ended_at__isnull=False)
        .order_by("-ended_at")
        .values_list("ended_at", "end_reason")
        .first()
    )
    at, reason = ended if ended is not None else (None, "")
    if at is None:
        return ": the rep never held it"
    return f": {_ENDED_BECAUSE.get(reason, reason or 'its assignment ended')} at {at.isoformat()}"


def _rep_facts(rep: Rep, now: datetime) -> MemberFacts:
    """A rep's own availability (absence covering now, working hours) outside any group."""
    away = Absence.objects.filter(rep=rep, starts_at__lte=now, ends_at__gt=now).order_by("-ends_at").first()
    return MemberFacts(
        rep_id=rep.pk,
        rep_name=rep.name,
        rep_email=rep.email,
        position=0,
        weight=1,
        rep_active=rep.active,
        member_active=True,
        rep_timezone=rep.timezone,
        working_hours=rep.working_hours,
        absences=((away.starts_at, away.ends_at),) if away else (),
    )


def _still_queued(lead: Lead, only_queued: bool) -> None:
    """From the fallback queue page: the lead must still be queued under its lock, or another
    manager (or a drain) took it meanwhile and this action must not move it again."""
    if only_queued and lead.status != LeadStatus.QUEUED:
        raise LeadConflict(f"no longer in the queue (now {lead.status}: someone else acted on it first).")


def _rep_or_rejected(rep: Rep | None, rep_id: int) -> Rep:
    if rep is None:
        raise ActionRejected({"rep": [f"No rep with id {rep_id}."]})
    if not rep.active:
        raise ActionRejected({"rep": [f"Rep {rep_id} is inactive."]})
    return rep


def lead_reassign(*, lead_id: int, rep_id: int, reason: str, actor: str, only_queued: bool = False) -> Lead:
    """A manager gives the lead to a rep by hand. The pointer does not move; the assignment
    counts toward the rep's daily count; a cap may be exceeded, and the audit says so.
    `only_queued`: refuse (LeadConflict) a lead that is no longer in the fallback queue."""

    def body() -> Lead:
        # The rep as it is, to refuse a bad one before any lock; then, after the rotation row
        # and the lead's (the one lock order: a rep's deletion takes its groups' rotation rows
        # before the rep's, as routing takes a rotation row before the rep's foreign key), its
        # row: a deactivation or deletion committing meanwhile is waited for and seen.
        _rep_or_rejected(Rep.objects.filter(pk=rep_id).first(), rep_id)
        lead, state = _lock_lead_and_group(lead_id)
        rep = _rep_or_rejected(Rep.objects.select_for_update(no_key=True).filter(pk=rep_id).first(), rep_id)
        _still_queued(lead, only_queued)
        if lead.status == LeadStatus.CLOSED:
            raise LeadConflict(f"Lead {lead_id} is closed.")
        if lead.status in OPEN_STATUSES and lead.owner_id == rep_id:
            # Named: the admin shows this to a manager, who picked a name, not an id.
            raise LeadConflict(f"{rep.name} (rep {rep_id}) already owns lead #{lead_id}.")
        now = timezone.now()
        group = state.group if state is not None else None
        facts = _facts_of(routing.member_facts(group, now, with_counts=True), rep_id) if group else None
        caps: dict[str, Any] = {}
        over_cap = False
        # Not a member of the group: still away or off hours as a rep (no caps to read).
        eligible, why = eligibility(facts if facts is not None else _rep_facts(rep, now), now)
        if facts is not None:
            caps = {
                "open": facts.open,
                "max_open": facts.max_open,
                "assigned_today": facts.assigned_today,
                "max_per_day": facts.max_per_day,
            }
            over_open = facts.max_open is not None and facts.open >= facts.max_open
            over_day = facts.max_per_day is not None and facts.assigned_today >= facts.max_per_day
            over_cap = over_open or over_day
            caps["exceeded"] = [name for name, hit in (("max_open", over_open), ("max_per_day", over_day)) if hit]
        previous = _open_assignment(lead)
        from_rep = previous.rep_id if previous else None
        _end(previous, now, "reassigned")
        new = _assign(lead, rep_id=rep_id, group=group, reason=Assignment.Reason.MANUAL, now=now, over_cap=over_cap)
        lead.save(update_fields=LEAD_ROUTING_FIELDS)
        explanation = {
            "reason": reason,
            "from_rep": from_rep,
            "to_rep": rep_id,
            "attempt": new.attempt,
            # A lead that no group holds has no members to be one of (None: not asked).
            "member_of_group": facts is not None if group is not None else None,
            "eligible_now": eligible,
            "not_eligible_because": why or None,
            "over_cap": over_cap,
            "caps": caps,
            "pointer": state.pointer if state else None,
            "pointer_moved": False,
            "sla_due_at": _iso(new.due_at),
        }
        audit_record_many(
            events=[
                Event(
                    AuditEvent.Type.LEAD_REASSIGNED,
                    actor,
                    lead.id,
                    group.slug if group else "",
                    rep_id,
                    explanation,
                )
            ]
        )
        if from_rep is not None:
            because = f"lead {lead.id} reassigned by hand from rep {from_rep} ({actor})"
            scheduling.drain_schedule_on_commit(group_ids=[lead.group_id], because=because)
        return lead

    return _in_transaction(body)


def _lead_data(lead: Lead) -> dict[str, Any]:
    fields = ("email", "country", "region", "source", "product", "score", "company_size", "external_id")
    data: dict[str, Any] = {f: getattr(lead, f) for f in fields}
    data["attributes"] = lead.attributes or {}
    return data


def _without_this_lead(facts: list[MemberFacts], holding: Assignment, group: Group, now: datetime) -> list[MemberFacts]:
    """The members as a reroute must weigh them: the rep who holds the lead in this group has
    it among their open leads (and, given today, their assignments today), yet keeping it
    takes nothing more from their caps, so it is not counted against them."""
    today = holding.group_id == group.id and holding.started_at >= routing.day_start(now, group.timezone)
    return [
        replace(f, open=max(f.open - 1, 0), assigned_today=max(f.assigned_today - int(today), 0))
        if f.rep_id == holding.rep_id
        else f
        for f in facts
    ]


def lead_reroute(*, lead_id: int, actor: str, only_queued: bool = False, because: str = "") -> Lead:
    """Runs the rules and the rotation again (e.g. the territory changed): audited, and the
    only way a lead moves between groups. `because`: why, when no one asked (the event's
    `rerouted_because`)."""
    from .services import lead_resolve_group  # intake's resolution, evaluated before any lock

    current = Lead.objects.filter(pk=lead_id).first()
    if current is None:
        raise Lead.DoesNotExist(f"no lead {lead_id}")
    if current.status == LeadStatus.CLOSED:
        raise LeadConflict(f"Lead {lead_id} is closed.")
    requested = Group.objects.filter(slug=current.requested_group).first() if current.requested_group else None
    resolution = lead_resolve_group(data=_lead_data(current), requested=requested)

    def body() -> Lead:
        target = resolution.group
        # The lock: the target group's rotation row, then the lead.
        state = routing.lock_rotation(target.id) if target is not None else None
        lead = _lock_lead(lead_id)
        if lead is None:
            raise Lead.DoesNotExist(f"no lead {lead_id}")
        _still_queued(lead, only_queued)
        if lead.status == LeadStatus.CLOSED:
            raise LeadConflict(f"Lead {lead_id} is closed.")
        now = timezone.now()
        from_group = lead.group
        previous = _open_assignment(lead)
        explanation: dict[str, Any] = {
            **resolution.explanation(),
            "from_group": from_group.slug if from_group else None,
            "from_rep": previous.rep_id if previous else None,
            "from_status": lead.status,
        }
        if because:
            explanation["rerouted_because"] = because
        group = state.group if state is not None else None
        lead.group = group
        if group is not None:  # inactive or not: the trail names the group the lead is now in
            explanation.update({"group": group.slug, "strategy": group.strategy})
        new_rep: int | None = None
        kept: Assignment | None = None
        new: Assignment | None = None
        if group is None:
            _end(previous, now, "rerouted")
            _queue(lead, "no rule matched and there is no default group")
        elif not group.active:
            _end(previous, now, "rerouted")
            _queue(lead, f"group '{group.slug}' is inactive")
        else:
            assert state is not None
            # As at intake: the account owner when eligible (rotation untouched), else the rotation.
            holds = previous is not None and from_group == group and lead.status in OPEN_STATUSES
            facts = routing.member_facts(group, now)
            if holds and previous is not None:
                facts = _without_this_lead(facts, previous, group, now)
            facts, decision = ownership.group_decide(
                owner=resolution.owner, group=group, state=state, now=now, facts=facts
            )
            explanation.update(decision.explanation())
            if (
                previous is not None
                and from_group == group
                and lead.status in OPEN_STATUSES
                and decision.rep_id == previous.rep_id
            ):
                # Where it already is: the assignment stands (an accepted lead stays accepted, its
                # due time as it was, so its SLA cannot escalate it away from the rep who took it)
                # and the rotation stays where it was, as nothing was given out.
                kept = previous
                new_rep = decision.rep_id
                explanation.update(
                    {
                        "unchanged": True,
                        "reason": kept.reason,
                        "pointer_after": decision.pointer_before,
                        "attempt": kept.attempt,
                        "sla_due_at": _iso(kept.due_at),
                    }
                )
                if "current_weights_before" in explanation:
                    explanation["current_weights_after"] = explanation["current_weights_before"]
            elif decision.rep_id is None:
                _end(previous, now, "rerouted")
                _queue(lead, routing.queue_reason(group, decision))
            else:
                reason = decision.reason if decision.reason == ownership.OWNER_MATCH else Assignment.Reason.REROUTE
                _end(previous, now, "rerouted")
                new = _assign(lead, rep_id=decision.rep_id, group=group, reason=reason, now=now)
                routing.advance(state, decision)
                new_rep = decision.rep_id
                # As intake's: the account owner's (the rotation did not move) or the rotation's.
                explanation.update({"reason": reason, "attempt": new.attempt, "sla_due_at": _iso(new.due_at)})
        explanation.update({"to_rep": new_rep, "queue_reason": lead.queue_reason or None})
        lead.save(update_fields=LEAD_ROUTING_FIELDS)
        if previous is not None and from_group is not None and (new_rep is None or from_group != group):
            # Taken from its rep into the queue, or to a rep of another group (whose webhooks
            # hear of it as an assignment): the webhooks of the group it left hear of it too,
            # as after an escalation to the queue, or the CRM would go on showing the old owner.
            if new is None:
                notify.lead_notify_left(lead=lead, group=from_group, reason="queued", attempt=previous.attempt, at=now)
            else:
                notify.lead_notify_left(lead=lead, group=from_group, reason=new.reason, attempt=new.attempt, at=now)
        if previous is not None and new_rep is None:
            # Its rep is told, whichever group held it (none: given by hand while it had none).
            notify.lead_notify_moved_away(
                lead=lead, rep_id=previous.rep_id, why="it was routed again, to the fallback queue", at=now
            )
        audit_record_many(
            events=[
                Event(AuditEvent.Type.LEAD_REROUTED, actor, lead.id, group.slug if group else "", new_rep, explanation)
            ]
        )
        if previous is not None and kept is None and from_group is not None:
            freed = f"lead {lead.id} rerouted away from rep {previous.rep_id} ({actor})"
            scheduling.drain_schedule_on_commit(group_ids=[from_group.id], because=freed)
        return lead

    return _in_transaction(body)


def lead_close(*, lead_id: int, outcome: str, actor: str, only_queued: bool = False) -> Lead:
    """Closes the lead with an outcome; an open lead's rep gets the capacity back."""
    if outcome not in Lead.Outcome.values:
        raise ActionRejected({"outcome": [f"Must be one of: {', '.join(Lead.Outcome.values)}."]})

    def body() -> Lead:
        lead = _lock_lead(lead_id)
        if lead is None:
            raise Lead.DoesNotExist(f"no lead {lead_id}")
        _still_queued(lead, only_queued)
        if lead.status == LeadStatus.CLOSED:
            raise LeadConflict(f"Lead {lead_id} is already closed ({lead.outcome}).")
        now = timezone.now()
        was = lead.status
        previous = _open_assignment(lead)
        _end(previous, now, "closed")
        if previous is not None and previous.accepted_at is None:
            _miss_run_ends_if_in_time(previous, now)
        lead.status, lead.outcome, lead.closed_at, lead.queue_reason = LeadStatus.CLOSED, outcome, now, ""
        lead.save(update_fields=LEAD_ROUTING_FIELDS)
        # The group's webhooks hear of it, the outcome as the reason; no e-mail.
        notify.lead_notify(
            lead=lead, event="lead.closed", reason=outcome, attempt=previous.attempt if previous else 0, at=now
        )
        audit_record_many(
            events=[
                Event(
                    AuditEvent.Type.LEAD_CLOSED,
                    actor,
                    lead.id,
                    lead.group.slug if lead.group else "",
                    lead.owner_id,
                    {"outcome": outcome, "from_status": was, "attempt": previous.attempt if previous else None},
                )
            ]
        )
        if was in OPEN_STATUSES:
            because = f"lead {lead.id} of rep {lead.owner_id} closed ({outcome}, {actor})"
            scheduling.drain_schedule_on_commit(group_ids=[lead.group_id], because=because)
        return lead

    return _in_transaction(body)


def open_duplicate(lead: Lead, email_normalized: str) -> Lead | None:
    """Another open lead with this address, within `lead`'s group's dedup window: what intake
    would answer `duplicate_of` with. None for a closed `lead` (dedup is about open leads)."""
    if lead.status not in DEDUP_STATUSES:
        return None
    window = lead.group.dedup_days if lead.group is not None else 30
    if not window:
        return None  # the group keeps no window: each lead is one of its own
    since = timezone.now() - timedelta(days=window)
    return (
        Lead.objects.filter(email_normalized=email_normalized, status__in=DEDUP_STATUSES, created_at__gte=since)
        .exclude(pk=lead.pk)
        .order_by("-id")
        .first()
    )


def lead_update(*, lead_id: int, changes: Mapping[str, Any], actor: str) -> Lead:
    """Edits contact fields and routing facts (EDITABLE_FIELDS). Never moves the lead (a
    reroute does that, explicitly). A new email address that another open lead has is refused
    (LeadConflict): one open lead per address, as intake keeps it."""
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        raise ActionRejected({name: ["This field cannot be edited here."] for name in unknown})

    def body() -> Lead:
        from .services import normalize_email

        email_normalized = normalize_email(changes["email"]) if "email" in changes else None
        old_email = None
        if email_normalized is not None:
            # Both addresses' intake locks, before any row lock as intake takes them: an intake
            # of the new address and this edit cannot both pass dedup, and an intake of the old
            # one cannot answer `duplicate_of` this lead just as it stops having that address.
            old_email = Lead.objects.filter(pk=lead_id).values_list("email_normalized", flat=True).first()
            routing.lock_emails([email_normalized] if old_email is None else [email_normalized, old_email])
        lead = _lock_lead(lead_id)
        if lead is None:
            raise Lead.DoesNotExist(f"no lead {lead_id}")
        if email_normalized is not None and lead.email_normalized != old_email:
            raise _LeadMoved()  # its address changed since it was read: start over with the right locks
        changed = [name for name, value in changes.items() if getattr(lead, name) != value]
        if not changed:
            return lead
        if email_normalized is not None and email_normalized != lead.email_normalized:
            other = open_duplicate(lead, email_normalized)
            if other is not None:
                raise LeadConflict(
                    f"Lead {other.id} is open with this email address: close or merge one of the two leads first."
                )
        # Contact values and attributes stay in the lead row, not in the trail: field names
        # only. The routing facts (a country, a score) are no contact data: before and after,
        # so that the trail explains why a later reroute decided differently.
        explanation: dict[str, Any] = {"fields": sorted(changed), "moved": False}
        facts = {name: [getattr(lead, name), changes[name]] for name in sorted(changed) if name in SCALAR_FACTS}
        if facts:
            explanation["facts"] = facts
        for name in changed:
            setattr(lead, name, changes[name])
        fields = list(changed)
        if "email" in changed:
            lead.email_normalized = normalize_email(lead.email)
            fields.append("email_normalized")
        lead.save(update_fields=fields)
        audit_record_many(
            events=[
                Event(
                    AuditEvent.Type.LEAD_CHANGED,
                    actor,
                    lead.id,
                    lead.group.slug if lead.group else "",
                    lead.owner_id,
                    explanation,
                )
            ]
        )
        return lead

    return _in_transaction(body)


# --- the fallback queue ----------------------------------------------------------------------


def queue_drain(*, group_id: int, actor: str = "system:queue", limit: int | None = None, because: str = "") -> int:
    """Routes the group's queued leads in arrival order, up to DRAIN_CHUNK per locked transaction,
    until no eligible rep is left, the queue is walked through, or `limit` leads are
    assigned. Leads that used up the group's `max_attempts` wait for a manager; a lead that
    no free rep may take (only reps who had it are free, or it waits for its account's
    owner) is stepped over, and counts for nothing: however many wait so, the leads behind
    them are reached. `because`: what freed capacity (or the sweep), in words, which each
    lead's audit event gives. Returns how many were assigned."""
    routed, _ended = _queue_walk(group_id, actor, limit or settings.QUEUE_DRAIN_BATCH, steps=None, because=because)
    return routed


def queue_drain_now(*, group_id: int, actor: str = "system:queue", because: str = "") -> bool:
    """The drain a change that freed capacity runs itself once committed, in its own request
    or task (scheduling.drain_publish): the manager who closes a lead, un-pauses a rep or
    raises a cap gets the answer with the queued leads already routed, and a lead posted after
    that answer cannot take the freed place before the leads that waited for it (one already
    waiting for the group's rotation lock when the change committed may: the drain runs after
    the commit, as SPEC 5 has it, and queues for the lock behind it). Bounded
    (`QUEUE_DRAIN_INLINE` leads routed, twice as many looked at), so that a change freeing a
    lot of capacity still answers promptly: True when the walk came to its end, False when
    the rest is left to the worker."""
    limit = settings.QUEUE_DRAIN_INLINE
    _routed, ended = _queue_walk(group_id, actor, limit, steps=2 * limit, because=because)
    return ended


def _queue_walk(group_id: int, actor: str, limit: int, *, steps: int | None, because: str) -> tuple[int, bool]:
    """Routes queued leads until `limit` are assigned or `steps` looked at; returns how many
    were assigned and whether the walk ended (nobody free, or no lead left to try). The
    default group's walk first routes again the queued leads no group holds."""
    orphans_done = _orphans_route(group_id, actor, limit, because)
    if not Lead.objects.filter(status=LeadStatus.QUEUED, group_id=group_id).exists():
        return 0, orphans_done  # no rotation lock taken for an empty queue (or a group deleted since)
    cursor = [0]  # the id of the last lead looked at: the walk goes on past it
    routed, looked, ended = 0, 0, False
    while not ended and routed < limit and (steps is None or looked < steps):
        start = cursor[0]
        chunk = min(DRAIN_CHUNK, limit - routed, DRAIN_CHUNK if steps is None else steps - looked)

        def drain_chunk(start: int = start, chunk: int = chunk) -> list[str]:
            # Up to `chunk` leads under one wait for the rotation lock: under a stream of
            # intake, a lock taken per lead waited its turn behind the stream each time. A
            # retried chunk walks again from where it began (its leads were rolled back).
            cursor[0] = start
            state = routing.lock_rotation(group_id)
            outcomes: list[str] = []
            while len(outcomes) < chunk:
                outcomes.append(_drain_one(state, cursor, actor, because))
                if outcomes[-1] not in ("assigned", "skipped"):
                    break
            return outcomes

        for outcome in _in_transaction(drain_chunk):
            looked += 1
            if outcome == "assigned":
                routed += 1
            elif outcome != "skipped":
                ended = True
    if routed:
        logger.info("queue drained: %s leads assigned in group %s", routed, group_id)
    return routed, ended and orphans_done


def _orphans_route(group_id: int, actor: str, limit: int, because: str) -> bool:
    """A lead queued because no rule matched and there was no default group waits in no
    group's queue, so no drain would ever reach it. Once there is a default (this group, active),
    its drains route those leads again, oldest first, as `reroute` does: the rules as they are
    now, else the default group (audited as `lead.rerouted`, with `rerouted_because`). At most
    `limit` per call; True when none is left."""
    if not Group.objects.filter(pk=group_id, is_default=True, active=True).exists():
        return True
    waiting = list(
        Lead.objects.filter(status=LeadStatus.QUEUED, group__isnull=True)
        .order_by("id")
        .values_list("id", flat=True)[: limit + 1]
    )
    why = f"a default group now exists; {because}" if because else "a default group now exists"
    for lead_id in waiting[:limit]:
        try:
            lead_reroute(lead_id=lead_id, actor=actor, only_queued=True, because=why)
        except (Lead.DoesNotExist, LeadConflict):
            continue  # closed, deleted or taken by a manager meanwhile
    return len(waiting) <= limit


# Queued leads a drain routes per transaction, under one wait for the rotation lock (each
# costs the lock about a millisecond more).
DRAIN_CHUNK = 10


def _drain_one(state: RotationState, cursor: list[int], actor: str, because: str) -> str:
    """Routes the next queued lead past `cursor` under the rotation lock `state` holds."""
    group, group_id = state.group, state.group_id
    if not group.active:
        return "inactive"
    tried = Subquery(
        Assignment.objects.filter(lead=OuterRef("pk"), group_id=group_id)
        .values("lead")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    lead = (
        Lead.objects.select_for_update(of=("self",), skip_locked=True)
        .alias(tried=tried)
        .filter(status=LeadStatus.QUEUED, group_id=group_id)
        .filter(Q(tried__isnull=True) | Q(tried__lt=group.max_attempts))
        .filter(pk__gt=cursor[0])
        .order_by("id")
        .first()
    )
    if lead is None:
        return "empty"
    cursor[0] = lead.id
    now = timezone.now()
    held = list(Assignment.objects.filter(lead=lead).values_list("rep_id", "ended_at"))
    had = {rep_id for rep_id, _ended in held}
    facts, decision = ownership.group_decide(
        owner=ownership.account_owner_lookup(email=lead.email), group=group, state=state, now=now, exclude=had
    )
    if decision.rep_id is None:
        if had and not decision.queue_reason:
            _requeue_reason(lead, group)
        if had or decision.queue_reason:
            # Only reps who already had this lead are free, or it waits for its account's
            # owner: later leads may still go.
            return "skipped"
        # The leads waiting for a rep of this group say what holds them now, for the manager
        # working the queue: those queued while it had no members or was inactive (a member
        # joined paused or away, the group is active again), and those whose count of what
        # keeps members out was read before (queued overnight "outside working hours", the
        # caps filled since). Such a reason speaks of the group, not of the lead.
        now_reason = routing.queue_reason(group, decision)
        slug = group.slug
        stale = Q(
            queue_reason__in=[
                f"group '{slug}' has no members",
                f"group '{slug}' is inactive",
                f"no eligible rep in group '{slug}'",
            ]
        ) | Q(queue_reason__startswith=f"no eligible rep in group '{slug}' (")
        Lead.objects.filter(status=LeadStatus.QUEUED, group_id=group_id).filter(stale).exclude(
            queue_reason=now_reason
        ).update(queue_reason=now_reason)
        return "no_rep"
    queued_reason = lead.queue_reason
    new = _assign(lead, rep_id=decision.rep_id, group=group, reason=decision.reason, now=now)
    routing.advance(state, decision)
    lead.save(update_fields=LEAD_ROUTING_FIELDS)
    explanation = {
        "trigger": "queue_drain",
        # What freed the capacity this lead now takes (a lead closed, a rep back...), or the
        # periodic sweep: the drain's own why, beside the lead's (`queued_because`).
        "drained_because": because or None,
        "group": group.slug,
        "strategy": group.strategy,
        "queued_because": queued_reason,
        # Since it was queued: when its last assignment ended (an escalation, a manager), else
        # when it came in. Its age read as queue time the time reps held it.
        "queued_for_s": round((now - max([lead.created_at, *(e for _r, e in held if e)])).total_seconds(), 3),
        **decision.explanation(),
        "excluded": sorted(had),
        "reason": decision.reason,
        "attempt": new.attempt,
        "sla_due_at": _iso(new.due_at),
    }
    audit_record_many(
        events=[Event(AuditEvent.Type.LEAD_ASSIGNED, actor, lead.id, group.slug, decision.rep_id, explanation)]
    )
    return "assigned"


def _none_left(group: Group, candidates: Iterable[Mapping[str, Any]]) -> str:
    """Why an escalation found nobody, as the queue says it: every member had the lead, or
    what keeps out those who did not (a cap, a pause, an absence), which is what a manager can
    act on. "No eligible rep who has not had this lead" alone read as "everyone tried it"."""
    candidates = list(candidates)
    if not candidates:  # every member removed while the lead was held
        return f"group '{group.slug}' has no members"
    others = [c["reason"] for c in candidates if c["reason"] != "already had this lead"]
    if not others:
        return f"every rep in '{group.slug}' has had this lead"
    return f"no eligible rep in '{group.slug}' who has not had this lead (the others: {reasons_counted(others)})"


def _requeue_reason(lead: Lead, group: Group) -> None:
    """A queued lead the drain looked at and stepped over (only reps who had it are free): a
    reason that no longer holds, its group's `max_attempts` reached (raised since) or its group
    inactive (active again), is replaced by the one that does, so that a manager working the
    queue reads why the lead still waits. Other reasons (a rule's, a manager's) are kept."""
    stale = "max_attempts (" in lead.queue_reason or lead.queue_reason.endswith(f"group '{group.slug}' is inactive")
    if not stale:
        return
    missed = "SLA missed; " if lead.queue_reason.startswith("SLA missed") else ""
    reason = f"{missed}no eligible rep in '{group.slug}' who has not had this lead"
    if reason != lead.queue_reason:
        lead.queue_reason = reason
        lead.save(update_fields=["queue_reason"])  # the row is locked (select_for_update above)


QUEUE_SWEEP_BECAUSE = "periodic sweep of the fallback queues (capacity freed by time alone, or a drain missed)"


def queue_drain_all(*, actor: str = "system:queue") -> int:
    """The periodic backstop: drains every group that has queued leads (e.g. an absence
    that simply ran out, which no write announces)."""
    group_ids = list(
        Lead.objects.filter(status=LeadStatus.QUEUED, group__isnull=False, group__active=True)
        .order_by("group_id")
        .values_list("group_id", flat=True)
        .distinct()
    )
    if Lead.objects.filter(status=LeadStatus.QUEUED, group__isnull=True).exists():
        # Leads no group holds go to the default group's drain (`_orphans_route`), if any.
        default = Group.objects.filter(is_default=True, active=True).values_list("id", flat=True).first()
        if default is not None and default not in group_ids:
            group_ids = sorted([*group_ids, default])
    routed = 0
    for group_id in group_ids:
        # One group that cannot be drained now (its rotation held past the lock timeout, or a
        # failure) must not hold back the others' queues: the next sweep looks at it again.
        try:
            routed += queue_drain(group_id=group_id, actor=actor, because=QUEUE_SWEEP_BECAUSE)
        except routing.RoutingBusy:
            logger.warning("queue drain of group %s left to the next sweep: its rotation is busy", group_id)
        except Exception:
            logger.exception("queue drain of group %s failed", group_id)
    return routed
