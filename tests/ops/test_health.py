"""Probes answer within seconds whatever the state of what they check: a database or broker
that accepts connections and then says nothing (a hung host) is reported, not waited for."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection
from rest_framework.test import APIClient

from routing_project import health
from tests.celery_worker import broker_at


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    server.close()


def timed(path: str):
    started = time.monotonic()
    response = APIClient().get(path)
    return response, time.monotonic() - started


@pytest.mark.django_db
def test_a_hung_broker_is_degraded_at_once(silent_port):
    with broker_at(f"redis://127.0.0.1:{silent_port}/0"):
        response, seconds = timed("/readyz")
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    assert seconds < 1.5


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_hung_database_is_unavailable_within_seconds(monkeypatch, silent_port):
    params = connection.get_connection_params()
    monkeypatch.setattr(connection, "get_connection_params", lambda: {**params, "port": silent_port})
    response, seconds = timed("/readyz")
    assert response.status_code == 503 and response.json()["database"] != "ok"
    assert seconds < health.DATABASE_PROBE_TIMEOUT_S + 1.5
    scrape, seconds = timed("/metrics")
    assert scrape.status_code == 200 and b"leadrouter_metrics_database_up 0.0" in scrape.content
    assert seconds < health.DATABASE_PROBE_TIMEOUT_S + 1.5


@pytest.mark.django_db
def test_ready_when_both_answer():
    response, _ = timed("/readyz")
    assert response.status_code == 200 and response.json() | {"broker_url_scheme": "x"} == {
        "status": "ok",
        "database": "ok",
        "broker": "ok",
        "broker_url_scheme": "x",
    }


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_request_to_a_database_host_that_answers_nothing_is_a_503_within_the_connect_timeout(
    api, monkeypatch, silent_port
):
    """A database host gone from the network answers nothing, not even a refusal: the
    request's connection gives up after `connect_timeout` (settings: 5 s) and the client gets
    its 503 with Retry-After, where it waited for as long as the kernel retried."""
    assert connection.settings_dict["OPTIONS"]["connect_timeout"] == 5
    assert connection.settings_dict["OPTIONS"]["tcp_user_timeout"] == 20_000  # for one lost mid-request
    params = connection.get_connection_params()
    connection.close()
    monkeypatch.setattr(connection, "get_connection_params", lambda: {**params, "port": silent_port})
    started = time.monotonic()
    response = api.get("/api/v1/leads/")
    seconds = time.monotonic() - started
    monkeypatch.undo()
    connection.close()
    assert response.status_code == 503 and response["Retry-After"] == "2"
    assert 4 < seconds < 9
