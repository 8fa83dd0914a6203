"""Lead events to announce (webhook per group, e-mail to the rep), through the outbox.

Call `lead_notify` inside the transaction that assigned or escalated the lead, after the
lead row has its new owner: it writes one outbox row (one INSERT) and the delivery runs in
Celery after commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notifications.models import OutboxMessage
from notifications.services import outbox_add

from .models import Lead

# The lead's fields in a webhook payload (the owner is added at delivery time).
PAYLOAD_FIELDS = (
    "id",
    "status",
    "email",
    "first_name",
    "last_name",
    "company",
    "phone",
    "country",
    "region",
    "source",
    "product",
    "score",
    "company_size",
    "external_id",
)


def lead_payload(lead: Lead, **extra: Any) -> dict[str, Any]:
    """Plain data only: no queries when `lead.group` is loaded (intake sets it)."""
    doc: dict[str, Any] = {f: getattr(lead, f) for f in PAYLOAD_FIELDS}
    doc["group"] = lead.group.slug if lead.group is not None else None
    doc["attributes"] = lead.attributes or {}
    for name in ("created_at", "assigned_at", "sla_due_at"):
        value: datetime | None = getattr(lead, name)
        doc[name] = value.isoformat() if value else None
    return {"lead": doc, **extra}


def lead_notify(*, lead: Lead, event: str, reason: str, attempt: int, at: datetime | None = None) -> None:
    """Announces that `lead` now belongs to `lead.owner` (event "lead.assigned" or "lead.escalated")."""
    outbox_add(
        event=event,
        lead_id=lead.id,
        group_id=lead.group_id,
        rep_id=lead.owner_id,
        payload=lead_payload(lead, reason=reason, attempt=attempt),
        at=at,
    )


def lead_notify_message(*, lead: Lead, event: str, reason: str, attempt: int, at: datetime) -> OutboxMessage:
    """The unsaved outbox row, for batch routing (`notifications.services.outbox_add_many`)."""
    return OutboxMessage(
        event=event,
        lead_id=lead.id,
        group_id=lead.group_id,
        rep_id=lead.owner_id,
        payload=lead_payload(lead, reason=reason, attempt=attempt),
        created_at=at,
    )
