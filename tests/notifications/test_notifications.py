"""Notifications: the outbox row is written in the routing transaction; deliveries are
signed webhooks to a real HTTP receiver and e-mails, retried with exponential backoff."""

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone

from leads.models import Lead
from notifications import services, tasks
from notifications.models import Delivery, OutboxMessage, WebhookEndpoint
from routing_project import broker_breaker

pytestmark = pytest.mark.django_db


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server answering with `handler`, for the time of the block: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def verify(secret: str, header: str, body: bytes) -> bool:
    """As a receiver checks: any of the header's v1 values made with `secret`."""
    parts = [p.split("=", 1) for p in header.split(",")]
    [t] = [value for key, value in parts if key == "t"]
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, value) for key, value in parts if key == "v1")


def signatures(header: str) -> int:
    return sum(1 for p in header.split(",") if p.startswith("v1="))


def make_due(delivery_id: int) -> None:
    Delivery.objects.filter(pk=delivery_id).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def test_intake_writes_one_outbox_row_with_the_assignment(post_lead, make_group):
    group, reps = make_group(2, slug="emea")
    body = post_lead(group="emea", company="Acme", external_id="crm-1").json()
    message = OutboxMessage.objects.get()
    assert (message.event, message.lead_id, message.group_id, message.rep_id) == (
        "lead.assigned",
        body["id"],
        group.id,
        reps[0].id,
    )
    assert message.payload["lead"]["company"] == "Acme" and message.payload["lead"]["group"] == "emea"
    assert message.payload["reason"] == "rotation" and message.payload["attempt"] == 1
    assert message.payload["lead"]["queue_reason"] is None  # as in the API: null unless queued
    assert message.dispatched_at is None


def test_a_queued_lead_announces_nothing(post_lead, make_group):
    make_group(0, slug="empty")
    assert post_lead(group="empty").json()["status"] == "queued"
    assert not OutboxMessage.objects.exists()


def test_the_outbox_row_rolls_back_with_its_transaction(make_group):
    group, reps = make_group(1)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.outbox_add(event="lead.assigned", lead_id=1, group_id=group.id, rep_id=reps[0].id, payload={})
        raise RuntimeError("routing failed")
    assert not OutboxMessage.objects.exists()


def test_webhook_is_signed_and_email_sent(post_lead, make_group, receiver):
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/off", active=False)
    lead_id = post_lead(group="emea", company="Acme").json()["id"]
    message = OutboxMessage.objects.get()

    ids = services.outbox_dispatch(message_id=message.id)
    assert services.outbox_dispatch(message_id=message.id) == []  # running twice fans out once
    deliveries = {d.channel: d for d in Delivery.objects.filter(pk__in=ids)}
    assert set(deliveries) == {"webhook", "email"}  # the inactive endpoint gets nothing
    for d in deliveries.values():
        assert services.delivery_attempt(delivery_id=d.id) is None
        d.refresh_from_db()
        assert (d.status, d.attempts, d.last_error) == ("sent", 1, "")

    [request] = receiver.requests
    headers = request["headers"]
    assert verify(endpoint.secret, headers["X-Signature"], request["body"])
    assert not verify("another secret", headers["X-Signature"], request["body"])
    assert headers["X-Event"] == "lead.assigned" and headers["X-Message-Id"] == f"msg_{message.id}"
    doc = json.loads(request["body"])
    assert doc["event"] == "lead.assigned" and doc["lead"]["id"] == lead_id
    assert doc["lead"]["owner"] == {"id": reps[0].id, "name": reps[0].name, "email": reps[0].email}
    assert deliveries["webhook"].last_status_code == 200

    [email] = mail.outbox
    assert email.to == [reps[0].email]
    assert email.subject == f"Lead #{lead_id} assigned to you"
    assert "Acme" in email.body and f"/admin/leads/lead/{lead_id}/change/" in email.body
    assert Lead.objects.get(pk=lead_id).email not in email.body  # contact details stay in the app

    # A sent delivery is never sent again.
    make_due(deliveries["webhook"].id)
    assert services.delivery_attempt(delivery_id=deliveries["webhook"].id) is None
    assert len(receiver.requests) == 1


def test_the_email_gives_the_due_time_on_the_reps_clock(post_lead, make_group):
    from datetime import datetime
    from zoneinfo import ZoneInfo

    group, [rep] = make_group(1, slug="emea", sla_minutes=30)
    rep.timezone = "America/New_York"
    rep.save(update_fields=["timezone"])
    lead_id = post_lead(group="emea").json()["id"]
    [email_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    assert services.delivery_attempt(delivery_id=email_id) is None
    due = Lead.objects.get(pk=lead_id).sla_due_at
    local = due.astimezone(ZoneInfo("America/New_York"))
    [email] = mail.outbox
    shown = f"{local:%Y-%m-%d %H:%M:%S}" if local.second else f"{local:%Y-%m-%d %H:%M}"  # never cut to a past minute
    assert f"Accept before: {shown} (America/New_York)" in email.body, email.body
    assert isinstance(due, datetime) and due.isoformat() not in email.body


def test_what_a_lead_says_cannot_add_lines_or_links_to_the_reps_email(post_lead, make_group):
    """A company of "Acme\n\nAccept it: http://evil.example/" put a fake accept link on a line
    of its own, above the real one, in the e-mail a rep trusts."""
    make_group(1, slug="emea", sla_minutes=30)
    fake = "Acme\n\nAccept it: http://evil.example/phish/\r\nIn the admin: http://evil.example/"
    lead_id = post_lead(group="emea", company=fake, product="x\u2028Bcc: a@b.example").json()["id"]
    [email_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    assert services.delivery_attempt(delivery_id=email_id) is None
    [email] = mail.outbox
    lines = email.body.splitlines()
    assert [line for line in lines if line.startswith("Accept it:")] == [
        line for line in lines if line.startswith("Accept it:") and "evil" not in line
    ]
    assert not any(line.startswith(("In the admin: http://evil", "Bcc:")) for line in lines), email.body
    # Nor a link: a mail client makes one of a scheme, "www." or a host name.
    assert "Company: Acme Accept it: http[:]//evil[.]example/phish/ In the admin: http[:]//evil[.]example/" in lines
    assert f"/admin/leads/lead/{lead_id}/change/" in lines[-1]


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("see https://evil.example/leads/accept/x/ first", "see https[:]//evil[.]example/leads/accept/x/ first"),
        ("www.evil.example", "www[.]evil[.]example"),
        ("Re-confirm at evil.example/a", "Re-confirm at evil[.]example/a"),
        ("mailto:boss@evil.example", "mailto:boss@evil[.]example"),
        ("Acme Inc.", "Acme Inc."),  # no host name: as written
        ("Widget v2.0, e.g. blue", "Widget v2.0, e.g. blue"),
        ("J.P.Morgan, Dr.Oetker", "J.P.Morgan, Dr.Oetker"),  # names, not host names
        ("HTTPS://EVIL.EXAMPLE/x", "HTTPS[:]//EVIL[.]EXAMPLE/x"),
        ("Ac\u202eme\u200b Ltd", "Acme Ltd"),  # a bidirectional override, a zero width: gone
        (
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 Co",
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 Co",
        ),  # a Persian non-joiner stays
    ],
)
def test_a_value_of_the_leads_reads_as_written_never_as_a_link(post_lead, make_group, written, shown):
    make_group(1, slug="emea")
    post_lead(group="emea", company=written)
    [email_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    services.delivery_attempt(delivery_id=email_id)
    [email] = mail.outbox
    assert f"Company: {shown}" in email.body.splitlines(), email.body


def test_failed_webhook_is_retried_with_exponential_backoff(post_lead, make_group, receiver, settings):
    settings.NOTIFY_BACKOFF_BASE_S = 5
    settings.NOTIFY_REP_EMAIL = False
    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [500, 503, 200]
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)

    before = timezone.now()
    assert 5 <= services.delivery_attempt(delivery_id=delivery_id) <= 6.25  # the backoff, spread
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_status_code) == ("pending", 1, 500)
    assert d.last_error.startswith("HTTP 500")
    assert d.next_attempt_at >= before + timedelta(seconds=5)

    # Not due yet: an early duplicate (timer and sweep together) sends nothing.
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    assert len(receiver.requests) == 1

    make_due(delivery_id)
    assert 10 <= services.delivery_attempt(delivery_id=delivery_id) <= 12.5  # doubled
    make_due(delivery_id)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d.refresh_from_db()
    assert (d.status, d.attempts, d.last_status_code, d.last_error) == ("sent", 3, 200, "")
    assert len(receiver.requests) == 3
    # Every retry carries the same message id, so a receiver can drop repeats.
    assert len({r["headers"]["X-Message-Id"] for r in receiver.requests}) == 1


