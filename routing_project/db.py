"""Database helpers shared by the apps."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection


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
