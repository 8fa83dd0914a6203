"""What an operator sees and can do after a receiver was away: the hold an unreachable endpoint
earns, sending failed deliveries again, and the delivery log's search."""

import socket
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from notifications import services
from notifications.models import Delivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def dead_url() -> str:
    """An address nothing listens on: every send is refused (no answer at all)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks/leads"


def dispatched(group, rep, lead_id: int) -> int:
    """A `lead.assigned` message for `lead_id`, fanned out: its one webhook delivery's id."""
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned", lead_id=lead_id, group_id=group.id, rep_id=rep.id, payload={}
        )
    [delivery_id] = services.outbox_dispatch(message_id=message.id)
    return delivery_id


@pytest.fixture
def given_up(make_group, settings):
    """An endpoint that gave no answer to a delivery's only attempt: the delivery ended failed.
    Returns (group, rep, endpoint, delivery id)."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_MAX_ATTEMPTS = 1
    settings.NOTIFY_BACKOFF_BASE_S = 600  # a hold, if one were set, would outlast the test
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=dead_url())
    delivery_id = dispatched(group, reps[0], 7)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    assert Delivery.objects.get(pk=delivery_id).status == "failed"
    return group, reps[0], endpoint, delivery_id


def test_a_delivery_given_up_on_holds_nothing_after_it(given_up, receiver):
    """The hold lasts until the failed delivery's next try: one given up on has none. A receiver
    back a minute later gets the next lead at once, not after the backoff of a try that will
    never come (up to NOTIFY_BACKOFF_MAX_S, half an hour)."""
    group, rep, endpoint, _ = given_up
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is None
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url)  # the receiver is back
    delivery_id = dispatched(group, rep, 8)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts) == ("sent", 1)
    assert len(receiver.requests) == 1


def test_sending_again_lifts_the_endpoints_hold(given_up, receiver, admin_client, django_capture_on_commit_callbacks):
    """Sales ops send a failed delivery again once its receiver is back: it goes now, even when
    the endpoint is still held by another delivery's try that got no answer."""
    _group, _rep, endpoint, delivery_id = given_up
    held_until = timezone.now() + timedelta(minutes=30)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url, unreachable_until=held_until)
    with django_capture_on_commit_callbacks(execute=False):
        r = admin_client.post(
            "/admin/notifications/delivery/",
            {"action": "send_again", "_selected_action": [delivery_id]},
            follow=True,
        )
    assert "1 delivery will be sent again." in r.content.decode()
    endpoint.refresh_from_db()
    assert endpoint.unreachable_until is None
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.attempts, d.last_status_code) == ("sent", 1, 200)
    assert len(receiver.requests) == 1


@pytest.mark.parametrize("path", ["/admin/notifications/delivery/", "/admin/notifications/outboxmessage/"])
@pytest.mark.parametrize("term", ["²", "①", "7²"])
def test_a_search_for_a_digit_that_is_no_number_finds_nothing(admin_client, given_up, path, term):
    """A "²" is a digit to str.isdigit() but no number: the log searched for it finds
    nothing, rather than failing and showing every delivery as if each matched."""
    r = admin_client.get(path, {"q": term})
    assert r.status_code == 200
    assert r.context["cl"].result_count == 0


def test_credentials_in_the_address_are_sent_as_basic_auth_and_shown_masked(
    make_group, receiver, settings, admin_client, client
):
    """An endpoint's address may carry a user and password for a receiver behind HTTP Basic
    authentication: they are sent (http.client alone dropped them, and the receiver refused
    every delivery), and the delivery log, the audit trail and the endpoint's name, which staff
    who may not see the endpoints read, show the password masked."""
    import base64

    from django.contrib.auth.models import Group as Role
    from django.contrib.auth.models import User

    from audit.models import AuditEvent

    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1, slug="emea")
    url = receiver.url.replace("http://", "http://crm:p%40ss-w0rd@")
    r = admin_client.post("/admin/notifications/webhookendpoint/add/", {"group": group.pk, "url": url, "active": "on"})
    assert r.status_code == 200
    assert "p%40ss" not in r.content.decode() and "crm:***@" in r.content.decode()  # the secret's page
    endpoint = WebhookEndpoint.objects.get(group=group)
    assert endpoint.url == url
    listed = admin_client.get("/admin/notifications/webhookendpoint/").content.decode()
    assert "p%40ss" not in listed and "crm:***@" in listed
    rotated = admin_client.post(
        "/admin/notifications/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": [endpoint.pk]},
    ).content.decode()
    assert "p%40ss" not in rotated and "crm:***@" in rotated
    endpoint.refresh_from_db()
    delivery_id = dispatched(group, reps[0], 7)
    assert services.delivery_attempt(delivery_id=delivery_id) is None
    [request] = receiver.requests
    assert request["headers"]["Authorization"] == "Basic " + base64.b64encode(b"crm:p@ss-w0rd").decode()
    d = Delivery.objects.get(pk=delivery_id)
    assert d.status == "sent"
    assert d.target == receiver.url.replace("http://", "http://crm:***@")
    assert "p%40ss" not in str(endpoint)
    created = AuditEvent.objects.get(type=AuditEvent.Type.CLIENT_CHANGED, explanation__change="created")
    assert "p%40ss" not in str(created.explanation) and "crm:***@" in created.explanation["url"]

    auditor = User.objects.create_user("auditor", password="x", is_staff=True)
    auditor.groups.add(Role.objects.get(name="Auditors"))
    client.force_login(auditor)
    for page in ("/admin/notifications/delivery/", f"/admin/notifications/delivery/{delivery_id}/change/"):
        r = client.get(page)
        assert r.status_code == 200
        assert "p%40ss" not in r.content.decode() and "p@ss" not in r.content.decode()


