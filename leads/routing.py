"""The routing transaction: lock a group's rotation row, read eligibility, pick, advance.

Everything here runs inside a transaction the caller opened (intake, reroute, escalation,
queue drain). Lock order, everywhere: the email's advisory lock (intake only), then the
group's rotation row, then lead rows by id. One order means no deadlocks between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ValidationError
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import Count, OuterRef, Subquery

from rotation import strategies
from rotation.eligibility import MemberFacts, eligibility, reasons_counted
from rotation.models import Absence, Group, Membership, RotationState
from routing_project import metrics

from . import routing_sql
from .models import OPEN_STATUSES, Assignment, Lead

logger = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"  # statement_timeout: intake bounds its whole wait for a row so (routing_sql)
RETRYABLE = {"40P01", "40001"}  # deadlock detected, serialization failure


class RoutingBusy(Exception):
    """The rotation row stayed locked past the lock timeout."""


def sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def is_lock_timeout(exc: BaseException) -> bool:
    if not isinstance(exc, OperationalError):
        return False
    if connection.vendor == "sqlite":
        return "locked" in str(exc)
    return sqlstate(exc) in (LOCK_NOT_AVAILABLE, QUERY_CANCELED)


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError) and sqlstate(exc) in RETRYABLE


def lock_email(email_normalized: str) -> None:
    """Serializes intake of one email address, so two concurrent posts cannot both miss dedup."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [email_normalized])


