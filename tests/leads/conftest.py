"""Fixtures for the leads tests: a real Celery worker and a private Redis (tests/celery_worker.py)."""

from tests.celery_worker import celery_worker, celery_worker_factory, private_redis

__all__ = ["celery_worker", "celery_worker_factory", "private_redis"]