def test_a_redirect_says_where_to(make_group, settings):
    """A 3xx is not followed: the log says where the receiver points, the address to correct."""
    from http.server import BaseHTTPRequestHandler

    from tests.notifications.test_notifications import serving

    class Moved(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(308)
            self.send_header("Location", "https://crm.example/v2/hooks")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1)
    with serving(Moved) as base:
        WebhookEndpoint.objects.create(group=group, url=f"{base}/hooks")
        delivery_id = dispatched(group, reps[0], 7)
        assert services.delivery_attempt(delivery_id=delivery_id) is not None
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.last_status_code) == ("pending", 308)
    assert d.last_error == "HTTP 308: Location: https://crm.example/v2/hooks"


def test_the_drain_fans_out_a_message_stamped_by_a_clock_ahead_of_its_own(make_group, settings):
    """The outbox row's time is the web host's clock; the drain runs on the notify worker's. A
    web host a few milliseconds ahead stamped messages "in the future" for the worker, and the
    drain left them to the sweep (up to NOTIFY_SWEEP_GRACE_S plus its period late): the drain
    takes every message committed, whatever its time; only the sweep waits out its grace."""
    from notifications import tasks

    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1)
    WebhookEndpoint.objects.create(group=group, url=dead_url())
    with transaction.atomic():
        message = services.outbox_add(
            event="lead.assigned",
            lead_id=7,
            group_id=group.id,
            rep_id=reps[0].id,
            payload={},
            at=timezone.now() + timedelta(seconds=2),
        )
    assert tasks.outbox_drain() == 1
    message.refresh_from_db()
    assert message.dispatched_at is not None
    assert Delivery.objects.filter(message=message).count() == 1


def test_a_delivery_to_an_endpoint_moved_to_another_group_is_not_sent_again(
    make_group, receiver, settings, admin_client
):
    """An endpoint moved to another group gets none of the first group's leads: the delivery log
    does not say such a delivery "will be sent again", only for it to end failed at its try."""
    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1, slug="emea")
    other, _ = make_group(1, slug="apac")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    delivery_id = dispatched(group, reps[0], 7)
    r = admin_client.post(
        f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/",
        {"group": other.pk, "url": receiver.url, "active": "on"},
    )
    assert r.status_code == 302
    assert Delivery.objects.get(pk=delivery_id).status == "failed"
    r = admin_client.post(
        "/admin/notifications/delivery/",
        {"action": "send_again", "_selected_action": [delivery_id]},
        follow=True,
    )
    assert "0 deliveries will be sent again. 1 left as they are" in r.content.decode()
    assert "moved to another group" in r.content.decode()
    d = Delivery.objects.get(pk=delivery_id)
    assert (d.status, d.last_error) == ("failed", "the endpoint was moved to another group")
    assert receiver.requests == []