def lock_emails(emails: list[str]) -> None:
    """Several addresses' intake locks, in the order of their lock keys: the order every holder
    of several takes them in (a batch of intakes, a CSV import, an email edit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_advisory_xact_lock(k)) FROM "
                "(SELECT DISTINCT hashtextextended(e, 0) AS k FROM unnest(%s::text[]) AS e ORDER BY k) AS keys",
                [emails],
            )


def lock_rotation(group_id: int) -> RotationState:
    """Takes the group's rotation row lock and returns it with the group read *after* the lock.

    FOR NO KEY UPDATE (not FOR UPDATE): it still serializes routing in the group, but does
    not block inserts of leads and assignments that reference the group row. The group row
    is locked in the same statement so that, after a wait, PostgreSQL re-reads it too: a
    group deactivated or switched to another strategy while we waited is seen as it is now.
    """
    qs = RotationState.objects.select_for_update(no_key=True, of=("self", "group")).select_related("group")
    started = time.perf_counter()
    with _wait_counted_if_it_times_out(started):
        state = _lock_rotation(qs, group_id)
    acquired = time.perf_counter()
    metrics.rotation_lock_waited(acquired - started)
    # How long the row stays locked (until COMMIT): a hot group's capacity is 1 / this.
    transaction.on_commit(lambda: metrics.rotation_lock_held(time.perf_counter() - acquired))
    return state


@contextmanager
def _wait_counted_if_it_times_out(started: float) -> Iterator[None]:
    """A wait that ends in a lock timeout (a 503) is a wait too: left out, the lock wait
    histogram would look best exactly when a group is overloaded."""
    try:
        yield
    except Exception as exc:
        if is_lock_timeout(exc):
            metrics.rotation_lock_waited(time.perf_counter() - started)
        raise


def _lock_rotation(qs: Any, group_id: int) -> RotationState:
    if connection.vendor == "postgresql":  # the same statement without the ORM's compile cost
        fetched = routing_sql.rotation_lock_fetch(group_id)
        if fetched is None:
            _rotation_row_made(group_id)
            fetched = routing_sql.rotation_lock_fetch(group_id)
        if fetched is None:
            raise RotationState.DoesNotExist(f"no rotation state for group {group_id}")
        state = fetched
    else:
        try:
            state = qs.get(group_id=group_id)
        except RotationState.DoesNotExist:
            _rotation_row_made(group_id)
            state = qs.get(group_id=group_id)
    return state


def _rotation_row_made(group_id: int) -> None:
    """A group's missing rotation row, made. A group deleted since the request named it (its
    rotation row went with it, under the lock this request waited on) is the client's `group`
    gone: a 400 naming the field, as for a slug naming no group, and nothing written."""
    if not Group.objects.filter(pk=group_id).exists():
        raise ValidationError({"group": ["The group was deleted while this lead was being taken in."]})
    RotationState.objects.get_or_create(group_id=group_id)


def lock_rotations_read(
    group_ids: list[int], now: datetime
) -> tuple[dict[int, RotationState], dict[int, list[Any]] | None]:
    """`lock_rotation` for several groups (a batch of intakes), in group id order, and on
    PostgreSQL each group's members (`member_facts`'s `rows`) read after the locks, all in
    one round trip; None elsewhere (member_facts reads them)."""
    ids = sorted(set(group_ids))
    if connection.vendor != "postgresql" or not ids:
        return {group_id: lock_rotation(group_id) for group_id in ids}, None
    started = time.perf_counter()
    with _wait_counted_if_it_times_out(started):
        states, rows = routing_sql.rotation_lock_fetch_with_members(ids, now)
    missing = [group_id for group_id in ids if group_id not in states]
    for group_id in missing:  # no rotation row yet: made, then locked like the rest
        states[group_id] = lock_rotation(group_id)
    if missing:
        rows.update(routing_sql.member_rows_many(missing, now))
    acquired = time.perf_counter()
    metrics.rotation_lock_waited(acquired - started)
    transaction.on_commit(lambda: metrics.rotation_lock_held(time.perf_counter() - acquired))
    return states, rows


def rotations_busy(group_ids: Iterable[int]) -> set[int]:
    """The groups among `group_ids` whose rotation (or group) row another transaction holds
    right now, found without waiting (SKIP LOCKED) in a transaction of its own."""
    ids = sorted(set(group_ids))
    if not ids or connection.vendor != "postgresql":
        return set(ids)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.group_id FROM rotation_rotationstate r JOIN rotation_group g ON g.id = r.group_id "
            "WHERE r.group_id = ANY(%s) FOR NO KEY UPDATE OF r, g SKIP LOCKED",
            [ids],
        )
        free = {row[0] for row in cursor.fetchall()}
    return set(ids) - free


def day_start(now: datetime, tz: str) -> datetime:
    local = now.astimezone(ZoneInfo(tz))
    # fold=0: in the second pass of an hour repeated after midnight (clocks going back from
    # 01:00 to 00:00), `local` carries fold=1, which would start the day an hour late.
    return local.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)


def week_start(now: datetime, tz: str) -> datetime:
    start = day_start(now, tz)
    return start - timedelta(days=start.weekday())


def member_facts(
    group: Group, now: datetime, *, with_counts: bool | None = None, rows: list[Any] | None = None
) -> list[MemberFacts]:
    """Reads every member's state now. Called after the rotation lock by routing. `rows`: the
    group's routing_sql.member_rows, when the caller read several groups' at once."""
    # One statement for members, reps and the time away covering now: this runs under the
    # rotation lock, so every round trip saved shortens the lock.
    memberships: list[Any]
    if rows is not None:
        memberships = rows
    elif connection.vendor == "postgresql":  # the same statement without the ORM's compile cost
        memberships = routing_sql.member_rows(group.id, now)
    else:
        away = Absence.objects.filter(rep_id=OuterRef("rep_id"), starts_at__lte=now, ends_at__gt=now).order_by(
            "-ends_at"
        )
        memberships = list(
            Membership.objects.filter(group=group)
            .select_related("rep")
            .annotate(away_from=Subquery(away.values("starts_at")[:1]), away_until=Subquery(away.values("ends_at")[:1]))
            .order_by("position", "rep_id")
        )
    if not memberships:
        return []
    rep_ids = [m.rep_id for m in memberships]
    absences: dict[int, list[tuple[datetime, datetime]]] = {}
    for row in memberships:
        member: Any = row  # a Membership annotated with away_*, or a routing_sql.MemberRow
        if member.away_until is not None:
            absences[member.rep_id] = [(member.away_from, member.away_until)]
    if absences and connection.vendor != "postgresql":
        absences = _through_follow_ons(absences, now)  # PostgreSQL's statement does it itself
    need_open = with_counts or group.strategy == "least_loaded" or any(m.max_open is not None for m in memberships)
    need_today = with_counts or any(m.max_per_day is not None for m in memberships)
    open_counts: dict[int, int] = {}
    today_counts: dict[int, int] = {}
    if need_open:
        open_counts = dict(
            Lead.objects.filter(group=group, status__in=OPEN_STATUSES, owner_id__in=rep_ids)
            .values_list("owner_id")
            .annotate(n=Count("id"))
            .values_list("owner_id", "n")
        )
    if need_today:
        today_counts = dict(
            Assignment.objects.filter(group=group, started_at__gte=day_start(now, group.timezone))
            .values_list("rep_id")
            .annotate(n=Count("id"))
            .values_list("rep_id", "n")
        )
    return [
        MemberFacts(
            rep_id=m.rep_id,
            rep_name=m.rep.name,
            rep_email=m.rep.email,
            position=m.position,
            weight=m.weight,
            rep_active=m.rep.active,
            member_active=m.active,
            rep_timezone=m.rep.timezone,
            working_hours=m.rep.working_hours,
            absences=tuple(absences.get(m.rep_id, ())),
            max_open=m.max_open,
            max_per_day=m.max_per_day,
            open=open_counts.get(m.rep_id, 0),
            assigned_today=today_counts.get(m.rep_id, 0),
            paused_reason=m.paused_reason,
        )
        for m in memberships
    ]


def _through_follow_ons(
    absences: dict[int, list[tuple[datetime, datetime]]], now: datetime
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Each rep's time away covering now carried on through the absences that follow on
    without a gap (a day off, then a week's holiday), so that "out of office until" says when
    the rep is back, as routing_sql's statement reads it on PostgreSQL."""
    ahead: dict[int, list[tuple[datetime, datetime]]] = {}
    for rep_id, starts, ends in Absence.objects.filter(rep_id__in=list(absences), ends_at__gt=now).values_list(
        "rep_id", "starts_at", "ends_at"
    ):
        ahead.setdefault(rep_id, []).append((starts, ends))
    out = {}
    for rep_id, [(first, back)] in absences.items():
        first = min([first, *(s for s, e in ahead.get(rep_id, []) if s <= now < e)])
        for starts, ends in sorted(ahead.get(rep_id, [])):
            if starts <= back:
                back = max(back, ends)
        out[rep_id] = [(first, back)]
    return out


