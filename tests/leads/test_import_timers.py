"""The SLA timers of imported leads, with a real Celery worker on Redis and no beat: a batch
whose due time is within the timer horizon escalates at that time, by its own timer."""

import pytest
from django.core.management import call_command

from audit.models import AuditEvent
from leads.models import Lead
from tests.celery_worker import wait_for

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("celery"),
]


def test_an_imported_batch_due_within_the_horizon_escalates_by_its_timer(make_group, celery_worker_factory, tmp_path):
    _group, reps = make_group(3, slug="fast", sla_minutes="0.03")  # 1.8 s
    worker = celery_worker_factory(beat=False)  # no sweep, no arm: only a published timer escalates
    worker.start()
    csv_path = tmp_path / "leads.csv"
    csv_path.write_text("email,group\n" + "".join(f"i{n}@example.com,fast\n" for n in range(6)))
    call_command("import_leads", str(csv_path), "--no-progress")
    leads = list(Lead.objects.order_by("id"))
    assert len(leads) == 6 and all(lead.sla_due_at for lead in leads)

    def first_escalations() -> list[AuditEvent]:
        # The first assignment's (the next owner's short SLA runs out in turn).
        events = AuditEvent.objects.filter(type="lead.escalated", explanation__missed_attempt=1)
        return list(events.order_by("lead_id"))

    assert wait_for(lambda: len(first_escalations()) == 6, timeout=15), worker.log()
    for event, lead in zip(first_escalations(), leads, strict=True):
        assert event.lead_id == lead.id
        assert event.at >= lead.sla_due_at  # at its due time, not before (how soon: `measure_escalation`)
        assert event.actor == "system:sla" and event.explanation["trigger"] == "timer"
        assert event.explanation["from_rep"] == lead.owner_id and event.rep_id != lead.owner_id
        assert event.rep_id in {rep.id for rep in reps}