def test_gives_up_after_the_last_attempt(make_group, settings):
    settings.NOTIFY_MAX_ATTEMPTS = 2
    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1)
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    WebhookEndpoint.objects.create(group=group, url=f"http://127.0.0.1:{port}/")
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.escalated", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={"lead": {"id": 7}}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    make_due(delivery_id)
    # The endpoint refused: it is held until the retry (see the test below); that time passed.
    WebhookEndpoint.objects.update(unreachable_until=timezone.now() - timedelta(seconds=1))
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts) == ("failed", 2)
    assert "URLError" in d.last_error or "Connection" in d.last_error


def test_a_redirect_is_a_failed_attempt_not_a_delivery(make_group, settings):
    """Following a 302 would turn the POST into a bodiless GET elsewhere (the signature header
    along) and log the delivery as sent: a 3xx is retried like any other failure."""
    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1)
    requests: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            requests.append(("POST", self.path))
            self.send_response(302)
            self.send_header("Location", "/moved")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            requests.append(("GET", self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as base:
        WebhookEndpoint.objects.create(group=group, url=f"{base}/hooks")
        with transaction.atomic():
            message = services.outbox_add(
                event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={"lead": {"id": 7}}
            )
        [delivery_id] = services.outbox_dispatch(message_id=message.id)
        assert services.delivery_attempt(delivery_id=delivery_id) is not None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_status_code) == ("pending", 1, 302)
    assert requests == [("POST", "/hooks")]


def test_backoff_is_capped(settings):
    settings.NOTIFY_BACKOFF_BASE_S = 5
    settings.NOTIFY_BACKOFF_MAX_S = 60
    assert [services.backoff_seconds(n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]


def test_retries_that_failed_together_are_spread(settings):
    """A receiver down for a minute fails many deliveries at once: their retries must not all
    come back in the same second. Each waits its backoff and up to a quarter more."""
    settings.NOTIFY_BACKOFF_BASE_S = 5
    delays = [services.retry_delay(3) for _ in range(200)]
    assert all(20 <= d <= 25 for d in delays)
    assert len({round(d, 1) for d in delays}) > 20


def test_a_receiver_that_trickles_its_answer_is_cut_at_the_timeout(make_group, settings):
    """The timeout bounds the whole exchange, not each read: a receiver sending its answer a
    byte at a time does not hold the worker past it."""
    import time

    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_WEBHOOK_TIMEOUT_S = 0.5
    group, reps = make_group(1)
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100:  # each byte well within a read timeout
                if stop.wait(0.1):
                    return
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as base:
        try:
            WebhookEndpoint.objects.create(group=group, url=f"{base}/slow")
            with transaction.atomic():
                message = services.outbox_add(
                    event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={"lead": {"id": 7}}
                )
            [delivery_id] = services.outbox_dispatch(message_id=message.id)
            started = time.monotonic()
            assert services.delivery_attempt(delivery_id=delivery_id) is not None
            took = time.monotonic() - started
        finally:
            stop.set()
    assert took < 2, took  # the receiver would take 10 s or more
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_status_code) == ("pending", 1, None)
    assert d.last_error == "no complete answer within 0.5 s"


def test_the_task_retries_through_celery(post_lead, make_group, receiver, settings):
    """The Celery task itself (run in process): a failure raises a retry, whose eager re-run
    finds the delivery not yet due and stops, leaving the scheduled attempt to the timer."""
    settings.NOTIFY_REP_EMAIL = False
    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [502, 200]
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    tasks.delivery_send.apply(args=[delivery_id])
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts) == ("pending", 1)
    make_due(delivery_id)
    tasks.delivery_send.apply(args=[delivery_id])
    d.refresh_from_db()
    assert (d.status, d.attempts) == ("sent", 2)


def test_pending_messages_are_fanned_out_by_the_sweep(post_lead, make_group):
    make_group(1, slug="emea")
    post_lead(group="emea")
    post_lead(group="emea")
    # Not older than the grace period yet: left to the on-commit task.
    assert services.outbox_dispatch_pending(older_than_s=60) == 0
    assert services.outbox_dispatch_pending(older_than_s=0) == 2
    assert Delivery.objects.filter(channel="email").count() == 2
    assert not OutboxMessage.objects.filter(dispatched_at__isnull=True).exists()
    assert services.deliveries_due(older_than_s=0) == list(
        Delivery.objects.order_by("next_attempt_at").values_list("id", flat=True)
    )


