"""Publishing to a broker that hangs (a frozen Redis, a partition) rather than refuses: the
publishes under way when it hung wait for the socket timeout once; after that no request
tries it again itself, a background probe does, and publishing resumes when it answers."""

import socket
import time

import pytest

from leads import scheduling
from routing_project import broker_breaker
from routing_project.celery import app
from tests.celery_worker import broker_at, wait_for


@pytest.fixture
def hung_port():
    """A port whose connections the kernel accepts and nobody ever answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def short_socket_timeout():
    saved = app.conf.broker_transport_options
    app.conf.broker_transport_options = {**saved, "socket_timeout": 0.5}
    yield
    app.conf.broker_transport_options = saved


def test_a_hung_broker_holds_one_publish_then_only_the_probe_waits(
    settings, hung_port, short_socket_timeout, private_redis
):
    settings.BROKER_PUBLISH_BACKOFF_S = 0.3
    try:
        with broker_at(f"redis://127.0.0.1:{hung_port}/0"):
            started = time.monotonic()
            assert not scheduling.publish(scheduling.DRAIN_TASK, args=[0, "test"])
            assert time.monotonic() - started >= 0.4  # this one waited for the socket timeout
            assert broker_breaker.is_open()
            time.sleep(0.35)  # the backoff is over: a probe starts, and no request waits
            started = time.monotonic()
            for _ in range(50):
                assert not scheduling.publish(scheduling.DRAIN_TASK, args=[0, "test"])
            assert time.monotonic() - started < 0.2
            time.sleep(1.5)  # the probe timed out (1 s): still open, nobody waited
            assert broker_breaker.is_open()
        with broker_at(private_redis.url):
            broker_breaker.failed()  # as when it hung, now that it answers
            time.sleep(0.35)
            assert not scheduling.publish(scheduling.DRAIN_TASK, args=[0, "test"])  # the probe's turn
            assert wait_for(lambda: not broker_breaker.is_open(), timeout=5)
            assert scheduling.publish(scheduling.DRAIN_TASK, args=[0, "test"])
    finally:
        broker_breaker.reset()
