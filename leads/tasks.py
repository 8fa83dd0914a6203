"""Celery tasks: thin. They take ids, call one service in `leads/actions.py`, and are safe to
run twice (the service locks the rotation row, then the lead, and does only the work still
missing). Late acknowledgement: a worker killed mid-task leaves the message to be delivered
again, and the beat sweep escalates whatever is overdue in any case.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task
from celery.app.task import Task
from django.conf import settings
from django.db import OperationalError

from . import actions, scheduling
from .routing import RoutingBusy

logger = logging.getLogger(__name__)

RETRY = {"autoretry_for": (OperationalError,), "retry_backoff": 1, "retry_backoff_max": 30, "max_retries": 5}


@shared_task(bind=True, acks_late=True, ignore_result=True, **RETRY)
def escalate_assignment(self: Task, assignment_id: int) -> str:
    """The SLA timer of one assignment."""
    try:
        result = actions.lead_escalate(assignment_id=assignment_id, actor="system:sla")
    except RoutingBusy as exc:
        raise self.retry(countdown=1, exc=exc) from exc
    if result.outcome == "not_due" and result.due_at is not None:
        # Woken early (clock skew between hosts): wait for the stored due time.
        scheduling.timer_publish(assignment_id=assignment_id, due_at=result.due_at)
    return result.outcome


@shared_task(bind=True, acks_late=True, ignore_result=True, **RETRY)
def escalate_group_due(self: Task, group_id: int, until: str) -> dict[str, int]:
    """The SLA timer of a group's slice: escalates the group's assignments due by `until`."""
    try:
        tally = actions.escalate_group_due(group_id=group_id, until=datetime.fromisoformat(until))
    except RoutingBusy as exc:
        raise self.retry(countdown=1, exc=exc) from exc
    if tally:
        logger.info("escalation timer of group %s: %s", group_id, tally)
    return tally


@shared_task(bind=True, acks_late=True, ignore_result=True, **RETRY)
def drain_group(self: Task, group_id: int, because: str = "") -> int:
    """Routes a group's queued leads now that capacity freed up (`because` says how)."""
    try:
        routed = actions.queue_drain(group_id=group_id, because=because)
    except RoutingBusy as exc:
        raise self.retry(countdown=1, exc=exc) from exc
    if routed >= settings.QUEUE_DRAIN_BATCH:
        scheduling.publish(scheduling.DRAIN_TASK, args=[group_id, because])  # more to do: continue in a new task
    return routed


@shared_task(ignore_result=True)
def escalation_sweep() -> dict[str, int]:
    """Beat, every few seconds: escalates the overdue assignments whose timer was lost."""
    tally = actions.escalation_sweep()
    if tally:
        logger.info("escalation sweep: %s", tally)
    return tally


@shared_task(ignore_result=True)
def escalate_due() -> dict[str, int]:
    """The SLA timer of a bulk import's batch (its assignments share one due time): escalates
    what is due then, as their own timers would."""
    tally = actions.escalation_sweep(actor="system:sla")
    if tally:
        logger.info("escalation timer of an import batch: %s", tally)
    return tally


@shared_task(ignore_result=True)
def escalation_arm() -> int:
    """Beat: publishes the timers of assignments now within the timer horizon."""
    return actions.escalation_arm()


@shared_task(ignore_result=True)
def queue_drain_sweep() -> int:
    """Beat: drains every group with queued leads (capacity freed by time alone, e.g. an
    absence that ran out, is announced by no write)."""
    return actions.queue_drain_all()


@shared_task(ignore_result=True)
def idempotency_purge() -> int:
    """Drops idempotency keys past their retention (hourly)."""
    from .services import idempotency_purge as purge

    return purge()
