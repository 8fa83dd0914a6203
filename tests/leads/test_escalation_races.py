"""Accept, timer and sweep racing on real PostgreSQL with real threads: whatever the order,
each lead ends either accepted by its owner (never escalated) or escalated exactly once (and
the late accept is a 409), and no rep has it twice."""

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions
from leads.models import Assignment, Lead
from rotation.models import Rep, RotationState
from tests.conftest import lead_body
from tests.factories import api_client_with
from tests.leads.test_concurrency import waiting_on_locks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


RACE_ROUND = 2  # leads raced at once: 4 connections each, within a shared server's max_connections


def test_accept_timer_and_sweep_race(api, make_group):
    group, reps = make_group(3, slug="race", sla_minutes="10")
    ids = [api.post("/api/v1/leads/", lead_body(group="race"), format="json").json()["id"] for _ in range(20)]
    firsts = {a.lead_id: a for a in Assignment.objects.filter(lead_id__in=ids)}
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

    # A few leads at a time (each thread holds a connection of its own: 4 per lead), falling
    # due together so that their escalations also meet on the group's rotation row.
    for start in range(0, len(ids), RACE_ROUND):
        round_ids = ids[start : start + RACE_ROUND]
        Assignment.objects.filter(lead_id__in=round_ids).update(due_at=timezone.now() - timedelta(milliseconds=1))
        threads = [
            threading.Thread(target=run, args=(lead_id, what))
            for lead_id in round_ids
            for what in ("timer", "accept", "sweep", "timer")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread hung"
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


def started(target, errors: list[BaseException]) -> threading.Thread:
    """`target` in a thread (and a database connection) of its own; what it raises is kept in
    `errors`, for the test to surface."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for_lock_waiters(n: int = 1, errors: list[BaseException] | None = None) -> None:
    """Returns once `n` transactions wait on a lock; else fails with what the threads raised."""
    deadline = time.monotonic() + 10
    while waiting_on_locks() < n and time.monotonic() < deadline:
        if errors:
            break
        time.sleep(0.02)
    assert waiting_on_locks() >= n, errors


def wait_for_a_waiter_on(blocker_pid: int, errors: list[BaseException]) -> None:
    """Returns once a transaction waits on a lock that the backend `blocker_pid` holds. Not
    any lock wait: the one a thread is still leaving (its lock just released) may linger in
    `pg_stat_activity` for a moment, and a test would read the next step's state too soon."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND %s = ANY(pg_blocking_pids(pid))"
    )

    def waiters() -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql, [blocker_pid])
            return cursor.fetchone()[0]

    deadline = time.monotonic() + 10
    while waiters() < 1 and time.monotonic() < deadline and not errors:
        time.sleep(0.02)
    assert waiters() >= 1, errors


def holding(lock, locked: threading.Event, release: threading.Event):
    """A transaction that takes `lock` (a callable), says so, and commits when released."""

    def run() -> None:
        with transaction.atomic():
            lock()
            locked.set()
            release.wait(30)

    return run


def _lead_row_locked(lead_id: int) -> bool:
    """Whether another transaction holds the lead's row lock (asked from a connection of its own)."""
    out: dict[str, bool] = {}

    def probe() -> None:
        try:
            with transaction.atomic():
                Lead.objects.select_for_update(nowait=True).filter(pk=lead_id).first()
            out["locked"] = False
        except DatabaseError:
            out["locked"] = True

    started(probe, []).join(10)
    return out["locked"]


