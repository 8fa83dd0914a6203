"""A real Celery worker (and beat) on Redis, as a subprocess, pointed at the test database.

Not eager mode: tasks go through Redis and run in another process, as in production. Each
pytest-xdist worker has its own broker key prefix (routing_project/settings/test.py), so
parallel test processes never consume each other's tasks; the subprocess inherits it.
Tests using it need `django_db(transaction=True)`: the worker only sees committed rows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

BASE_DIR = Path(__file__).resolve().parent.parent
XDIST = os.environ.get("PYTEST_XDIST_WORKER", "main")
# How `make run` (scripts/run.sh) and docker-compose.yml start the notify worker's pool
# (tests/ops/test_compose.py holds both to it).
NOTIFY_POOL_ARGS = ("--pool", "threads", "--concurrency", "8", "--prefetch-multiplier", "8")


def broker_purge() -> None:
    """Drops every broker key of this test process (stale timers of earlier tests)."""
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def database_url() -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Worker:
    def __init__(
        self,
        tmp: Path,
        *,
        beat: bool = True,
        env: dict[str, str] | None = None,
        queues: str = "celery,notify",
        pool_args: tuple[str, ...] = ("--concurrency", "2"),
    ) -> None:
        self.tmp = tmp
        self.beat = beat
        self.queues = queues
        self.pool_args = pool_args
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.tmp / f"worker-{self.starts}.log"

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "routing_project.settings.test",
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.CELERY_BROKER_URL,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "PYTEST_XDIST_WORKER": XDIST,
            "ESCALATION_SWEEP_EVERY_S": "1",
            "QUEUE_DRAIN_SWEEP_EVERY_S": "3600",
            "CONN_MAX_AGE": "0",
            "PYTHONUNBUFFERED": "1",
            # The worker's e-mails (file backend) in this test's directory, not in var/mail/
            # beside the ones `make run` writes for a developer to read.
            "EMAIL_FILE_PATH": str(self.tmp / "mail"),
            **self.extra_env,
        }
        cmd = [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "routing_project",
            "worker",
            "-Q",
            self.queues,
            "--loglevel",
            "INFO",
            *self.pool_args,
            "--hostname",
            f"test-{XDIST}-{os.getpid()}-{self.starts}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        if self.beat:
            cmd += ["--beat", "--schedule", str(self.tmp / f"beat-{self.starts}")]
        log = self.log_path.open("wb")
        # Own session: the worker, its pool children and beat form one process group to kill.
        self.proc = subprocess.Popen(
            cmd, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log_path.read_bytes():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"celery worker did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        """SIGKILL to the whole process group: no cleanup, no acknowledgements."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None


@contextlib.contextmanager
def broker_unreachable() -> Iterator[None]:
    """This process publishes to a closed port (Redis "down" for intake); restored after."""
    with broker_at("redis://127.0.0.1:1/0"):  # nothing listens on port 1
        yield


@contextlib.contextmanager
def broker_at(url: str) -> Iterator[None]:
    """This process publishes to `url` for a while; restored after."""
    from leads import scheduling
    from routing_project.celery import app

    def reset_pools() -> None:
        # Forget the cached pools (not close them: kombu keeps producer pools in a global
        # registry per URL, and the real one must stay usable when restored).
        app._pool = None
        app.amqp._producer_pool = None
        scheduling.publish_reset()

    # Both settings: Celery resolves the write URL once from the broker URL at configuration.
    saved = app.conf.broker_url, app.conf.broker_write_url
    app.conf.broker_url = app.conf.broker_write_url = url
    reset_pools()
    try:
        yield
    finally:
        app.conf.broker_url, app.conf.broker_write_url = saved
        reset_pools()


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def celery_worker(transactional_db, tmp_path) -> Iterator[Worker]:
    """A started worker with an embedded beat (sweep every second)."""
    broker_purge()
    from leads import scheduling

    scheduling.publish_reset()
    worker = Worker(tmp_path)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        broker_purge()


@pytest.fixture
def celery_worker_factory(transactional_db, tmp_path) -> Iterator[Callable[..., Worker]]:
    """Workers the test starts itself (e.g. after Redis was "down", or a second life)."""
    broker_purge()
    from leads import scheduling

    scheduling.publish_reset()
    made: list[Worker] = []

    def make(**kwargs: Any) -> Worker:
        worker = Worker(tmp_path, **kwargs)
        made.append(worker)
        return worker

    try:
        yield make
    finally:
        for worker in made:
            worker.stop()
        broker_purge()


class PrivateRedis:
    """A redis-server of this test's own, on a port of its own, to stop and start again."""

    def __init__(self, tmp: Path) -> None:
        index = int(XDIST[2:]) if XDIST.startswith("gw") else 0
        self.port = 18300 + 10 + index
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.tmp)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        if not wait_for(lambda: self._ping(client), timeout=10):
            raise RuntimeError("private redis-server did not start")

    @staticmethod
    def _ping(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