def test_delivery_log_in_the_admin(admin_client, post_lead, make_group, receiver, django_assert_max_num_queries):
    group, _ = make_group(2, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [500]
    for _ in range(5):
        post_lead(group="emea")
    services.outbox_dispatch_pending()
    for d in Delivery.objects.filter(channel="webhook"):
        services.delivery_attempt(delivery_id=d.id)
    with django_assert_max_num_queries(12):  # no query per row
        page = admin_client.get("/admin/notifications/delivery/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "HTTP 500" in html and receiver.url in html and "pending" in html
    detail = admin_client.get(f"/admin/notifications/delivery/{Delivery.objects.first().id}/change/")
    assert detail.status_code == 200


def test_the_delivery_log_shows_a_next_attempt_only_for_a_delivery_still_to_be_tried(
    admin_client, post_lead, make_group
):
    """A delivery given up on (an endpoint deactivated) and every e-mail sent kept the time they
    were last due: "next attempt at 13:05" read as a try still to come."""
    from django.utils import formats

    make_group(1, slug="emea")
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    delivery = Delivery.objects.get(pk=delivery_id)
    due = formats.localize(timezone.localtime(delivery.next_attempt_at))
    page = admin_client.get(f"/admin/notifications/delivery/{delivery_id}/change/").content.decode()
    assert due in page  # pending: when it is tried
    services.delivery_attempt(delivery_id=delivery_id)
    delivery.refresh_from_db()
    assert delivery.status == "sent"
    page = admin_client.get(f"/admin/notifications/delivery/{delivery_id}/change/").content.decode()
    row = page.split("Next attempt at", 1)[1].split("</div>", 2)[:2]
    assert '<div class="readonly">-</div>' in "</div>".join(row) + "</div>", row
    listing = admin_client.get("/admin/notifications/delivery/").content.decode()
    assert '<td class="field-next_attempt">-</td>' in listing


def test_the_outbox_list_names_the_lead_group_and_rep(admin_client, post_lead, make_group):
    """It showed the lead, group and rep as bare ids: the lead as its payload names it (linked
    to its page), the group by slug, the rep by name; one deleted since by the id it named.
    (tests/rotation/test_admin.py counts the page's queries for 4 and 40 messages.)"""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    group, reps = make_group(2, slug="emea")
    lead = post_lead(group="emea", first_name="Ana", last_name="Souza", email="ana@customer.example").json()
    message = OutboxMessage.objects.get(lead_id=lead["id"])
    gone = make_group(1, slug="gone")[0]
    OutboxMessage.objects.create(
        event="lead.rerouted", lead_id=lead["id"], group_id=gone.pk, rep_id=10**9, created_at=message.created_at
    )
    gone_id = gone.pk
    gone.delete()  # the key has no constraint: the message keeps the id
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/notifications/outboxmessage/")
    assert page.status_code == 200 and len(page.context["cl"].result_list) == 2
    assert [m.event for m in page.context["cl"].result_list] == ["lead.rerouted", "lead.assigned"]  # newest first
    html = " ".join(page.content.decode().split())
    link = f'<a href="/admin/leads/lead/{lead["id"]}/change/">#{lead["id"]}</a>'
    assert f"{link} Ana Souza &lt;ana@customer.example&gt;" in html
    assert '<td class="field-group_shown">emea</td>' in html
    assert f'<td class="field-rep_shown">{reps[0].name}</td>' in html
    assert f'<td class="field-group_shown">#{gone_id} (deleted)</td>' in html
    assert f'<td class="field-rep_shown">#{10**9} (deleted)</td>' in html
    # The groups and reps come joined to the page's select.
    (select,) = [q["sql"] for q in queries.captured_queries if 'FROM "notifications_outboxmessage"' in q["sql"]][-1:]
    assert 'LEFT OUTER JOIN "rotation_group"' in select and 'LEFT OUTER JOIN "rotation_rep"' in select, select
    # The delivery log names the lead the same way.
    services.outbox_dispatch_pending()
    deliveries = " ".join(admin_client.get("/admin/notifications/delivery/").content.decode().split())
    assert f"{link} Ana Souza &lt;ana@customer.example&gt;" in deliveries
    detail = admin_client.get(f"/admin/notifications/outboxmessage/{message.pk}/change/")
    assert detail.status_code == 200 and "emea" in detail.content.decode()


def test_a_deliverys_payload_reads_names_as_written(admin_client, post_lead, make_group):
    """The payload on a delivery's page was dumped as ASCII JSON: a lead from Café Müller read
    "Caf\\u00e9 M\\u00fcller" to the sales ops and managers reading the delivery log."""
    make_group(1, slug="emea")
    post_lead(group="emea", company="Café Müller")
    services.outbox_dispatch_pending()
    delivery = Delivery.objects.get(channel="email")
    html = admin_client.get(f"/admin/notifications/delivery/{delivery.id}/change/").content.decode()
    assert "&quot;company&quot;: &quot;Café Müller&quot;" in html
    assert "\\u00e9" not in html


def test_escalation_and_manual_assignment_announce_the_new_owner(post_lead, make_group):
    from leads import actions
    from leads.models import Assignment

    group, reps = make_group(2, slug="emea", sla_minutes=5)
    lead_id = post_lead(group="emea").json()["id"]
    first = Assignment.objects.get(lead_id=lead_id)
    Assignment.objects.filter(pk=first.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        actions.lead_escalate(assignment_id=first.pk)
    escalated = OutboxMessage.objects.get(event="lead.escalated")
    assert (escalated.lead_id, escalated.rep_id, escalated.group_id) == (lead_id, reps[1].id, group.id)
    assert escalated.payload["reason"] == "escalation" and escalated.payload["attempt"] == 2
    assert escalated.payload["lead"]["group"] == "emea"

    actions.lead_reassign(lead_id=lead_id, rep_id=reps[0].id, reason="covering", actor="test")
    manual = OutboxMessage.objects.filter(event="lead.assigned").order_by("id").last()
    assert (manual.rep_id, manual.payload["reason"]) == (reps[0].id, "manual")


def test_intake_carries_on_when_the_broker_is_down(post_lead, make_group, django_capture_on_commit_callbacks):
    from tests.celery_worker import broker_unreachable

    make_group(1, slug="emea")
    services.enqueue_reset()
    try:
        with broker_unreachable():
            with django_capture_on_commit_callbacks(execute=True):
                first = post_lead(group="emea")
            assert broker_breaker.is_open()  # the breaker is open: the next requests do not even try
            with django_capture_on_commit_callbacks(execute=True):
                second = post_lead(group="emea")
    finally:
        services.enqueue_reset()
    assert (first.status_code, second.status_code) == (201, 201)
    # Nothing was lost: the rows wait in the outbox for the sweep.
    assert OutboxMessage.objects.filter(dispatched_at__isnull=True).count() == 2
    assert services.outbox_dispatch_pending(older_than_s=0) == 2


@pytest.mark.parametrize(
    "role, delivery_log, endpoints, lead_import",
    [("Sales ops", 200, 403, 200), ("Managers", 200, 403, 403), ("Auditors", 200, 403, 403)],
)
def test_roles_read_the_delivery_log_only_superusers_see_endpoints(client, role, delivery_log, endpoints, lead_import):
    from django.contrib.auth.models import Group as Role
    from django.contrib.auth.models import Permission, User

    from security.roles import roles_sync

    roles_sync(group_model=Role, permission_model=Permission)
    user = User.objects.create_user("someone", password="pw-123456789", is_staff=True)
    user.groups.add(Role.objects.get(name=role))
    client.force_login(user)
    assert client.get("/admin/notifications/delivery/").status_code == delivery_log
    assert client.get("/admin/notifications/webhookendpoint/").status_code == endpoints
    assert client.get("/admin/lead-import/").status_code == lead_import


def test_the_endpoint_secret_is_shown_once_and_can_be_rotated(admin_client, make_group):
    group, _ = make_group(1, slug="emea")
    r = admin_client.post(
        "/admin/notifications/webhookendpoint/add/",
        {"group": group.pk, "url": "https://crm.example/hook", "active": "on"},
    )
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    endpoint = WebhookEndpoint.objects.get()
    assert len(endpoint.secret) == 64 and endpoint.secret in r.content.decode()
    said = " ".join(r.content.decode().split())
    assert "It is kept to sign deliveries, and never displayed again; if the signing secret is lost, rotate it." in said
    change = admin_client.get(f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret not in change and endpoint.secret[:4] in change
    # No old secret signs: said as every empty value is, not as Python's "None".
    old_secret = " ".join(change.split()).split("Old secret signs until:</label>", 1)[1][:60]
    assert '<div class="readonly">-</div>' in old_secret, old_secret
    old = endpoint.secret
    r = admin_client.post(
        "/admin/notifications/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": [endpoint.pk]},
    )
    endpoint.refresh_from_db()
    assert endpoint.secret != old and endpoint.secret in r.content.decode()


def test_after_a_rotation_deliveries_are_signed_under_the_old_secret_too_for_a_day(
    admin_client, post_lead, make_group, receiver, monkeypatch
):
    """The receiver holds the old secret until someone gives it the new one: for 24 hours each
    delivery carries a v1 under each, so nothing it receives meanwhile fails its check. Rotating
    again (the new secret was lost) keeps every replaced secret for its own 24 hours."""
    group, _ = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    first = endpoint.secret

    def deliver() -> tuple[str, bytes]:
        post_lead(group="emea")
        message = OutboxMessage.objects.filter(dispatched_at__isnull=True).get()
        [webhook] = Delivery.objects.filter(pk__in=services.outbox_dispatch(message_id=message.id), channel="webhook")
        assert services.delivery_attempt(delivery_id=webhook.id) is None
        request = receiver.requests[-1]
        assert verify(endpoint.secret, request["headers"]["X-Signature"], request["body"])
        return request["headers"]["X-Signature"], request["body"]

    header, body = deliver()
    assert signatures(header) == 1

    r = admin_client.post(
        "/admin/notifications/webhookendpoint/", {"action": "rotate_secret", "_selected_action": [endpoint.pk]}
    )
    endpoint.refresh_from_db()
    second = endpoint.secret
    assert second != first and second in r.content.decode() and "24 hours" in r.content.decode()
    header, body = deliver()
    assert signatures(header) == 2 and verify(first, header, body) and verify(second, header, body)
    change = admin_client.get(f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert "Old secret signs until" in change and first not in change and second not in change

    later = timezone.now() + timedelta(hours=2)
    monkeypatch.setattr(services.timezone, "now", lambda: later)
    third = services.endpoint_rotate_secret(endpoint=endpoint, actor="test")
    endpoint.refresh_from_db()
    header, body = deliver()
    assert signatures(header) == 3 and all(verify(s, header, body) for s in (first, second, third))

    # The first replaced secret ends 24 hours after its rotation, the second 24 hours after its own.
    monkeypatch.setattr(services.timezone, "now", lambda: later + timedelta(hours=22, minutes=1))
    header, body = deliver()
    assert signatures(header) == 2 and not verify(first, header, body) and verify(second, header, body)
    monkeypatch.setattr(services.timezone, "now", lambda: later + timedelta(hours=24, minutes=1))
    header, body = deliver()
    assert signatures(header) == 1 and verify(third, header, body) and not verify(second, header, body)


def test_signing_with_the_old_secret_can_be_stopped_at_once(admin_client, post_lead, make_group, receiver):
    """The receiver has switched, or an old secret leaked (whoever holds it can forge deliveries
    a receiver still checking it would trust): the old secrets stop signing now, audited."""
    from audit.models import AuditEvent

    group, _ = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    old = endpoint.secret
    new = services.endpoint_rotate_secret(endpoint=endpoint, actor="test")
    r = admin_client.post(
        "/admin/notifications/webhookendpoint/",
        {"action": "revoke_previous_secrets", "_selected_action": [endpoint.pk]},
        follow=True,
    )
    assert "Deliveries to 1 endpoint(s) are signed with the current secret only." in r.content.decode()
    post_lead(group="emea")
    [webhook] = Delivery.objects.filter(
        pk__in=services.outbox_dispatch(message_id=OutboxMessage.objects.get().id), channel="webhook"
    )
    assert services.delivery_attempt(delivery_id=webhook.id) is None
    [request] = receiver.requests
    header = request["headers"]["X-Signature"]
    assert signatures(header) == 1 and verify(new, header, request["body"]) and not verify(old, header, request["body"])
    [event] = AuditEvent.objects.filter(explanation__change="previous secrets revoked")
    assert (event.group, event.explanation["revoked"]) == ("emea", 1) and event.actor.startswith("admin:")
    assert old not in str(event.explanation)

    r = admin_client.post(
        "/admin/notifications/webhookendpoint/",
        {"action": "revoke_previous_secrets", "_selected_action": [endpoint.pk]},
        follow=True,
    )
    assert "None of these endpoints was signing with an old secret." in r.content.decode()


@pytest.mark.parametrize("url", ["ftp://crm.example/hook", "ftps://crm.example/hook"])
def test_an_endpoint_address_that_cannot_be_posted_to_is_refused_in_the_admin(admin_client, make_group, url):
    """Deliveries are HTTP POSTs: an address URLField takes but nothing can POST to would only
    fill the delivery log with failures."""
    group, _ = make_group(1, slug="emea")
    r = admin_client.post("/admin/notifications/webhookendpoint/add/", {"group": group.pk, "url": url, "active": "on"})
    assert r.status_code == 200 and r.context["adminform"].form.errors["url"] == [
        "Enter an http:// or https:// URL: deliveries are POSTed."
    ]
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("url", ["http://crm.example:99999/hook", "https://crm.example:0/hook"])
def test_an_endpoint_port_nothing_can_listen_on_is_refused_in_the_admin(admin_client, make_group, url):
    """URLValidator takes any port of up to five digits: every delivery to one over 65535
    failed (ValueError) until it was given up."""
    group, _ = make_group(1, slug="emea")
    r = admin_client.post("/admin/notifications/webhookendpoint/add/", {"group": group.pk, "url": url, "active": "on"})
    assert r.status_code == 200 and r.context["adminform"].form.errors["url"] == ["Enter a port from 1 to 65535."]
    assert not WebhookEndpoint.objects.exists()
    ok = admin_client.post(
        "/admin/notifications/webhookendpoint/add/",
        {"group": group.pk, "url": "https://crm.example:65535/hook", "active": "on"},
    )
    assert ok.status_code == 200 and WebhookEndpoint.objects.get().url == "https://crm.example:65535/hook"


@pytest.mark.postgres
def test_one_drain_is_published_for_messages_committed_while_one_is_queued(
    post_lead, make_group, monkeypatch, django_capture_on_commit_callbacks
):
    make_group(2, slug="emea")
    published: list[str] = []
    monkeypatch.setattr(services, "_enqueue", lambda name, arg: published.append(name))
    services.enqueue_reset()
    services.drain_flag_clear()
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            assert post_lead(group="emea").status_code == 201
    assert published == ["notifications.outbox_drain"]  # the later two found it queued
    # The drain clears the flag before reading: it fans out all three, and the next commit
    # publishes a new drain.
    assert tasks.outbox_drain() == 3
    with django_capture_on_commit_callbacks(execute=True):
        assert post_lead(group="emea").status_code == 201
    assert published == ["notifications.outbox_drain"] * 2
    services.drain_flag_clear()


def test_an_escalation_to_the_queue_tells_the_webhooks_nobody_owns_the_lead(post_lead, make_group, settings):
    from leads import actions
    from leads.models import Assignment

    group, reps = make_group(1, slug="emea", sla_minutes=5, max_attempts=1)
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/")
    lead_id = post_lead(group="emea").json()["id"]
    first = Assignment.objects.get(lead_id=lead_id)
    Assignment.objects.filter(pk=first.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        assert actions.lead_escalate(assignment_id=first.pk).outcome == "queued"
    message = OutboxMessage.objects.get(event="lead.escalated")
    assert (message.lead_id, message.rep_id, message.group_id) == (lead_id, None, group.id)
    assert message.payload["reason"] == "queued" and message.payload["lead"]["status"] == "queued"
    deliveries = Delivery.objects.filter(id__in=services.outbox_dispatch(message_id=message.id))
    assert [d.channel for d in deliveries] == ["webhook"]  # no e-mail: nobody owns it
    lead = json.loads(services.webhook_body(deliveries[0]))["lead"]
    assert lead["owner"] is None
    # Why it is queued, as the API's lead says it (the receiver need not ask).
    assert lead["queue_reason"] == Lead.objects.get(pk=lead_id).queue_reason
    assert "max_attempts" in lead["queue_reason"]


@pytest.mark.parametrize("moved", [False, True])
def test_a_reroute_into_the_queue_tells_the_webhooks_of_the_group_it_left(post_lead, make_group, moved):
    """The CRM showed the old owner for good: a reroute that takes the lead from its rep into
    the queue announced nothing, unlike an escalation to the queue."""
    from leads import actions
    from rotation.models import RoutingRule

    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/")
    lead_id = post_lead(group="emea", country="FR").json()["id"]
    if moved:  # the territory moved to a group nobody is in yet
        france, _ = make_group(0, slug="france")
        RoutingRule.objects.create(
            name="France", priority=1, group=france, conditions=[{"field": "country", "op": "equals", "value": "FR"}]
        )
    else:
        group.memberships.update(active=False)
    lead = actions.lead_reroute(lead_id=lead_id, actor="t")
    assert lead.status == "queued"
    message = OutboxMessage.objects.get(event="lead.rerouted")
    assert (message.lead_id, message.rep_id, message.group_id) == (lead_id, None, group.id)
    assert message.payload["reason"] == "queued" and message.payload["lead"]["status"] == "queued"
    assert message.payload["lead"]["group"] == ("france" if moved else "emea")
    assert message.payload["lead"]["queue_reason"] == Lead.objects.get(pk=lead_id).queue_reason != ""
    deliveries = Delivery.objects.filter(id__in=services.outbox_dispatch(message_id=message.id))
    assert [d.channel for d in deliveries] == ["webhook"]  # no e-mail: nobody owns it
    # Rerouted again while queued: nobody held it, nothing more to tell.
    actions.lead_reroute(lead_id=lead_id, actor="t")
    assert OutboxMessage.objects.filter(event="lead.rerouted").count() == 1


def test_a_reroute_to_another_groups_rep_tells_the_webhooks_of_the_group_it_left(post_lead, make_group):
    """The group it left heard nothing when the lead went to a rep of another group (only a
    reroute into the queue was announced there): its CRM went on showing the old owner."""
    from leads import actions
    from rotation.models import RoutingRule

    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/")
    lead_id = post_lead(group="emea", country="FR").json()["id"]
    france, [pierre] = make_group(1, slug="france")
    RoutingRule.objects.create(
        name="France", priority=1, group=france, conditions=[{"field": "country", "op": "equals", "value": "FR"}]
    )
    lead = actions.lead_reroute(lead_id=lead_id, actor="t")
    assert (lead.status, lead.owner_id) == ("assigned", pierre.id)
    message = OutboxMessage.objects.get(event="lead.rerouted")
    assert (message.lead_id, message.rep_id, message.group_id) == (lead_id, pierre.id, group.id)
    assert message.payload["reason"] == "reroute" and message.payload["lead"]["group"] == "france"
    deliveries = Delivery.objects.filter(id__in=services.outbox_dispatch(message_id=message.id))
    assert [d.channel for d in deliveries] == ["webhook"]  # the new owner's e-mail is the assignment's
    assert json.loads(services.webhook_body(deliveries[0]))["lead"]["owner"]["id"] == pierre.id
    # The new group's webhooks and the new owner hear of it as an assignment, once.
    assert OutboxMessage.objects.filter(event="lead.assigned", group_id=france.id, rep_id=pierre.id).count() == 1


def test_a_deactivated_endpoint_gets_no_more_retries(post_lead, make_group, receiver, settings):
    settings.NOTIFY_REP_EMAIL = False
    group, _ = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [500, 200]
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
    make_due(delivery_id)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_error) == ("failed", 1, "the endpoint was deactivated")
    assert len(receiver.requests) == 1


def test_a_deleted_endpoint_gets_no_more_retries(post_lead, make_group, receiver, settings):
    settings.NOTIFY_REP_EMAIL = False
    group, _ = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [500, 200]
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    endpoint.delete()
    make_due(delivery_id)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_error) == ("failed", 1, "the endpoint was deleted")
    assert len(receiver.requests) == 1


def test_deliveries_have_a_queue_of_their_own_apart_from_sla_timers():
    from routing_project.celery import app

    def queue(name: str) -> str:
        return app.amqp.router.route({}, name)["queue"].name

    assert {queue(n) for n in ("notifications.delivery_send", "notifications.outbox_drain")} == {"notify"}
    assert {queue(n) for n in ("leads.tasks.escalate_assignment", "leads.tasks.drain_group")} == {"celery"}
    # The safety net and the purge only touch the database: never stuck behind deliveries.
    assert {queue(n) for n in ("notifications.outbox_sweep", "notifications.purge")} == {"celery"}


def test_sweeps_piled_up_while_the_notify_worker_was_away_are_dropped(settings):
    """Each outbox sweep re-publishes every overdue delivery: an hour of sweeps replayed at
    once would publish each of them 120 times."""
    entry = settings.CELERY_BEAT_SCHEDULE["notifications-outbox-sweep"]
    assert 0 < entry["options"]["expires"] <= entry["schedule"]


def test_endpoints_created_pointed_elsewhere_or_rotated_in_the_admin_are_audited(admin_client, make_group):
    """A webhook endpoint receives every lead's contact data: creating one, pointing it at
    another URL and rotating its secret are client.changed events (never the secret), as
    the same changes to API clients and intake sources are."""
    from audit.models import AuditEvent

    group, _ = make_group(1, slug="emea")
    admin_client.post(
        "/admin/notifications/webhookendpoint/add/",
        {"group": group.pk, "url": "https://crm.example/hook", "active": "on"},
    )
    endpoint = WebhookEndpoint.objects.get()
    r = admin_client.post(
        f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/",
        {"group": group.pk, "url": "https://elsewhere.example/collect", "active": "on"},
    )
    assert r.status_code == 302
    admin_client.post(
        "/admin/notifications/webhookendpoint/", {"action": "rotate_secret", "_selected_action": [endpoint.pk]}
    )
    events = list(AuditEvent.objects.filter(type="client.changed").order_by("id"))
    assert [(e.group, e.explanation) for e in events] == [
        (
            "emea",
            {"webhook_endpoint": endpoint.pk, "change": "created", "url": "https://crm.example/hook", "active": True},
        ),
        (
            "emea",
            {
                "webhook_endpoint": endpoint.pk,
                "change": "edited",
                "fields": {"url": "https://elsewhere.example/collect"},
            },
        ),
        ("emea", {"webhook_endpoint": endpoint.pk, "change": "secret rotated", "grace_hours": 24.0}),
    ]
    assert all(e.actor.startswith("admin:") for e in events)
    endpoint.refresh_from_db()
    assert endpoint.secret not in str([e.explanation for e in events])


def dispatched(group, rep, lead_ids: list[int]) -> list[int]:
    """A `lead.assigned` outbox message per lead id, each fanned out: the deliveries' ids."""
    ids: list[int] = []
    for lead_id in lead_ids:
        with transaction.atomic():
            message = services.outbox_add(
                event="lead.assigned", lead_id=lead_id, group_id=group.id, rep_id=rep.id, payload={}
            )
        ids += services.outbox_dispatch(message_id=message.id)
    return ids


def hanging_handler(hits: list[str], release: threading.Event, *, wait_s: float, then_answer: bool):
    """A receiver that records each POST's path and hangs until `release` is set (at most
    `wait_s`), then answers 200 or, with `then_answer` false, closes without an answer."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hits.append(self.path)
            if not release.is_set():
                release.wait(wait_s)  # hung, past the timeout
            if then_answer:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def log_message(self, *args) -> None:
            pass

    return Handler


def test_an_endpoint_that_does_not_answer_holds_its_deliveries_not_the_workers(make_group, receiver, settings):
    """A receiver that hangs holds a worker for the whole timeout on every send: after one send
    it did not answer, its other deliveries' tries fail as its did, unsent (no worker held), while other
    endpoints' go on; once it answers again, the hold is lifted. An HTTP error answer is an
    answer: it holds nothing."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_WEBHOOK_TIMEOUT_S = 0.3
    group, reps = make_group(1)
    hits: list[str] = []
    answering = threading.Event()

    with serving(hanging_handler(hits, answering, wait_s=2, then_answer=True)) as base:
        try:
            hung = WebhookEndpoint.objects.create(group=group, url=f"{base}/h")
            WebhookEndpoint.objects.create(group=group, url=receiver.url)
            ids = dispatched(group, reps[0], [7, 8])
            to_hung = [i for i in ids if Delivery.objects.get(pk=i).endpoint_id == hung.id]
            to_healthy = [i for i in ids if i not in to_hung]

            assert services.delivery_attempt(delivery_id=to_hung[0]) is not None  # timed out
            hung.refresh_from_db()
            assert hung.unreachable_until is not None and hung.unreachable_until > timezone.now()
            wait = services.delivery_attempt(delivery_id=to_hung[1])
            assert wait is not None and wait > 0
            held = Delivery.objects.get(pk=to_hung[1])
            # Not sent: failed as the try that got no answer did, due again once the hold is over.
            assert (held.status, held.attempts, held.last_status_code) == ("pending", 1, None)
            assert held.next_attempt_at >= hung.unreachable_until
            assert held.last_error.startswith("not sent: the endpoint gave another delivery no answer")
            assert len(hits) == 1  # not sent: no second hung request
            for delivery_id in to_healthy:
                assert services.delivery_attempt(delivery_id=delivery_id) is None
            assert len(receiver.requests) == 2  # the other endpoint was served meanwhile

            answering.set()
            WebhookEndpoint.objects.filter(pk=hung.pk).update(unreachable_until=timezone.now() - timedelta(seconds=1))
            make_due(to_hung[1])
            assert services.delivery_attempt(delivery_id=to_hung[1]) is None
            assert Delivery.objects.get(pk=to_hung[1]).status == "sent"
            hung.refresh_from_db()
            assert hung.unreachable_until is None
        finally:
            answering.set()


@pytest.mark.postgres  # row locks of two connections (SKIP LOCKED, FOR NO KEY UPDATE)
@pytest.mark.django_db(transaction=True)
def test_once_the_hold_is_over_one_delivery_tries_the_endpoint_the_others_wait(make_group, settings):
    """When an unreachable endpoint's hold ends, its held deliveries are all due at that same
    instant: one of them tries the endpoint, the others wait for that try's outcome, without
    spending an attempt or holding a worker each for the whole timeout."""
    from django.db import connection

    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_WEBHOOK_TIMEOUT_S = 1.0
    group, reps = make_group(1)
    hits: list[str] = []
    release = threading.Event()

    with serving(hanging_handler(hits, release, wait_s=3, then_answer=False)) as base:
        try:
            hung = WebhookEndpoint.objects.create(group=group, url=f"{base}/h")
            ids = dispatched(group, reps[0], [7, 8])
            # Both held until now, as after an earlier try that got no answer.
            WebhookEndpoint.objects.filter(pk=hung.pk).update(unreachable_until=timezone.now() - timedelta(seconds=1))

            def probe() -> None:
                try:
                    services.delivery_attempt(delivery_id=ids[0])
                finally:
                    connection.close()

            first = threading.Thread(target=probe)
            first.start()
            for _ in range(200):
                if hits:
                    break
                threading.Event().wait(0.01)
            assert hits == ["/h"]
            wait = services.delivery_attempt(delivery_id=ids[1])
            assert wait is not None and wait > 0
            assert len(hits) == 1  # not sent while the first try is under way
            assert Delivery.objects.get(pk=ids[1]).attempts == 0
            # Another lead's fan-out writes its delivery for the endpoint meanwhile: the try's
            # row lock does not hold the deliveries' foreign key check.
            started = time.monotonic()
            assert len(dispatched(group, reps[0], [9])) == 1
            assert time.monotonic() - started < 0.5 and first.is_alive()
            first.join()
            assert Delivery.objects.get(pk=ids[0]).attempts == 1
        finally:
            release.set()


def test_a_repointed_endpoint_gets_the_retries_and_the_log_says_so(make_group, receiver, settings):
    """An endpoint given a new URL in the admin (the old receiver is down) takes the pending
    retries there: the delivery log names the address each delivery was last sent to."""
    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/old")  # nothing listens
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url, unreachable_until=None)
    make_due(delivery_id)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.target) == ("sent", 2, receiver.url)
    assert len(receiver.requests) == 1


def test_an_email_retry_goes_to_the_reps_corrected_address(make_group, settings):
    """A rep's address the mail server refused, corrected by sales ops meanwhile: the retries
    go to the new address, and the delivery log names it."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 1  # nothing listens
    group, reps = make_group(1)
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    assert Delivery.objects.get(pk=delivery_id).target == reps[0].email

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    reps[0].email = "corrected@corp.example"
    reps[0].save(update_fields=["email"])
    make_due(delivery_id)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.target) == ("sent", 2, "corrected@corp.example")
    [email] = mail.outbox
    assert email.to == ["corrected@corp.example"]


def test_an_http_error_answer_holds_nothing(make_group, receiver, settings):
    settings.NOTIFY_REP_EMAIL = False
    receiver.statuses = [503]
    group, reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is None


def test_an_http_error_answer_lifts_an_endpoints_hold(make_group, receiver, settings):
    """An endpoint back after a spell without answers, answering with an error: an answer all
    the same, so its deliveries are no longer held for one try at a time."""
    settings.NOTIFY_REP_EMAIL = False
    receiver.statuses = [503]
    group, reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(
        group=group, url=receiver.url, unreachable_until=timezone.now() - timedelta(seconds=1)
    )
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    assert services.delivery_attempt(delivery_id=delivery_id) is not None
    assert len(receiver.requests) == 1
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is None


def test_an_error_answer_with_a_nul_byte_is_counted_and_ends_failed(make_group, settings):
    """PostgreSQL text holds no NUL: a receiver's error body carrying one must still be a
    counted attempt (and, at the last one, a failed delivery), not a rollback retried for ever."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_MAX_ATTEMPTS = 2
    group, reps = make_group(1)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"upstream \x00 failure"
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as base:
        WebhookEndpoint.objects.create(group=group, url=f"{base}/hooks")
        with transaction.atomic():
            message = services.outbox_add(
                event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
            )
        [delivery_id] = services.outbox_dispatch(message_id=message.id)
        assert services.delivery_attempt(delivery_id=delivery_id) is not None
        d = Delivery.objects.get(pk=delivery_id)
        assert (d.status, d.attempts, d.last_status_code) == ("pending", 1, 500)
        assert d.last_error == "HTTP 500: upstream \ufffd failure"
        make_due(delivery_id)
        assert services.delivery_attempt(delivery_id=delivery_id) is None
    d.refresh_from_db()
    assert (d.status, d.attempts) == ("failed", 2)


def test_the_log_says_what_failed_and_warns_when_a_delivery_is_given_up(make_group, receiver, settings, caplog):
    settings.NOTIFY_MAX_ATTEMPTS = 2
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 1  # nothing listens
    receiver.statuses = [503]
    group, reps = make_group(1)
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=7, group_id=group.id, rep_id=reps[0].id, payload={}
        )
    ids = services.outbox_dispatch(message_id=message.id)
    with caplog.at_level("INFO", logger="notifications.services"):
        for _ in range(2):
            for delivery_id in ids:
                make_due(delivery_id)
                services.delivery_attempt(delivery_id=delivery_id)
    webhook, email = sorted(ids, key=lambda i: Delivery.objects.get(pk=i).channel == "email")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("INFO", f"delivery {webhook} (webhook) attempt 1 failed: HTTP 503"),
        ("INFO", f"delivery {email} (email) attempt 1 failed: ConnectionRefusedError"),
        ("WARNING", f"delivery {webhook} (webhook) failed for good after 2 attempts: HTTP 503"),
        ("WARNING", f"delivery {email} (email) failed for good after 2 attempts: ConnectionRefusedError"),
    ]


