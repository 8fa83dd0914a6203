"""Gunicorn's threaded worker, taking new connections in turn with its siblings.

Every worker of a gunicorn server waits on the same listening socket, and whichever wakes
first takes the connection. Intake clients keep their connections open (keep-alive), so an
early run of luck is kept for good: `make bench` saw 32 clients split 6 / 26 between two
workers, time after time. The 6 were answered in 41 ms, the 26 in 157 ms, because each
worker runs Python on one core at most (the GIL); the p99 was that of the crowded worker.

This worker publishes how many connections it holds in a table every worker shares (memory
mapped by the master before it forks), and listens for new connections only while it holds
no more than any sibling (least connections). The least loaded worker always listens, so a
connection is never left waiting for all of them; a worker that stopped listening looks
again every few milliseconds, since a sibling's count changes without waking it. Nobody
defers to a worker that takes no connections: a worker counts only once its loop runs (not
while it loads the application), stops counting when it is told to stop, and the master
frees a dead worker's row (gunicorn.conf.py's `child_exit`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any

from gunicorn import glogging
from gunicorn import util as gunicorn_util
from gunicorn.workers.gthread import ThreadWorker

from routing_project.logging import request_id_var

MAX_WORKERS = 64
# How often a worker that is not listening compares its count with its siblings' again.
RECHECK_S = 0.005
_FREE = 0
_NOT_LISTENING = -1

# One row per worker: its pid, and its connections (or _NOT_LISTENING: still loading the
# application, or stopping). Created when gunicorn loads
# this class in the master, before any fork, so every worker maps the same memory.
_pids = multiprocessing.RawArray("q", MAX_WORKERS)
_conns = multiprocessing.RawArray("q", MAX_WORKERS)
_rows_used = multiprocessing.RawValue("q", 0)  # rows at and past it were never claimed
_claim_lock = multiprocessing.Lock()


def claim_row(pid: int) -> int | None:
    """A free row of the table for worker `pid`, or None (the table full, or its lock held
    for seconds by a worker killed while claiming): that worker then listens all the time,
    as gunicorn's own does, and nobody waits on it."""
    if not _claim_lock.acquire(timeout=2):
        return None
    try:
        for row in range(MAX_WORKERS):
            if _pids[row] in (_FREE, pid):
                _pids[row] = pid
                _conns[row] = _NOT_LISTENING  # until its loop runs: it is still loading the app
                _rows_used.value = max(_rows_used.value, row + 1)
                return row
        return None
    finally:
        _claim_lock.release()


def release_row(pid: int) -> None:
    """Frees the row of worker `pid` (the master calls this when the worker exits). Without
    the lock, so that the master never waits: the count is cleared before the pid, so a
    worker claiming the row meanwhile either skips it or takes it whole."""
    for row in range(_rows_used.value):
        if _pids[row] == pid:
            _conns[row] = _NOT_LISTENING
            _pids[row] = _FREE


