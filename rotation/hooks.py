"""Callbacks run after commit when a configuration change frees capacity in groups, and the
trail of what goes with a deleted group.

`rotation` must not import `leads` (imports run leads -> rotation -> audit), yet a rep coming
back, un-paused, joining or getting a higher cap must drain the group's fallback queue. The
leads app registers its drain here at startup (`LeadsConfig.ready`); rotation's services call
`capacity_freed(...)` inside their transaction, saying what freed it (`because`, for the drain's
audit event), and the callbacks run once it commits.
Likewise the apps whose rows a group's delete takes with it (its webhook endpoints) say here
what the trail must record of them (`group_deleting`). No Django signals: the call sites are
explicit and greppable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import Event
from routing_project import configcache

logger = logging.getLogger(__name__)

CapacityCallback = Callable[[list[int], str], None]
_callbacks: list[CapacityCallback] = []
LaterCallback = Callable[[list[int], datetime, str], None]
_later: list[LaterCallback] = []
DeletingCallback = Callable[[int, str, str], list[Event]]
_deleting: list[DeletingCallback] = []


def on_capacity_freed(callback: CapacityCallback) -> None:
    """Registers `callback(group_ids, because)`; registering the same callback twice is a no-op."""
    if callback not in _callbacks:
        _callbacks.append(callback)


def capacity_freed(*, group_ids: Iterable[int], because: str) -> None:
    """Runs the registered callbacks after the current transaction commits (now if none).
    `because`: the change that freed capacity, in words; the drain's audit event says it."""
    _after_commit(_callbacks, group_ids, because)


def on_capacity_frees_at(callback: LaterCallback) -> None:
    """Registers `callback(group_ids, at, because)`; registering the same callback twice is a
    no-op."""
    if callback not in _later:
        _later.append(callback)


def capacity_frees_at(*, group_ids: Iterable[int], at: datetime, because: str) -> None:
    """Capacity that time alone will free (an absence ending at `at`): the registered
    callbacks run after the current transaction commits, with `at` and `because`."""
    _after_commit(_later, group_ids, at, because)


def on_group_deleting(callback: DeletingCallback) -> None:
    """Registers `callback(group_id, slug, actor)`, returning the audit events of its rows that
    go with the group; registering the same callback twice is a no-op."""
    if callback not in _deleting:
        _deleting.append(callback)


def group_deleting(*, group_id: int, slug: str, actor: str) -> list[Event]:
    """The audit events of the rows a group's delete takes with it, read before it (inside its
    transaction)."""
    return [event for callback in _deleting for event in callback(group_id, slug, actor)]


def _after_commit(callbacks: list[Any], group_ids: Iterable[int], *args: Any) -> None:
    """Runs `callback(ids, *args)` for each of `callbacks` once the transaction commits; a
    callback that fails is logged and the others still run."""
    ids = sorted({int(g) for g in group_ids if g is not None})
    if not ids:
        return

    def run() -> None:
        # The request that made the change read the configuration before it (its token, at
        # the start): from here on it reads the committed one, its own change included (a
        # group just made the default takes the leads no rule matches).
        configcache.refresh()
        for callback in list(callbacks):
            try:
                callback(ids, *args)
            except Exception:  # a side effect must never break the change that triggered it
                logger.exception("capacity callback %s failed", getattr(callback, "__name__", callback))

    transaction.on_commit(run)
