import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import (
    DisallowedHost,
    ObjectDoesNotExist,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.db import DataError, IntegrityError, OperationalError
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
    UnreadablePostError,
)
from django.urls import Resolver404, is_valid_path, resolve
from ipware import get_client_ip

from . import configcache, metrics
from .logging import request_id_var

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


class HeadWithoutBodyMiddleware:
    """A HEAD answer carries the GET answer's headers and no body (RFC 9110). Django leaves
    dropping the body to the server, and gunicorn logs a warning on every such response:
    load balancers' HEAD probes of /healthz would fill the logs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.method == "HEAD" and not response.streaming and response.content:
            response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response


class ClientAddressMiddleware:
    """Behind TRUSTED_PROXY_COUNT proxies, each appending the address it got the request from
    to X-Forwarded-For, the client's address (REMOTE_ADDR, which the login throttle and the
    bad-signature limit count by) is the one the farthest trusted proxy saw: read from the
    header's end, so addresses a client wrote at its start count for nothing. Without it, every
    request behind a load balancer had the balancer's address, and one client's failed logins
    locked every login out. A request with fewer entries than proxies (one that reached the
    server around them) keeps its connection's address."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        proxies = settings.TRUSTED_PROXY_COUNT
        if proxies:
            # python-ipware's count is of the proxies whose own addresses are in the header:
            # all but the nearest one, whose address is the connection's.
            # Not strict: entries a client wrote before the proxies' own are allowed, and skipped.
            client, _ = get_client_ip(
                request,
                proxy_order="left-most",
                proxy_count=proxies - 1,
                request_header_order=["HTTP_X_FORWARDED_FOR"],
                strict=False,
            )
            if client is not None:
                request.META["REMOTE_ADDR"] = str(client)
        return self.get_response(request)


