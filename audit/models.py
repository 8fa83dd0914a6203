from django.db import models
from django.db.models.fields.json import KT


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
            models.Index(fields=["group"], name="audit_group_idx"),
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
