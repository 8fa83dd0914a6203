"""SLA escalation with a real Celery worker and beat on Redis (not eager mode), on PostgreSQL.

SLAs here are seconds long (sla_minutes 0.03 = 1.8 s); the worker's beat sweeps every second.
"""

import math
import re
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.summary import event_summary
from leads import scheduling
from leads.models import Assignment, Lead
from rotation.models import Membership
from tests.celery_worker import broker_at, broker_unreachable, wait_for
from tests.conftest import lead_body

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("celery"),
]


def post(api, **fields) -> dict:
    r = api.post("/api/v1/leads/", lead_body(**fields), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def escalations(lead_id: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(lead_id=lead_id, type="lead.escalated").order_by("id"))


def escalations_of(lead_id: int, attempt: int) -> list[AuditEvent]:
    """The escalations of one assignment (the next owner's short SLA may run out too)."""
    return [e for e in escalations(lead_id) if e.explanation["missed_attempt"] == attempt]


def check_history(lead_id: int) -> list[Assignment]:
    """Invariants over everything recorded: attempts 1..n, one open assignment at most, no rep twice."""
    rows = list(Assignment.objects.filter(lead_id=lead_id).order_by("attempt"))
    assert [a.attempt for a in rows] == list(range(1, len(rows) + 1))
    assert sum(1 for a in rows if a.ended_at is None) <= 1
    assert len({a.rep_id for a in rows}) == len(rows)
    return rows


def test_timer_escalates_within_two_seconds_of_due(api, make_group, celery_worker_factory):
    group, reps = make_group(3, slug="fast", sla_minutes="0.03")
    worker = celery_worker_factory(beat=False)  # no sweep to race it: only the timer escalates
    worker.start()
    lead = post(api, group="fast")
    due = Lead.objects.get(pk=lead["id"]).sla_due_at
    assert wait_for(lambda: escalations(lead["id"]), timeout=10), worker.log()
    (event,) = escalations(lead["id"])[:1]
    late = (event.at - due).total_seconds()
    assert 0 <= late < 2.0, late
    assert event.actor == "system:sla" and event.explanation["trigger"] == "timer"
    assert event.explanation["from_rep"] == reps[0].id and event.rep_id == reps[1].id
    assert re.fullmatch(r"[0-9a-f-]{36}", event.request_id), event.request_id  # the timer task's id
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.owner_id == reps[1].id and stored.escalations >= 1
    rows = check_history(lead["id"])
    assert rows[0].end_reason == "sla_missed" and rows[1].reason == "escalation"


def test_a_burst_into_one_group_is_escalated_by_its_slice_timers(api, make_group, celery_worker_factory):
    # 20 leads into one group in a moment: their timers are the group's slices (0.25 s each),
    # a few tasks that each escalate what is due, every lead within 2 s of its due time.
    group, reps = make_group(3, slug="fast", sla_minutes="0.05")  # 3 s
    worker = celery_worker_factory(beat=False)  # no sweep: only the timers escalate
    worker.start()
    leads = [post(api, group="fast")["id"] for _ in range(20)]
    dues = dict(Lead.objects.filter(pk__in=leads).values_list("id", "sla_due_at"))

    def first() -> list[AuditEvent]:
        return list(AuditEvent.objects.filter(type="lead.escalated", explanation__missed_attempt=1))

    assert wait_for(lambda: len(first()) == 20, timeout=20), worker.log()
    log = worker.log_path.read_text(errors="replace")
    for event in first():
        late = (event.at - dues[event.lead_id]).total_seconds()
        assert 0 <= late < 2.0, (event.lead_id, late)
        assert event.actor == "system:sla" and event.explanation["trigger"] == "timer"
    width = settings.ESCALATION_TIMER_SLICE_S
    slices = {math.ceil(due.timestamp() / width) for due in dues.values()}
    # Read after the log: every timer it shows is for an assignment written by then.
    after = list(Assignment.objects.filter(lead_id__in=leads, attempt__gte=2).values_list("due_at", flat=True))
    later = {math.ceil(due.timestamp() / width) for due in after}
    # Timers published, by task id: a timer retried (its group's rotation row busy on a loaded
    # machine) is received again under the same id, and is not a second timer.
    received = len(set(re.findall(r"leads\.tasks\.escalate_group_due\[([0-9a-f-]+)\]", log)))
    # The test's process publishes each first slice once; each of the worker's two pool
    # processes may publish a slice of the next owners' due times once; no assignment has a
    # timer of its own.
    assert 0 < received <= len(slices) + 2 * len(later), (received, slices, later)
    assert "leads.tasks.escalate_assignment[" not in log
    for lead_id in leads:
        check_history(lead_id)


def test_accept_just_before_due_keeps_the_lead(api, make_group, celery_worker):
    group, reps = make_group(2, slug="fast", sla_minutes="0.05")
    lead = post(api, group="fast")
    due = Lead.objects.get(pk=lead["id"]).sla_due_at
    # A second before: the accept commits before the due time even on a loaded machine (a
    # request there can take a few hundred milliseconds), and the timer then finds it accepted.
    time.sleep(max(0.0, (due - timezone.now()).total_seconds() - 1.0))
    r = api.post(f"/api/v1/leads/{lead['id']}/accept/", {"rep": reps[0].id}, format="json")
    assert r.status_code == 200, r.content
    assert Lead.objects.get(pk=lead["id"]).accepted_at < due
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 2.5)  # the timer and two sweeps have run
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.status == "accepted" and stored.owner_id == reps[0].id and stored.escalations == 0
    assert escalations(lead["id"]) == []
    assert len(check_history(lead["id"])) == 1


