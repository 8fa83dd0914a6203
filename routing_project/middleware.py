import re
import uuid
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from .logging import request_id_var

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when sane), echoed back and logged."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = request_id_var.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = request_id
        return response


class BodySizeLimitMiddleware:
    """413 for API bodies over the limit, before anything reads them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Invalid Content-Length header."}, status=400)
            if length > settings.MAX_REQUEST_BODY_BYTES:
                return JsonResponse(
                    {"detail": f"Request body is over {settings.MAX_REQUEST_BODY_BYTES} bytes."},
                    status=413,
                )
        return self.get_response(request)
