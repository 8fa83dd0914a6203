"""Lead intake: the request that creates a lead routes it, in one locked transaction."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Event, audit_build, audit_record_many
from notifications.services import outbox_announce_on_commit
from rotation.models import Group, Rep, RoutingRule
from rotation.rules import RuleSpec, lead_facts, match_rules
from routing_project import configcache, metrics

from . import notify, ownership, routing, routing_sql, scheduling
from .models import DEDUP_STATUSES, ApiClient, Assignment, IdempotencyRecord, Lead, LeadStatus

logger = logging.getLogger(__name__)

CONTACT_FIELDS = ("email", "first_name", "last_name", "company", "phone")
ROUTING_FIELDS = ("country", "region", "source", "product", "score", "company_size", "external_id")


class IdempotencyConflict(Exception):
    """A request with the same key is still being processed (409)."""


class IdempotencyMismatch(Exception):
    """The same key was used with a different body (422)."""


@dataclass
class Replay:
    status: int
    body: bytes


@dataclass
class Resolution:
    group: Group | None
    rule: str | None
    rules_tried: list[str]
    source: str  # "rule", "requested", "default" or "none"
    owner: ownership.OwnerHint | None = None  # the account owner by email domain (leads/ownership.py)

    def explanation(self) -> dict[str, Any]:
        return {"rule": self.rule, "rules_tried": self.rules_tried, "group_source": self.source}


@dataclass
class IntakeResult:
    lead: Lead
    duplicate_of: int | None
    status_code: int
    body: bytes


def normalize_email(email: str) -> str:
    return email.strip().lower()


def request_fingerprint(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- group resolution (before any lock) ------------------------------------------------------


def active_rules() -> list[RuleSpec]:
    return configcache.cached("rules", None, _active_rules_load)


def _active_rules_load() -> list[RuleSpec]:
    return [
        RuleSpec(r.id, r.name, r.priority, r.conditions, r.group.slug)
        for r in RoutingRule.objects.filter(active=True).select_related("group")
    ]


def group_by_slug(slug: str) -> Group | None:
    """The group with this slug, from the configuration cache (shared: do not modify it)."""
    return configcache.cached("group", slug, lambda: Group.objects.filter(slug=slug).first())


def group_default() -> Group | None:
    """The default group, from the configuration cache (shared: do not modify it)."""
    return configcache.cached("group-default", None, lambda: Group.objects.filter(is_default=True).first())


def lead_resolve_group(*, data: dict[str, Any], requested: Group | None) -> Resolution:
    """First matching rule by priority, else the lead's own group, else the default group;
    and the owner of the email domain's account, if any."""
    resolution = _resolve_group(data=data, requested=requested)
    resolution.owner = ownership.account_owner_lookup(email=data.get("email") or "")
    return resolution


def _resolve_group(*, data: dict[str, Any], requested: Group | None) -> Resolution:
    match = match_rules(active_rules(), lead_facts(data))
    if match.rule is not None:
        group = group_by_slug(match.rule.group_slug)
        return Resolution(group, match.rule.name, match.tried, "rule")
    if requested is not None:
        return Resolution(requested, None, match.tried, "requested")
    default = group_default()
    if default is not None:
        return Resolution(default, None, match.tried, "default")
    return Resolution(None, None, match.tried, "none")


# --- idempotency -----------------------------------------------------------------------------


def idempotency_claim(*, client: ApiClient, key: str, fingerprint: str) -> Replay | IdempotencyRecord:
    """Claims (client, key) for this request, or returns the stored response to replay.

    The claim is committed on its own, so a concurrent request with the same key sees it
    and gets 409 while this one runs. The response is stored in the routing transaction.
    """
    now = timezone.now()
    for _ in range(3):
        try:
            with transaction.atomic():
                return IdempotencyRecord.objects.create(
                    client=client, key=key, request_hash=fingerprint, created_at=now
                )
        except IntegrityError:
            pass
        record = IdempotencyRecord.objects.filter(client=client, key=key).first()
        if record is None:
            continue  # deleted meanwhile (released or expired): claim again
        if record.created_at < now - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS):
            IdempotencyRecord.objects.filter(pk=record.pk, created_at=record.created_at).delete()
            continue
        if record.request_hash != fingerprint:
            raise IdempotencyMismatch()
        if record.state == IdempotencyRecord.State.DONE:
            return Replay(status=record.response_status or 200, body=bytes(record.response_body or b""))
        stale = now - timedelta(seconds=settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S)
        if record.created_at < stale:
            # Its request died without finishing (and so without writing a lead): take it over.
            taken = IdempotencyRecord.objects.filter(
                pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT, created_at=record.created_at
            ).update(created_at=now)
            if taken:
                record.created_at = now
                return record
            continue
        raise IdempotencyConflict()
    raise IdempotencyConflict()


def idempotency_release(record: IdempotencyRecord) -> None:
    """The request failed without writing anything: the key may be used again."""
    IdempotencyRecord.objects.filter(pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT).delete()


