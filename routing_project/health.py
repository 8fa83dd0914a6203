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


def check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, "ok"
    except Exception as exc:  # any failure means not ready
        return False, type(exc).__name__


def check_broker() -> tuple[bool, str]:
    from routing_project.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=1)
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
