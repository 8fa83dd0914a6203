"""Fixed-window rate limits in a store every process shares (Redis), failing open.

A limit is only useful if it holds across web processes and machines, so the counters live
in Redis (`REDIS_URL`). Without Redis (the embedded default, one machine) they live in Django's
cache, which is then diskcache's (`var/cache`, settings): its increments are atomic across
processes, so every web process `make run` starts counts against one budget (in each
process's memory, a client got through once per process). When the store is unreachable the
limit fails open, with one warning at most every few seconds: intake must keep working. The
limits against guessing (the admin's login throttle, bad web-form signatures) are asked with
`held_when_down`: they are then counted in the process's own memory meanwhile, a budget per
web process rather than none.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection

logger = logging.getLogger(__name__)

# After a Redis error, skip Redis for this long (no per-request connect timeouts while down).
_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    count: int
    limit: int
    retry_after: int  # seconds until the window resets (0 when allowed)


class _RedisState:
    client: Any = None
    url: str = ""
    down_until: float = 0.0
    last_warning: float = 0.0


_state = _RedisState()

# The counts of `held_when_down` limits while the store is unreachable: full key (its window's
# number in it) -> (hits, when the key is over, time.time()).
_local: dict[str, tuple[int, float]] = {}
_local_lock = threading.Lock()


def _local_hit(full_key: str, window_s: int, delta: int = 1) -> int:
    now = time.time()
    with _local_lock:
        if len(_local) > 10_000:
            for key in [k for k, (_, over) in _local.items() if over < now]:
                del _local[key]
            if len(_local) > 100_000:  # that many live keys: memory before counting
                _local.clear()
        count = max(0, _local.get(full_key, (0, 0.0))[0] + delta)
        _local[full_key] = (count, now + window_s + 1)
        return count


def _redis() -> Any:
    url = getattr(settings, "RATE_LIMIT_REDIS_URL", "") or settings.REDIS_URL
    if not url:
        return None
    if _state.client is None or _state.url != url:
        import redis

        _state.client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)
        _state.url = url
    return _state.client


def _prefix() -> str:
    # The database name keeps deployments (and parallel test workers) sharing one Redis apart.
    return f"rl:{connection.settings_dict.get('NAME')}"


def _fail_open(limit: int, exc: Exception) -> Verdict:
    now = time.monotonic()
    _state.down_until = now + _BACKOFF_S
    if now - _state.last_warning > _BACKOFF_S:
        _state.last_warning = now
        logger.warning(
            "rate limits not enforced: the shared store is unavailable (%s); the login throttle and the "
            "bad-signature limit count in each process meanwhile",
            type(exc).__name__,
        )
    return Verdict(True, 0, limit, 0)


def rate_limit_hit(*, key: str, limit: int, window_s: int = 60, held_when_down: bool = False) -> Verdict:
    """Counts one hit on `key` in the current window and says whether it is within `limit`.
    `held_when_down`: counted in this process's memory while the store is unreachable."""
    now = time.time()
    window = int(now // window_s)
    retry_after = max(1, math.ceil((window + 1) * window_s - now))
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    if client is not None:
        count: int | None = None
        if time.monotonic() >= _state.down_until:  # else backing off: no connect timeout per request
            try:
                count = int(client.incr(full_key))
                if count == 1:
                    # Once per key: the window is in the key, so the expiry only tidies (a key
                    # left without one by a crash in between counts for no later window).
                    client.expire(full_key, window_s + 1)
            except Exception as exc:  # any Redis failure: fail open, intake keeps working
                _fail_open(limit, exc)
        if count is None:  # the store is unreachable
            if not held_when_down:
                return Verdict(True, 0, limit, 0)
            count = _local_hit(full_key, window_s)
    else:
        cache.add(full_key, 0, timeout=window_s + 1)
        try:
            count = cache.incr(full_key)
        except ValueError:  # expired between add and incr
            cache.set(full_key, 1, timeout=window_s + 1)
            count = 1
    allowed = count <= limit
    return Verdict(allowed, count, limit, 0 if allowed else retry_after)


def rate_limit_count(*, key: str, window_s: int = 60, held_when_down: bool = False) -> int:
    """The hits counted on `key` in the current window (0 when the store is unavailable; with
    `held_when_down`, those this process counted meanwhile)."""
    window = int(time.time() // window_s)
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    down = _local.get(full_key, (0, 0.0))[0] if held_when_down else 0
    if client is not None and time.monotonic() < _state.down_until:
        return down  # the same back-off as the hits: no per-request connect timeout while down
    try:
        if client is not None:
            value = client.get(full_key)
        else:
            value = cache.get(full_key)
    except Exception as exc:  # any store failure: fail open, and back off as a hit would
        if client is not None:
            _fail_open(0, exc)
        return down
    return int(value or 0)


def rate_limit_undo(*, key: str, window_s: int = 60) -> None:
    """Takes back one hit counted on `key` in the current window (an attempt that turned out
    not to count: a login that succeeded). Nothing when the window has none or the store is down."""
    window = int(time.time() // window_s)
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    if full_key in _local:  # counted here while the store was down
        _local_hit(full_key, window_s, delta=-1)
    try:
        if client is not None:
            if time.monotonic() >= _state.down_until and int(client.get(full_key) or 0) > 0:
                client.decr(full_key)
        else:
            cache.decr(full_key)
    except Exception:  # noqa: S110 - a missing key (the window ended) or a store down: nothing to take back
        pass


def rate_limit_reset(*, key: str, window_s: int = 60) -> None:
    window = int(time.time() // window_s)
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    with _local_lock:
        _local.pop(full_key, None)
    try:
        if client is not None:
            client.delete(full_key)
        else:
            cache.delete(full_key)
    except Exception:  # noqa: S110 - nothing to reset when the store is down
        pass
