"""Accept, timer and sweep racing on real PostgreSQL with real threads: whatever the order,
each lead ends either accepted by its owner (never escalated) or escalated exactly once (and
the late accept is a 409), and no rep has it twice."""

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions
from leads.models import Assignment, Lead
from tests.conftest import lead_body

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


def test_accept_timer_and_sweep_race(api, make_group):
    group, reps = make_group(3, slug="race", sla_minutes="10")
    ids = [api.post("/api/v1/leads/", lead_body(group="race"), format="json").json()["id"] for _ in range(20)]
    firsts = {a.lead_id: a for a in Assignment.objects.filter(lead_id__in=ids)}
    Assignment.objects.filter(lead_id__in=ids).update(due_at=timezone.now() - timedelta(milliseconds=1))
    outcomes: dict[int, list] = {lead_id: [] for lead_id in ids}
    errors: list[BaseException] = []

    def run(lead_id: int, what: str) -> None:
        try:
            a = firsts[lead_id]
            if what == "accept":
                time.sleep(random.uniform(0, 0.3))  # sometimes before the escalation, sometimes after
                try:
                    actions.lead_accept(lead_id=lead_id, rep_id=a.rep_id, actor="test")
                    outcomes[lead_id].append("accepted")
                except actions.LeadConflict:
                    outcomes[lead_id].append("conflict")
            elif what == "timer":
                actions.lead_escalate(assignment_id=a.id)
            else:
                actions.lead_escalate(assignment_id=a.id, actor="system:sweep", skip_locked=True)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(lead_id, what))
        for lead_id in ids
        for what in ("timer", "accept", "sweep", "timer")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert {str(v) for v in outcomes.values()} <= {"['accepted']", "['conflict']"}
    for lead_id in ids:
        lead = Lead.objects.get(pk=lead_id)
        escalated = AuditEvent.objects.filter(lead_id=lead_id, type="lead.escalated").count()
        rows = list(Assignment.objects.filter(lead_id=lead_id).order_by("attempt"))
        assert len({a.rep_id for a in rows}) == len(rows)
        assert sum(1 for a in rows if a.ended_at is None) == 1
        if outcomes[lead_id] == ["accepted"]:
            assert escalated == 0 and lead.status == "accepted" and lead.owner_id == firsts[lead_id].rep_id
            assert len(rows) == 1
        else:
            assert outcomes[lead_id] == ["conflict"]
            assert escalated == 1 and len(rows) == 2 and lead.status == "assigned"
            assert lead.owner_id != firsts[lead_id].rep_id


def _lead_row_locked(lead_id: int) -> bool:
    """Whether another transaction holds the lead's row lock (asked from a connection of its own)."""
    from django.db import DatabaseError, connections, transaction

    out: dict[str, bool] = {}

    def probe() -> None:
        try:
            with transaction.atomic():
                Lead.objects.select_for_update(nowait=True).filter(pk=lead_id).first()
            out["locked"] = False
        except DatabaseError:
            out["locked"] = True
        finally:
            connections.close_all()

    t = threading.Thread(target=probe)
    t.start()
    t.join(10)
    return out["locked"]


def test_reassign_of_a_lead_moved_meanwhile_starts_over_in_lock_order(api, make_group):
    """A reassign reads the lead's group, locks that rotation row and waits on the lead, which a
    reroute is moving to another group. When the move commits, the reassign must not lock the
    new group's rotation row while holding the lead's (the other order: a deadlock with anyone
    routing that lead in its new group); it starts over and waits holding nothing."""
    from django.db import connection, transaction

    from rotation.models import RotationState
    from tests.leads.test_concurrency import waiting_on_locks

    g1, _reps1 = make_group(2, slug="from")
    g2, reps2 = make_group(2, slug="to")
    lead_id = api.post("/api/v1/leads/", lead_body(group="from"), format="json").json()["id"]
    target = reps2[0].id
    mover_locked, mover_commit = threading.Event(), threading.Event()
    blocker_locked, blocker_release = threading.Event(), threading.Event()
    outcome: dict = {}
    errors: list[BaseException] = []

    def mover() -> None:  # a reroute's write, paused with the lead row locked
        try:
            with transaction.atomic():
                Lead.objects.select_for_update().get(pk=lead_id)
                Lead.objects.filter(pk=lead_id).update(group_id=g2.id)
                mover_locked.set()
                mover_commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def blocker() -> None:  # someone routing in the new group, holding its rotation row
        try:
            with transaction.atomic():
                RotationState.objects.select_for_update(no_key=True).get(group_id=g2.id)
                blocker_locked.set()
                blocker_release.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def reassign() -> None:
        try:
            outcome["lead"] = actions.lead_reassign(lead_id=lead_id, rep_id=target, reason="by hand", actor="test")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 10
        while waiting_on_locks() < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waiting_on_locks() >= n

    threads = [threading.Thread(target=mover), threading.Thread(target=blocker)]
    for t in threads:
        t.start()
    assert mover_locked.wait(10) and blocker_locked.wait(10)
    worker = threading.Thread(target=reassign)
    worker.start()
    try:
        wait_for(1)  # the reassign holds the old group's rotation row and waits on the lead
        mover_commit.set()
        threads[0].join(10)
        wait_for(1)  # now it waits on the new group's rotation row...
        assert not _lead_row_locked(lead_id), "the reassign holds the lead's row while waiting on a rotation row"
    finally:
        mover_commit.set()
        blocker_release.set()
        for t in [*threads, worker]:
            t.join(30)
        connection.close()
    assert not errors, errors
    lead = Lead.objects.get(pk=lead_id)
    assert (lead.group_id, lead.owner_id, lead.status) == (g2.id, target, "assigned")
    assert AuditEvent.objects.filter(lead_id=lead_id, type=AuditEvent.Type.LEAD_REASSIGNED).count() == 1
    assert Assignment.objects.filter(lead_id=lead_id, ended_at__isnull=True).count() == 1


