"""Lead intake: the request that creates a lead routes it, in one locked transaction."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Event, audit_build, audit_record_many
from notifications.models import OutboxMessage
from notifications.services import outbox_announce_many_on_commit, outbox_announce_on_commit
from rotation.eligibility import MemberFacts
from rotation.models import Group, Rep, RotationState, RoutingRule
from rotation.rules import RuleSpec, lead_facts, match_rules
from routing_project import configcache, metrics
from routing_project.db import on_a_live_connection, set_lock_timeout
from routing_project.logging import request_id_var

from . import batching, notify, ownership, routing, routing_sql, scheduling
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
    lead_id: int | None = None


@dataclass
class Resolution:
    group: Group | None
    rule: str | None
    rules_tried: list[str]
    source: str  # "rule", "requested", "default" or "none"
    owner: ownership.OwnerHint | None = None  # the account owner by email domain (leads/ownership.py)
    matched_on: list[dict[str, Any]] = field(default_factory=list)  # the rule's conditions (rules.matched_on)

    def explanation(self) -> dict[str, Any]:
        explained: dict[str, Any] = {"rule": self.rule, "rules_tried": self.rules_tried, "group_source": self.source}
        if self.rule is not None:
            explained["matched_on"] = self.matched_on
        return explained


@dataclass
class IntakeResult:
    lead: Lead
    duplicate_of: int | None
    status_code: int
    body: bytes


def normalize_email(email: str) -> str:
    return email.strip().lower()


def request_fingerprint(data: Any) -> str:
    """The body as a JSON document, not as bytes: a retry that a client library serialises
    again (keys in another order, other whitespace or escapes, `1000` for `1000.0`, as
    JavaScript writes every whole number) is the same request."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    # Whole numbers written as floats (1000.0, 1e3) as ints, through the C parser and encoder:
    # they keep to the nesting the body's own parse allowed, where a Python walk would not.
    whole = json.loads(canonical, parse_float=_whole_number)
    canonical = json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _whole_number(text: str) -> int | float:
    number = float(text)
    return int(number) if number.is_integer() else number


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
        return Resolution(group, match.rule.name, match.tried, "rule", matched_on=match.matched_on)
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
                    client=client, key=key, request_hash=fingerprint, created_at=now, claimed_by_pid=_backend_pid()
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
            return Replay(
                status=record.response_status or 200, body=bytes(record.response_body or b""), lead_id=record.lead_id
            )
        stale = now - timedelta(seconds=settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S)
        if record.created_at < stale or _claimer_gone(record):
            # Its request died without finishing (and so without writing a lead): take it over.
            # Safe even if it lives on: its routing transaction stores its answer only while
            # the claim is still its own (`_idempotency_store`), else it writes nothing.
            taken = IdempotencyRecord.objects.filter(
                pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT, created_at=record.created_at
            ).update(created_at=now, claimed_by_pid=_backend_pid())
            if taken:
                record.created_at = now
                return record
            continue
        raise IdempotencyConflict()
    raise IdempotencyConflict()


def _backend_pid() -> int | None:
    """This connection's PostgreSQL backend (psycopg knows it: no round trip); None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def _claimer_gone(record: IdempotencyRecord) -> bool:
    """The backend that claimed the key has ended: the worker of its request was killed (its
    connection closed with it) or the database restarted. Behind a pooler that hands each
    transaction another backend the claimer's stays up, and the claim waits to go stale."""
    if record.claimed_by_pid is None or connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        # The backends' states are read once per transaction and kept: read them now.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [record.claimed_by_pid])
        return cursor.fetchone() is None


def idempotency_release(record: IdempotencyRecord) -> None:
    """The request failed without writing anything: the key may be used again (unless a retry
    took it over meanwhile: its claim is not this request's to free). On a new connection if
    the failure was the connection's (PostgreSQL restarted): left in flight, the key would
    answer the retry the 503 asks for with 409 until it goes stale."""
    on_a_live_connection(
        lambda: IdempotencyRecord.objects.filter(
            pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT, created_at=record.created_at
        ).delete()
    )


