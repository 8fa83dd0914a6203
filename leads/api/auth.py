"""Bearer-token authentication against hashed API client tokens, and scope checks."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from leads.models import ApiClient
from routing_project import configcache

LAST_USED_RESOLUTION = timedelta(minutes=1)
# (client id, token hash) -> when this process last wrote it. The hash too: on SQLite a
# client deleted and another created may get the same id, and must not inherit the memo.
_last_used: dict[tuple[int, str], datetime] = {}


class ClientPrincipal:
    """What `request.user` is for an API call: the client, not a Django user."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def __str__(self) -> str:
        return f"api:{self.client.name}"


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ClientPrincipal, ApiClient] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        token_hash = ApiClient.hash_token(parts[1])
        # From the configuration cache: revoking a token changes the version, so the next
        # request reads it again (routing_project/configcache.py). Shared: never modified.
        client = configcache.cached(
            "client",
            token_hash,
            lambda: ApiClient.objects.filter(token_hash=token_hash, active=True, revoked_at=None).first(),
            keep_none=False,
        )
        if client is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        now = timezone.now()
        memo = (client.pk, client.token_hash)
        seen = max(filter(None, (client.last_used_at, _last_used.get(memo))), default=None)
        if seen is None or now - seen > LAST_USED_RESOLUTION:
            # At most one write a minute per client and process: last-used is for humans.
            ApiClient.objects.filter(pk=client.pk).update(last_used_at=now)
            _last_used[memo] = now
        return ClientPrincipal(client), client

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class HasScope(BasePermission):
    """The view names the scope each action needs: `required_scopes = {action: scope}`
    (or `required_scope` for all). No token: 401; a token without the scope: 403."""

    message = "This token lacks the scope this endpoint needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        scope = required_scope(view, request)
        if scope is None:
            return True
        client = request.auth
        if not isinstance(client, ApiClient):
            raise exceptions.NotAuthenticated()
        if not client.has_scope(scope):
            self.message = f"This token lacks the '{scope}' scope."
            return False
        return True


def required_scope(view: Any, request: Request) -> str | None:
    scopes = getattr(view, "required_scopes", None)
    if scopes:
        action = getattr(view, "action", None) or (request.method or "").lower()
        # An action the view does not name needs the widest scope: never none by omission.
        return scopes.get(action, scopes.get("*", "manage"))
    return getattr(view, "required_scope", None)


def actor_of(request: Request) -> str:
    client = request.auth
    return f"api:{client.name}" if isinstance(client, ApiClient) else "api:anonymous"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "leads.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}
