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
