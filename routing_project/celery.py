import os

from celery import Celery
from celery.signals import setup_logging

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
