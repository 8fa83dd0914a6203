"""Fixtures for the leads tests: a real Celery worker and a private Redis (tests/celery_worker.py)."""

import pytest

from tests.celery_worker import celery_worker, celery_worker_factory, private_redis

__all__ = ["celery_worker", "celery_worker_factory", "private_redis"]


@pytest.fixture
def manager(client, django_user_model):
    """A logged-in admin client of a superuser (the admin's lead pages)."""
    user = django_user_model.objects.create_superuser("maria", "maria@example.com", "pw-maria-123")
    client.force_login(user)
    return client
