"""Thin Celery tasks: ids in, a service call, retries with backoff. Safe to run twice."""

from typing import Any

from celery import shared_task
from django.conf import settings

from . import services


@shared_task(name="notifications.outbox_dispatch", acks_late=True)
def outbox_dispatch(message_id: int) -> int:
    return len(services.outbox_dispatch(message_id=message_id))


@shared_task(name="notifications.outbox_drain", acks_late=True)
def outbox_drain() -> int:
    """Fans out every undispatched message (after intake or a bulk import), in chunks."""
    services.drain_flag_clear()  # first: a message committed from now on publishes a new drain
    total = 0
    while n := services.outbox_dispatch_pending(older_than_s=0):
        total += n
    return total


@shared_task(name="notifications.delivery_send", bind=True, acks_late=True, max_retries=None)
def delivery_send(self: Any, delivery_id: int) -> None:
    # The attempt count lives on the Delivery row (NOTIFY_MAX_ATTEMPTS), not in Celery.
    retry_in = services.delivery_attempt(delivery_id=delivery_id)
    # A retry further off than the horizon gets no task: the outbox sweep sends it when due
    # (its `next_attempt_at`). A worker holds every countdown task in memory, and one past the
    # broker's visibility timeout is delivered again: thousands of deliveries waiting on a
    # receiver down for an hour stay rows in PostgreSQL, not tasks in the worker.
    if retry_in is not None and retry_in <= settings.NOTIFY_TIMER_HORIZON_S:
        raise self.retry(countdown=retry_in)


@shared_task(name="notifications.deliveries_publish", acks_late=True)
def deliveries_publish(delivery_ids: list[int]) -> int:
    """Publishes a send per delivery: many at once (an endpoint re-pointed, deliveries sent
    again from the admin), off the request that asked for them."""
    services.deliveries_publish(ids=delivery_ids)
    return len(delivery_ids)


@shared_task(name="notifications.outbox_sweep", acks_late=True)
def outbox_sweep() -> dict[str, int]:
    """The safety net: messages and retries whose task was lost (broker down, worker killed)."""
    grace = settings.NOTIFY_SWEEP_GRACE_S
    dispatched = services.outbox_dispatch_pending(older_than_s=grace)
    due = services.deliveries_due(older_than_s=grace)
    for delivery_id in due:
        delivery_send.delay(delivery_id)
    return {"dispatched": dispatched, "retried": len(due)}


# A purge runs in the routing worker, beside SLA timers: a long one (the first past retention
# after a large import) goes in turns of this long, queued again behind what came meanwhile.
PURGE_TURN_S = 10.0


@shared_task(name="notifications.purge")
def purge() -> int:
    """Beat, hourly: drops announced messages and their finished deliveries past retention."""
    deleted, finished = services.purge(budget_s=PURGE_TURN_S)
    if not finished:  # another turn, behind the tasks that came meanwhile
        purge.delay()
    return deleted
