"""Publishing SLA timers and queue drains to Celery, after commit, without ever blocking.

The due time stored on the assignment is the truth; a published timer is only a wake-up call
that makes the escalation prompt. So publishing is best effort: when the broker is down,
intake and actions carry on (short timeouts, errors swallowed and logged) and the beat sweep
catches up with whatever was missed. After a failure, publishing is skipped for a few
seconds (a small circuit breaker) so that an outage costs each request nothing.

Two Celery-on-Redis traps shape the timers (see the settings' Escalation section):
- a countdown longer than the broker's visibility timeout is delivered again;
- a worker holds every ETA task it has received in memory.
So only timers due within `ESCALATION_TIMER_HORIZON_S` are published, at commit; the
assignments due later are published by the `escalation_arm` beat task when they come within
the horizon. A worker therefore holds at most the timers of the next few minutes, however
many assignments are pending, and every countdown stays well under the visibility timeout.

And the timers of one group are published by slice of `ESCALATION_TIMER_SLICE_S`: the
assignments of a group due within the same slice share one task, due at the slice's end,
which escalates the group's whole due backlog (`escalate_group_due`). Each process publishes
a slice once (it remembers the slices it published until they have passed), so a burst of
leads into one group costs the worker a handful of tasks, not one per lead.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from routing_project import broker_breaker

logger = logging.getLogger(__name__)

ESCALATE_TASK = "leads.tasks.escalate_assignment"
ESCALATE_DUE_TASK = "leads.tasks.escalate_due"
ESCALATE_GROUP_TASK = "leads.tasks.escalate_group_due"
DRAIN_TASK = "leads.tasks.drain_group"


# The slices this process has published a group's timer for: (group id, slice end, epoch s).
_slices_lock = threading.Lock()
_slices: set[tuple[int, float]] = set()
_SLICES_PRUNE_AT = 4096
# A slice ending sooner than this after the commit gets no shared timer: an assignment due
# that soon (a short SLA, a clock a little ahead) has its own, as a slice's task might
# already have run when it commits.
_SLICE_MIN_LEAD_S = 1.0


def publish(name: str, *, args: list[Any], **options: Any) -> bool:
    """Sends a task by name; False (logged, never raised) when the broker is unavailable."""
    if not broker_breaker.allowed():
        return False
    from routing_project.celery import app

    try:
        app.send_task(name, args=args, retry=False, **options)
        return True
    except Exception as exc:  # the broker is down or refused: the sweep will catch up
        broker_breaker.failed()
        logger.warning(
            "broker unavailable: %s not published (%s: %s); the sweep catches up", name, type(exc).__name__, exc
        )
        return False


def publish_reset() -> None:
    """Closes the circuit breaker and forgets the slices published (tests, or after the broker
    is known to be back, its queue possibly emptied)."""
    broker_breaker.reset()
    with _slices_lock:
        _slices.clear()


def within_horizon(due_at: datetime, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return due_at - now <= timedelta(seconds=settings.ESCALATION_TIMER_HORIZON_S)


def timer_publish(*, assignment_id: int, due_at: datetime, group_id: int | None = None) -> bool:
    """Publishes the SLA timer of one assignment when it is due within the horizon: its
    group's timer for the slice its due time falls in (`slice_publish`), or its own when it
    has no group, slices are off, or the slice ends too soon to share."""
    if not within_horizon(due_at):
        return False  # `escalation_arm` publishes it when it comes within the horizon
    if group_id is not None and slice_publish(group_id=group_id, due_at=due_at):
        return True
    return publish(ESCALATE_TASK, args=[assignment_id], eta=due_at, expires=due_at + timedelta(hours=1))


def slice_end(due_at: datetime) -> float | None:
    """The end of the timer slice `due_at` falls in (epoch seconds), or None when slices are
    off or it ends less than `_SLICE_MIN_LEAD_S` from now."""
    width = settings.ESCALATION_TIMER_SLICE_S
    if width <= 0:
        return None
    end = math.ceil(due_at.timestamp() / width) * width
    return end if end - time.time() >= _SLICE_MIN_LEAD_S else None


def slice_publish(*, group_id: int, due_at: datetime) -> bool:
    """The group's timer for the slice `due_at` falls in, published by this process once.
    True when it is published (now or before); False when the assignment needs a timer of
    its own (`slice_end` is None) or the broker is down."""
    end = slice_end(due_at)
    if end is None:
        return False
    key = (group_id, end)
    with _slices_lock:
        if key in _slices:
            return True
    eta = datetime.fromtimestamp(end, tz=UTC)
    if not publish(ESCALATE_GROUP_TASK, args=[group_id, eta.isoformat()], eta=eta, expires=eta + timedelta(hours=1)):
        return False
    with _slices_lock:
        if len(_slices) >= _SLICES_PRUNE_AT:
            now = time.time()
            _slices.difference_update([k for k in _slices if k[1] < now])
        _slices.add(key)
    return True


def timer_schedule_on_commit(*, assignment_id: int, due_at: datetime | None, group_id: int | None = None) -> None:
    """The SLA timer of a new assignment, published once the transaction commits."""
    if due_at is None or not within_horizon(due_at):
        return  # none, or `escalation_arm` publishes it when it comes within the horizon
    transaction.on_commit(lambda: timer_publish(assignment_id=assignment_id, due_at=due_at, group_id=group_id))


def batch_timer_schedule_on_commit(*, timers: Iterable[tuple[int | None, datetime | None]]) -> None:
    """The SLA timers of a batch (a bulk import's, an escalation backlog's): (group id, due
    time) of each assignment. Once it commits, one task per group and slice within the
    horizon, or, for those that cannot share a slice, one per due time, which escalates
    whatever is due then. Not one per assignment: a file of short-SLA leads would fill the
    worker with timers. Later due times are armed one by one by `escalation_arm`; this covers
    the ones due before its next window, which it would never publish."""
    pending = sorted({(g, due) for g, due in timers if due is not None and within_horizon(due)}, key=_by_due)
    if pending:
        transaction.on_commit(lambda: _batch_timers_publish(pending))


def _by_due(timer: tuple[int | None, datetime]) -> tuple[datetime, int]:
    return timer[1], timer[0] or 0


def _batch_timers_publish(timers: list[tuple[int | None, datetime]]) -> None:
    dues: set[datetime] = set()
    for group_id, due in timers:
        if group_id is not None and slice_publish(group_id=group_id, due_at=due):
            continue
        if due in dues:
            continue
        if not publish(ESCALATE_DUE_TASK, args=[], eta=due, expires=due + timedelta(hours=1)):
            return  # the broker is down: the sweep escalates them
        dues.add(due)


def drain_schedule_on_commit(*, group_ids: Iterable[int | None], because: str) -> None:
    """Drains these groups' fallback queues once the transaction commits. `because`: the
    change that freed capacity, in words, for the audit events of the leads it routes."""
    ids = sorted({g for g in group_ids if g is not None})
    if ids:
        transaction.on_commit(lambda: drain_publish(ids, because))


def drain_publish(group_ids: list[int], because: str) -> None:
    """After the commit of a change that freed capacity: each group's queue is drained here
    and now, up to a bound (actions.queue_drain_now); what is left, or a drain that failed
    (its rotation busy, the database away), goes to the worker, and the sweep backs both."""
    from . import actions
    from .routing import RoutingBusy

    for group_id in group_ids:
        try:
            ended = actions.queue_drain_now(group_id=group_id, because=because)
        except RoutingBusy:
            ended = False
        except Exception:  # the change is committed: its answer must not fail for the drain
            logger.warning("queue drain of group %s left to the worker", group_id, exc_info=True)
            ended = False
        if not ended:
            publish(DRAIN_TASK, args=[group_id, because])


def drain_publish_at(group_ids: list[int], at: datetime, because: str) -> None:
    """Drains these groups when an absence ends at `at` (ABSENCE_END_DRAIN_DELAY_S after), if
    that is within the timer horizon; `escalation_arm` publishes later ones when they come
    within it."""
    if not within_horizon(at):  # far off (an open-ended leave may end in the year 9999): armed later
        return
    eta = at + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)
    if eta <= timezone.now() or not within_horizon(eta):
        return
    for group_id in group_ids:
        publish(DRAIN_TASK, args=[group_id, because], eta=eta, expires=eta + timedelta(hours=1))
