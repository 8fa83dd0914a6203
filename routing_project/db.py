"""Database helpers shared by the apps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection

T = TypeVar("T")

# Seconds to wait before each try: a dropped connection is replaced at once, a restart
# that takes a moment longer is waited for, about 1.7 s in all.
RECONNECT_DELAYS_S = (0.0, 0.2, 0.5, 1.0)


def server_bound_cursor() -> Any:
    """A cursor binding parameters on the server, on Django's connection (same transaction),
    wrapped as Django wraps its own (query logging, execute wrappers, error translation).

    Django's default cursor binds on the client: psycopg parses the statement and quotes
    every value in Python on each execution, which for intake's writes cost more CPU than
    building them. With server-side binding psycopg converts each statement once (cached)
    and prepares it after a few executions, which also spares PostgreSQL the planning.
    Only statements whose parameter types PostgreSQL can always infer should use it (the
    routing statements of leads/routing_sql.py, the configuration version)."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw: Any = psycopg.Cursor(connection.connection)  # django-stubs types these wrappers' argument too narrowly
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def on_a_live_connection(write: Callable[[], T]) -> T:
    """Runs `write` (outside a transaction), on a new connection when the current one died:
    for the clean-up a failed request must leave behind even when the failure was the
    database connection itself (PostgreSQL restarted, the connection dropped), such as
    releasing an idempotency key or a signature claimed for the request."""
    for attempt, delay in enumerate(RECONNECT_DELAYS_S):
        time.sleep(delay)
        try:
            return write()
        except DatabaseError:
            if attempt == len(RECONNECT_DELAYS_S) - 1 or connection.in_atomic_block:
                raise
            connection.close()  # a dead connection is not reused: the next query opens one
    raise AssertionError("unreachable")


def set_lock_timeout() -> None:
    """Bounds how long this transaction waits for any lock, as routing does
    (ROUTING_LOCK_TIMEOUT_MS; SET LOCAL: this transaction only): past it, the lock timeout is
    raised, a 503 with Retry-After in the API, never a request hanging."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{settings.ROUTING_LOCK_TIMEOUT_MS}ms"])
