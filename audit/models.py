from django.db import models
from django.db.models.fields.json import KT

# An event by which a lead enters the fallback queue: queued at intake, or escalated or
# rerouted to no rep (AuditEvent.Type's values). PostgreSQL uses audit_queue_entry_at_idx only
# for a query whose condition implies the index's, so the dashboard filters by this very one.
QUEUE_ENTRY = models.Q(type__in=["lead.queued", "lead.escalated", "lead.rerouted"], rep_id__isnull=True)


class AuditEvent(models.Model):
    """One thing that happened, append-only.

    The references are plain values, not foreign keys: deleting a group or a rep must never
    touch (and could never update) the trail. PostgreSQL rejects UPDATE and DELETE on this
    table (see the migration's trigger).
    """

    class Type(models.TextChoices):
        LEAD_RECEIVED = "lead.received"
        LEAD_ASSIGNED = "lead.assigned"
        LEAD_QUEUED = "lead.queued"
        LEAD_DUPLICATE = "lead.duplicate"
        LEAD_ACCEPTED = "lead.accepted"
        LEAD_ESCALATED = "lead.escalated"
        LEAD_REASSIGNED = "lead.reassigned"
        LEAD_REROUTED = "lead.rerouted"
        LEAD_CLOSED = "lead.closed"
        LEAD_CHANGED = "lead.changed"
        GROUP_CHANGED = "group.changed"
        MEMBERSHIP_CHANGED = "membership.changed"
        RULE_CHANGED = "rule.changed"
        REP_CHANGED = "rep.changed"
        ABSENCE_CHANGED = "absence.changed"
        ACCOUNT_CHANGED = "account.changed"
        CLIENT_CHANGED = "client.changed"

    id = models.BigAutoField(primary_key=True)
    type = models.CharField(max_length=40, choices=Type.choices)
    at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=200)
    lead_id = models.BigIntegerField(null=True, blank=True)  # looked up through audit_lead_id_idx
    group = models.CharField(max_length=64, blank=True, default="")
    rep_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    explanation = models.JSONField(default=dict)
    request_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["id"]
        # Every index is written twice per routed lead (two events): exact matches only, none twice.
        indexes = [
            models.Index(fields=["lead_id", "id"], name="audit_lead_id_idx"),
            # A group's events newest first (the trail filtered by group, a page deep) read in
            # the index's order instead of sorting every event of the group.
            models.Index(fields=["group", "id"], name="audit_group_id_idx"),
            # The queue's entries (an event that leaves a lead without a rep), by time, for the
            # dashboard's queue depth: else it reads the whole trail, a second at 450,000
            # events. Written for those events only. The condition is QUEUE_ENTRY's, exactly.
            models.Index(fields=["at"], condition=QUEUE_ENTRY, name="audit_queue_entry_at_idx"),
            # The external ids of the leads taken in as duplicates (no lead row holds them): a
            # re-run of an import skips those rows (leads/bulk.py). Written for duplicates only.
            models.Index(
                KT("explanation__external_id"),
                condition=models.Q(type="lead.duplicate"),
                name="audit_duplicate_external_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.id}"