@dataclass
class Decision:
    rep_id: int | None
    rep_name: str
    rep_email: str
    pointer_before: int
    pointer_after: int
    weights_before: dict[str, int]
    weights_after: dict[str, int]
    candidates: list[dict[str, Any]] = field(default_factory=list)
    reason: str = "rotation"  # or "owner_match" (leads/ownership.py): the rotation does not move
    queue_reason: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def explanation(self) -> dict[str, Any]:
        return {
            **self.notes,
            "candidates": self.candidates,
            "chosen": self.rep_id,
            "pointer_before": self.pointer_before,
            "pointer_after": self.pointer_after,
            **(
                {"current_weights_before": self.weights_before, "current_weights_after": self.weights_after}
                if self.weights_before or self.weights_after
                else {}
            ),
        }


def queue_reason(group: Group, decision: Decision) -> str:
    """Why a lead `decision` found no rep for waits in the queue: the decision's own reason
    (its account's owner), or what keeps each member out, counted ("no eligible rep in group
    'emea' (2 outside working hours, 1 out of office)"), which is what the manager working the
    queue can act on; "no eligible rep" alone said nothing of it."""
    if decision.queue_reason:
        return decision.queue_reason
    if not decision.candidates:
        return f"group '{group.slug}' has no members"
    return f"no eligible rep in group '{group.slug}' ({reasons_counted(c['reason'] for c in decision.candidates)})"