@pytest.mark.parametrize(
    "url",
    ["http://[::1/", "ftp://x.example/", "http:///no-host", "http://a b.example/", "http://a\x00b/", "http://h:99999/"],
)
def test_an_endpoint_url_that_cannot_be_posted_to_is_a_failed_attempt_not_a_crash(url):
    with pytest.raises(services.DeliveryError) as caught:
        services.webhook_post(url, b"{}", {}, timeout=1)
    assert caught.value.status_code is None


def test_a_host_name_that_does_not_resolve_in_time_is_a_failed_attempt_within_the_timeout(monkeypatch):
    """getaddrinfo has no timeout of its own: a resolver that does not answer held the worker
    past NOTIFY_WEBHOOK_TIMEOUT_S. The lookup now counts against the same deadline. (No DNS
    here: the resolver's silence is played by a lookup that sleeps.)"""
    lookup = socket.getaddrinfo
    released = threading.Event()

    def silent_resolver(host, *args, **kwargs):
        if host == "crm.example":
            released.wait(10)
            raise socket.gaierror("released")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", silent_resolver)
    started = time.monotonic()
    try:
        with pytest.raises(services.DeliveryError) as caught:
            services.webhook_post("https://crm.example/hook", b"{}", {}, timeout=0.5)
        assert time.monotonic() - started < 2
        assert "did not resolve in time" in str(caught.value) and caught.value.status_code is None
    finally:
        released.set()


