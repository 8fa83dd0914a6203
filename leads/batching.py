"""Concurrent intakes in one process share one routing transaction (flat combining).

A hot group routes one lead per hold of its rotation lock, so its rate is one over the time
the lock is held, and on a busy machine most of that time is the holder waiting for a CPU.
Here, each request thread hands its job to the process's combiner. If no batch is running,
it becomes the leader: it takes every job waiting (up to `max_batch`, one per email address,
so a duplicate is always judged against a committed lead), runs them in one transaction, and
then wakes the threads whose jobs it ran. The first thread still waiting is woken to lead the
next batch. Under light load a batch is the request itself (the single-lead path); under
heavy load one lock hold routes many leads.

The rotation stays exact: a batch decides its leads one after the other from the state read
under the lock, as separate transactions would in the same order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar


class Waiter:
    """What the combiner needs of a job (jobs subclass it)."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lead = False


J = TypeVar("J", bound=Waiter)


class Combiner(Generic[J]):
    def __init__(self, run: Callable[[list[J]], None], *, max_batch: int, key: Callable[[J], Hashable]) -> None:
        """`run(batch)` processes a batch and must not raise (it records each job's outcome
        on the job); `key(job)`: jobs with equal keys never share a batch."""
        self._run = run
        self._max = max_batch
        self._key = key
        self._mutex = threading.Lock()
        self._pending: list[J] = []
        self._busy = False

    def submit(self, job: J) -> None:
        """Returns once `job` has been run, by this thread or by another one."""
        with self._mutex:
            self._pending.append(job)
            if not self._busy:
                self._busy = job._lead = True
        if not job._lead:
            job._wake.wait()
            if not job._lead:
                return  # a leader ran it
        batch: list[J] = []
        try:
            batch = self._take(job)
            self._run(batch)
        finally:
            for other in batch:
                if other is not job:
                    other._wake.set()
            self._hand_over()

    def _take(self, leader: J) -> list[J]:
        with self._mutex:
            batch, keys, rest = [leader], {self._key(leader)}, []
            for job in self._pending:
                if job is leader:
                    continue
                key = self._key(job)
                if len(batch) < self._max and key not in keys:
                    batch.append(job)
                    keys.add(key)
                else:
                    rest.append(job)
            self._pending = rest
        return batch

    def _hand_over(self) -> None:
        with self._mutex:
            if self._pending:
                following = self._pending[0]
                following._lead = True
                following._wake.set()
            else:
                self._busy = False