def decide(
    *,
    strategy: str,
    pointer: int,
    current_weights: dict[str, int],
    facts: Iterable[MemberFacts],
    now: datetime,
    exclude: Iterable[int] = (),
) -> Decision:
    """Pure: who gets the next lead, and why each other member did not."""
    excluded = set(exclude)
    candidates: list[strategies.Candidate] = []
    described: list[dict[str, Any]] = []
    by_id: dict[int, MemberFacts] = {}
    for f in facts:
        by_id[f.rep_id] = f
        if f.rep_id in excluded:
            # Said first: the rep the lead escalates from counts it among its open leads, so a
            # full cap would have been given as the reason, where this is.
            ok, reason = False, "already had this lead"
        else:
            ok, reason = eligibility(f, now)
        candidates.append(strategies.Candidate(f.rep_id, f.position, f.weight, ok, reason, f.open))
        described.append(
            {"rep": f.rep_id, "name": f.rep_name, "position": f.position, "eligible": ok, "reason": reason}
        )
        # The counts routing read (only those it needed): replay starts from them.
        if strategy == "least_loaded" or f.max_open is not None:
            described[-1]["open"] = f.open
        if f.max_per_day is not None:
            described[-1]["today"] = f.assigned_today
        if strategy == "weighted":  # a weighted turn is read against the weights
            described[-1]["weight"] = f.weight
    picked = strategies.pick(strategy, candidates, pointer, current_weights)
    chosen = by_id.get(picked.rep_id) if picked.rep_id is not None else None
    for d in described:
        if d["rep"] == picked.rep_id:
            d["reason"] = "chosen"
        elif d["eligible"] and strategy != "least_loaded":
            d["reason"] = "not next in rotation"
        elif d["eligible"]:
            # Which of the two: the load, or the order among members as lightly loaded.
            if chosen is not None and d.get("open", 0) > chosen.open:
                d["reason"] = f"more open leads ({d['open']} against {chosen.open})"
            else:
                d["reason"] = "as few open leads, later in the rotation order"
    return Decision(
        rep_id=picked.rep_id,
        rep_name=chosen.rep_name if chosen else "",
        rep_email=chosen.rep_email if chosen else "",
        pointer_before=pointer,
        pointer_after=picked.pointer,
        weights_before=dict(current_weights) if strategy == "weighted" else {},
        # With nobody chosen the rotation does not move (advance_apply writes nothing).
        weights_after=(picked.current_weights if picked.rep_id is not None else dict(current_weights))
        if strategy == "weighted"
        else {},
        candidates=described,
    )


def turns_ahead(
    *,
    strategy: str,
    pointer: int,
    current_weights: dict[str, int],
    facts: Iterable[MemberFacts],
    now: datetime,
    limit: int = 500,
) -> dict[int, int]:
    """Pure: in how many leads each member eligible now gets its next one (1: the next lead),
    if nothing changes meanwhile but the leads themselves (each stays open and counts today,
    so caps fill and least loaded moves on). Played out by the strategy `decide` uses, so it
    is the rotation's own answer, not a reading of its state. A member not reached within
    `limit` leads is left out."""
    members = {f.rep_id: f for f in facts}
    candidates = {
        rep_id: strategies.Candidate(rep_id, f.position, f.weight, eligibility(f, now)[0], "", f.open)
        for rep_id, f in members.items()
    }
    waiting = {rep_id for rep_id, c in candidates.items() if c.eligible}
    found: dict[int, int] = {}
    for lead in range(1, limit + 1):
        if not waiting:
            break
        picked = strategies.pick(strategy, list(candidates.values()), pointer, current_weights)
        if picked.rep_id is None:
            break
        if picked.rep_id in waiting:
            waiting.discard(picked.rep_id)
            found[picked.rep_id] = lead
        pointer = picked.pointer
        if strategy == "weighted":
            current_weights = picked.current_weights
        # Only the member given the lead changes: one more open, one more today (its caps).
        f = members[picked.rep_id]
        f = members[picked.rep_id] = replace(f, open=f.open + 1, assigned_today=f.assigned_today + 1)
        candidates[picked.rep_id] = replace(candidates[picked.rep_id], eligible=eligibility(f, now)[0], open=f.open)
    return found


def advance(state: RotationState, decision: Decision) -> None:
    """Writes the new rotation position (only when the rotation chose a rep)."""
    if advance_apply(state, decision):
        advance_write(state)  # on PostgreSQL the same UPDATE, without the ORM's compile cost


def advance_write(state: RotationState) -> None:
    """Writes the position `advance_apply` moved `state` to (once for several decisions)."""
    if connection.vendor == "postgresql":
        routing_sql.rotation_advance(state)
    else:
        state.save(update_fields=["pointer", "current_weights", "turns", "updated_at"])


def advance_apply(state: RotationState, decision: Decision) -> bool:
    """Moves `state` to the decision's position in memory; False when the rotation does not
    move (no rep, or the account owner took the lead). The caller writes it (see `advance`)."""
    if decision.rep_id is None or decision.reason != "rotation":
        return False
    state.pointer = decision.pointer_after
    state.current_weights = decision.weights_after
    state.turns += 1
    return True


def sla_due(group: Group, now: datetime) -> datetime | None:
    if group.sla_minutes is None:
        return None
    return now + timedelta(minutes=float(group.sla_minutes))
