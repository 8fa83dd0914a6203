"""End to end through Redis and a real Celery worker process: the outbox row commits with
the assignment, the worker fans it out and delivers, retrying a failed webhook with backoff."""

import json
import time

import pytest
from django.utils import timezone

from notifications.models import Delivery, OutboxMessage, WebhookEndpoint
from tests.celery_worker import NOTIFY_POOL_ARGS, celery_worker_factory, wait_for  # noqa: F401 - the fixture
from tests.conftest import lead_body

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("celery"),
]


def test_the_worker_delivers_after_commit_and_retries_with_backoff(api, make_group, receiver, celery_worker_factory):  # noqa: F811
    worker = celery_worker_factory(beat=False, env={"NOTIFY_BACKOFF_BASE_S": "1"})
    worker.start()
    group, reps = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [503, 200]

    response = api.post("/api/v1/leads/", lead_body(group="emea", company="Acme"), format="json")
    assert response.status_code == 201
    lead_id = response.json()["id"]

    def both_sent() -> bool:
        return Delivery.objects.filter(message__lead_id=lead_id, status="sent").count() == 2

    assert wait_for(both_sent, timeout=30), worker.log()
    webhook = Delivery.objects.get(message__lead_id=lead_id, channel="webhook")
    assert (webhook.attempts, webhook.last_status_code, webhook.last_error) == (2, 200, "")
    assert (webhook.sent_at - webhook.created_at).total_seconds() >= 1  # the backoff was waited
    email = Delivery.objects.get(message__lead_id=lead_id, channel="email")
    assert (email.target, email.attempts) == (reps[0].email, 1)
    assert OutboxMessage.objects.get(lead_id=lead_id).dispatched_at is not None
    assert len(receiver.requests) == 2
    assert json.loads(receiver.requests[-1]["body"])["lead"]["id"] == lead_id


def test_a_receiver_slow_to_answer_does_not_hold_back_the_reps_emails(api, make_group, receiver, celery_worker_factory):  # noqa: F811
    # The notify worker as `make run` and docker-compose start it. With two slots, two
    # webhook sends waiting on a slow receiver held every e-mail behind them until it answered.
    worker = celery_worker_factory(
        beat=False, queues="notify", pool_args=NOTIFY_POOL_ARGS, env={"NOTIFY_WEBHOOK_TIMEOUT_S": "60"}
    )
    worker.start()
    group, reps = make_group(2, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.answering.clear()
    leads = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"] for _ in range(3)]

    def emails_sent() -> bool:
        return Delivery.objects.filter(message__lead_id__in=leads, channel="email", status="sent").count() == 3

    assert wait_for(emails_sent, timeout=30), worker.log()
    # Every webhook send is under way, waiting for its answer, none of them sent.
    assert wait_for(lambda: len(receiver.requests) == 3, timeout=30), worker.log()
    assert not Delivery.objects.filter(channel="webhook", status="sent").exists()
    receiver.answering.set()
    webhooks_sent = lambda: Delivery.objects.filter(channel="webhook", status="sent").count() == 3  # noqa: E731
    assert wait_for(webhooks_sent, timeout=30), worker.log()


def test_the_outbox_sweep_runs_while_the_notify_queue_is_backed_up(api, make_group, celery_worker_factory):  # noqa: F811
    """The sweep fans out messages whose drain never ran. It runs in the routing worker: with
    the notify worker busy (here: none at all), it still runs, instead of waiting in the
    notify queue behind the very backlog it is there to rescue."""
    from routing_project.celery import app

    worker = celery_worker_factory(beat=False, queues="celery", env={"NOTIFY_SWEEP_GRACE_S": "0.1"})
    worker.start()
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    message = OutboxMessage.objects.get(lead_id=lead_id)
    assert message.dispatched_at is None  # its drain waits in the notify queue, which no one reads
    # The sweep leaves messages younger than its grace to their drain: let this one pass it.
    time.sleep(max(0.0, 0.3 - (timezone.now() - message.created_at).total_seconds()))
    app.send_task("notifications.outbox_sweep")

    def fanned_out() -> bool:
        message.refresh_from_db()
        return message.dispatched_at is not None

    assert wait_for(fanned_out, timeout=30), worker.log()
    assert Delivery.objects.filter(message=message, channel="email", status="pending").exists()


def test_the_worker_logs_json_records_with_no_contact_data(api, make_group, celery_worker_factory):  # noqa: F811
    # The worst case: an e-mail backend that prints the whole message to the worker's stdout.
    env = {"LOG_FORMAT": "json", "EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}
    worker = celery_worker_factory(beat=False, env=env)
    worker.start()
    group, reps = make_group(1, slug="emea")
    response = api.post("/api/v1/leads/", lead_body(group="emea", phone="+33 6 12 34 56 78"), format="json")
    lead_id = response.json()["id"]
    assert wait_for(lambda: Delivery.objects.filter(message__lead_id=lead_id, status="sent").exists(), timeout=30)
    log = worker.log_path.read_text()
    assert reps[0].email not in log and response.json()["email"] not in log and "12 34 56" not in log, log
    assert "/leads/accept/[redacted]" in log, log  # the printed e-mail went through the filter too
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(r.get("logger") == "celery.app.trace" for r in records), log


def test_every_worker_line_about_a_task_carries_its_id(api, make_group, celery_worker_factory):  # noqa: F811
    """The "received" line is written before the task runs (its id not yet in force): it had
    no request id, and a search by the task's id missed when the task arrived."""
    worker = celery_worker_factory(beat=False, env={"LOG_FORMAT": "json"})
    worker.start()
    make_group(1, slug="emea")
    lead_id = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()["id"]
    assert wait_for(lambda: Delivery.objects.filter(message__lead_id=lead_id, status="sent").exists(), timeout=30)
    records = [json.loads(line) for line in worker.log_path.read_text().splitlines() if line.startswith("{")]
    about_a_task = [r for r in records if isinstance(r.get("data"), dict) and "id" in r["data"]]
    assert any(r["message"].endswith("] received") for r in about_a_task), records
    assert all(r["request_id"] == r["data"]["id"] for r in about_a_task), about_a_task


def test_a_worker_stopped_under_json_logs_writes_json_lines_only(celery_worker_factory):  # noqa: F811
    """Celery says "worker: Warm shutdown (MainProcess)" outside logging, on every stop or
    restart: a line of text in a JSON log, which a log shipper cannot read."""
    worker = celery_worker_factory(beat=False, env={"LOG_FORMAT": "json"})
    worker.start()
    worker.stop()
    after_start = worker.log_path.read_text().split(" ready.", 1)[1].splitlines()[1:]  # the banner: no --quiet here
    records = [json.loads(line) for line in after_start if line.strip()]  # a line of text fails here
    assert any(r["message"] == "worker: Warm shutdown (MainProcess)" for r in records), records
