"""The embedded default's broker (no REDIS_URL: kombu's filesystem transport): a worker polling
the folder while a message is being published sees no message or all of it, never an empty
file that it cannot decode (which stopped the worker, and `make run` with it)."""

import os
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection
from kombu.exceptions import DecodeError

from routing_project import broker

BASE_DIR = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def embedded_transport() -> str:
    """The transport the settings choose when no broker is configured, as `make run` starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL", "DATABASE_URL")}
    env["DJANGO_SETTINGS_MODULE"] = "routing_project.settings.local"
    code = (
        "import django; django.setup()\n"
        "from routing_project.celery import app\n"
        "with app.connection_for_write() as conn:\n"
        "    cls = type(conn.transport)\n"
        "print(f'{cls.__module__}:{cls.__qualname__}')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_worker_polling_during_a_publish_never_reads_a_message_half_written(embedded_transport, tmp_path):
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path), "store_processed": False}
    with (
        Connection("filesystem://", transport=embedded_transport, transport_options=options) as producer,
        Connection("filesystem://", transport=embedded_transport, transport_options=options) as worker,
    ):
        publishing, polling = producer.default_channel, worker.default_channel
        seen_while_publishing = []

        class PollsWhileEncoded:
            """Encoded while the message is published: the worker polls at that moment."""

            def __json__(self) -> str:
                try:
                    seen_while_publishing.append(polling._get("celery"))
                except Empty:
                    seen_while_publishing.append(None)
                except (ValueError, DecodeError) as exc:  # kombu's: JSONDecodeError on the empty file
                    seen_while_publishing.append(exc)
                return "body"

        publishing._put("celery", {"body": PollsWhileEncoded()})

        assert seen_while_publishing == [None]
        time.sleep(broker.RELIST_EVERY_S)  # the worker's next look at the folder
        assert polling._get("celery") == {"body": "body"}  # then the whole message
        assert sorted(os.listdir(tmp_path)) == []  # and nothing left behind


def test_a_worker_takes_a_backlog_in_order_without_listing_the_folder_for_each_message(
    embedded_transport, tmp_path, monkeypatch
):
    # kombu's reader listed and sorted the whole folder for every message: quadratic in a
    # backlog (the e-mails of a bulk import), a core spent listing files. And the messages
    # published within one millisecond came out in random order.
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path), "store_processed": False}
    with Connection("filesystem://", transport=embedded_transport, transport_options=options) as conn:
        channel = conn.default_channel
        for n in range(50):
            channel._put("notify", {"n": n})
        channel._put("celery", {"timer": 1})  # another queue's message, in the same folder
        listings = []
        real_listdir = os.listdir

        def counted(path):
            listings.append(path)
            return real_listdir(path)

        monkeypatch.setattr(os, "listdir", counted)
        taken = []
        for _ in range(50):
            taken.append(channel._get("notify")["n"])
            with pytest.raises(Empty):  # as a worker polls its remote-control queue in between
                channel._get("notify.worker@host.celery.pidbox")
        assert taken == list(range(50))
        assert len(listings) <= 3, len(listings)
        channel._put("notify", {"n": 50})  # published after the listing: taken next
        time.sleep(broker.RELIST_EVERY_S)
        assert channel._get("notify") == {"n": 50}
        with pytest.raises(Empty):
            channel._get("notify")
        assert channel._get("celery") == {"timer": 1}