def test_reassign_to_a_rep_deactivated_meanwhile_is_refused(api, make_group):
    """The rep is read under its row lock inside the reassign's transaction: a deactivation
    committing while the reassign waits is seen, and the lead stays where it was."""
    from django.db import connection, transaction

    from rotation.models import Rep
    from tests.leads.test_concurrency import waiting_on_locks

    group, reps = make_group(3, slug="g")
    lead_id = api.post("/api/v1/leads/", lead_body(group="g"), format="json").json()["id"]
    owner = Lead.objects.get(pk=lead_id).owner_id
    target = next(r for r in reps if r.id != owner)
    locked, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    outcome: dict = {}

    def deactivate() -> None:
        try:
            with transaction.atomic():
                Rep.objects.filter(pk=target.id).update(active=False)
                locked.set()
                commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def reassign() -> None:
        try:
            actions.lead_reassign(lead_id=lead_id, rep_id=target.id, reason="by hand", actor="test")
            outcome["result"] = "reassigned"
        except actions.ActionRejected as exc:
            outcome["result"] = exc.errors
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=deactivate)
    first.start()
    assert locked.wait(10)
    second = threading.Thread(target=reassign)
    second.start()
    try:
        deadline = time.monotonic() + 10
        while waiting_on_locks() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        commit.set()
        first.join(30)
        second.join(30)
        connection.close()
    assert not errors, errors
    assert outcome["result"] == {"rep": [f"Rep {target.id} is inactive."]}
    lead = Lead.objects.get(pk=lead_id)
    assert lead.owner_id == owner
    assert not AuditEvent.objects.filter(lead_id=lead_id, type=AuditEvent.Type.LEAD_REASSIGNED).exists()


def test_an_intake_of_an_address_a_lead_is_leaving_waits_for_the_edit(api, make_group):
    """An email edit holds both addresses' intake locks: a post of the old address, arriving
    while the edit is in flight, waits for it and is then a new lead, not a `duplicate_of` a
    lead that no longer has that address (the post would be lost)."""
    from django.db import connection, transaction
    from django.test import Client

    from tests.factories import api_client_with
    from tests.leads.test_concurrency import waiting_on_locks

    make_group(2, slug="g")
    lead_id = api.post("/api/v1/leads/", lead_body(group="g", email="old@acme.example"), format="json").json()["id"]
    _client, token = api_client_with(["intake"])
    edited, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    outcome: dict = {}

    def edit() -> None:
        try:
            with transaction.atomic():  # the edit's locks held until this commits
                actions.lead_update(lead_id=lead_id, changes={"email": "new@acme.example"}, actor="test")
                edited.set()
                commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def intake() -> None:
        try:
            r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
                "/api/v1/leads/", {"email": "OLD@acme.example", "group": "g"}, content_type="application/json"
            )
            outcome["status"], outcome["body"] = r.status_code, r.json()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    editor = threading.Thread(target=edit)
    editor.start()
    assert edited.wait(10)
    poster = threading.Thread(target=intake)
    poster.start()
    try:
        deadline = time.monotonic() + 10
        while waiting_on_locks() < 1 and time.monotonic() < deadline and poster.is_alive():
            time.sleep(0.02)
    finally:
        commit.set()
        editor.join(30)
        poster.join(30)
        connection.close()
    assert not errors, errors
    assert outcome["status"] == 201, outcome
    assert outcome["body"]["duplicate_of"] is None and outcome["body"]["id"] != lead_id
    assert Lead.objects.get(pk=lead_id).email_normalized == "new@acme.example"
