"""One circuit breaker per process for publishing to the broker (SLA timers, queue drains,
notification fan-out): publishing is best effort, and a broker outage must cost intake
nothing, the sweeps catching up from the database.

After a failed publish the breaker opens for `BROKER_PUBLISH_BACKOFF_S`. Once that has passed,
no request tries the broker again itself: a background thread pings it (1 s timeouts), and
publishing resumes when it answers. A Redis that hangs rather than refuses (a frozen process,
a partition) holds a publish for its socket timeout: so only the publishes under way when it
hung wait, once per outage, not one request every backoff period.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0

_lock = threading.Lock()
_retry_at = 0.0  # 0: closed, publishing goes ahead
_probing = False


def allowed() -> bool:
    """True when publishing may go ahead; False while the breaker is open (a probe of the
    broker is started here once its backoff has passed)."""
    global _probing
    if not _retry_at:
        return True
    if time.monotonic() < _retry_at:
        return False
    with _lock:
        if not _retry_at:
            return True
        if _probing or time.monotonic() < _retry_at:
            return False
        _probing = True
    threading.Thread(target=_probe, name="broker-probe", daemon=True).start()
    return False


def failed() -> None:
    """A publish failed: skip publishing for the backoff, then probe."""
    global _retry_at
    with _lock:
        _retry_at = time.monotonic() + settings.BROKER_PUBLISH_BACKOFF_S


def is_open() -> bool:
    return bool(_retry_at)


def reset() -> None:
    """Closes the breaker (tests, or once the broker is known to be back)."""
    global _retry_at
    with _lock:
        _retry_at = 0.0


def _probe() -> None:
    global _retry_at, _probing
    ok = False
    try:
        ok = broker_answers()
    finally:
        with _lock:
            _retry_at = 0.0 if ok else time.monotonic() + settings.BROKER_PUBLISH_BACKOFF_S
            _probing = False
    if ok:
        logger.info("broker answers again: publishing resumes")


def broker_answers() -> bool:
    """A PING to the Redis broker within PROBE_TIMEOUT_S (another broker: True, the next
    publish tells)."""
    from routing_project.celery import app

    url = str(app.conf.broker_write_url or app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://")):
        return True
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S)
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - refused, hung, or answering an error: still down
        return False
    finally:
        client.close()
