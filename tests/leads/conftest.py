"""Fixtures for the leads tests: a real Celery worker (tests/celery_worker.py)."""

from tests.celery_worker import celery_worker, celery_worker_factory

__all__ = ["celery_worker", "celery_worker_factory"]