def test_a_duplicate_delivery_escalates_once(api, make_group, celery_worker):
    group, reps = make_group(3, slug="fast", sla_minutes="0.03")
    lead = post(api, group="fast")
    assignment = Assignment.objects.get(lead_id=lead["id"])
    for _ in range(3):  # the same timer delivered again, several times, plus the sweep
        assert scheduling.publish(scheduling.ESCALATE_TASK, args=[assignment.id], eta=assignment.due_at)
    assert wait_for(lambda: escalations(lead["id"]), timeout=10), celery_worker.log()
    time.sleep(2.5)
    assert len(escalations_of(lead["id"], 1)) == 1
    rows = check_history(lead["id"])
    assert rows[0].end_reason == "sla_missed" and rows[1].reason == "escalation"


def test_max_attempts_then_the_queue(api, make_group, celery_worker):
    group, reps = make_group(3, slug="fast", sla_minutes="0.02", max_attempts=2)
    lead = post(api, group="fast")
    assert wait_for(lambda: Lead.objects.get(pk=lead["id"]).status == "queued", timeout=12), celery_worker.log()
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.owner_id is None and "max_attempts (2)" in stored.queue_reason and stored.escalations == 2
    first, second = escalations(lead["id"])
    assert first.rep_id == reps[1].id and second.rep_id is None and second.explanation["queued"] is True
    rows = check_history(lead["id"])
    assert [a.rep_id for a in rows] == [reps[0].id, reps[1].id] and all(a.ended_at for a in rows)


def test_auto_pause_after_consecutive_misses(api, make_group, celery_worker):
    group, reps = make_group(2, slug="fast", sla_minutes="0.02", auto_pause_after_misses=2, max_attempts=1)
    Membership.objects.filter(group=group, rep=reps[1]).update(active=False)  # reps[0] takes every lead
    leads = [post(api, group="fast"), post(api, group="fast")]
    member = Membership.objects.get(group=group, rep=reps[0])
    assert wait_for(lambda: not Membership.objects.get(pk=member.pk).active, timeout=12), celery_worker.log()
    member.refresh_from_db()
    assert member.paused_reason == "auto-paused after 2 consecutive SLA misses"
    (event,) = AuditEvent.objects.filter(
        type="membership.changed", rep_id=reps[0].id, explanation__action="auto_paused"
    )
    assert event.actor in ("system:sla", "system:sweep") and event.explanation["consecutive_misses"] == 2
    assert all(Lead.objects.get(pk=lead["id"]).status == "queued" for lead in leads)
    view = api.get("/api/v1/groups/fast/rotation/").json()
    (shown,) = [m for m in view["members"] if m["rep"]["id"] == reps[0].id]
    assert shown["eligible"] is False and "auto-paused" in shown["reason"]


