"""Lead events to announce (webhook per group, e-mail to the rep; an e-mail to a rep a lead
moved away from), through the outbox.

Call `lead_notify` inside the transaction that assigned or escalated the lead, after the
lead row has its new owner: it writes one outbox row (one INSERT) and the delivery runs in
Celery after commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from notifications.models import OutboxMessage
from notifications.services import MOVED_AWAY, outbox_announce_on_commit, outbox_message
from rotation.models import Group

from .models import LEAD_DATA_FIELDS, Lead

# The lead's fields in a webhook payload (the owner is added at delivery time).
PAYLOAD_FIELDS = ("id", "status", *LEAD_DATA_FIELDS)
TIME_FIELDS = ("created_at", "assigned_at", "sla_due_at")


def lead_payload(lead: Lead, **extra: Any) -> dict[str, Any]:
    """Plain data only: no queries when `lead.group` is loaded (intake sets it)."""
    values = {f: getattr(lead, f) for f in (*PAYLOAD_FIELDS, *TIME_FIELDS, "attributes", "queue_reason")}
    return lead_payload_values(values, lead.group.slug if lead.group is not None else None, **extra)


def lead_payload_values(values: Mapping[str, Any], group: str | None, **extra: Any) -> dict[str, Any]:
    """The same from a lead's column values (batch routing writes rows, not models)."""
    doc: dict[str, Any] = {f: values.get(f) for f in PAYLOAD_FIELDS}
    doc["group"] = group or None
    doc["attributes"] = values.get("attributes") or {}
    # Why a queued lead is queued (null otherwise, as in the API's lead).
    doc["queue_reason"] = values.get("queue_reason") or None
    for name in TIME_FIELDS:
        value: datetime | None = values.get(name)
        doc[name] = value.isoformat() if value else None
    return {"lead": doc, **extra}


def lead_notify(
    *, lead: Lead, event: str, reason: str, attempt: int, at: datetime | None = None, group: Group | None = None
) -> None:
    """Announces that `lead` now belongs to `lead.owner` (event "lead.assigned" or
    "lead.escalated", which e-mail the rep too), or that its owner accepted or closed it
    ("lead.accepted", "lead.closed": webhooks only), to the webhooks of `group` (default: the
    lead's group)."""
    message = lead_outbox_message(lead=lead, event=event, reason=reason, attempt=attempt, at=at, group=group)
    message.save(force_insert=True)
    outbox_announce_on_commit(message.id)


def lead_notify_left(*, lead: Lead, group: Group, reason: str, attempt: int, at: datetime) -> None:
    """Announces to `group`'s webhooks that `lead`, which a rep of it held, was rerouted away
    (event "lead.rerouted"): into the queue (owner null, reason "queued") or to a rep of another
    group (that rep, the new assignment's reason). The payload says where the lead is now. No
    e-mail: the new owner, if any, has the assignment's."""
    message = lead_outbox_message(lead=lead, event="lead.rerouted", reason=reason, attempt=attempt, at=at, group=group)
    message.payload["lead"]["group"] = lead.group.slug if lead.group is not None else None
    message.save(force_insert=True)
    outbox_announce_on_commit(message.id)


def lead_moved_away_message(*, lead: Lead, rep_id: int, why: str, at: datetime) -> OutboxMessage:
    """The e-mail telling `rep_id`, who held `lead`, that it is no longer theirs (`why`: "not
    accepted by its due time, it went to another rep"...), so that nobody works a lead someone
    else now owns. No group: no webhook (the group's webhooks hear of the move by the lead's
    own message). Unsaved, for the caller's transaction."""
    return outbox_message(
        event=MOVED_AWAY, lead_id=lead.id, group_id=None, rep_id=rep_id, payload=lead_payload(lead, why=why), at=at
    )


def lead_notify_moved_away(*, lead: Lead, rep_id: int, why: str, at: datetime) -> None:
    """`lead_moved_away_message`, written and announced after commit."""
    message = lead_moved_away_message(lead=lead, rep_id=rep_id, why=why, at=at)
    message.save(force_insert=True)
    outbox_announce_on_commit(message.id)


def lead_outbox_message(
    *, lead: Lead, event: str, reason: str, attempt: int, at: datetime | None = None, group: Group | None = None
) -> OutboxMessage:
    """The outbox row `lead_notify` writes, unsaved (intake writes it with the lead, whose id
    it does not have yet: routing_sql.lead_insert_with puts it in the payload)."""
    if group is None:
        payload = lead_payload(lead, reason=reason, attempt=attempt)
        group_id = lead.group_id
    else:
        values = {f: getattr(lead, f) for f in (*PAYLOAD_FIELDS, *TIME_FIELDS, "attributes", "queue_reason")}
        payload = lead_payload_values(values, group.slug, reason=reason, attempt=attempt)
        group_id = group.id
    # A lead not written yet has no id: its writer fills it in (0 meanwhile).
    return outbox_message(
        event=event, lead_id=lead.id or 0, group_id=group_id, rep_id=lead.owner_id, payload=payload, at=at
    )
