"""Fixed-window rate limits in a store every process shares (Redis), failing open.

A limit is only useful if it holds across web processes and machines, so the counters live
in Redis (`REDIS_URL`). Without Redis (the embedded default, one machine) they live in a small
SQLite file of their own (`RATE_LIMIT_SQLITE_PATH`), which every web process of the machine
shares: `make run` starts one per core, and a limit counted in each process's memory let a
client through that many times over. When the store is unreachable the limit fails open, with
one warning at most every few seconds: intake must keep working.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
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


def _redis() -> Any:
    url = getattr(settings, "RATE_LIMIT_REDIS_URL", "") or settings.REDIS_URL
    if not url:
        return None
    if _state.client is None or _state.url != url:
        import redis

        _state.client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)
        _state.url = url
    return _state.client


class _FileState(threading.local):
    """One connection per thread (gunicorn's threads) to the embedded store."""

    conn: sqlite3.Connection | None = None
    path: str = ""


_file = _FileState()


def _shared_file() -> sqlite3.Connection:
    """The embedded store: one row per counted window, updated in a write transaction so that
    every process's hits add up. Separate from the application's database: counting a request
    must not wait for a routing transaction's write lock."""
    path = str(settings.RATE_LIMIT_SQLITE_PATH)
    if _file.conn is None or _file.path != path:
        conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")  # counters of the current minute: no fsync needed
        conn.execute("CREATE TABLE IF NOT EXISTS hits (key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires REAL)")
        _file.conn, _file.path = conn, path
    return _file.conn


def _file_hit(key: str, expires: float) -> int:
    conn = _shared_file()
    conn.execute("BEGIN IMMEDIATE")  # the write lock first: two processes never read the same count
    try:
        conn.execute(
            "INSERT INTO hits (key, count, expires) VALUES (?, 1, ?) ON CONFLICT (key) DO UPDATE SET count = count + 1",
            [key, expires],
        )
        count = int(conn.execute("SELECT count FROM hits WHERE key = ?", [key]).fetchone()[0])
        if count == 1:  # a new window: the windows that ended go
            conn.execute("DELETE FROM hits WHERE expires < ?", [time.time()])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return count


def _prefix() -> str:
    # The database name keeps deployments (and parallel test workers) sharing one Redis apart.
    return f"rl:{connection.settings_dict.get('NAME')}"


def _fail_open(limit: int, exc: Exception) -> Verdict:
    now = time.monotonic()
    _state.down_until = now + _BACKOFF_S
    if now - _state.last_warning > _BACKOFF_S:
        _state.last_warning = now
        logger.warning("rate limits not enforced: the shared store is unavailable (%s)", type(exc).__name__)
    return Verdict(True, 0, limit, 0)


def rate_limit_hit(*, key: str, limit: int, window_s: int = 60) -> Verdict:
    """Counts one hit on `key` in the current window and says whether it is within `limit`."""
    now = time.time()
    window = int(now // window_s)
    retry_after = max(1, math.ceil((window + 1) * window_s - now))
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    if client is not None:
        if time.monotonic() < _state.down_until:
            return Verdict(True, 0, limit, 0)
        try:
            count = int(client.incr(full_key))
            if count == 1:
                # Once per key: the window is in the key, so the expiry only tidies (a key left
                # without one by a crash in between counts for no later window).
                client.expire(full_key, window_s + 1)
        except Exception as exc:  # any Redis failure: fail open, intake keeps working
            return _fail_open(limit, exc)
    else:
        try:
            count = _file_hit(full_key, expires=(window + 1) * window_s + 1)
        except sqlite3.Error as exc:  # the file unusable (disk full, locked for over a second)
            return _fail_open(limit, exc)
    allowed = count <= limit
    return Verdict(allowed, count, limit, 0 if allowed else retry_after)


def rate_limit_count(*, key: str, window_s: int = 60) -> int:
    """The hits counted on `key` in the current window (0 when the store is unavailable)."""
    window = int(time.time() // window_s)
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    if client is not None and time.monotonic() < _state.down_until:
        return 0  # the same back-off as the hits: no per-request connect timeout while down
    try:
        if client is not None:
            value = client.get(full_key)
        else:
            row = _shared_file().execute("SELECT count FROM hits WHERE key = ?", [full_key]).fetchone()
            value = row[0] if row else 0
    except Exception as exc:  # any store failure: fail open, and back off as a hit would
        if client is not None:
            _fail_open(0, exc)
        return 0
    return int(value or 0)


def rate_limit_reset(*, key: str, window_s: int = 60) -> None:
    window = int(time.time() // window_s)
    full_key = f"{_prefix()}:{key}:{window}"
    client = _redis()
    try:
        if client is not None:
            client.delete(full_key)
        else:
            _shared_file().execute("DELETE FROM hits WHERE key = ?", [full_key])
    except Exception:  # noqa: S110 - nothing to reset when the store is down
        pass
