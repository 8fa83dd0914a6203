"""A rep accepts a lead from the link in its notification e-mail: no login, no token; the
link is signed, expires, and works only while that rep owns the lead; GET changes nothing."""

import re
import socket
import time

import pytest
from django.core import mail
from django.db import connection
from django.test import Client

from audit.models import AuditEvent
from leads import actions
from leads.accept_link import accept_path
from leads.models import Assignment, Lead
from notifications import services as notify
from notifications.models import Delivery, OutboxMessage
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def routed(api, make_group):
    _group, reps = make_group(2, slug="emea", sla_minutes=30)
    body = api.post("/api/v1/leads/", lead_body(group="emea", company="Acme", phone="+33 1 23 45 67 89"), format="json")
    lead = Lead.objects.get(pk=body.json()["id"])
    return lead, reps


def emailed_link(lead: Lead) -> str:
    message = OutboxMessage.objects.get(lead_id=lead.id, event="lead.assigned")
    for delivery_id in notify.outbox_dispatch(message_id=message.id):
        if Delivery.objects.get(pk=delivery_id).channel == "email":
            notify.delivery_attempt(delivery_id=delivery_id)
    [email] = mail.outbox
    match = re.search(r"Accept it: https?://[^/]+(/leads/accept/[^/\s]+/)", email.body)
    assert match, email.body
    return match.group(1)


def test_the_owner_accepts_from_the_emailed_link_and_the_sla_stops(routed):
    lead, _reps = routed
    path = emailed_link(lead)
    browser = Client(enforce_csrf_checks=True)
    page = browser.get(path)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Accept this lead" in html and lead.email in html and "Acme" in html  # the owner sees contacts
    assert Lead.objects.get(pk=lead.pk).status == "assigned"  # looking changes nothing
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    done = browser.post(path, {"csrfmiddlewaretoken": token})
    assert done.status_code == 200 and "Accepted" in done.content.decode()
    lead.refresh_from_db()
    assert lead.status == "accepted" and lead.accepted_at is not None
    assert Assignment.objects.get(lead=lead).accepted_at is not None  # escalation stops
    event = AuditEvent.objects.get(type="lead.accepted", lead_id=lead.id)
    assert event.actor == f"rep-link:{lead.owner_id}"
    again = browser.get(path)
    assert again.status_code == 200 and "You have accepted this lead" in again.content.decode()


def test_the_page_gives_the_due_time_on_the_reps_clock_as_the_email_does(routed):
    lead, _reps = routed
    owner = lead.owner
    owner.timezone = "America/New_York"
    owner.save(update_fields=["timezone"])
    path = emailed_link(lead)
    [email] = mail.outbox
    due = re.search(r"Accept before: (.+)", email.body).group(1).strip()
    assert due.endswith("(America/New_York)")
    page = Client().get(path).content.decode()
    assert f"<dt>Accept before</dt><dd>{due}</dd>" in page


def test_a_post_without_the_pages_csrf_token_accepts_nothing(routed):
    lead, _reps = routed
    r = Client(enforce_csrf_checks=True).post(accept_path(lead_id=lead.id, rep_id=lead.owner_id))
    assert r.status_code == 403
    assert Lead.objects.get(pk=lead.pk).status == "assigned"


def test_once_the_lead_moved_the_old_owners_link_shows_no_contact_and_accepts_nothing(routed):
    lead, reps = routed
    old = lead.owner_id
    other = next(r for r in reps if r.id != old)
    actions.lead_reassign(lead_id=lead.id, rep_id=other.id, reason="test", actor="test")
    path = accept_path(lead_id=lead.id, rep_id=old)
    page = Client().get(path)
    assert page.status_code == 409
    assert lead.email not in page.content.decode() and "no longer yours" in page.content.decode()
    assert "Accept before" not in page.content.decode()  # the new owner's deadline is not theirs
    assert Client().post(path).status_code == 409
    assert Lead.objects.get(pk=lead.pk).status == "assigned"


def test_a_tampered_or_expired_link_is_refused(routed, settings):
    lead, reps = routed
    path = accept_path(lead_id=lead.id, rep_id=lead.owner_id)
    token = path.split("/")[-2]
    forged = path.replace(token, token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert Client().get(forged).status_code == 404
    assert Client().get("/leads/accept/not-a-token/").status_code == 404
    settings.ACCEPT_LINK_MAX_AGE_S = 1
    time.sleep(2.1)
    expired = Client().get(path)
    assert expired.status_code == 410 and lead.email not in expired.content.decode()
    assert Client().post(path).status_code == 410
    assert Lead.objects.get(pk=lead.pk).status == "assigned"


def test_the_links_token_never_reaches_the_logs(routed, caplog):
    lead, _reps = routed
    path = accept_path(lead_id=lead.id, rep_id=lead.owner_id)
    token = path.split("/")[-2]
    with caplog.at_level("INFO"):
        assert Client().get(path).status_code == 200
    lines = [record.getMessage() for record in caplog.records]
    assert any("/leads/accept/[redacted]/" in line for line in lines), lines
    # The filter redacts at the handler: what a handler would write carries no token.
    from security.redaction import redact

    assert token not in redact(f"GET {path} 200") and token not in redact(f"Accept it: https://x.example{path}")


def test_a_lead_locked_right_now_is_a_503_to_retry_not_a_500(routed, monkeypatch):
    from leads.routing import RoutingBusy

    lead, _reps = routed
    path = accept_path(lead_id=lead.id, rep_id=lead.owner_id)

    def busy(**kwargs):
        raise RoutingBusy()  # what lead_accept raises when the lead's row stays locked

    monkeypatch.setattr(actions, "lead_accept", busy)
    r = Client().post(path)
    assert r.status_code == 503 and r["Retry-After"] == "1" and "try again" in r.content.decode()
    assert Lead.objects.get(pk=lead.pk).status == "assigned"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_link_opened_while_the_database_is_away_is_a_503_to_retry(routed, monkeypatch):
    lead, _reps = routed
    path = accept_path(lead_id=lead.id, rep_id=lead.owner_id)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the connection is refused
    params = connection.get_connection_params()
    connection.close()
    with monkeypatch.context() as m:
        m.setattr(connection, "get_connection_params", lambda: {**params, "port": port})
        for answer in (Client().get(path), Client().post(path)):
            assert answer.status_code == 503 and answer["Retry-After"] == "2"
            assert "database is unavailable" in answer.content.decode()
    connection.close()
    assert Client().post(path).status_code == 200  # the database back: the same link works
    assert Lead.objects.get(pk=lead.id).status == "accepted"
