"""Per-client rate limits: `429` with `Retry-After`, counted in Redis so they hold across
processes and machines (see security/ratelimit.py; fails open when Redis is down)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from leads.models import ApiClient
from security.ratelimit import rate_limit_hit


class ClientRateThrottle(BaseThrottle):
    """`ApiClient.rate_limit_per_minute` requests a minute per client (empty: the
    API_RATE_LIMIT_PER_MINUTE setting). Runs after authentication and scope checks, so a
    request without a valid token is a 401 and never counts."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        client = request.auth
        if not isinstance(client, ApiClient):
            return True
        limit = client.rate_limit_per_minute
        if limit is None:
            limit = settings.API_RATE_LIMIT_PER_MINUTE
        # A request answered again (a configuration change, leads/api/views.py) counts once:
        # the verdict of its first attempt stands.
        verdict = getattr(request._request, "rate_limit_verdict", None)
        if verdict is None:
            # The token prefix is random per token: counters never leak between clients or databases.
            verdict = rate_limit_hit(key=f"client:{client.pk}:{client.token_prefix}", limit=limit)
            request._request.rate_limit_verdict = verdict  # type: ignore[attr-defined]
        self._wait = verdict.retry_after or None
        return verdict.allowed

    def wait(self) -> float | None:
        return self._wait
