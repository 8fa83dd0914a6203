"""Admin helpers for credentials: the page that shows a new secret or token once (never
cached), and the superusers-only guard of the admins that hold them."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers


class SuperusersOnly:
    """For the admins of credentials (API tokens, intake and webhook secrets) and of where the
    leads' contact data is sent: superusers only, whatever permissions a staff user was given
    by hand. The roles never grant them (security/roles.py), but a permission ticked on a
    user's page would otherwise let a manager mint a manage token or point a webhook at an
    address of their own."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser) and super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return bool(request.user.is_superuser) and super().has_add_permission(request, *args)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_delete_permission(request, obj)  # type: ignore[misc]


def shown_once(
    request: HttpRequest,
    *,
    title: str,
    what: str,
    items: list[tuple[str, str]],
    stored: str,
    lost: str,
    back: str,
    note: str = "",
) -> HttpResponse:
    from django.contrib import admin

    context = {
        **admin.site.each_context(request),
        "title": title,
        "what": what,
        "it": "it is" if len(items) == 1 else "they are",
        "items": items,
        "stored": stored,
        "lost": lost,
        "back": back,
        "note": note,
    }
    response = TemplateResponse(request, "security/shown_once.html", context)
    add_never_cache_headers(response)
    return response