def test_reassign_of_a_lead_moved_meanwhile_starts_over_in_lock_order(api, make_group):
    """A reassign reads the lead's group, locks that rotation row and waits on the lead, which a
    reroute is moving to another group. When the move commits, the reassign must not lock the
    new group's rotation row while holding the lead's (the other order: a deadlock with anyone
    routing that lead in its new group); it starts over and waits holding nothing."""
    g1, _reps1 = make_group(2, slug="from")
    g2, reps2 = make_group(2, slug="to")
    lead_id = api.post("/api/v1/leads/", lead_body(group="from"), format="json").json()["id"]
    target = reps2[0].id
    moved, commit_move = threading.Event(), threading.Event()
    blocked, release_block = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def move() -> None:  # a reroute's write, paused with the lead row locked
        Lead.objects.select_for_update().get(pk=lead_id)
        Lead.objects.filter(pk=lead_id).update(group_id=g2.id)

    blocker_pid: list[int] = []

    def block() -> None:  # someone routing in the new group, holding its rotation row
        RotationState.objects.select_for_update(no_key=True).get(group_id=g2.id)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            blocker_pid.append(cursor.fetchone()[0])

    mover = started(holding(move, moved, commit_move), errors)
    blocker = started(holding(block, blocked, release_block), errors)
    assert moved.wait(10) and blocked.wait(10)
    worker = started(lambda: actions.lead_reassign(lead_id=lead_id, rep_id=target, reason="r", actor="test"), errors)
    try:
        wait_for_lock_waiters(errors=errors)  # the reassign holds the old group's rotation row, waits on the lead
        commit_move.set()
        mover.join(10)
        wait_for_a_waiter_on(blocker_pid[0], errors)  # now it waits on the new group's rotation row...
        assert not _lead_row_locked(lead_id), "the reassign holds the lead's row while waiting on a rotation row"
    finally:
        commit_move.set()
        release_block.set()
        for t in (mover, blocker, worker):
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
    group, reps = make_group(3, slug="g")
    lead_id = api.post("/api/v1/leads/", lead_body(group="g"), format="json").json()["id"]
    owner = Lead.objects.get(pk=lead_id).owner_id
    target = next(r for r in reps if r.id != owner)
    deactivated, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    outcome: dict = {}

    def reassign() -> None:
        try:
            actions.lead_reassign(lead_id=lead_id, rep_id=target.id, reason="by hand", actor="test")
            outcome["result"] = "reassigned"
        except actions.ActionRejected as exc:
            outcome["result"] = exc.errors

    deactivate = lambda: Rep.objects.filter(pk=target.id).update(active=False)  # noqa: E731
    first = started(holding(deactivate, deactivated, commit), errors)
    assert deactivated.wait(10)
    second = started(reassign, errors)
    try:
        wait_for_lock_waiters()
    finally:
        commit.set()
        first.join(30)
        second.join(30)
        connection.close()
    assert not errors, errors
    assert outcome["result"] == {"rep": [f"Rep {target.id} is inactive."]}
    assert Lead.objects.get(pk=lead_id).owner_id == owner
    assert not AuditEvent.objects.filter(lead_id=lead_id, type=AuditEvent.Type.LEAD_REASSIGNED).exists()


def test_an_intake_of_an_address_a_lead_is_leaving_waits_for_the_edit(api, make_group):
    """An email edit holds both addresses' intake locks: a post of the old address, arriving
    while the edit is in flight, waits for it and is then a new lead, not a `duplicate_of` a
    lead that no longer has that address (the post would be lost)."""
    make_group(2, slug="g")
    lead_id = api.post("/api/v1/leads/", lead_body(group="g", email="old@acme.example"), format="json").json()["id"]
    _client, token = api_client_with(["intake"])
    edited, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    outcome: dict = {}

    def edit() -> None:  # the edit's locks held until the enclosing transaction commits
        actions.lead_update(lead_id=lead_id, changes={"email": "new@acme.example"}, actor="test")

    def intake() -> None:
        r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
            "/api/v1/leads/", {"email": "OLD@acme.example", "group": "g"}, content_type="application/json"
        )
        outcome["status"], outcome["body"] = r.status_code, r.json()

    editor = started(holding(edit, edited, commit), errors)
    assert edited.wait(10)
    poster = started(intake, errors)
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
