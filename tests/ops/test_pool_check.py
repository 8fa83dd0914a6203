"""The pool's health check (routing_project/postgresql): no round trip for a healthy idle
connection, and a connection the server dropped (a restart, pg_terminate_backend) is never
handed to a request."""

from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.utils import load_backend
from psycopg_pool import ConnectionPool

from routing_project.postgresql.base import idle_connection_check

from .webserver import gunicorn, live_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class CountingConnection(psycopg.Connection):
    """Counts the statements sent, the pool's own checks included."""

    statements = 0

    def execute(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        type(self).statements += 1
        return super().execute(*args, **kwargs)


def conninfo() -> str:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if isinstance(v, str | int)})


def terminate(pids: list[int]) -> None:
    with psycopg.connect(conninfo(), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def drop_connection_before_intake(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """PostgreSQL restarted mid-request: the first intake after this finds its request's
    connection terminated (the next ones run as usual). Returns the backend pids dropped."""
    from leads import services as lead_services

    intake = lead_services.lead_intake
    dropped: list[int] = []

    def intake_after_a_restart(**kwargs: Any) -> Any:
        if not dropped:
            dropped.append(connection.connection.info.backend_pid)
            terminate(dropped)
        return intake(**kwargs)

    monkeypatch.setattr(lead_services, "lead_intake", intake_after_a_restart)
    return dropped


def test_a_healthy_idle_connection_is_checked_without_a_round_trip():
    with ConnectionPool(
        conninfo(), min_size=1, max_size=1, check=idle_connection_check, connection_class=CountingConnection
    ) as pool:
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        CountingConnection.statements = 0
        for _ in range(5):
            with pool.connection() as conn:
                pass
        assert CountingConnection.statements == 0


@pytest.mark.parametrize("check", [idle_connection_check, None], ids=["checked", "unchecked"])
def test_connections_the_server_dropped_are_replaced_before_use(check):
    with ConnectionPool(conninfo(), min_size=2, max_size=2, check=check) as pool:
        pool.wait()
        pids = []
        with pool.connection() as a, pool.connection() as b:
            pids = [a.info.backend_pid, b.info.backend_pid]
        terminate(pids)  # as a restart does: an error message to each client, then end of file
        failures = 0
        for _ in range(2):
            try:
                with pool.connection() as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                    assert conn.info.backend_pid not in pids
            except psycopg.OperationalError:
                failures += 1
        # The unchecked pool shows what the check is for: it hands out the dead connections.
        assert failures == (0 if check else 2)


def test_djangos_pool_uses_the_check(settings):
    """The backend builds its pool with the check; a request after the server dropped every
    pooled connection gets a working one."""
    alias = "pool_check_test"
    settings_dict = {
        **connection.settings_dict,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 2}},
    }
    wrapper = load_backend("routing_project.postgresql").DatabaseWrapper(settings_dict, alias)
    try:
        assert wrapper.pool._check is idle_connection_check
        wrapper.ensure_connection()
        pid = wrapper.connection.info.backend_pid
        wrapper.close()  # back to the pool
        terminate([pid])
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pid
        wrapper.close()
    finally:
        wrapper.close_pool()


@pytest.mark.xdist_group("web-server")
def test_the_web_tier_carries_on_after_the_database_dropped_every_connection(make_group, tmp_path):
    """SPEC 10, PostgreSQL restarted: gunicorn with the production settings (the pool on),
    every connection to the database terminated as a restart does, and the next leads are
    routed, none lost, with no hand on the server."""
    import http.client
    import json

    from leads.models import Lead
    from tests.factories import api_client_with

    group, _reps = make_group(2)
    _client, token = api_client_with(["intake"])
    env = {
        "DATABASE_URL": live_database_url(),
        "WEB_WORKERS": "1",
        "WEB_THREADS": "2",
        "DB_POOL_MIN_SIZE": "2",
        # The generous bound of the test settings (routing_project/settings/test.py), not
        # production's 2 s. A request's routing statements get what is left of that bound as
        # their statement_timeout, and the first request after the drop opens a new backend
        # (cold caches) on a machine CI keeps busy: it spent 3.3 s getting there, and its
        # rotation row read, waiting on no lock, was cancelled with 250 ms left (a 503 "rotation
        # busy"). The bound is on waiting for the row, which nobody else holds here.
        "ROUTING_LOCK_TIMEOUT_MS": "5000",
    }
    with gunicorn(tmp_path, **env) as server:

        def post(n: int) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            body = json.dumps({"email": f"restart{n}@customer.example", "group": group.slug})
            conn.request(
                "POST", "/api/v1/leads/", body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            )
            status = conn.getresponse().status
            conn.close()
            return status

        assert [post(n) for n in range(4)] == [201] * 4
        with psycopg.connect(conninfo(), autocommit=True) as admin:
            dropped = admin.execute(
                "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()[0]
        # This test's own connection was dropped too: closed now, so that a failure below
        # leaves no dead connection to the tests this process runs next.
        connection.close()
        assert dropped >= 2  # the web process's pooled connections (and this test's own)
        assert [post(n) for n in range(4, 8)] == [201] * 4, server.log_tail()
    assert Lead.objects.filter(email__startswith="restart").count() == 8
