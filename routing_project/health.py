"""Liveness and readiness for load balancers and orchestrators (no authentication)."""

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

logger = logging.getLogger(__name__)


# Probes read: GET or HEAD, anything else a 405 (not the CSRF check's 403 page).
@csrf_exempt
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


# A probe answers within seconds whatever the state of what it checks: a database or broker
# that does not answer is reported as down, not waited for (a pooled connection would be
# waited for DB_POOL_TIMEOUT, an unpooled one to a hung server for ever).
DATABASE_PROBE_TIMEOUT_S = 2  # libpq's least connect_timeout
BROKER_PROBE_TIMEOUT_S = 0.5


def check_database() -> tuple[bool, str]:
    """The database answers `SELECT 1`. PostgreSQL: on a connection of its own, opened with a
    timeout, so that neither a pool waiting for a server nor a hung server holds the probe."""
    try:
        if connection.vendor != "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return True, "ok"
        import psycopg

        params = connection.get_connection_params()
        params["connect_timeout"] = DATABASE_PROBE_TIMEOUT_S
        with psycopg.connect(**params) as probe:
            probe.execute("SELECT set_config('statement_timeout', %s, false)", [str(DATABASE_PROBE_TIMEOUT_S * 1000)])
        return True, "ok"
    except Exception as exc:  # any failure means not ready
        return False, type(exc).__name__


def check_broker() -> tuple[bool, str]:
    """The broker answers: a Redis PING with short timeouts, else one kombu connection attempt."""
    from routing_project.celery import app

    url = app.conf.broker_write_url or app.conf.broker_url or settings.CELERY_BROKER_URL  # what intake publishes to
    try:
        if url.startswith(("redis://", "rediss://", "unix://")):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=BROKER_PROBE_TIMEOUT_S, socket_timeout=BROKER_PROBE_TIMEOUT_S
            )
            try:
                client.ping()
            finally:
                client.close()
            return True, "ok"
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0, timeout=1)
        return True, "ok"
    except Exception as exc:
        return False, type(exc).__name__


@csrf_exempt
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when the database answers. The broker's state is reported: intake keeps working
    without it (the escalation sweep catches up), so a down broker is 'degraded', not down."""
    db_ok, db_detail = check_database()
    broker_ok, broker_detail = check_broker()
    body = {
        "status": "ok" if db_ok and broker_ok else ("degraded" if db_ok else "unavailable"),
        "database": db_detail,
        "broker": broker_detail,
        "broker_url_scheme": settings.CELERY_BROKER_URL.split(":", 1)[0],
    }
    return JsonResponse(body, status=200 if db_ok else 503)