def fewest_elsewhere(row: int) -> int | None:
    """The fewest connections any other listening worker holds (None: no other worker)."""
    fewest = None
    for other in range(_rows_used.value):
        if other == row or _pids[other] == _FREE:
            continue
        count = _conns[other]
        if count >= 0 and (fewest is None or count < fewest):
            fewest = count
    return fewest


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's own answer to a request it cannot hand to the application (a request line
    over 4,094 bytes: 414; headers too large: 431; a malformed request line or header: 400),
    in JSON as every other error of the API, where gunicorn writes an HTML page."""
    body = json.dumps({"detail": f"{reason}: {mesg}" if mesg else reason}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


# The worker's error path calls it through the module (gunicorn.workers.base: util.write_error).
gunicorn_util.write_error = write_json_error


class BalancedThreadWorker(ThreadWorker):
    """gthread, listening only while it holds no more connections than any sibling."""

    row: int | None = None

    def init_process(self) -> None:
        self.row = claim_row(os.getpid())
        super().init_process()

    def _my_turn(self) -> bool:
        if self.row is None:
            return True
        fewest = fewest_elsewhere(self.row)
        return fewest is None or self.nr_conns <= fewest

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled and self._my_turn())

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        wants = self.alive and self.nr_conns < self.worker_connections
        if self.row is not None:
            _conns[self.row] = self.nr_conns if self.alive else _NOT_LISTENING
            if wants:
                self.set_accept_enabled(True)  # or not, if a sibling holds fewer
        if wants and not self._accepting:
            timeout = min(timeout, RECHECK_S)
        super().wait_for_and_dispatch_events(timeout)
        if self.row is not None:
            _conns[self.row] = self.nr_conns if self.alive else _NOT_LISTENING

    def handle_exit(self, sig: Any, frame: Any) -> None:
        if self.row is not None:
            _conns[self.row] = _NOT_LISTENING
        super().handle_exit(sig, frame)

    quitting = False

    def handle_quit(self, sig: Any, frame: Any) -> None:
        """Quits once. Ctrl-C sends SIGINT to the whole process group, so a worker gets it
        from the terminal and then SIGQUIT from the master, often while the first handler
        is still in the thread pool's shutdown: gthread's handler, run again there, waits
        for the pool's lock its own first run holds, and the worker hangs until the master
        kills it after the graceful timeout (30 s). The second signal has nothing to add."""
        if self.quitting:
            return
        self.quitting = True
        if self.row is not None:
            _conns[self.row] = _NOT_LISTENING
        super().handle_quit(sig, frame)


class AccessLogger(glogging.Logger):
    """gunicorn's logger, its lines handed to the product's logging (gunicorn.conf.py:
    `logconfig_dict`). gunicorn takes any logging configuration as a wish for its access
    lines: the product writes its own (JSON, with the request id), so gunicorn's are built and
    written only when WEB_ACCESS_LOG asks for them."""

    @property
    def access_log_enabled(self) -> bool:
        return bool(self.cfg.accesslog)

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if not self.cfg.accesslog:
            return
        # Written once the application has answered and let go of the request's id: the line
        # carries the id the answer echoes, as every other line of the request does.
        request_id = next((value for name, value in resp.headers if name.lower() == "x-request-id"), None)
        token = request_id_var.set(request_id) if request_id else None
        try:
            super().access(resp, req, environ, request_time)
        finally:
            if token is not None:
                request_id_var.reset(token)


# A lead as a client posts it, valid, touching every kind of field intake validates.
_WARM_LEAD = {
    "email": "warm.up@example.com",
    "first_name": "Warm",
    "phone": "+1 555 0100",
    "country": "de",
    "score": 1,
    "company_size": 1,
    "external_id": "warm-up",
    "attributes": {"warm": True},
}


def warm() -> None:
    """Does once, before the worker takes connections, what Django and DRF otherwise do on
    the first requests, lazily and unlocked: every URL pattern's regular expression, and the
    validators' (the email domain pattern alone takes 30 to 60 ms to compile here). Left to
    the first requests, each of the worker's threads that got one of them compiled the same
    patterns at once, holding the interpreter's lock: the first leads after a start or a
    recycle waited hundreds of milliseconds. The same for the modules the first lead
    imported (the rate limit's Redis client, the connection pool, Celery's publishing side:
    70 ms of its 100). Connects to nothing: the clients made here connect on first use."""
    import psycopg_pool  # noqa: F401 - imported by the first connection otherwise
    import redis  # noqa: F401 - imported by the rate limit's first count otherwise
    from django.urls import URLResolver, get_resolver

    from leads.api.serializers import LeadInSerializer
    from routing_project.celery import app

    def walk(patterns: list[Any]) -> None:
        for entry in patterns:
            entry.pattern.regex  # noqa: B018 - compiled and kept by the pattern
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns)

    walk(get_resolver().url_patterns)
    LeadInSerializer(data=dict(_WARM_LEAD)).is_valid()
    app.amqp.router  # noqa: B018 - what send_task reads first
    app.producer_pool.connections.connection.transport  # noqa: B018 - the broker's transport, not connected
    app.AsyncResult, app.Task, app.backend, app.events  # noqa: B018 - no result backend: nothing to connect
