"""Django's own 400, 403, 404 and 500 pages, as JSON under /api/ (a URL that matches no route, such
as /api/v1/leads/abc/, is still an API error with a `detail`); HTML elsewhere."""

from __future__ import annotations

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A request Django itself refuses (a SuspiciousOperation: a Host header not in
    ALLOWED_HOSTS, say). The exception's text is not echoed: it can name the settings."""
    if request.path.startswith("/api/"):
        if isinstance(exception, DisallowedHost):
            return JsonResponse({"detail": "This server does not answer for the request's Host header."}, status=400)
        return JsonResponse({"detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """An admin page a user's role does not open (a manager on the import page): the admin's
    own page, with its menu and a way back, where Django's bare "403 Forbidden" left the user
    on an unstyled page of one line."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "You do not have permission to perform this action."}, status=403)
    if request.path.startswith("/admin/") and request.user.is_authenticated and request.user.is_staff:
        from django.contrib import admin
        from django.template.response import TemplateResponse

        context = {**admin.site.each_context(request), "title": "Not allowed"}
        response = TemplateResponse(request, "admin/permission_denied.html", context, status=403)
        return response.render()
    return defaults.permission_denied(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error."}, status=500)
    return defaults.server_error(request)
