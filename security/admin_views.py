"""The admin page that shows a new secret or token once, never cached."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers


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