def test_deliveries_held_by_an_endpoint_that_stays_down_end_after_their_attempts(make_group, settings):
    """Each delivery is retried until NOTIFY_MAX_ATTEMPTS, about three hours, however many wait
    for one endpoint that stays down: a try that falls while another delivery's unanswered try
    holds the endpoint is not sent but counts, and each goes on along its own backoff. Held
    tries spent no attempt before, and only the delivery that ended the hold advanced: five
    deliveries still pending after three rounds, four of them with no attempt at all."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_MAX_ATTEMPTS = 3
    settings.NOTIFY_BACKOFF_BASE_S = 600  # the hold outlasts the test
    group, reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(group=group, url=dead_url())
    ids = [dispatched(group, reps[0], lead_id) for lead_id in range(7, 12)]
    for _round in range(3):
        due = Delivery.objects.filter(pk__in=ids, status="pending")
        due.update(next_attempt_at=timezone.now() - timedelta(seconds=1))  # each one's own retry time
        for delivery_id in ids:
            services.delivery_attempt(delivery_id=delivery_id)
        endpoint.refresh_from_db()
        assert endpoint.unreachable_until is not None  # the first try's hold, all along
    deliveries = Delivery.objects.filter(pk__in=ids).order_by("id")
    assert [(d.status, d.attempts) for d in deliveries] == [("failed", 3)] * 5
    assert deliveries[0].last_error.startswith("not sent: the endpoint gave another delivery no answer")


def test_a_held_try_waits_for_its_own_backoff_or_the_hold_whichever_is_later(make_group, settings):
    """Not sent while held, a delivery is due again at its own backoff, or when the hold ends
    if that is later: the deliveries of a held endpoint do not all come due at its end."""
    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_BACKOFF_BASE_S = 60
    group, reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(group=group, url=dead_url())
    first, second = dispatched(group, reps[0], 7), dispatched(group, reps[0], 8)
    hold = timezone.now() + timedelta(seconds=5)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(unreachable_until=hold)
    wait = services.delivery_attempt(delivery_id=first)
    assert wait is not None and 60 <= wait <= 75  # its own backoff, past the hold's end
    hold = timezone.now() + timedelta(seconds=600)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(unreachable_until=hold)
    wait = services.delivery_attempt(delivery_id=second)
    assert wait is not None and 590 <= wait <= 600
    assert Delivery.objects.get(pk=second).next_attempt_at == hold


def test_metrics_count_each_try_by_outcome_and_the_deliveries_pending(
    make_group, settings, receiver, django_capture_on_commit_callbacks
):
    """A dead CRM receiver showed only in the admin's delivery log: /metrics now counts the
    tries (sent, retry, failed) and the deliveries still pending, by channel."""
    from tests.ops.test_metrics import scrape, value

    settings.NOTIFY_REP_EMAIL = False
    settings.NOTIFY_MAX_ATTEMPTS = 2
    group, reps = make_group(1, slug="emea")
    WebhookEndpoint.objects.create(group=group, url=receiver.url)
    receiver.statuses = [500, 500, 200]
    before = scrape()
    first, second = dispatched(group, reps[0], 7), dispatched(group, reps[0], 8)
    assert value(scrape(), "leadrouter_deliveries_pending", channel="webhook") == 2
    with django_capture_on_commit_callbacks(execute=True):
        services.delivery_attempt(delivery_id=first)  # 500: tried again later
        Delivery.objects.filter(pk=first).update(next_attempt_at=timezone.now())  # its backoff over
        services.delivery_attempt(delivery_id=first)  # 500 on its last attempt: given up
        services.delivery_attempt(delivery_id=second)  # 200
    after = scrape()

    def tries(outcome: str) -> float:
        name = "leadrouter_deliveries_total"
        return value(after, name, channel="webhook", outcome=outcome) - value(
            before, name, channel="webhook", outcome=outcome
        )

    assert (tries("retry"), tries("failed"), tries("sent")) == (1, 1, 1)
    assert value(after, "leadrouter_deliveries_pending", channel="webhook") == 0
    assert ("leadrouter_deliveries_pending", (("channel", "email"),)) in after  # 0, not missing


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_try_that_ends_a_hold_leaves_the_groups_rotation_free(make_group, settings, receiver):
    """The delivery that tries an endpoint again after a hold locks the endpoint's row for the
    send. Through the model's ordering (by group) it locked the group's row too: while a hung
    receiver took its timeout, the group's intake waited on that row and answered 503."""
    import threading

    from django.db import connection

    settings.NOTIFY_REP_EMAIL = False
    group, reps = make_group(1, slug="emea")
    endpoint = WebhookEndpoint.objects.create(group=group, url=receiver.url)
    delivery_id = dispatched(group, reps[0], 7)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(unreachable_until=timezone.now() - timedelta(seconds=1))
    receiver.answering.clear()  # the receiver hangs until told

    def send() -> None:
        try:
            services.delivery_attempt(delivery_id=delivery_id)
        finally:
            connection.close()  # this thread's own

    sending = threading.Thread(target=send)
    sending.start()
    try:
        deadline = timezone.now() + timedelta(seconds=10)
        while not receiver.requests:  # the send is under way, its locks held
            assert timezone.now() < deadline
            threading.Event().wait(0.05)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '500ms'")
            # The group's row as routing takes it (leads/routing.py: FOR NO KEY UPDATE OF the group).
            cursor.execute("SELECT id FROM rotation_group WHERE id = %s FOR NO KEY UPDATE", [group.pk])
            assert cursor.fetchone() == (group.pk,)
    finally:
        receiver.answering.set()
        sending.join(timeout=30)
    assert Delivery.objects.get(pk=delivery_id).status == "sent"