def test_worker_killed_mid_escalation_loses_nothing_and_assigns_once(api, make_group, celery_worker_factory):
    group, reps = make_group(3, slug="fast", sla_minutes="0.02")
    worker = celery_worker_factory()
    worker.start()
    lead = post(api, group="fast")
    # Hold the lead's row: the worker's escalation blocks on it, mid-transaction.
    holder_ready, release, killed = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Lead.objects.select_for_update().get(pk=lead["id"])
                holder_ready.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holder_ready.wait(5)

    def worker_waits_on_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return cursor.fetchone()[0] > 0

    try:
        assert wait_for(worker_waits_on_lock, timeout=10, interval=0.01), worker.log()
        worker.kill()
        killed.set()
    finally:
        release.set()
        holder.join(10)
    assert killed.is_set()
    time.sleep(0.5)
    assert escalations(lead["id"]) == []  # the killed transaction committed nothing
    assert Lead.objects.get(pk=lead["id"]).owner_id == reps[0].id
    # A new worker: the sweep (the lost message is only redelivered after the visibility timeout).
    fresh = celery_worker_factory()
    fresh.start()
    assert wait_for(lambda: escalations(lead["id"]), timeout=10), fresh.log()
    time.sleep(2.5)
    (event,) = escalations_of(lead["id"], 1)
    # Usually the sweep; the killed worker's unacknowledged timer may also come back: either
    # way, exactly one escalation.
    assert event.actor in ("system:sweep", "system:sla") and event.rep_id == reps[1].id
    rows = check_history(lead["id"])
    assert [a.rep_id for a in rows][:2] == [reps[0].id, reps[1].id]


def test_redis_down_during_intake_then_the_sweep_catches_up(api, make_group, celery_worker_factory):
    group, reps = make_group(2, slug="fast", sla_minutes="0.02")
    with broker_unreachable():
        started = time.monotonic()
        leads = [post(api, group="fast") for _ in range(3)]
        elapsed = time.monotonic() - started
        readyz = api.get("/readyz")
    assert elapsed < 3.0, elapsed  # intake did not wait on the broker
    assert all(lead["status"] == "assigned" for lead in leads)
    assert readyz.status_code == 200 and readyz.json()["status"] == "degraded"
    time.sleep(1.5)  # all three are overdue now, and no timer was ever published
    worker = celery_worker_factory()
    worker.start()
    for lead in leads:
        assert wait_for(lambda lead=lead: escalations(lead["id"]), timeout=10), worker.log()
    time.sleep(1.5)
    for lead in leads:
        (event,) = escalations_of(lead["id"], 1)
        assert event.actor == "system:sweep"
        check_history(lead["id"])
    assert Lead.objects.filter(pk__in=[lead["id"] for lead in leads]).count() == 3


