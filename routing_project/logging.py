"""Request ids for log lines, carried in a context variable set by the middleware."""

import contextvars
import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Django logs a 4xx or 5xx after the middleware has let go of the id: its record carries
        # the request, which holds it.
        # Several handlers filter the same record: the first one's answer stands.
        if getattr(record, "request_id", "-") == "-":
            request = getattr(record, "request", None)
            request_id = getattr(request, "request_id", None) or request_id_var.get()
            record.request_id = (_task_id(record) or "-") if request_id == "-" else request_id
        return True


class RefusalWithoutTracebackFilter(logging.Filter):
    """Django logs a 403 (a user refused a page their role may not open) with the traceback of
    the PermissionDenied behind it: thirty lines of the framework's own stack for a refusal
    that is working as meant. The one line stays, with the path and the status."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403:
            record.exc_info = record.exc_text = None
        return True


def _task_id(record: logging.LogRecord) -> str | None:
    """The id of the task a Celery worker line is about: its "received" line is written before
    the task runs (its id in force), with the task's context as the record's `data`."""
    data = getattr(record, "data", None)
    task_id = data.get("id") if isinstance(data, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line (LOG_FORMAT=json): time, level, logger, message, request id,
    and the fields passed with `extra=`. Callers never pass contact data (email, phone, names)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            # exc_text when a filter rendered it already (the redaction filter does).
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(config: dict[str, Any]) -> None:
    """LOGGING_CONFIG: Django's dictConfig, and Python's warnings as records of `py.warnings`
    (Django 5 no longer captures them), so that a library's warning goes through the same
    handler as every other line: JSON under LOG_FORMAT=json, redacted."""
    logging.config.dictConfig(config)
    logging.captureWarnings(True)