def _idempotency_store(record: IdempotencyRecord | None, *, status: int, body: bytes, lead: Lead) -> None:
    if record is None:
        return
    # Only while the claim is still this request's: a retry takes over a claim older than
    # IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S (setting its created_at), and then this request must
    # write nothing, else the key would have two leads. Raising rolls the transaction back.
    stored = IdempotencyRecord.objects.filter(
        pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT, created_at=record.created_at
    ).update(state=IdempotencyRecord.State.DONE, response_status=status, response_body=body, lead=lead)
    if stored != 1:
        raise IdempotencyConflict()


# --- intake ----------------------------------------------------------------------------------


@dataclass
class IntakeJob(batching.Waiter):
    """One validated lead to route, with what was resolved before any lock."""

    data: dict[str, Any]
    raw: dict[str, Any]
    requested: Group | None
    resolution: Resolution
    client: ApiClient | None
    actor: str
    request_id: str
    email_normalized: str
    # With an Idempotency-Key: the claimed record, and how to render the answer stored in it.
    idempotency: IdempotencyRecord | None = None
    render: Callable[[Lead, int | None], bytes] | None = None
    result: IntakeResult | None = None
    error: BaseException | None = None
    # The configuration version the request's look-ups used, for the routing transaction to
    # check when no read confirmed it yet (routing_project/configcache.py: `defer`); set to
    # True once the transaction found it current.
    config_version: int | None = None
    config_checked: bool = False
    # When the request stops waiting for locks (time.perf_counter()): one lock timeout after
    # it came, however long it was queued behind other batches (`_lock_timeout_ms`).
    deadline: float | None = None

    def __post_init__(self) -> None:
        batching.Waiter.__init__(self)


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
    stored idempotent response. On PostgreSQL, concurrent intakes of one process share that
    transaction (leads/batching.py).
    """
    resolution = lead_resolve_group(data=data, requested=requested)
    started = time.perf_counter()
    rid = request_id_var.get()
    job = IntakeJob(
        data,
        raw or {},
        requested,
        resolution,
        client,
        actor,
        "" if rid == "-" else rid,
        normalize_email(data["email"]),
        idempotency=idempotency,
        render=render,
        config_version=configcache.unconfirmed_version(),
        deadline=started + settings.ROUTING_LOCK_TIMEOUT_MS / 1000,
    )
    try:
        # A caller's own transaction must hold its lead: batches run in the leader's connection.
        if connection.vendor == "postgresql" and settings.INTAKE_BATCH_MAX > 1 and not connection.in_atomic_block:
            _combiner().submit(job)
            if job.error is not None:
                raise job.error
            if job.result is None:
                raise RuntimeError("intake batch ended without routing this lead")
            result = job.result
        else:
            result = _intake_one(job, render, idempotency)
    except routing.RoutingBusy:
        # A 503 counted with its whole wait, as the lock wait histogram counts it: left out, the
        # routing time's p99 improved just as a group overloaded.
        metrics.intake_refused_busy(seconds=time.perf_counter() - started)
        raise
    finally:
        if job.config_checked:
            configcache.confirm()
    # Counted once the lead is taken in: not for an attempt answered again (StaleConfiguration).
    # How it ended is counted under the same group, so that per group received = routed +
    # queued + duplicate (a duplicate's open lead may be in another group).
    group = resolution.group.slug if resolution.group else None
    metrics.lead_received(group=group)
    if not result.body:
        result.body = render(result.lead, result.duplicate_of)
    metrics.intake_finished(
        group=group,
        status=result.lead.status,
        duplicate=result.duplicate_of is not None,
        seconds=time.perf_counter() - started,
    )
    return result


def _intake_one(
    job: IntakeJob, render: Callable[[Lead, int | None], bytes] | None, idempotency: IdempotencyRecord | None
) -> IntakeResult:
    """One lead in its own transaction, retried after a deadlock or serialization failure."""
    attempts = settings.ROUTING_MAX_RETRIES + 1
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                return _intake_locked(job, render, idempotency)
        except Exception as exc:
            if routing.is_lock_timeout(exc):
                metrics.routing_busy(group=job.resolution.group.slug if job.resolution.group else None)
                raise routing.RoutingBusy() from exc
            if routing.is_retryable(exc) and attempt + 1 < attempts:
                logger.warning("routing transaction retried after %s", routing.sqlstate(exc))
                time.sleep(0.01 * (attempt + 1))
                continue
            raise
    raise routing.RoutingBusy()


_combiner_instance: batching.Combiner[IntakeJob] | None = None
_combiner_mutex = threading.Lock()


def _combiner() -> batching.Combiner[IntakeJob]:
    global _combiner_instance
    if _combiner_instance is None:
        with _combiner_mutex:
            if _combiner_instance is None:
                _combiner_instance = batching.Combiner(
                    _intake_batch, max_batch=settings.INTAKE_BATCH_MAX, key=lambda job: job.email_normalized
                )
    return _combiner_instance


def _intake_batch(jobs: list[IntakeJob], *, again_if_busy: bool = True) -> None:
    """Runs a batch (leads/batching.py): one transaction for all when there are several; each
    job gets its result or its error. If the shared transaction fails for another reason than
    a busy rotation, each lead is routed again on its own, so one bad lead fails alone. If a
    rotation stays busy past the lock timeout, only the leads of the groups still busy get
    503: the others are routed again (once) without them."""
    if len(jobs) == 1:
        _intake_one_recorded(jobs[0])
        if not isinstance(jobs[0].error, configcache.StaleConfiguration):
            metrics.intake_batch(1)
        return
    attempts = settings.ROUTING_MAX_RETRIES + 1
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                results = _intake_locked_many(jobs)
        except Exception as exc:
            if routing.is_lock_timeout(exc):
                metrics.intake_batch(len(jobs))
                busy = routing.rotations_busy(_group_ids(jobs)) if again_if_busy else set()
                rest = [job for job in jobs if busy and _group_id(job) not in busy]
                for job in jobs:
                    if not any(job is other for other in rest):
                        metrics.routing_busy(group=job.resolution.group.slug if job.resolution.group else None)
                        job.error = routing.RoutingBusy()
                if rest:
                    _intake_batch(rest, again_if_busy=False)
                return
            if routing.is_retryable(exc) and attempt + 1 < attempts:
                logger.warning("routing batch retried after %s", routing.sqlstate(exc))
                time.sleep(0.01 * (attempt + 1))
                continue
            logger.warning("routing batch of %d failed (%s); routing them one by one", len(jobs), type(exc).__name__)
            metrics.intake_batch(len(jobs))
            break
        else:
            # Counted: the leads this transaction took in (not those answered again).
            if taken := sum(result is not None for result in results):
                metrics.intake_batch(taken)
            for job, result in zip(jobs, results, strict=True):
                if result is None:
                    job.error = configcache.StaleConfiguration()
                else:
                    job.result = result
            return
    for job in jobs:
        _intake_one_recorded(job)


def _group_id(job: IntakeJob) -> int | None:
    return job.resolution.group.id if job.resolution.group is not None else None


def _group_ids(jobs: list[IntakeJob]) -> list[int]:
    return [gid for gid in map(_group_id, jobs) if gid is not None]


def _intake_one_recorded(job: IntakeJob) -> None:
    try:
        job.result = _intake_one(job, job.render, job.idempotency)
    except Exception as exc:  # noqa: BLE001 - handed to the job's own request thread, which raises it
        job.error = exc


# --- the routing transaction -------------------------------------------------------------------


@dataclass
class _Routed:
    """A new lead routed under the lock, with the rows to write with it."""

    lead: Lead
    events: list[AuditEvent]
    assignment: Assignment | None = None
    outbox: OutboxMessage | None = None
    advanced: bool = False


def _lead_new(job: IntakeJob, now: datetime) -> Lead:
    data = job.data
    return Lead(
        email=data["email"],
        email_normalized=job.email_normalized,
        **{f: data.get(f) or "" for f in CONTACT_FIELDS if f != "email"},
        country=data.get("country") or "",
        region=data.get("region") or "",
        source=data.get("source") or "",
        product=data.get("product") or "",
        score=data.get("score"),
        company_size=data.get("company_size"),
        external_id=data.get("external_id") or "",
        attributes=data.get("attributes") or {},
        raw_payload=job.raw,
        requested_group=job.requested.slug if job.requested else "",
        api_client=job.client,
        created_at=now,
    )


def _route(
    job: IntakeJob, now: datetime, state: RotationState | None, facts: list[MemberFacts] | None
) -> tuple[_Routed, routing.Decision | None]:
    """Decides one new lead under its group's lock (`state`, read with the lock, and `facts`,
    the members read after it; None when the group is inactive) and builds its rows."""
    lead = _lead_new(job, now)
    explanation: dict[str, Any] = job.resolution.explanation()
    group = job.resolution.group
    decision: routing.Decision | None = None
    if group is None or state is None:
        lead.status, lead.queue_reason = LeadStatus.QUEUED, "no rule matched and there is no default group"
    else:
        group = state.group
        explanation.update({"group": group.slug, "strategy": group.strategy})
        if not group.active or facts is None:
            lead.status, lead.queue_reason = LeadStatus.QUEUED, f"group '{group.slug}' is inactive"
        else:
            # The account owner when eligible (rotation untouched), else the rotation.
            _facts, decision = ownership.group_decide(
                owner=job.resolution.owner, group=group, state=state, now=now, facts=facts
            )
            explanation.update(decision.explanation())
            if decision.rep_id is None:
                lead.status = LeadStatus.QUEUED
                lead.queue_reason = routing.queue_reason(group, decision)
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
        job.actor,
        None,  # the lead's id, once written
        group.slug if group else "",
        None,
        {
            "source": lead.source,
            "external_id": lead.external_id,
            "requested_group": lead.requested_group or None,
            "client": job.client.name if job.client else None,
        },
    )
    routed = _Routed(lead, [])
    if decision is not None and decision.rep_id is not None and state is not None and group is not None:
        routed.assignment = Assignment(
            rep_id=decision.rep_id,
            group=group,
            attempt=1,
            reason=decision.reason,
            started_at=now,
            due_at=lead.sla_due_at,
        )
        routed.advanced = routing.advance_apply(state, decision)
        # Webhook and e-mail: an outbox row in this transaction, delivered by Celery after commit.
        routed.outbox = notify.lead_outbox_message(
            lead=lead, event="lead.assigned", reason=decision.reason, attempt=1, at=now
        )
        explanation.update({"reason": decision.reason, "attempt": 1, "sla_due_at": _iso(lead.sla_due_at)})
        outcome = Event(AuditEvent.Type.LEAD_ASSIGNED, job.actor, None, group.slug, decision.rep_id, explanation)
    else:
        explanation["queue_reason"] = lead.queue_reason
        outcome = Event(AuditEvent.Type.LEAD_QUEUED, job.actor, None, group.slug if group else "", None, explanation)
    routed.events = audit_build(events=[received, outcome], request_id=job.request_id)
    return routed, decision


def _routed_written(routed: _Routed) -> None:
    """After the rows are written: the ids into the objects that carry them, and the SLA timer
    and notification fan-out published after commit (they never block intake; the sweeps
    catch up)."""
    lead = routed.lead
    for event in routed.events:
        event.lead_id = lead.id
    if routed.assignment is not None and routed.outbox is not None:
        routed.assignment.lead = lead
        routed.outbox.lead_id = lead.id
        routed.outbox.payload["lead"]["id"] = lead.id


def _routed_announce(routed: _Routed) -> None:
    if routed.assignment is not None and routed.outbox is not None:
        scheduling.timer_schedule_on_commit(
            assignment_id=routed.assignment.id, due_at=routed.lead.sla_due_at, group_id=routed.assignment.group_id
        )
        outbox_announce_on_commit(routed.outbox.id)


def _duplicate(job: IntakeJob, existing: Lead, window: int) -> IntakeResult:
    audit_record_many(
        events=[
            Event(
                AuditEvent.Type.LEAD_DUPLICATE,
                job.actor,
                existing.id,
                existing.group.slug if existing.group else "",
                existing.owner_id,
                {
                    # The new submission's resolution: its group's window found the open lead.
                    "rule": job.resolution.rule,
                    "rules_tried": job.resolution.rules_tried,
                    "dedup_group": job.resolution.group.slug if job.resolution.group else None,
                    "duplicate_of": existing.id,
                    "dedup_days": window,
                    "source": job.data.get("source") or "",
                    "external_id": job.data.get("external_id") or "",
                    "note": "same email has an open lead; no new rotation turn",
                },
            )
        ],
        request_id=job.request_id,
    )
    return IntakeResult(existing, existing.id, 200, b"")


def _open_lead(email_normalized: str, since: datetime) -> Lead | None:
    return (
        Lead.objects.filter(email_normalized=email_normalized, status__in=DEDUP_STATUSES, created_at__gte=since)
        .select_related("group", "owner")
        .order_by("-id")
        .first()
    )


def _dedup_window(job: IntakeJob) -> int:
    return job.resolution.group.dedup_days if job.resolution.group else 30


# Whatever is left of a request's lock timeout, a batch still waits this long for a lock: a
# rotation row held briefly by another batch at work is waited for, not refused.
LOCK_WAIT_FLOOR_MS = 100


def _lock_timeout_ms(jobs: list[IntakeJob]) -> int:
    """The lock timeout of a routing transaction: what is left of the youngest request's (a
    request queued behind a batch that waited for a busy rotation has been waiting all that
    time, and PostgreSQL would count its timeout again from zero), at least the floor."""
    full = settings.ROUTING_LOCK_TIMEOUT_MS
    deadlines = [job.deadline for job in jobs if job.deadline is not None]
    if len(deadlines) < len(jobs):
        return full
    left = int((max(deadlines) - time.perf_counter()) * 1000)
    return max(min(full, LOCK_WAIT_FLOOR_MS), min(full, left))


def _intake_locked(
    job: IntakeJob, render: Callable[[Lead, int | None], bytes] | None, idempotency: IdempotencyRecord | None
) -> IntakeResult:
    now = timezone.now()
    postgres = connection.vendor == "postgresql"

    # Dedup: under the email's lock, so two concurrent posts of one address cannot both pass.
    if postgres:  # the lock timeout, the email's lock and the configuration version in one statement
        version = routing_sql.intake_begin(
            email_normalized=job.email_normalized, lock_timeout_ms=_lock_timeout_ms([job])
        )
        if _stale([job], version):
            raise configcache.StaleConfiguration()
    else:
        set_lock_timeout()
        routing.lock_email(job.email_normalized)
    window = _dedup_window(job)
    since = now - timedelta(days=window)
    existing = None
    # Most leads are new: a cheap existence check first, the full load only for a duplicate. A
    # group that keeps no window (dedup_days 0) looks for none: `since` is now, taken before
    # the email's lock, and a lead of the address committed meanwhile would be found.
    if window and routing_sql.open_lead_may_exist(
        email_normalized=job.email_normalized, statuses=DEDUP_STATUSES, since=since
    ):
        existing = _open_lead(job.email_normalized, since)
    if existing is not None:
        result = _duplicate(job, existing, window)
        if render is not None and idempotency is not None:
            result.body = render(existing, existing.id)
            _idempotency_store(idempotency, status=200, body=result.body, lead=existing)
        return result

    state = facts = None
    if job.resolution.group is not None:
        # The lock: everything below reads and writes under the group's rotation row (the
        # members are read after it, in the same round trip on PostgreSQL).
        group_id = job.resolution.group.id
        states, rows = routing.lock_rotations_read([group_id], now)
        state = states[group_id]
        if state.group.active:
            facts = routing.member_facts(state.group, now, rows=None if rows is None else rows.get(group_id, []))
    routed, _decision = _route(job, now, state, facts)
    lead = routed.lead

    if postgres:
        # The lead, its assignment, its audit events, the outbox row and the rotation's advance
        # in one statement: the locked block's only write.
        dependents: list[tuple[list[Any], dict[str, str]]] = [(routed.events, {"lead_id": routing_sql.LEAD_ID})]
        if routed.assignment is not None and routed.outbox is not None:
            dependents.append(([routed.assignment], {"lead_id": routing_sql.LEAD_ID}))
            payload_with_id = f"jsonb_set(%s, '{{lead,id}}', to_jsonb({routing_sql.LEAD_ID}))"
            dependents.append(([routed.outbox], {"lead_id": routing_sql.LEAD_ID, "payload": payload_with_id}))
        ids = routing_sql.lead_insert_with(lead, dependents, state if routed.advanced else None)
        lead.id = ids[0]
        lead._state.adding = False
        _routed_written(routed)
        if routed.assignment is not None and routed.outbox is not None:
            routed.assignment.id, routed.outbox.id = ids[2], ids[3]
    else:
        lead.save(force_insert=True)
        _routed_written(routed)
        AuditEvent.objects.bulk_create(routed.events)
        if routed.assignment is not None and routed.outbox is not None:
            routed.assignment.save(force_insert=True)
            routed.outbox.save(force_insert=True)
        if routed.advanced and state is not None:
            state.save(update_fields=["pointer", "current_weights", "turns", "updated_at"])
    _routed_announce(routed)

    # The answer is rendered under the lock only when it must be stored with the lead (an
    # Idempotency-Key); otherwise lead_intake renders it after commit.
    body = b""
    if render is not None and idempotency is not None:
        body = render(lead, None)
        _idempotency_store(idempotency, status=201, body=body, lead=lead)
    return IntakeResult(lead, None, 201, body)


def _stale(jobs: list[IntakeJob], version: int | None) -> set[int]:
    """The ids of the jobs whose request's look-ups used another configuration version than
    the one the routing transaction read (routing_project/configcache.py: `defer`); the
    others that had one to check are marked checked."""
    configcache.observed(version)
    stale = set()
    for job in jobs:
        if job.config_version is None:
            continue
        job.config_checked = job.config_version == version
        if not job.config_checked:
            stale.add(id(job))
    return stale


def _intake_locked_many(jobs: list[IntakeJob]) -> list[IntakeResult | None]:
    """The routing transaction for a batch: every email's lock (in one order), one dedup
    check, every group's rotation lock (in id order) and each group's members read once after
    it (one round trip), the leads decided one after the other in arrival order (each decision moves the
    in-memory rotation and counts the next one reads), and all their rows and the advances
    written in one statement (plus one for the answers of Idempotency-Key requests)."""
    now = timezone.now()
    version = routing_sql.intake_begin_many(
        emails=sorted(job.email_normalized for job in jobs), lock_timeout_ms=_lock_timeout_ms(jobs)
    )
    stale = _stale(jobs, version)
    if not stale:
        return list(_intake_locked_many_current(jobs, now))
    # Those are answered again by their requests (None here); the others go on.
    live = [job for job in jobs if id(job) not in stale]
    done = dict(zip(map(id, live), _intake_locked_many_current(live, now) if live else [], strict=True))
    return [done.get(id(job)) for job in jobs]


def _intake_locked_many_current(jobs: list[IntakeJob], now: datetime) -> list[IntakeResult]:
    """`_intake_locked_many` for the jobs whose configuration is current, after the email locks."""
    windows = [_dedup_window(job) for job in jobs]  # 0: no window, nothing looked for (see `_intake_locked`)
    sinces = [now - timedelta(days=window) for window in windows]
    newest = routing_sql.open_leads_newest(
        emails=[job.email_normalized for job in jobs], statuses=DEDUP_STATUSES, since=min(sinces)
    )
    results: list[IntakeResult | None] = []
    fresh: list[IntakeJob] = []
    for job, window, since in zip(jobs, windows, sinces, strict=True):
        found = newest.get(job.email_normalized)
        existing = _open_lead(job.email_normalized, since) if window and found is not None and found >= since else None
        if existing is not None:
            results.append(_duplicate(job, existing, window))
        else:
            results.append(None)
            fresh.append(job)

    states, read = routing.lock_rotations_read(
        [job.resolution.group.id for job in fresh if job.resolution.group is not None], now
    )
    active = [group_id for group_id, locked in states.items() if locked.group.active]
    facts: dict[int, list[MemberFacts]] = {
        group_id: routing.member_facts(
            states[group_id].group, now, rows=None if read is None else read.get(group_id, [])
        )
        for group_id in active
    }

    routed_all: list[_Routed] = []
    for job in fresh:
        gid = job.resolution.group.id if job.resolution.group is not None else None
        state = states.get(gid) if gid is not None else None
        routed, decision = _route(job, now, state, facts.get(gid) if gid is not None else None)
        if gid is not None and decision is not None and decision.rep_id is not None:
            # The next lead of the group sees this one: one more open lead and one more today.
            facts[gid] = [
                replace(f, open=f.open + 1, assigned_today=f.assigned_today + 1) if f.rep_id == decision.rep_id else f
                for f in facts[gid]
            ]
        routed_all.append(routed)

    if routed_all:
        with_rep = [r for r in routed_all if r.assignment is not None and r.outbox is not None]
        for place, routed in enumerate(routed_all, start=1):  # each row's lead, by its place
            for event in routed.events:
                event.lead_id = place
            if routed.assignment is not None and routed.outbox is not None:
                routed.assignment.lead_id = routed.outbox.lead_id = place
        lead_ref = {"lead_id": routing_sql.BATCH_LEAD_ID}
        payload_with_id = "jsonb_set(%s, '{lead,id}', to_jsonb(" + routing_sql.BATCH_LEAD_ID % 'r."lead_id"' + "))"
        advanced = sorted({r.lead.group_id for r in routed_all if r.advanced and r.lead.group_id is not None})
        _lead_ids, (_event_ids, assignment_ids, outbox_ids) = routing_sql.batch_write(
            [r.lead for r in routed_all],
            [
                ([e for r in routed_all for e in r.events], lead_ref),
                ([r.assignment for r in with_rep if r.assignment is not None], lead_ref),
                ([r.outbox for r in with_rep if r.outbox is not None], {**lead_ref, "payload": payload_with_id}),
            ],
            [states[group_id] for group_id in advanced],
        )
        for routed in routed_all:
            _routed_written(routed)
        for routed, assignment_id, outbox_id in zip(with_rep, assignment_ids, outbox_ids, strict=True):
            if routed.assignment is not None and routed.outbox is not None:
                routed.assignment.id, routed.outbox.id = assignment_id, outbox_id
                scheduling.timer_schedule_on_commit(
                    assignment_id=assignment_id, due_at=routed.lead.sla_due_at, group_id=routed.lead.group_id
                )
        outbox_announce_many_on_commit(outbox_ids)  # one drain task for the batch

    # Back in arrival order: the duplicates where they were, the new leads in between.
    new_leads = iter(routed_all)
    ordered = [result or IntakeResult(next(new_leads).lead, None, 201, b"") for result in results]
    # Answers to store with an Idempotency-Key: rendered now, written in this transaction.
    stored = []
    for job, result in zip(jobs, ordered, strict=True):
        if job.idempotency is not None and job.render is not None:
            result.body = job.render(result.lead, result.duplicate_of)
            stored.append((job.idempotency, result.status_code, result.body, result.lead.id))
    # As `_idempotency_store`: a claim taken over by a retry fails the batch, whose leads are
    # then routed one by one (`_intake_batch`), that one alone failing.
    if stored and routing_sql.idempotency_store_many(stored, done=IdempotencyRecord.State.DONE) != len(stored):
        raise IdempotencyConflict()
    return ordered


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def idempotency_purge(*, now: datetime | None = None) -> int:
    """Deletes idempotency records past their retention (IDEMPOTENCY_TTL_HOURS, at least 24 h).

    Expired records are also ignored by the claim, so this only keeps the table small."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