def test_a_webhook_to_a_host_name_reaches_its_receiver(receiver):
    """The lookup is the deliverer's own now: a name (here localhost's) still gets its POST."""
    url = receiver.url.replace("127.0.0.1", "localhost")
    assert url != receiver.url
    assert services.webhook_post(url, b"{}", {"Content-Type": "application/json"}, timeout=2)[0] == 200
    assert len(receiver.requests) == 1


def test_a_webhook_is_posted_to_an_ipv6_receiver_with_its_query():
    class V6Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = V6Server(("::1", 0), Handler)  # the machine's IPv6 loopback (Redis listens on it too)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://[::1]:{server.server_address[1]}/hooks?team=emea"
        assert services.webhook_post(url, b"{}", {"Content-Type": "application/json"}, timeout=2) == (204, "")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/hooks?team=emea"]


def test_an_endpoint_pointed_elsewhere_in_the_admin_is_tried_there_at_once(
    admin_client, make_group, receiver, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """The old address gave no answer, so the endpoint's deliveries wait out its backoff and
    hold (up to half an hour). Sales ops give it the right URL: its pending deliveries go there
    now, not at the time the old address earned."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_BACKOFF_BASE_S = 600
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/old")  # nothing listens
    ids = dispatched(group, reps[0], [7, 8])
    assert services.delivery_attempt(delivery_id=ids[0]) is not None  # no answer: held
    assert services.delivery_attempt(delivery_id=ids[1]) is not None  # waits for the hold
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is not None

    published: list[tuple] = []
    monkeypatch.setattr(services, "_enqueue", lambda name, arg: published.append((name, arg)))
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(
            f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/",
            {"group": group.pk, "url": receiver.url, "active": "on"},
        )
    assert r.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is None
    # One task publishes the sends, in the notify worker, not each from the admin's request.
    assert published == [("notifications.deliveries_publish", ids)]
    published.clear()
    tasks.deliveries_publish(ids)
    assert published == [("notifications.delivery_send", i) for i in ids]
    for delivery_id in ids:
        assert services.delivery_attempt(delivery_id=delivery_id) is None
    assert [(d.status, d.target) for d in Delivery.objects.filter(pk__in=ids)] == [("sent", receiver.url)] * 2
    assert len(receiver.requests) == 2


@pytest.mark.parametrize("stop", ["deactivated", "deleted"])
def test_an_endpoint_stopped_in_the_admin_ends_its_pending_deliveries_at_once(
    admin_client, make_group, receiver, settings, stop
):
    """Deactivated or deleted, an endpoint gets nothing more: the delivery log says so of its
    pending deliveries at once, rather than showing them pending until their next try."""
    settings.NOTIFY_REP_EMAIL = False
    receiver.statuses = [500]
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    ids = dispatched(group, reps[0], [7, 8])
    assert services.delivery_attempt(delivery_id=ids[0]) is not None  # retried later
    if stop == "deactivated":
        r = admin_client.post(
            f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/", {"group": group.pk, "url": receiver.url}
        )
    else:
        r = admin_client.post(f"/admin/notifications/webhookendpoint/{endpoint.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302
    assert [(d.status, d.attempts, d.last_error) for d in Delivery.objects.filter(pk__in=ids).order_by("id")] == [
        ("failed", 1, f"the endpoint was {stop}"),
        ("failed", 0, f"the endpoint was {stop}"),
    ]
    assert services.delivery_attempt(delivery_id=ids[1]) is None
    assert len(receiver.requests) == 1


def test_failed_deliveries_can_be_sent_again_from_the_delivery_log(
    admin_client, make_group, receiver, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """A receiver down for longer than the retries last loses the leads' webhooks for good
    unless they can be sent again: the delivery log's action gives the failed ones a new round
    of attempts. A sent delivery is never sent twice, and a stopped endpoint gets nothing."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_MAX_ATTEMPTS = 1
    receiver.statuses = [500, 500, 200]
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    stopped = WebhookEndpoint.objects.create(group=group, url=receiver.url + "/stopped")
    ids = dispatched(group, reps[0], [7])
    failed = Delivery.objects.get(pk__in=ids, endpoint=endpoint).id
    to_stopped = Delivery.objects.get(pk__in=ids, endpoint=stopped).id
    assert services.delivery_attempt(delivery_id=failed) is None
    assert services.delivery_attempt(delivery_id=to_stopped) is None
    assert Delivery.objects.filter(pk__in=ids, status="failed").count() == 2
    WebhookEndpoint.objects.filter(pk=stopped.pk).update(active=False)
    sent = dispatched(group, reps[0], [8])
    Delivery.objects.filter(pk__in=sent).exclude(endpoint=endpoint).delete()
    [sent_id] = Delivery.objects.filter(pk__in=sent).values_list("id", flat=True)
    assert services.delivery_attempt(delivery_id=sent_id) is None
    assert Delivery.objects.get(pk=sent_id).status == "sent"
    assert len(receiver.requests) == 3

    published: list[tuple] = []
    monkeypatch.setattr(services, "_enqueue", lambda name, arg: published.append((name, arg)))
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(
            "/admin/notifications/delivery/",
            {"action": "send_again", "_selected_action": [failed, to_stopped, sent_id]},
            follow=True,
        )
    assert "1 delivery will be sent again. 2 left as they are" in r.content.decode()
    assert published == [("notifications.deliveries_publish", [failed])]
    assert services.delivery_attempt(delivery_id=failed) is None
    d = Delivery.objects.get(pk=failed)
    assert (d.status, d.attempts) == ("sent", 1)
    assert Delivery.objects.get(pk=to_stopped).status == "failed"
    assert len(receiver.requests) == 4


def test_only_superusers_may_send_deliveries_again(client, make_group):
    from django.contrib.auth.models import Group as Role
    from django.contrib.auth.models import Permission, User

    from security.roles import roles_sync

    roles_sync(group_model=Role, permission_model=Permission)
    user = User.objects.create_user("ops", password="pw-123456789", is_staff=True)
    user.groups.add(Role.objects.get(name="Sales ops"))
    client.force_login(user)
    assert "send_again" not in client.get("/admin/notifications/delivery/").content.decode()


def test_an_endpoint_moved_to_another_group_gets_none_of_the_first_groups_pending_leads(
    admin_client, make_group, receiver, settings
):
    """An endpoint given another group now takes that group's leads: the deliveries of the first
    group's leads still pending (a retry, or held back by the sweep) are not sent to it, in the
    admin as when the change is made another way."""
    settings.NOTIFY_REP_EMAIL = False
    receiver.statuses = [500, 200]
    emea, reps = make_group(1, slug="emea")
    amer, _ = make_group(1, slug="amer")
    endpoint = WebhookEndpoint.objects.create(group=emea, url=receiver.url)
    first, second = dispatched(emea, reps[0], [7, 8])
    assert services.delivery_attempt(delivery_id=first) is not None  # retried later
    r = admin_client.post(
        f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/",
        {"group": amer.pk, "url": receiver.url, "active": "on"},
    )
    assert r.status_code == 302
    assert [(d.status, d.last_error) for d in Delivery.objects.filter(pk__in=[first, second]).order_by("id")] == [
        ("failed", "the endpoint was moved to another group")
    ] * 2
    other = WebhookEndpoint.objects.create(group=emea, url=receiver.url)
    [third] = dispatched(emea, reps[0], [9])
    WebhookEndpoint.objects.filter(pk=other.pk).update(group=amer)  # moved outside the admin
    assert services.delivery_attempt(delivery_id=third) is None
    assert Delivery.objects.get(pk=third).last_error == "the endpoint was moved to another group"
    assert len(receiver.requests) == 1


@pytest.mark.parametrize(("base_s", "timer"), [(5.0, True), (600.0, False)])
def test_a_retry_beyond_the_horizon_is_left_to_the_sweep(post_lead, make_group, receiver, settings, base_s, timer):
    """A worker holds every countdown task in memory: a retry due within NOTIFY_TIMER_HORIZON_S
    gets one, a later one stays a row that the outbox sweep sends once it is due."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_BACKOFF_BASE_S, settings.NOTIFY_TIMER_HORIZON_S = base_s, 300.0
    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [502, 200]
    post_lead(group="emea")
    [delivery_id] = services.outbox_dispatch(message_id=OutboxMessage.objects.get().id)
    countdowns: list[float] = []

    def retry(*, countdown: float, **_options) -> Exception:
        countdowns.append(countdown)
        return RuntimeError("retry published")

    with mock.patch.object(tasks.delivery_send, "retry", retry):
        if timer:
            with pytest.raises(RuntimeError, match="retry published"):
                tasks.delivery_send.run(delivery_id)
        else:
            tasks.delivery_send.run(delivery_id)
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts) == ("pending", 1)
    assert len(countdowns) == (1 if timer else 0)
    assert delivery_id not in services.deliveries_due(older_than_s=settings.NOTIFY_SWEEP_GRACE_S)
    overdue = timezone.now() - timedelta(seconds=settings.NOTIFY_SWEEP_GRACE_S + 1)
    Delivery.objects.filter(pk=delivery_id).update(next_attempt_at=overdue)
    assert services.deliveries_due(older_than_s=settings.NOTIFY_SWEEP_GRACE_S) == [delivery_id]
    tasks.delivery_send.run(delivery_id)
    d.refresh_from_db()
    assert (d.status, d.attempts) == ("sent", 2)


def test_announced_messages_past_retention_are_purged_with_their_finished_deliveries(post_lead, make_group, settings):
    settings.NOTIFY_RETENTION_DAYS = 30
    group, _ = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/hook")
    for _ in range(5):
        post_lead(group="emea")
    messages = list(OutboxMessage.objects.order_by("id"))
    for message in messages[:4]:
        services.outbox_dispatch(message_id=message.id)
    old_sent, old_failed, old_pending, recent, old_undispatched = messages
    Delivery.objects.filter(message=old_sent).update(status="sent")
    Delivery.objects.filter(message=old_failed).update(status="failed")
    Delivery.objects.filter(message=old_pending, channel="webhook").update(status="failed")  # its e-mail pending
    Delivery.objects.filter(message=recent).update(status="sent")
    long_ago = timezone.now() - timedelta(days=31)
    OutboxMessage.objects.exclude(pk=recent.pk).update(created_at=long_ago)

    assert services.purge(batch=1) == (2, True)
    assert set(OutboxMessage.objects.values_list("id", flat=True)) == {old_pending.id, recent.id, old_undispatched.id}
    assert not Delivery.objects.filter(message_id__in=[old_sent.id, old_failed.id]).exists()
    assert Delivery.objects.filter(message=old_pending).count() == 2
    assert tasks.purge.apply().get() == 0  # the hourly task: nothing more past retention


def test_a_long_purge_goes_in_turns_queued_behind_what_came_meanwhile(post_lead, make_group, settings, monkeypatch):
    """It runs in the routing worker, beside SLA timers: the first purge past retention after
    a large import held one of its processes for as long as it took."""
    settings.NOTIFY_RETENTION_DAYS = 30
    make_group(1, slug="emea")
    for _ in range(3):
        post_lead(group="emea")
    for message in OutboxMessage.objects.all():
        services.outbox_dispatch(message_id=message.id)
    Delivery.objects.update(status="sent")
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(days=31))
    assert services.purge(batch=1, budget_s=0) == (1, False)  # a turn spent: stops, some left
    queued = []
    monkeypatch.setattr(tasks.purge, "delay", lambda: queued.append("purge"))
    monkeypatch.setattr(tasks, "PURGE_TURN_S", 0)
    assert tasks.purge.apply().get() > 0
    assert queued == ["purge"]
    assert services.purge() == (0, True)


def test_the_readmes_receiver_check_accepts_a_delivery_under_either_secret_during_a_rotation(
    post_lead, make_group, receiver
):
    """The README shows receivers how to check a delivery: run as written, against a real one."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [code] = [block.split("```", 1)[0] for block in readme.split("```python\n") if "def delivery_is_ours(" in block]
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the project's own README, to keep its example true
    delivery_is_ours = namespace["delivery_is_ours"]

    group, _ = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    old = endpoint.secret
    new = services.endpoint_rotate_secret(endpoint=endpoint, actor="test")
    post_lead(group="emea")
    [webhook] = Delivery.objects.filter(
        pk__in=services.outbox_dispatch(message_id=OutboxMessage.objects.get().id), channel="webhook"
    )
    assert services.delivery_attempt(delivery_id=webhook.id) is None
    [request] = receiver.requests
    header, body = request["headers"]["X-Signature"], request["body"]
    assert delivery_is_ours(old, header, body) and delivery_is_ours(new, header, body)
    assert not delivery_is_ours("another secret", header, body)
    assert not delivery_is_ours(new, header, body + b" ")
    assert not delivery_is_ours(new, header, body, tolerance=-1)  # too old


def test_an_endpoint_whose_secret_the_keys_no_longer_open_holds_up_no_other_notification(
    post_lead, make_group, receiver, settings
):
    """Sealed under a key this process no longer has (made from a shell with another
    SECRET_KEY): its group's fan-out raised, the whole chunk with it, so no e-mail and no
    other group's webhook went out, again at every drain and sweep."""
    from cryptography.fernet import Fernet

    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    emea, _ = make_group(1, slug="emea")
    apac, _ = make_group(1, slug="apac")
    settings.SECRET_BOX_KEYS = [old_key]
    WebhookEndpoint.objects.create(group=emea, url=receiver.url)
    settings.SECRET_BOX_KEYS = [new_key]
    WebhookEndpoint.objects.create(group=apac, url=receiver.url)
    post_lead(group="emea")
    post_lead(group="apac")
    assert services.outbox_dispatch_pending(older_than_s=0) == 2
    for delivery in Delivery.objects.order_by("id"):
        services.delivery_attempt(delivery_id=delivery.id)
    slugs = {emea.id: "emea", apac.id: "apac"}
    outcomes = {
        (slugs[d.message.group_id], d.channel): (d.status, d.last_error)
        for d in Delivery.objects.select_related("message")
    }
    assert (
        outcomes[("emea", "email")][0] == outcomes[("apac", "email")][0] == outcomes[("apac", "webhook")][0] == "sent"
    )
    status, error = outcomes[("emea", "webhook")]
    assert status == "pending" and error.startswith("not sent: A stored secret cannot be decrypted"), error
    assert len(mail.outbox) == 2 and len(receiver.requests) == 1


def test_a_leads_messages_arriving_out_of_order_carry_the_order_they_were_written_in(
    post_lead, make_group, receiver, settings
):
    """After a receiver's outage a lead's escalation arrived before its assignment (each
    delivery is retried on its own), and a CRM applying what came last kept the stale owner."""
    from leads import actions
    from leads.models import Assignment

    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(2, slug="emea", sla_minutes="30")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    lead_id = post_lead(group="emea").json()["id"]
    Assignment.objects.filter(lead_id=lead_id).update(due_at=timezone.now() - timedelta(seconds=1))
    actions.escalation_sweep()
    services.outbox_dispatch_pending(older_than_s=0)
    for delivery in Delivery.objects.order_by("-id"):  # the later event delivered first
        services.delivery_attempt(delivery_id=delivery.id)
    arrived = [json.loads(r["body"]) for r in receiver.requests]
    assert [doc["event"] for doc in arrived] == ["lead.escalated", "lead.assigned"]
    latest = max(arrived, key=lambda doc: doc["sequence"])  # what a receiver keeps
    assert latest["event"] == "lead.escalated" and latest["lead"]["owner"]["id"] == reps[1].id
    assert all(doc["id"] == f"msg_{doc['sequence']}" for doc in arrived)


def _sent_emails(event: str) -> list:
    """Fans out and sends the messages of `event` not dispatched yet; the e-mails they sent."""
    mail.outbox.clear()
    for message in OutboxMessage.objects.filter(event=event, dispatched_at__isnull=True).order_by("id"):
        for delivery_id in services.outbox_dispatch(message_id=message.id):
            assert services.delivery_attempt(delivery_id=delivery_id) is None
    return list(mail.outbox)


def test_a_rep_a_lead_moves_away_from_is_told_by_email_and_no_webhook_hears_of_it(post_lead, make_group):
    # A rep whose lead was escalated, reassigned or rerouted away heard nothing and could go on
    # working a lead someone else now owned.
    from leads import actions
    from leads.models import Assignment

    group, (first, second) = make_group(2, slug="emea", sla_minutes=5)
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/")
    lead_id = post_lead(group="emea", company="Acme").json()["id"]
    assignment = Assignment.objects.get(lead_id=lead_id)
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        assert actions.lead_escalate(assignment_id=assignment.pk).outcome == "escalated"
    [told] = _sent_emails("lead.moved_away")
    assert told.to == [first.email] and told.subject == f"Lead #{lead_id} is no longer yours"
    assert (
        f"Lead #{lead_id} is no longer yours: it was not accepted by its due time, and went to another rep."
        in told.body
    )
    assert "Acme" in told.body and "Accept" not in told.body and "/leads/accept/" not in told.body
    message = OutboxMessage.objects.get(event="lead.moved_away")
    assert message.group_id is None and not message.deliveries.filter(channel="webhook").exists()

    actions.lead_reassign(lead_id=lead_id, rep_id=first.pk, reason="covering", actor="test")
    [told] = _sent_emails("lead.moved_away")
    assert told.to == [second.email] and "no longer yours: a manager gave it to another rep." in told.body

    group.memberships.update(active=False)
    actions.lead_reroute(lead_id=lead_id, actor="test")
    [told] = _sent_emails("lead.moved_away")
    assert told.to == [first.email] and "no longer yours: it was routed again, to the fallback queue." in told.body

    # A queued lead given by hand moves away from nobody.
    group.memberships.update(active=True)
    actions.lead_reassign(lead_id=lead_id, rep_id=second.pk, reason="covering", actor="test")
    assert _sent_emails("lead.moved_away") == []
    assert OutboxMessage.objects.filter(event="lead.moved_away").count() == 3


def test_an_escalation_to_the_queue_tells_the_rep_who_missed_it(post_lead, make_group):
    from leads import actions
    from leads.models import Assignment

    group, [rep] = make_group(1, slug="emea", sla_minutes=5, max_attempts=1)
    lead_id = post_lead(group="emea").json()["id"]
    assignment = Assignment.objects.get(lead_id=lead_id)
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with transaction.atomic():
        assert actions.lead_escalate(assignment_id=assignment.pk).outcome == "queued"
    [told] = _sent_emails("lead.moved_away")
    assert told.to == [rep.email]
    assert "no longer yours: it was not accepted by its due time, and went to the fallback queue." in told.body


def test_accepting_and_closing_a_lead_tell_the_groups_webhooks_and_email_nobody(post_lead, make_group):
    # The CRM showed a lead as waiting for its rep until the SLA ran out, and open for good.
    from leads import actions

    group, [rep] = make_group(1, slug="emea", sla_minutes=5)
    WebhookEndpoint.objects.create(group=group, url="http://127.0.0.1:9/")
    lead_id = post_lead(group="emea").json()["id"]
    actions.lead_accept(lead_id=lead_id, rep_id=rep.pk, actor="test")
    actions.lead_accept(lead_id=lead_id, rep_id=rep.pk, actor="test")  # twice: a no-op, told once
    actions.lead_close(lead_id=lead_id, outcome="won", actor="test")
    accepted, closed = OutboxMessage.objects.filter(event__in=["lead.accepted", "lead.closed"]).order_by("id")
    assert (accepted.event, accepted.group_id, accepted.rep_id, accepted.payload["reason"]) == (
        "lead.accepted",
        group.id,
        rep.id,
        "accepted",
    )
    assert accepted.payload["lead"]["status"] == "accepted" and accepted.payload["attempt"] == 1
    assert (closed.event, closed.payload["reason"], closed.payload["lead"]["status"]) == (
        "lead.closed",
        "won",
        "closed",
    )
    for message in (accepted, closed):
        deliveries = Delivery.objects.filter(id__in=services.outbox_dispatch(message_id=message.id))
        assert [d.channel for d in deliveries] == ["webhook"]
        body = json.loads(services.webhook_body(deliveries[0]))
        assert body["event"] == message.event and body["lead"]["owner"]["id"] == rep.id
        assert body["sequence"] > OutboxMessage.objects.get(event="lead.assigned").id


def test_a_lead_of_no_group_given_by_hand_then_rerouted_to_the_queue_tells_its_rep(post_lead, make_group):
    from leads import actions
    from tests.factories import RepFactory

    rep = RepFactory()
    lead_id = post_lead().json()["id"]  # no rule, no group named, no default group: queued
    actions.lead_reassign(lead_id=lead_id, rep_id=rep.pk, reason="covering", actor="test")
    group, _ = make_group(1, slug="catchall", is_default=True)
    group.memberships.update(active=False)
    assert actions.lead_reroute(lead_id=lead_id, actor="test").status == "queued"
    [told] = _sent_emails("lead.moved_away")
    assert told.to == [rep.email] and "routed again, to the fallback queue" in told.body
