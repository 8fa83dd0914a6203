"""One place that turns what can go wrong in a request into a clear JSON 4xx or 503."""

import logging

from django.core.exceptions import ImproperlyConfigured, ObjectDoesNotExist, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL: lock_timeout ran out


class RetryAfter(exceptions.APIException):
    """An answer that tells the client when to retry: its `Retry-After` (seconds)."""

    def __init__(self, detail: str | None = None, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class ServiceUnavailable(RetryAfter):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The service is busy; retry shortly."
    default_code = "busy"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "Conflict."
    default_code = "conflict"


class InFlight(RetryAfter, Conflict):
    """A request with the same Idempotency-Key is being answered: a 409 with Retry-After, the
    time after which the retry is most likely replayed."""


class Unprocessable(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "Unprocessable request."
    default_code = "unprocessable"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "too_large"


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    elif isinstance(exc, ObjectDoesNotExist):
        # The object a change names was deleted by another request since this one read it.
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, IntegrityError):
        # Validation passed, then a concurrent request wrote the same unique value first (two
        # posts of one slug, one member, one e-mail): the loser wrote nothing and is told why.
        constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
        logger.info("integrity conflict: %s", constraint or type(exc.__cause__).__name__)
        exc = Conflict(
            "This change conflicts with another one made at the same time"
            + (f" ({constraint})" if constraint else "")
            + "; read the current state and retry."
        )
    elif isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
        # A row the change needs (a group's rotation row) stayed locked past the lock timeout.
        logger.info("lock timeout outside routing")
        exc = ServiceUnavailable("A row this change needs is busy (locked by routing); retry shortly.", retry_after=1)
    elif isinstance(exc, OperationalError):
        # The database went away or refused (restart, failover, lock timeout outside routing):
        # the request wrote nothing it did not commit, so the client can retry.
        logger.warning("database unavailable: %s", type(exc).__name__)
        exc = ServiceUnavailable("The database is unavailable; retry shortly.", retry_after=2)
    elif isinstance(exc, ImproperlyConfigured):
        # The server's configuration, not the request (a stored secret the keys no longer open
        # after SECRET_KEY changed): the operator is told in the log, the client to come back.
        logger.error("misconfigured: %s", exc)
        exc = ServiceUnavailable(
            "The service is misconfigured; its operator has been told. Retry later.", retry_after=60
        )
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, RetryAfter):
        response["Retry-After"] = str(exc.retry_after)
    return response
