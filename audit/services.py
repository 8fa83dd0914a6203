"""The one way to write the audit trail."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from routing_project.logging import request_id_var

from .models import AuditEvent


@dataclass
class Event:
    type: str
    actor: str
    lead_id: int | None = None
    group: str = ""
    rep_id: int | None = None
    explanation: dict[str, Any] = field(default_factory=dict)


def audit_record(
    *,
    type: str,
    actor: str,
    lead_id: int | None = None,
    group: str = "",
    rep_id: int | None = None,
    explanation: dict[str, Any] | None = None,
    request_id: str | None = None,
) -> AuditEvent:
    return audit_record_many(
        events=[Event(type, actor, lead_id, group, rep_id, explanation or {})], request_id=request_id
    )[0]


def audit_record_many(*, events: Iterable[Event], request_id: str | None = None) -> list[AuditEvent]:
    """Writes several events in one INSERT (inside the caller's transaction)."""
    return AuditEvent.objects.bulk_create(audit_build(events=events, request_id=request_id))


def audit_build(*, events: Iterable[Event], request_id: str | None = None) -> list[AuditEvent]:
    """The rows `audit_record_many` writes, unsaved: for a caller that writes them in a
    statement of its own (intake writes a lead and its events in one)."""
    now = timezone.now()
    rid = request_id if request_id is not None else request_id_var.get()
    return [
        AuditEvent(
            type=e.type,
            at=now,
            actor=e.actor[:200],
            lead_id=e.lead_id,
            group=e.group or "",
            rep_id=e.rep_id,
            explanation=e.explanation,
            request_id="" if rid == "-" else rid,
        )
        for e in events
    ]


def audit_record_bulk(*, events: Iterable[Event], request_id: str | None = None) -> int:
    """Like `audit_record_many` for batch jobs (bulk import): one COPY on PostgreSQL (one
    INSERT elsewhere); returns how many events were written."""
    from routing_project.bulkdb import rows_insert

    now = timezone.now()
    rid = request_id if request_id is not None else request_id_var.get()
    rid = "" if rid == "-" else rid
    return rows_insert(
        AuditEvent,
        [
            {
                "type": e.type,
                "at": now,
                "actor": e.actor[:200],
                "lead_id": e.lead_id,
                "group": e.group or "",
                "rep_id": e.rep_id,
                "explanation": e.explanation,
                "request_id": rid,
            }
            for e in events
        ],
    )
