"""The batch writers in routing_project.bulkdb give the rows Django's bulk_create and
bulk_update would: every value type the escalation batch writes (text with quotes, null and
set foreign keys, times and nulls, counters, JSON), each row its own values, nothing else
touched. Runs on PostgreSQL (arrays and COPY) and on the embedded SQLite (the fallback)."""

from datetime import UTC, datetime, timedelta

import pytest

from leads.models import Lead, LeadStatus
from notifications.models import OutboxMessage
from routing_project.bulkdb import objects_create, objects_update

from ..factories import GroupFactory, RepFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def _lead(n: int, **fields) -> Lead:
    return Lead.objects.create(
        email=f"b{n}@example.com",
        email_normalized=f"b{n}@example.com",
        status=LeadStatus.QUEUED,
        created_at=T0,
        **fields,
    )


def test_objects_update_writes_each_rows_own_values_and_nothing_else():
    group, other = GroupFactory(), GroupFactory()
    rep = RepFactory()
    leads = [_lead(n, group=group, company=f"Co {n}") for n in range(4)]
    untouched = _lead(99, group=group, queue_reason="stays")

    leads[0].status, leads[0].owner, leads[0].assigned_at = LeadStatus.ASSIGNED, rep, T0 + timedelta(minutes=1)
    leads[0].queue_reason, leads[0].escalations = "", 3
    leads[1].queue_reason, leads[1].group = 'O\'Brien said "later"; \\ and ,{} too', other
    leads[2].sla_due_at, leads[2].group = T0 + timedelta(hours=2, microseconds=7), None
    leads[3].attributes = {"tier": "gold", "seats": [1, 2], "nested": {"ok": True, "none": None}}
    fields = ["status", "owner", "group", "assigned_at", "sla_due_at", "queue_reason", "escalations", "attributes"]

    assert objects_update(Lead, leads, fields) == 4

    for lead in leads:
        stored = Lead.objects.get(pk=lead.pk)
        for name in fields:
            attname = Lead._meta.get_field(name).attname
            assert getattr(stored, attname) == getattr(lead, attname), (lead.pk, name)
        assert stored.company == lead.company
    assert Lead.objects.get(pk=untouched.pk).queue_reason == "stays"
    assert objects_update(Lead, [], fields) == 0


def test_objects_create_sets_ids_and_saves_every_value():
    group, rep = GroupFactory(), RepFactory()
    before = OutboxMessage.objects.count()
    messages = [
        OutboxMessage(event="lead.assigned", lead_id=10, group=group, rep=rep, payload={"n": 1}, created_at=T0),
        OutboxMessage(event="lead.escalated", lead_id=11, group=None, rep=None, payload={}, created_at=T0),
    ]

    objects_create(OutboxMessage, messages)

    assert all(m.pk is not None and not m._state.adding for m in messages)
    assert OutboxMessage.objects.count() == before + 2
    first, second = (OutboxMessage.objects.get(pk=m.pk) for m in messages)
    assert (first.event, first.lead_id, first.group_id, first.rep_id, first.payload) == (
        "lead.assigned",
        10,
        group.pk,
        rep.pk,
        {"n": 1},
    )
    assert (second.group_id, second.rep_id, second.payload, second.dispatched_at) == (None, None, {}, None)
    # Saved instances behave as saved: a later save() updates the same row.
    messages[1].dispatched_at = T0
    messages[1].save(update_fields=["dispatched_at"])
    assert OutboxMessage.objects.get(pk=messages[1].pk).dispatched_at == T0
