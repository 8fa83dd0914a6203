"""The configuration intake reads before any lock, kept in memory per process.

Every intake resolves its client's token, the rules, its group and the account owning the
email's domain before it takes a lock. Those are read far more often than they change, and
on a small machine reading them with the ORM costs several milliseconds of CPU per lead.
Each process keeps them in memory, under the configuration version (rotation.ConfigVersion):
PostgreSQL triggers give it a new number, never reused, with every statement that writes
groups, rules, accounts, reps' active flag or API clients. A request reads that number once
(one indexed single-row SELECT) and uses the snapshot of that version for all its look-ups;
a new number starts an empty snapshot. So a change is seen by the next request that starts
after its commit, as when reading the tables directly, and never half.

Intake over the API skips that read (`defer`): it starts on the process's latest snapshot,
and its routing transaction reads the version in its first statement, before it writes
anything. If the version moved, the transaction is rolled back (StaleConfiguration) and the
request is answered again from the start under the new configuration; an answer given
without reaching that transaction (a 4xx, a replay, a busy rotation) is checked against the
version before it leaves (`settle`). So a change is still seen by every request that starts
after its commit, and by those whose transaction starts after it, and a busy intake makes
one round trip fewer per lead.

Nothing read under a rotation lock comes from here: members, eligibility, caps, the group's
state and strategy are always read after the lock. On other databases (the embedded SQLite
default) there is no version, and every look-up reads the tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from contextvars import ContextVar
from typing import Any, TypeVar

from django.db import DatabaseError, connection

from .db import server_bound_cursor

T = TypeVar("T")

# Each kind of look-up keeps at most this many keys per version (account domains, tokens);
# past it the kind starts over, so a flood of unknown domains cannot grow a process.
MAX_KEYS = 50_000
_MISSING = object()

_VERSION_SQL = "SELECT version FROM rotation_configversion WHERE id = 1"


class Snapshot:
    """The look-ups made under one configuration version."""

    def __init__(self, version: int | None) -> None:
        self.version = version
        self._kinds: dict[str, dict[Hashable, Any]] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, key: Hashable, loader: Callable[[], T], *, keep_none: bool = True) -> T:
        if self.version is None:
            return loader()
        values = self._kinds.get(kind)
        # One look-up, not `in` then `[]`: another thread may empty the dict in between (MAX_KEYS).
        cached = values.get(key, _MISSING) if values is not None else _MISSING
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        value = loader()
        if value is None and not keep_none:
            return value
        with self._lock:
            values = self._kinds.setdefault(kind, {})
            if len(values) >= MAX_KEYS:
                values.clear()
            values[key] = value
        return value


_latest = Snapshot(None)
_bound: ContextVar[Snapshot | None] = ContextVar("config_snapshot", default=None)


def config_version() -> int | None:
    """The current configuration version, or None where there is none (not PostgreSQL, or the
    row is missing, e.g. right after a TRUNCATE): then nothing is cached."""
    if connection.vendor != "postgresql":
        return None
    with server_bound_cursor() as cursor:  # prepared after a few requests
        cursor.execute(_VERSION_SQL)
        row = cursor.fetchone()
    return int(row[0]) if row else None


def snapshot() -> Snapshot:
    """This request's snapshot (the version is read on the first look-up of the request);
    outside a request (tasks, commands, tests calling services), the current one, read now."""
    bound = _bound.get()
    if bound is not None:
        return bound
    snap = _current()
    if _scoped.get():
        _bound.set(snap)
    return snap


def _current() -> Snapshot:
    global _latest
    version = config_version()
    if version is None:
        return Snapshot(None)
    latest = _latest
    if latest.version == version:
        return latest
    fresh = Snapshot(version)
    _latest = fresh
    return fresh


_scoped: ContextVar[bool] = ContextVar("config_scoped", default=False)
# True while this request's look-ups use a snapshot bound by `defer` that no read of the
# version has confirmed yet.
_unconfirmed: ContextVar[bool] = ContextVar("config_unconfirmed", default=False)


class request_scope:
    """Within it, every look-up uses the snapshot of the version read at the first one (the
    request middleware opens one per request)."""

    def __enter__(self) -> None:
        self._tokens = (_scoped.set(True), _bound.set(None), _unconfirmed.set(False))

    def __exit__(self, *exc: object) -> None:
        scoped, bound, unconfirmed = self._tokens
        _unconfirmed.reset(unconfirmed)
        _bound.reset(bound)
        _scoped.reset(scoped)


class StaleConfiguration(Exception):
    """An intake's routing transaction read a newer configuration version than the one its
    request's look-ups used: the transaction wrote nothing and is rolled back, and the request
    is answered again under the new version."""


def defer() -> bool:
    """Binds this request to the process's latest snapshot without reading the version, for a
    request whose writes all happen in an intake transaction (which checks the version, see
    `unconfirmed_version`) and which calls `settle` before answering. False (nothing bound)
    outside a request scope, once a look-up was made, or when no version is known yet."""
    if not _scoped.get() or _bound.get() is not None:
        return False
    latest = _latest
    if latest.version is None:
        return False
    _bound.set(latest)
    _unconfirmed.set(True)
    return True


def unconfirmed_version() -> int | None:
    """The version this request's look-ups used, while no read of the version confirmed it:
    the routing transaction compares it with the version it reads. None: nothing to check."""
    if not _unconfirmed.get():
        return None
    bound = _bound.get()
    return bound.version if bound is not None else None


def observed(version: int | None) -> None:
    """A version read from the database (by a routing transaction): later requests of the
    process start from it."""
    global _latest
    if version is not None and _latest.version != version:
        _latest = Snapshot(version)


def confirm() -> None:
    """This request's routing transaction read the version its look-ups used."""
    _unconfirmed.set(False)


def settle() -> bool:
    """Before a deferred request answers: True when its look-ups are current (confirmed by its
    routing transaction, or by reading the version now). False when the version moved: a
    snapshot of the new one is bound, and the request is to be answered again. When the
    database cannot be read, the answer already made stands."""
    if not _unconfirmed.get():
        return True
    _unconfirmed.set(False)
    bound = _bound.get()
    try:
        current = _current()
    except DatabaseError:
        return True
    if bound is not None and current.version == bound.version:
        return True
    _bound.set(current)
    return False


def refresh() -> None:
    """After StaleConfiguration: the request's next look-up reads the version again."""
    _unconfirmed.set(False)
    _bound.set(None)


def cached(kind: str, key: Hashable, loader: Callable[[], T], *, keep_none: bool = True) -> T:
    """`loader()`, or its value for `key` under the current configuration version (a None
    is kept too unless `keep_none` is false: unknown tokens are not worth remembering)."""
    return snapshot().get(kind, key, loader, keep_none=keep_none)


def clear() -> None:
    """Forgets everything cached in this process (tests)."""
    global _latest
    _latest = Snapshot(None)
