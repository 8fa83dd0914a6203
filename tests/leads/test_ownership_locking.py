"""Ownership is looked up before the lock, but decided after it (real threads, PostgreSQL)."""

import threading
import time

import pytest

from leads.models import Assignment
from rotation.models import Account, Membership
from tests.factories import api_client_with
from tests.leads.test_concurrency import hold_rotation_lock, http_client, post, run_threads, waiting_on_locks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


@pytest.mark.parametrize("pause_owner", [True, False])
def test_owner_paused_while_the_request_waits_does_not_get_the_lead(make_group, pause_owner):
    group, (a, b) = make_group(2, slug="g")
    Account.objects.create(domain="acme.example", owner=b)
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder() -> None:
        hold_rotation_lock(group.id, locked, release)

    def requester() -> None:
        locked.wait(10)
        r = post(http_client(token), {"email": "jane@acme.example", "group": "g"})
        outcome["status"], outcome["body"] = r.status_code, r.json()

    def controller() -> None:
        locked.wait(10)
        deadline = time.monotonic() + 10
        while waiting_on_locks() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        # The account's owner was found before the lock; the request now waits on the row.
        if pause_owner:
            Membership.objects.filter(group=group, rep=b).update(active=False)
        release.set()

    run_threads(3, lambda i: (holder, requester, controller)[i]())
    assert outcome["status"] == 201
    expected, reason = (a.id, "rotation") if pause_owner else (b.id, "owner_match")
    assert outcome["body"]["owner"]["id"] == expected
    assert Assignment.objects.get(lead_id=outcome["body"]["id"]).reason == reason