def test_redis_stopped_and_restarted_loses_nothing(api, make_group, celery_worker_factory, private_redis):
    """A real outage: the broker process dies while leads come in, then comes back; the
    worker reconnects by itself and the sweep escalates what was missed, once each."""
    group, reps = make_group(3, slug="fast", sla_minutes="0.03")
    worker = celery_worker_factory(env={"CELERY_BROKER_URL": private_redis.url, "REDIS_URL": private_redis.url})
    with broker_at(private_redis.url):
        worker.start()
        before = post(api, group="fast")  # its timer is in Redis when Redis dies
        private_redis.stop()
        started = time.monotonic()
        during = [post(api, group="fast") for _ in range(3)]
        assert time.monotonic() - started < 3.0  # intake did not wait on the broker
        time.sleep(8.0)  # Celery's own consumer would be waiting 8 s before its fourth try by now
        private_redis.start()
        leads = [before, *during]
        for lead in leads:
            assert wait_for(lambda lead=lead: escalations_of(lead["id"], 1), timeout=30), worker.log()
    for lead in leads:
        assert len(escalations_of(lead["id"], 1)) == 1
        check_history(lead["id"])
    # The worker (and its beat, if it first connected during the outage) tried every second
    # (BROKER_RECONNECT_EVERY_S), not 2 s, 4 s, 6 s ... up to 30 s apart.
    waits = [
        float(s) for s in re.findall(r"Trying again in ([0-9.]+) seconds?", worker.log_path.read_text(errors="replace"))
    ]
    assert len(waits) >= 5 and set(waits) == {1.0}, waits


def test_a_lead_waiting_when_the_groups_sla_is_removed_is_not_escalated(api, make_group, celery_worker):
    group, reps = make_group(2, slug="fast", sla_minutes="0.03")
    lead = post(api, group="fast")
    assignment = Assignment.objects.get(lead_id=lead["id"])
    r = api.patch("/api/v1/groups/fast/", {"sla_minutes": None}, format="json")
    assert r.status_code == 200, r.content
    # Its timer still fires at the old due time: it finds no SLA to enforce and clears the due time.
    assert wait_for(lambda: Lead.objects.get(pk=lead["id"]).sla_due_at is None, timeout=10), celery_worker.log()
    time.sleep(2.5)  # and two sweeps have run since
    stored = Lead.objects.get(pk=lead["id"])
    assert stored.status == "assigned" and stored.owner_id == reps[0].id and stored.escalations == 0
    assert escalations(lead["id"]) == []
    assignment.refresh_from_db()
    assert assignment.ended_at is None and assignment.due_at is None
    (event,) = AuditEvent.objects.filter(lead_id=lead["id"], type="lead.changed")
    assert event.explanation["fields"] == ["sla_due_at"] and "SLA was removed" in event.explanation["because"]
    summary = event_summary(type=event.type, explanation=event.explanation, rep_id=event.rep_id, names={})
    assert summary == "SLA due time cleared: the group's SLA was removed; the lead stays with its rep."
    assert api.get(f"/api/v1/leads/{lead['id']}/").json()["sla_due_at"] is None


def test_a_members_row_lock_takes_that_row_alone(api, make_group):
    """Escalation (holding the group's rows as routing does) locks the member's row to count
    a miss, and a member's edit locks it first. Each must lock the member's row only: a lock
    query joining the group's row (as the model's ordering makes `first()` do) took it FOR
    UPDATE too, and an edit and an escalation of the same member deadlocked."""
    from django.test.utils import CaptureQueriesContext

    from leads import actions
    from rotation import services

    group, reps = make_group(2, slug="emea", sla_minutes="1")
    lead = post(api, group="emea")
    member = Membership.objects.get(group=group, rep=reps[1])
    member.max_open = 3
    with CaptureQueriesContext(connection) as edit:
        services.membership_update(membership=member, actor="t", changed=["max_open"])
    assignment = Assignment.objects.get(lead_id=lead["id"])
    Assignment.objects.filter(pk=assignment.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with CaptureQueriesContext(connection) as escalation:
        assert actions.lead_escalate(assignment_id=assignment.id).outcome == "escalated"
    locks = [
        q["sql"]
        for q in [*edit.captured_queries, *escalation.captured_queries]
        if q["sql"].startswith('SELECT "rotation_membership"') and "FOR UPDATE" in q["sql"]
    ]
    assert len(locks) == 2, locks
    assert all("rotation_group" not in sql and sql.endswith('FOR UPDATE OF "rotation_membership"') for sql in locks)