class AdminListGuardMiddleware:
    """An admin list page given a filter in its query string that the database refuses (a NUL,
    a broken regular expression, a range of one value, a number or a date out of range) shows
    Django's "invalid filter" page (?e=1), as for any other bad filter, not a 500; an action
    posted with ids that are not ids is a 400."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, SuspiciousOperation):
            # Too many fields, a body too big: reading request.GET or POST here would raise it
            # again; Django answers it with a 400.
            return None
        hostile_filter = isinstance(exception, DataError | OverflowError | IndexError | ValueError)
        on_a_list = request.method in ("GET", "HEAD") and request.path.startswith("/admin/") and request.GET
        if on_a_list and hostile_filter and "e" not in request.GET:
            logging.getLogger(__name__).info("admin list filter refused: %s", type(exception).__name__)
            return HttpResponseRedirect(f"{request.path}?e=1")
        if request.path.startswith("/admin/") and _is_lock_timeout(exception):
            # A change that needs a group's rotation row (a member added or removed) while
            # routing held it past the lock timeout: rolled back, to be retried, not a 500.
            logging.getLogger(__name__).info("admin change refused: lock timeout")
            busy = HttpResponse(
                "A row this change needs is busy (locked by routing); nothing was saved. Go back and retry shortly.",
                status=503,
                content_type="text/plain; charset=utf-8",
            )
            busy["Retry-After"] = "1"
            return busy
        if (
            request.path.startswith("/admin/")
            and request.method == "POST"
            and isinstance(exception, ObjectDoesNotExist)
        ):
            # The object the form edits was deleted by someone else since the page was read.
            logging.getLogger(__name__).info("admin change refused: %s", type(exception).__name__)
            return HttpResponse(
                f"{exception} Nothing was saved; go back to the list.",
                status=404,
                content_type="text/plain; charset=utf-8",
            )
        if request.path.startswith("/admin/") and request.method == "POST" and isinstance(exception, IntegrityError):
            # A row of the page collides with one saved by someone else since the page was read
            # and its form checked (two tabs adding the same rep to a group, or giving two
            # members one position): the whole save was rolled back. The page again, as it is
            # now, with what happened, not a 500.
            constraint = getattr(getattr(exception.__cause__, "diag", None), "constraint_name", None)
            # A constraint no concurrent edit explains is logged as a warning: a bug may hide there.
            known = (constraint or "") in _CONFLICTS
            level = logging.INFO if known else logging.WARNING
            logging.getLogger(__name__).log(level, "admin change refused: %s", constraint or "integrity error")
            what = _CONFLICTS.get(constraint or "", "a row of this page collides with one saved")
            messages.error(
                request,
                f"Nothing was saved: {what} by someone else since the page was read. Here it is as it is "
                "now: make your changes again.",
            )
            return HttpResponseRedirect(request.get_full_path())
        # An action posted with a selection that names no row (the page never sends one).
        forged_selection = request.method == "POST" and "_selected_action" in request.POST
        if request.path.startswith("/admin/") and forged_selection and isinstance(exception, ValueError):
            return HttpResponseBadRequest("The selection names no object: select rows on the list page.")
        return None


class DatabaseUnavailableMiddleware:
    """A page outside the API (a rep's accept link, the admin) whose database went away or
    refused answers 503 with Retry-After, as the API does (routing_project.exceptions), not a
    500: the request wrote nothing it did not commit, and trying again shortly works once the
    database is back. After AdminListGuardMiddleware, which says more of an admin lock timeout."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError):
            return None
        logging.getLogger(__name__).warning("database unavailable: %s", type(exception).__name__)
        unavailable = HttpResponse(
            "The database is unavailable; nothing was changed. Try again in a moment.",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
        unavailable["Retry-After"] = "2"
        return unavailable


# The unique constraints a change saved by someone else meanwhile can collide with, in words.
_CONFLICTS = {
    "one_membership_per_rep_and_group": "a rep added here was made a member of the group",
    "unique_position_in_group": "a position given here was taken by another member",
    "group_slug_unique_without_case": "a group with this slug was made",
    "rep_email_unique_without_case": "a rep with this e-mail was made",
    "one_default_group": "another group was made the default",
}


def _is_lock_timeout(exception: Exception) -> bool:
    return isinstance(exception, OperationalError) and getattr(exception.__cause__, "sqlstate", None) == "55P03"


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when sane), echoed back and logged."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        # "-" is the id of no request (log lines outside one; the audit stores it as none).
        request_id = incoming if _REQUEST_ID_RE.match(incoming) and incoming != "-" else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = request_id_var.set(request_id)
        try:
            with configcache.request_scope():  # one configuration version per request
                response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = request_id
        if (
            isinstance(response, StreamingHttpResponse)
            and not response.is_async
            and not isinstance(response, FileResponse)
        ):
            # A streamed page goes on working after this returns (the admin's lead import
            # routes its batches as its page is sent): its log lines are the request's too.
            response.streaming_content = _with_request_id(response.streaming_content, request_id)
        return response


def _with_request_id(content: Iterable[bytes], request_id: str) -> Iterator[bytes]:
    """Each part of a streamed response made with the request's id in force."""
    parts = iter(content)
    while True:
        token = request_id_var.set(request_id)
        try:
            part = next(parts)
        except StopIteration:
            return
        finally:
            request_id_var.reset(token)
        yield part


class NoStoreMiddleware:
    """The API's answers and a rep's accept page carry leads' contact details: no browser or
    proxy cache may keep a copy of them."""

    _PATHS = ("/api/v1/", "/leads/accept/")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith(self._PATHS) and "Cache-Control" not in response:
            response["Cache-Control"] = "no-store"
        return response


_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


# A refused body up to this size is read and dropped before the 413 goes out.
DRAIN_REFUSED_BODY_BYTES = 1024 * 1024


def _drain(request: HttpRequest, length: int) -> None:
    """Reads and drops a refused body (up to DRAIN_REFUSED_BODY_BYTES): left unread, gunicorn
    closed the keep-alive connection after the 413 it announced as kept alive, and a client's
    next request on it (a pooled connection) failed. A larger body is left: the connection
    ends, which costs less than reading it."""
    if length > DRAIN_REFUSED_BODY_BYTES:
        return
    stream = request.META.get("wsgi.input")
    remaining = length
    try:
        while stream is not None and remaining > 0:
            chunk = stream.read(min(65536, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
    except OSError:
        pass  # the client went away: nothing to keep alive


class BodySizeLimitMiddleware:
    """413 for API bodies over the limit, before anything reads them; and a 400 (JSON under the
    API, plain text elsewhere) for a query string or a form body of more parameters than Django
    parses (DATA_UPLOAD_MAX_NUMBER_FIELDS), which Django raises as a SuspiciousOperation from
    whatever first reads `request.GET` or `request.POST`: an HTML 400 with DEBUG off, and with
    DEBUG on a 500, its debug page reading them again."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
                # Django reads a body by its Content-Length: without one, a chunked body would
                # be read as empty and the request refused for fields it did send.
                return JsonResponse(
                    {"detail": "Send the body with a Content-Length; chunked request bodies are not accepted."},
                    status=411,
                )
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Invalid Content-Length header."}, status=400)
            if length > settings.MAX_REQUEST_BODY_BYTES:
                _drain(request, length)
                return JsonResponse(
                    {"detail": f"Request body is over {settings.MAX_REQUEST_BODY_BYTES} bytes."},
                    status=413,
                )
            try:
                request.GET  # noqa: B018 (parsed here, where its refusal can be answered)
            except TooManyFieldsSent:
                limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
                return JsonResponse({"detail": f"Too many query parameters (at most {limit})."}, status=400)
            return self.get_response(request)
        # The admin and the other pages: the same refusal as a plain 400, for the query string
        # and for a form's body (CSRF's check reads the form before any view would anyway).
        try:
            request.GET  # noqa: B018
            if request.method == "POST" and request.content_type in _FORM_TYPES:
                request.POST  # noqa: B018
        except UnreadablePostError:
            pass  # the client went away mid-body: met again, and answered, where it is read
        except TooManyFieldsSent:
            limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
            return HttpResponseBadRequest(
                f"Too many fields in the request (at most {limit}).", content_type="text/plain; charset=utf-8"
            )
        except RequestDataTooBig:
            return HttpResponse(
                f"The form's body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.",
                status=413,
                content_type="text/plain; charset=utf-8",
            )
        return self.get_response(request)


class ApiTrailingSlashMiddleware:
    """API paths end with a slash. Django's APPEND_SLASH answers a path without it with a 301
    (a 500 for a POST with DEBUG on), which clients follow with a GET: a lead posted to
    /api/v1/leads would get the list of leads and never be taken in. An API request without
    the slash gets a 308 to the path with it instead, which clients follow with the same
    method and body, and a JSON body naming the path. An API path no route matches is a JSON
    404 with DEBUG on too (Django's debug page is HTML)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if path.startswith("/api/") and not path.endswith("/"):
            urlconf = getattr(request, "urlconf", None)
            if not is_valid_path(path, urlconf) and is_valid_path(f"{path}/", urlconf):
                detail = f"API paths end with a slash: {request.path}/ (this answer is a 308 to it)."
                return HttpResponsePermanentRedirect(  # 308: the method and the body are kept
                    request.get_full_path(force_append_slash=True),
                    preserve_request=True,
                    content=json.dumps({"detail": detail}),
                    content_type="application/json",
                )
        response = self.get_response(request)
        if (
            response.status_code == 404
            and path.startswith("/api/")
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            # A path no route matches: with DEBUG on, Django answers it with its HTML page
            # (handler404 only serves DEBUG off); an API answers JSON either way.
            return JsonResponse({"detail": "Not found."}, status=404)
        return response


access_logger = logging.getLogger("routing_project.access")
_QUIET_PATHS = ("/metrics", "/healthz", "/readyz", "/static/")


def _view_label(request: HttpRequest) -> str:
    """The URL pattern's name of the request's view, for the HTTP histogram. A request answered
    before URL resolution (a 413 body, a 411 chunked one, a bad Content-Length) is labelled by
    the view its path names, so that a client's refused posts count against the endpoint they
    were for; a path no route matches is "unmatched" (never the raw path: one series each)."""
    match = request.resolver_match
    if match is None:
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return "unmatched"
    return match.view_name or match.route


class AllowedHostMiddleware:
    """A Host header not in ALLOWED_HOSTS gets the plain 400 (JSON under /api/) with DEBUG on
    too, where Django answers with its debug page. That page lists the settings, the database
    and Redis URLs with their passwords among them, and a browser lured to a host name of an
    attacker's that resolves to this server (DNS rebinding) lets the attacker's page read it.
    Logged as Django logs it, on django.security.DisallowedHost."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            request.get_host()
        except DisallowedHost as exc:
            from .error_views import bad_request

            logging.getLogger("django.security.DisallowedHost").error(
                str(exc), extra={"status_code": 400, "request": request}
            )
            return bad_request(request, exc)
        return self.get_response(request)


class AccessLogMiddleware:
    """One access line per request (method, path, status, duration, request id, client name)
    and the request's duration in the HTTP histogram. The path is logged without its query
    string, and nothing from the body: no contact data reaches the logs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        seconds = time.perf_counter() - started
        view = _view_label(request)
        metrics.http_request_observed(
            method=request.method or "", view=view, status=response.status_code, seconds=seconds
        )
        if not request.path.startswith(_QUIET_PATHS):
            client = getattr(request, "auth", None)
            # Escaped as Django escapes the path in its own lines: a CR or LF (%0A) in it would
            # otherwise start a forged line in the plain format.
            path = request.path.encode("unicode_escape").decode("ascii")
            access_logger.info(
                "%s %s %s %.1fms",
                request.method,
                path,
                response.status_code,
                seconds * 1000,
                extra={
                    "method": request.method,
                    "path": path,
                    "status": response.status_code,
                    "duration_ms": round(seconds * 1000, 2),
                    "client": getattr(client, "name", None),
                },
            )
        return response
