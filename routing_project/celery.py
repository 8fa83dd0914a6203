import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routing_project.settings.local")

app = Celery("routing_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
