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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger(__name__)

ESCALATE_TASK = "leads.tasks.escalate_assignment"
ESCALATE_DUE_TASK = "leads.tasks.escalate_due"
DRAIN_TASK = "leads.tasks.drain_group"

_breaker = threading.Lock()
_down_until = 0.0


def publish(name: str, *, args: list[Any], **options: Any) -> bool:
    """Sends a task by name; False (logged, never raised) when the broker is unavailable."""
    global _down_until
    if time.monotonic() < _down_until:
        return False
    from routing_project.celery import app

    try:
        app.send_task(name, args=args, retry=False, **options)
        return True
    except Exception as exc:  # the broker is down or refused: the sweep will catch up
        with _breaker:
            _down_until = time.monotonic() + settings.BROKER_PUBLISH_BACKOFF_S
        logger.warning(
            "broker unavailable: %s not published (%s: %s); the sweep catches up", name, type(exc).__name__, exc
        )
        return False


def publish_reset() -> None:
    """Closes the circuit breaker (tests, or after the broker is known to be back)."""
    global _down_until
    _down_until = 0.0


def within_horizon(due_at: datetime, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return due_at - now <= timedelta(seconds=settings.ESCALATION_TIMER_HORIZON_S)


def timer_publish(*, assignment_id: int, due_at: datetime) -> bool:
    """Publishes the SLA timer of one assignment when it is due within the horizon."""
    if not within_horizon(due_at):
        return False  # `escalation_arm` publishes it when it comes within the horizon
    return publish(ESCALATE_TASK, args=[assignment_id], eta=due_at, expires=due_at + timedelta(hours=1))


def timer_schedule_on_commit(*, assignment_id: int, due_at: datetime | None) -> None:
    """The SLA timer of a new assignment, published once the transaction commits."""
    if due_at is None or not within_horizon(due_at):
        return  # none, or `escalation_arm` publishes it when it comes within the horizon
    transaction.on_commit(lambda: timer_publish(assignment_id=assignment_id, due_at=due_at))


def batch_timer_schedule_on_commit(*, due_times: Iterable[datetime | None]) -> None:
    """The SLA timers of a bulk import's batch, once it commits: one task per due time
    within the horizon (a batch's assignments share it), which escalates whatever is due
    then. Not one per assignment: a file of short-SLA leads would fill the worker with
    timers. Later due times are armed one by one by `escalation_arm`; this covers the ones
    due before its next window, which it would never publish."""
    dues = sorted({due for due in due_times if due is not None and within_horizon(due)})
    if dues:
        transaction.on_commit(lambda: _batch_timers_publish(dues))


def _batch_timers_publish(dues: list[datetime]) -> None:
    for due in dues:
        if not publish(ESCALATE_DUE_TASK, args=[], eta=due, expires=due + timedelta(hours=1)):
            return  # the broker is down: the sweep escalates them


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