def _idempotency_store(record: IdempotencyRecord | None, *, status: int, body: bytes, lead: Lead) -> None:
    if record is None:
        return
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        state=IdempotencyRecord.State.DONE, response_status=status, response_body=body, lead=lead
    )


# --- intake ----------------------------------------------------------------------------------


def lead_intake(
    *,
    data: dict[str, Any],
    requested: Group | None,
    client: ApiClient | None,
    actor: str,
    render: Callable[[Lead, int | None], bytes],
    raw: dict[str, Any] | None = None,
    idempotency: IdempotencyRecord | None = None,
) -> IntakeResult:
    """Takes a validated lead in and routes it, exactly once.

    Before the lock: rules and group resolution. In one transaction: the email's advisory
    lock and the dedup check, the group's rotation row lock, eligibility read after it, the
    pick, the lead and its assignment, the rotation advance, the audit events, and the
    stored idempotent response.
    """
    resolution = lead_resolve_group(data=data, requested=requested)
    slug = resolution.group.slug if resolution.group else None
    metrics.lead_received(group=slug)
    started = time.perf_counter()
    attempts = settings.ROUTING_MAX_RETRIES + 1
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                result = _intake_locked(data, raw or {}, requested, resolution, client, actor, render, idempotency)
            if not result.body:
                result.body = render(result.lead, result.duplicate_of)
            metrics.intake_finished(
                group=result.lead.group.slug if result.lead.group else None,
                status=result.lead.status,
                duplicate=result.duplicate_of is not None,
                seconds=time.perf_counter() - started,
            )
            return result
        except Exception as exc:
            if routing.is_lock_timeout(exc):
                metrics.routing_busy(group=slug)
                raise routing.RoutingBusy() from exc
            if routing.is_retryable(exc) and attempt + 1 < attempts:
                logger.warning("routing transaction retried after %s", routing.sqlstate(exc))
                time.sleep(0.01 * (attempt + 1))
                continue
            raise
    raise routing.RoutingBusy()


