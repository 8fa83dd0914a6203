import logging
import os
import sys
from typing import Any

from celery import Celery
from celery.signals import setup_logging, task_postrun, task_prerun

from routing_project.logging import JsonFormatter, request_id_var

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routing_project.settings.local")

app = Celery("routing_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def logging_as_the_web(**kwargs: object) -> None:
    """The worker and beat log as the web does (Django's LOGGING: JSON lines with
    LOG_FORMAT=json, the redacting filter on every record) in place of Celery's own format.
    Whatever a task prints (an e-mail backend writing to stdout) becomes such a record too, as
    Celery does by default, so it is redacted as well."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
    if app.conf.worker_redirect_stdouts:
        app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)
    if settings.LOGGING["handlers"]["console"]["formatter"] == "json":
        from celery.apps import worker

        worker.safe_say = _say_as_json


def _say_as_json(msg: str, f: Any = sys.__stderr__) -> None:
    """Celery's `safe_say` under LOG_FORMAT=json: what the worker writes outside logging, from
    a signal handler ("worker: Warm shutdown (MainProcess)" on every stop or restart), as one
    JSON line like every other, not a line of text a log shipper cannot read. Written with
    os.write as Celery's is: a signal handler takes no logging lock."""
    if hasattr(f, "fileno") and f.fileno() is not None:
        record = logging.makeLogRecord(
            {"name": "celery.apps.worker", "levelno": logging.WARNING, "levelname": "WARNING", "msg": msg.strip()}
        )
        os.write(f.fileno(), (JsonFormatter().format(record) + "\n").encode())


# Task id -> the token that puts back the request id in force before the task ran.
_request_id_tokens: dict[str, Any] = {}


@task_prerun.connect
def request_id_of_task(task_id: str | None = None, **kwargs: object) -> None:
    """A task's log lines and audit events carry its task id as their request id, as a
    request's carry the request's: an operator finds every line of one escalation or sweep
    from the id on its audit event. A task run inside a request (eagerly) keeps the
    request's id."""
    if task_id and request_id_var.get() == "-":
        _request_id_tokens[task_id] = request_id_var.set(task_id)


@task_postrun.connect
def request_id_of_task_reset(task_id: str | None = None, **kwargs: object) -> None:
    token = _request_id_tokens.pop(task_id or "", None)
    if token is not None:
        request_id_var.reset(token)
