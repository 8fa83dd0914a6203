"""Beat started while Redis is away tries again every BROKER_RECONNECT_EVERY_S, as the worker
does (tests/leads/test_escalation.py stops a real Redis under a real worker): Celery's own beat
waited 2 s, 4 s, 6 s ... up to 30 s between tries, so the first sweep after the broker's return
could come half a minute late."""

from __future__ import annotations

import logging
import socket

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

from routing_project.celery import app
from routing_project.celery_reconnect import PersistentScheduler


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_worker_and_beat_reconnect_steadily_and_without_end():
    assert app.conf.worker_consumer == "routing_project.celery_reconnect:Consumer"
    assert app.conf.beat_scheduler == "routing_project.celery_reconnect:PersistentScheduler"
    assert app.conf.broker_connection_max_retries is None


def test_beat_connecting_during_an_outage_tries_every_second(settings, tmp_path, caplog):
    settings.BROKER_RECONNECT_EVERY_S = 0.2
    # An app of its own, to stop after four tries (the product's tries without end).
    outage = Celery("outage", set_as_current=False)
    outage.conf.update(broker_url=f"redis://127.0.0.1:{closed_port()}/0", broker_connection_max_retries=4)
    scheduler = PersistentScheduler(app=outage, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    with caplog.at_level(logging.ERROR, logger="celery.beat"), pytest.raises(OperationalError):
        scheduler._ensure_connected()
    waits = [
        r.getMessage().rsplit("Trying again in ", 1)[1] for r in caplog.records if "Trying again" in r.getMessage()
    ]
    assert waits == ["0.2 seconds..."] * 4
