"""The worker's consumer and beat's scheduler: Celery's, reconnecting at a steady pace.

Celery reconnects to a broker that went away with kombu's defaults: 2 s, then 4, 6, 8 ... up to
30 s between tries, and gives up after 100 (the process then exits). After a Redis outage of a
few seconds the worker came back up to 10 s after Redis did, and after a minute's outage up to
30 s: the escalations missed meanwhile waited for the worker, not for the one sweep period the
README and SPEC 5 promise. Beat, connecting for the first time while Redis is away (started
during an outage), waited the same way before it published a sweep. Here both try every
`BROKER_RECONNECT_EVERY_S` (1 s), without end (`CELERY_BROKER_CONNECTION_MAX_RETRIES = None`):
one log line a try while the broker is away, and work again within a second of its return.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import beat
from celery.worker.consumer import Consumer as CeleryConsumer
from django.conf import settings

logger = logging.getLogger("celery.beat")


def _steady() -> dict[str, float]:
    every = settings.BROKER_RECONNECT_EVERY_S
    return {"interval_start": every, "interval_step": 0, "interval_max": every}


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn: Any) -> Any:
        # Celery calls conn.ensure_connection(errback, max_retries, callback=...) with kombu's
        # default intervals: the same call with a steady one.
        conn.ensure_connection = functools.partial(conn.ensure_connection, **_steady())
        return super().ensure_connected(conn)


class PersistentScheduler(beat.PersistentScheduler):
    """Celery's default scheduler (the schedule in a shelve file), connecting as the worker does."""

    def _ensure_connected(self) -> Any:
        def retrying(exc: Exception, interval: float) -> None:
            logger.error("beat: Connection error: %s. Trying again in %s seconds...", exc, interval)

        return self.connection.ensure_connection(retrying, self.app.conf.broker_connection_max_retries, **_steady())