def _intake_locked(
    data: dict[str, Any],
    raw: dict[str, Any],
    requested: Group | None,
    resolution: Resolution,
    client: ApiClient | None,
    actor: str,
    render: Callable[[Lead, int | None], bytes],
    idempotency: IdempotencyRecord | None,
) -> IntakeResult:
    now = timezone.now()
    email_normalized = normalize_email(data["email"])
    postgres = connection.vendor == "postgresql"

    # Dedup: under the email's lock, so two concurrent posts of one address cannot both pass.
    if postgres:  # the lock timeout and the email's lock in one statement
        routing_sql.intake_begin(email_normalized=email_normalized, lock_timeout_ms=settings.ROUTING_LOCK_TIMEOUT_MS)
    else:
        routing.set_lock_timeout()
        routing.lock_email(email_normalized)
    window = resolution.group.dedup_days if resolution.group else 30
    since = now - timedelta(days=window)
    existing = None
    # Most leads are new: a cheap existence check first, the full load only for a duplicate.
    if routing_sql.open_lead_may_exist(email_normalized=email_normalized, statuses=DEDUP_STATUSES, since=since):
        existing = (
            Lead.objects.filter(email_normalized=email_normalized, status__in=DEDUP_STATUSES, created_at__gte=since)
            .select_related("group", "owner")
            .order_by("-id")
            .first()
        )
    if existing is not None:
        audit_record_many(
            events=[
                Event(
                    AuditEvent.Type.LEAD_DUPLICATE,
                    actor,
                    existing.id,
                    existing.group.slug if existing.group else "",
                    existing.owner_id,
                    {
                        "duplicate_of": existing.id,
                        "dedup_days": window,
                        "source": data.get("source") or "",
                        "external_id": data.get("external_id") or "",
                        "note": "same email has an open lead; no new rotation turn",
                    },
                )
            ]
        )
        body = render(existing, existing.id)
        _idempotency_store(idempotency, status=200, body=body, lead=existing)
        return IntakeResult(existing, existing.id, 200, body)

    lead = Lead(
        email=data["email"],
        email_normalized=email_normalized,
        **{f: data.get(f) or "" for f in CONTACT_FIELDS if f != "email"},
        country=data.get("country") or "",
        region=data.get("region") or "",
        source=data.get("source") or "",
        product=data.get("product") or "",
        score=data.get("score"),
        company_size=data.get("company_size"),
        external_id=data.get("external_id") or "",
        attributes=data.get("attributes") or {},
        raw_payload=raw,
        requested_group=requested.slug if requested else "",
        api_client=client,
        created_at=now,
    )
    explanation: dict[str, Any] = resolution.explanation()
    group = resolution.group
    decision: routing.Decision | None = None
    state = None
    if group is None:
        lead.status, lead.queue_reason = LeadStatus.QUEUED, "no rule matched and there is no default group"
    else:
        # The lock: everything below reads and writes under the group's rotation row.
        state = routing.lock_rotation(group.id)
        group = state.group
        explanation.update({"group": group.slug, "strategy": group.strategy})
        if not group.active:
            lead.status, lead.queue_reason = LeadStatus.QUEUED, f"group '{group.slug}' is inactive"
        else:
            # The account owner when eligible (rotation untouched), else the rotation.
            facts, decision = ownership.group_decide(owner=resolution.owner, group=group, state=state, now=now)
            explanation.update(decision.explanation())
            if decision.rep_id is None:
                lead.status = LeadStatus.QUEUED
                lead.queue_reason = decision.queue_reason or (
                    f"no eligible rep in group '{group.slug}'" if facts else f"group '{group.slug}' has no members"
                )
            else:
                lead.status = LeadStatus.ASSIGNED
                # The owner as read under the lock: rendering the answer needs no query (other
                # fields are deferred and load on access).
                lead.owner = Rep.from_db(
                    None, ["id", "name", "email"], [decision.rep_id, decision.rep_name, decision.rep_email]
                )
                lead.assigned_at = now
                lead.sla_due_at = routing.sla_due(group, now)
    lead.group = group

    received = Event(
        AuditEvent.Type.LEAD_RECEIVED,
        actor,
        None,  # the lead's id, once written
        group.slug if group else "",
        None,
        {
            "source": lead.source,
            "external_id": lead.external_id,
            "requested_group": lead.requested_group or None,
            "client": client.name if client else None,
        },
    )
    assignment = outbox = None
    advanced = False
    if decision is not None and decision.rep_id is not None and state is not None:
        assignment = Assignment(
            rep_id=decision.rep_id,
            group=group,
            attempt=1,
            reason=decision.reason,
            started_at=now,
            due_at=lead.sla_due_at,
        )
        advanced = routing.advance_apply(state, decision)
        # Webhook and e-mail: an outbox row in this transaction, delivered by Celery after commit.
        outbox = notify.lead_outbox_message(lead=lead, event="lead.assigned", reason=decision.reason, attempt=1, at=now)
        explanation.update({"reason": decision.reason, "attempt": 1, "sla_due_at": _iso(lead.sla_due_at)})
        outcome = Event(AuditEvent.Type.LEAD_ASSIGNED, actor, None, state.group.slug, decision.rep_id, explanation)
    else:
        explanation["queue_reason"] = lead.queue_reason
        outcome = Event(AuditEvent.Type.LEAD_QUEUED, actor, None, group.slug if group else "", None, explanation)
    events = audit_build(events=[received, outcome])

    if postgres:
        # The lead, its assignment, its audit events, the outbox row and the rotation's advance
        # in one statement: the locked block's only write.
        dependents: list[tuple[list[Any], dict[str, str]]] = [(events, {"lead_id": routing_sql.LEAD_ID})]
        if assignment is not None and outbox is not None:
            dependents.append(([assignment], {"lead_id": routing_sql.LEAD_ID}))
            payload_with_id = f"jsonb_set(%s, '{{lead,id}}', to_jsonb({routing_sql.LEAD_ID}))"
            dependents.append(([outbox], {"lead_id": routing_sql.LEAD_ID, "payload": payload_with_id}))
        ids = routing_sql.lead_insert_with(lead, dependents, state if advanced else None)
        lead.id = ids[0]
        lead._state.adding = False
        if assignment is not None and outbox is not None:
            assignment.id, outbox.id = ids[2], ids[3]
            outbox.lead_id = lead.id
            outbox.payload["lead"]["id"] = lead.id
    else:
        lead.save(force_insert=True)
        for event in events:
            event.lead_id = lead.id
        AuditEvent.objects.bulk_create(events)
        if assignment is not None and outbox is not None and state is not None:
            assignment.lead = lead
            assignment.save(force_insert=True)
            outbox.lead_id = lead.id
            outbox.payload["lead"]["id"] = lead.id
            outbox.save(force_insert=True)
            if advanced:
                state.save(update_fields=["pointer", "current_weights", "turns", "updated_at"])
    if assignment is not None and outbox is not None:
        assignment.lead = lead
        # The SLA timer and the notification fan-out, published after commit; never block
        # intake (the sweeps catch up).
        scheduling.timer_schedule_on_commit(assignment_id=assignment.id, due_at=lead.sla_due_at)
        outbox_announce_on_commit(outbox.id)

    # The answer is rendered under the lock only when it must be stored with the lead (an
    # Idempotency-Key); otherwise lead_intake renders it after commit.
    body = render(lead, None) if idempotency is not None else b""
    _idempotency_store(idempotency, status=201, body=body, lead=lead)
    return IntakeResult(lead, None, 201, body)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def idempotency_purge(*, now: datetime | None = None) -> int:
    """Deletes idempotency records past their retention (IDEMPOTENCY_TTL_HOURS, at least 24 h).

    Expired records are also ignored by the claim, so this only keeps the table small."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
