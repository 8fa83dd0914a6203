"""Notifications: the outbox (written in the routing transaction) and its delivery.

`outbox_add` is the one way in: call it inside the transaction that assigned or escalated a
lead. It writes one row and, after commit, enqueues the fan-out. Nothing here runs under a
rotation lock except that INSERT; the HTTP calls and e-mails happen in Celery tasks, each
delivery retried with exponential backoff until it succeeds or runs out of attempts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Event, audit_record
from rotation.models import Rep
from routing_project import broker_breaker, metrics
from routing_project.bulkdb import rows_insert
from security import secret_rotation

from .models import Delivery, OutboxMessage, WebhookEndpoint, new_secret, url_shown

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Signature"
# The events that give the rep they name a lead, with an accept link in its e-mail (a
# lead.rerouted names the new owner for the webhooks of the group the lead left; that rep is
# e-mailed by the assignment's own message).
EMAILED_EVENTS = ("lead.assigned", "lead.escalated")
# The message that tells a rep a lead it held is no longer its: an e-mail only (no group).
MOVED_AWAY = "lead.moved_away"


class DeliveryError(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


# --- writing the outbox (inside the caller's transaction) -----------------------------------


def group_endpoints_deleted(group_id: int, slug: str, actor: str) -> list[Event]:
    """The `client.changed` events of a group's webhook endpoints, which go with the group (the
    foreign key cascades): where its leads were sent, and who stopped it, as when an endpoint
    is deleted by hand."""
    endpoints = WebhookEndpoint.objects.filter(group_id=group_id).order_by("id").values_list("pk", "url")
    return [
        Event(
            AuditEvent.Type.CLIENT_CHANGED,
            actor,
            group=slug,
            explanation={
                "webhook_endpoint": pk,
                "change": "deleted",
                "url": url_shown(url),
                "because": "group deleted",
            },
        )
        for pk, url in endpoints
    ]


def outbox_add(
    *,
    event: str,
    lead_id: int,
    group_id: int | None,
    rep_id: int | None,
    payload: dict[str, Any],
    at: datetime | None = None,
) -> OutboxMessage:
    """Records a lead event to announce. Call it inside the transaction that made it happen:
    the row commits (or rolls back) with the assignment, and the fan-out runs after commit."""
    message = outbox_message(event=event, lead_id=lead_id, group_id=group_id, rep_id=rep_id, payload=payload, at=at)
    message.save(force_insert=True)
    outbox_announce_on_commit(message.id)
    return message


def outbox_message(
    *,
    event: str,
    lead_id: int,
    group_id: int | None,
    rep_id: int | None,
    payload: dict[str, Any],
    at: datetime | None = None,
) -> OutboxMessage:
    """The row `outbox_add` writes, unsaved, for a caller that writes it in a statement of its
    own; it then calls `outbox_announce_on_commit` with the row's id."""
    return OutboxMessage(
        event=event, lead_id=lead_id, group_id=group_id, rep_id=rep_id, payload=payload, created_at=at or timezone.now()
    )


def outbox_announce_on_commit(message_id: int) -> None:
    """Fans the message out in Celery once the transaction commits (the sweep if that fails)."""
    transaction.on_commit(lambda: _announce(message_id), robust=True)


def outbox_announce_many_on_commit(message_ids: list[int]) -> None:
    """The same for a batch of messages: one drain task fans them all out."""
    if message_ids:
        transaction.on_commit(lambda: _announce(None), robust=True)


# One drain task serves every message committed while it waits: intake commits hundreds of
# messages a second, and publishing a task per message cost more CPU than the rest of the
# routing. The flag (Redis, SET NX) says "a drain is queued"; the drain clears it *before* it
# reads the outbox, and a publisher sets it *after* its commit, so a message either finds the
# flag clear and publishes a drain, or finds it set by a drain that has not read yet and will
# see the message. The flag expires, so a lost drain task delays nothing past DRAIN_FLAG_TTL_MS
# (and the sweep remains the safety net).
DRAIN_FLAG_TTL_MS = 10_000


class _Flag:
    client: Any = None
    url: str = ""


def _drain_flag() -> tuple[Any, str] | None:
    """The Redis client of the broker tasks are published to, and the drain flag's key; None
    when that broker is not Redis (then one task per message)."""
    from routing_project.celery import app

    url = str(app.conf.broker_write_url or app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://")):
        return None
    if _Flag.client is None or _Flag.url != url:
        import redis

        _Flag.client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        _Flag.url = url
    # Beside the broker's own keys (a purge of the queue takes the flag with it), per database:
    # deployments and parallel test runs sharing a Redis stay apart.
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    return _Flag.client, f"{prefix}notify:drain-queued:{connection.settings_dict.get('NAME')}"


def _announce(message_id: int | None) -> None:
    """A drain for the messages just committed (`message_id`: one message, None: several)."""
    flag = _drain_flag()
    if flag is None:
        if message_id is None:
            _enqueue("notifications.outbox_drain", None)
        else:
            _enqueue("notifications.outbox_dispatch", message_id)
        return
    if not broker_breaker.allowed():
        return  # the broker is down: the sweep delivers
    client, key = flag
    try:
        queued = client.set(key, "1", nx=True, px=DRAIN_FLAG_TTL_MS)
    except Exception as exc:  # noqa: BLE001 - any Redis error: the periodic sweep delivers later
        broker_breaker.failed()
        logger.warning("notification drain not enqueued (%s); the sweep will deliver it", type(exc).__name__)
        return
    if queued:
        _enqueue("notifications.outbox_drain", None)


def drain_flag_clear() -> None:
    """Called by the drain before it reads the outbox (see above)."""
    flag = _drain_flag()
    if flag is None:
        return
    client, key = flag
    try:
        client.delete(key)
    except Exception:  # noqa: BLE001 - the flag expires by itself
        logger.warning("notification drain flag not cleared; it expires in %d ms", DRAIN_FLAG_TTL_MS)


def outbox_add_many(*, messages: list[dict[str, Any]]) -> int:
    """Bulk form for batch routing (bulk import): rows of OutboxMessage fields (event,
    lead_id, group_id, rep_id, payload, created_at), one COPY, one drain task after commit."""
    n = rows_insert(OutboxMessage, messages)
    if n:
        transaction.on_commit(lambda: _enqueue("notifications.outbox_drain", None), robust=True)
    return n


def _enqueue(task_name: str, arg: int | list[int] | None) -> None:
    """Publishes a task; a broker outage must not fail or slow the request: after a failure,
    publishing is skipped (routing_project.broker_breaker) and the sweep delivers."""
    if not broker_breaker.allowed():
        return
    from routing_project.celery import app

    try:
        app.send_task(task_name, args=[arg] if arg is not None else [], retry=False)
    except Exception as exc:  # noqa: BLE001 - any broker error: the periodic sweep delivers later
        broker_breaker.failed()
        logger.warning("notification task not enqueued (%s); the sweep will deliver it", type(exc).__name__)


def enqueue_reset() -> None:
    """Closes the circuit breaker (tests, or once the broker is known to be back)."""
    broker_breaker.reset()


def _enqueue_sends(ids: list[int]) -> None:
    for delivery_id in ids:
        _enqueue("notifications.delivery_send", delivery_id)


def deliveries_publish(*, ids: list[int]) -> None:
    """Publishes a send for each delivery (the `deliveries_publish` task, in the notify worker)."""
    _enqueue_sends(ids)


def _publish_on_commit(ids: list[int]) -> None:
    """After commit, one task publishes the sends in the notify worker: an endpoint re-pointed
    with thousands of deliveries pending (after an import) held the admin's answer for minutes
    while each send was published from its request."""
    if ids:
        transaction.on_commit(lambda: _enqueue("notifications.deliveries_publish", ids), robust=True)


# --- fan-out --------------------------------------------------------------------------------


def outbox_dispatch(*, message_id: int) -> list[int]:
    """Turns one message into its deliveries (webhook per active endpoint, e-mail to the rep).
    Safe to run twice: the message row is locked and marked dispatched in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        message = (
            OutboxMessage.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk=message_id, dispatched_at__isnull=True)
            .first()
        )
        if message is None:
            return []
        deliveries = _deliveries_for([message], now)
        Delivery.objects.bulk_create(deliveries)
        OutboxMessage.objects.filter(pk=message.pk).update(dispatched_at=now)
        ids = [d.id for d in deliveries]
        transaction.on_commit(lambda: _enqueue_sends(ids), robust=True)
    return ids


def outbox_dispatch_pending(*, older_than_s: float = 0.0, limit: int = 500) -> int:
    """Fans out messages not dispatched yet (a lost task, a broker outage, a bulk import).
    `older_than_s` (the sweep's grace): only messages written that long ago; 0 (the drain):
    every message committed, whatever its time, which is the writer's clock: a web host a few
    milliseconds ahead of the worker's would otherwise leave its messages to the sweep."""
    now = timezone.now()
    with transaction.atomic():
        undispatched = OutboxMessage.objects.select_for_update(skip_locked=True, no_key=True).filter(
            dispatched_at__isnull=True
        )
        if older_than_s > 0:
            undispatched = undispatched.filter(created_at__lte=now - timedelta(seconds=older_than_s))
        messages = list(undispatched.order_by("id")[:limit])
        if not messages:
            return 0
        deliveries = _deliveries_for(messages, now)
        Delivery.objects.bulk_create(deliveries)
        OutboxMessage.objects.filter(pk__in=[m.pk for m in messages]).update(dispatched_at=now)
        ids = [d.id for d in deliveries]
        transaction.on_commit(lambda: _enqueue_sends(ids), robust=True)
    return len(messages)


def _deliveries_for(messages: list[OutboxMessage], now: datetime) -> list[Delivery]:
    group_ids = {m.group_id for m in messages if m.group_id is not None}
    rep_ids = {m.rep_id for m in messages if m.rep_id is not None}
    endpoints: dict[int, list[WebhookEndpoint]] = {}
    # Without their secrets (read when a delivery is signed): one the keys no longer open
    # stopped the fan-out of every message in the chunk, e-mails and other groups' included.
    active = WebhookEndpoint.objects.filter(group_id__in=group_ids, active=True).only("id", "group_id", "url")
    for endpoint in active.order_by("id"):
        endpoints.setdefault(endpoint.group_id, []).append(endpoint)
    emails = dict(Rep.objects.filter(pk__in=rep_ids).values_list("id", "email"))
    out: list[Delivery] = []
    for m in messages:
        for endpoint in endpoints.get(m.group_id or 0, []):
            out.append(
                Delivery(
                    message=m,
                    channel=Delivery.Channel.WEBHOOK,
                    endpoint=endpoint,
                    rep_id=m.rep_id,
                    target=url_shown(endpoint.url),
                    created_at=now,
                    next_attempt_at=now,
                )
            )
        if settings.NOTIFY_REP_EMAIL and m.rep_id in emails and m.event in (*EMAILED_EVENTS, MOVED_AWAY):
            out.append(
                Delivery(
                    message=m,
                    channel=Delivery.Channel.EMAIL,
                    rep_id=m.rep_id,
                    target=emails[m.rep_id],
                    created_at=now,
                    next_attempt_at=now,
                )
            )
    return out


# --- sending --------------------------------------------------------------------------------


def backoff_seconds(attempts: int) -> float:
    """Exponential: base, 2 x base, 4 x base, ... capped."""
    return float(min(settings.NOTIFY_BACKOFF_BASE_S * 2 ** max(attempts - 1, 0), settings.NOTIFY_BACKOFF_MAX_S))


def retry_delay(attempts: int) -> float:
    """The backoff plus up to a quarter more, at random: the deliveries that failed together
    (a receiver down for a minute) do not all come back in the same second."""
    return backoff_seconds(attempts) * random.uniform(1.0, 1.25)  # noqa: S311 - spread, not secrecy


def delivery_attempt(*, delivery_id: int) -> float | None:
    """Sends one pending delivery once. Returns the seconds until its next attempt when it
    failed and may be retried, else None (sent, given up, not due, or being sent elsewhere).

    The row is locked (SKIP LOCKED) while sending, so the retry timer and the sweep never
    send the same delivery twice at once; a sent delivery is never sent again.
    """
    with transaction.atomic():
        d = (
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("message", "endpoint", "rep")
            .defer("endpoint__secret", "endpoint__previous_secret")  # read when signing
            .filter(pk=delivery_id, status=Delivery.Status.PENDING)
            .first()
        )
        if d is None:
            return None
        now = timezone.now()
        if d.next_attempt_at > now + timedelta(seconds=1):
            return None  # an early duplicate; the scheduled retry or the sweep sends it
        if d.channel == Delivery.Channel.WEBHOOK and (
            d.endpoint is None or not d.endpoint.active or d.endpoint.group_id != d.message.group_id
        ):
            # Deactivated or deleted since: nothing more is sent to it, retries included. Moved to
            # another group: it now takes that group's leads, not this one's contact data.
            if d.endpoint is None:
                gone = "deleted"
            else:
                gone = "deactivated" if not d.endpoint.active else "moved to another group"
            d.status, d.last_error = Delivery.Status.FAILED, f"the endpoint was {gone}"
            d.save(update_fields=["status", "last_error"])
            return None
        held = d.endpoint.unreachable_until if d.channel == Delivery.Channel.WEBHOOK and d.endpoint else None
        if held is not None and held > now:
            # Its endpoint gave no answer at all a moment ago: every send to it would hold a
            # worker for the whole timeout, in front of the other endpoints' deliveries. This try
            # is not sent; it fails as that one did (see _held_attempt).
            return _held_attempt(d, now, held)
        if held is not None and d.endpoint is not None:
            # The hold is over, and every delivery it held is due at once: one of them tries the
            # endpoint (its row locked while it does, SKIP LOCKED), the others wait for that
            # try's outcome instead of each holding a worker for the whole timeout again. FOR NO
            # KEY UPDATE: new deliveries for the endpoint (their foreign key's share lock) are
            # still written meanwhile, so the fan-out of other leads does not wait for the try.
            # The endpoint's row alone, in no order: the model's ordering (by group) joined the
            # group's row and locked it too, for the whole send, and routing, which locks that
            # row, answered the group's leads 503 behind a receiver that hung.
            probe = list(
                WebhookEndpoint.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
                .filter(pk=d.endpoint.pk)
                .order_by()
                .values_list("unreachable_until", flat=True)
            )
            if not probe:  # another delivery is trying it: its outcome, without spending an attempt
                wait_until = now + timedelta(seconds=settings.NOTIFY_WEBHOOK_TIMEOUT_S)
                d.next_attempt_at = wait_until
                d.save(update_fields=["next_attempt_at"])
                return (wait_until - now).total_seconds()
            if probe[0] is not None and probe[0] > now:  # that try got no answer either
                return _held_attempt(d, now, probe[0])
        d.attempts += 1
        d.last_attempt_at = now
        # Where this attempt goes, as the log names it: an endpoint re-pointed since, or a rep's
        # address corrected since (the old one refused), takes the retries at its new address.
        if d.endpoint is not None:
            d.target = url_shown(d.endpoint.url)
        elif d.channel == Delivery.Channel.EMAIL and d.rep is not None:
            d.target = d.rep.email
        try:
            if d.channel == Delivery.Channel.WEBHOOK:
                d.last_status_code = _send_webhook(d)
            else:
                _send_email(d)
        except DeliveryError as exc:
            # PostgreSQL text holds no NUL: a receiver's answer (or a malformed status line)
            # carrying one would roll the attempt back, uncounted, to be retried for ever.
            d.last_error = str(exc).replace("\x00", "\ufffd")[:2000]
            d.last_status_code = exc.status_code
            retry_in: float | None = None
            if d.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
                d.status = Delivery.Status.FAILED
            else:
                retry_in = retry_delay(d.attempts)
                d.next_attempt_at = now + timedelta(seconds=retry_in)
            d.save(
                update_fields=[
                    "attempts",
                    "target",
                    "last_attempt_at",
                    "last_error",
                    "last_status_code",
                    "status",
                    "next_attempt_at",
                ]
            )
            no_answer = d.channel == Delivery.Channel.WEBHOOK and exc.status_code is None
            if no_answer and retry_in is not None and d.endpoint_id is not None:
                # No answer at all (timeout, refused, unresolvable): the endpoint's other
                # deliveries wait with this one until its next try (`held` above), so a hung
                # receiver holds one worker per try, not one per pending delivery. A delivery
                # given up on has no next try, and holds nothing: it held the endpoint's next
                # leads for the backoff of a try that never came (up to NOTIFY_BACKOFF_MAX_S),
                # however soon the receiver was back.
                WebhookEndpoint.objects.filter(pk=d.endpoint_id).update(
                    unreachable_until=now + timedelta(seconds=backoff_seconds(d.attempts))
                )
            elif held is not None and d.endpoint_id is not None:  # an answer, if an error: the hold is lifted
                WebhookEndpoint.objects.filter(pk=d.endpoint_id).update(unreachable_until=None)
            # What went wrong, without the error's text (an SMTP refusal names the address): the
            # HTTP status, else the kind of error. A delivery given up on is a warning.
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "no answer"
            outcome = f"HTTP {exc.status_code}" if exc.status_code is not None else cause
            if d.status == Delivery.Status.FAILED:
                logger.warning(
                    "delivery %s (%s) failed for good after %s attempts: %s", d.id, d.channel, d.attempts, outcome
                )
            else:
                logger.info("delivery %s (%s) attempt %s failed: %s", d.id, d.channel, d.attempts, outcome)
            _tried(d)
            return retry_in
        d.status, d.sent_at, d.last_error = Delivery.Status.SENT, timezone.now(), ""
        sent = ["attempts", "target", "last_attempt_at", "last_status_code", "status", "sent_at", "last_error"]
        d.save(update_fields=sent)
        _tried(d)
        if held is not None and d.endpoint_id is not None:  # answering again: its held deliveries go at their next try
            WebhookEndpoint.objects.filter(pk=d.endpoint_id).update(unreachable_until=None)
        return None


def _held_attempt(d: Delivery, now: datetime, until: datetime) -> float | None:
    """A try of `d` that falls while its endpoint is held (`until`: another delivery's try got
    no answer): not sent, it fails as that try did, and the delivery goes on along its own
    backoff, not before the hold ends. Held tries that spent no attempt waited for the try that
    ended the hold, and only that try's delivery advanced: with N deliveries pending, an
    endpoint that stayed down kept them pending about N times as long as NOTIFY_MAX_ATTEMPTS
    lasts (never given up while new leads came), tried every few seconds by whichever fresh
    delivery ended the last hold, and every delivery it held came due at the same instant.
    Returns the seconds until its next try, or None when this was its last attempt."""
    d.attempts += 1
    d.last_attempt_at = now
    d.last_status_code = None
    d.last_error = f"not sent: the endpoint gave another delivery no answer, held until {until:%Y-%m-%d %H:%M:%S} UTC"
    retry_in: float | None = None
    if d.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
        d.status = Delivery.Status.FAILED
        logger.warning("delivery %s (%s) failed for good after %s attempts: held", d.id, d.channel, d.attempts)
    else:
        own = now + timedelta(seconds=retry_delay(d.attempts))
        d.next_attempt_at = max(own, until)
        retry_in = (d.next_attempt_at - now).total_seconds()
    d.save(update_fields=["attempts", "last_attempt_at", "last_status_code", "last_error", "status", "next_attempt_at"])
    _tried(d)
    return retry_in


def _tried(d: Delivery) -> None:
    """The try counted in /metrics once it is saved: sent, retry, or failed (given up)."""
    outcome = {"sent": "sent", "failed": "failed"}.get(str(d.status), "retry")
    channel = str(d.channel)
    transaction.on_commit(lambda: metrics.delivery_tried(channel=channel, outcome=outcome))


def endpoint_repointed(*, endpoint_id: int) -> list[int]:
    """An endpoint given another URL (its receiver moved, or the old address was wrong): its
    pending deliveries go to the new address now, not after the backoff and the hold the old
    address earned (up to NOTIFY_BACKOFF_MAX_S). Call it in the transaction that saved the URL;
    the sends are published after commit. A delivery being sent right now (its row locked)
    keeps its own outcome. Returns the ids of the deliveries brought forward."""
    now = timezone.now()
    WebhookEndpoint.objects.filter(pk=endpoint_id).update(unreachable_until=None)
    pending = Delivery.objects.filter(
        endpoint_id=endpoint_id, channel=Delivery.Channel.WEBHOOK, status=Delivery.Status.PENDING
    )
    ids = list(
        pending.select_for_update(skip_locked=True)
        .filter(next_attempt_at__gt=now)
        .order_by("id")
        .values_list("id", flat=True)
    )
    if ids:
        Delivery.objects.filter(pk__in=ids).update(next_attempt_at=now)
    _publish_on_commit(ids)
    return ids


def endpoint_stopped(*, endpoint_id: int, gone: str) -> int:
    """An endpoint deactivated or about to be deleted (`gone`): nothing more is sent to it, and
    its pending deliveries end `failed` now, saying why, rather than showing as pending in the
    delivery log until their next try. A delivery being sent right now (its row locked) ends
    at its next try, as before. Returns how many were ended."""
    ids = list(
        Delivery.objects.select_for_update(skip_locked=True)
        .filter(endpoint_id=endpoint_id, channel=Delivery.Channel.WEBHOOK, status=Delivery.Status.PENDING)
        .values_list("id", flat=True)
    )
    return Delivery.objects.filter(pk__in=ids).update(
        status=Delivery.Status.FAILED, last_error=f"the endpoint was {gone}"
    )


def deliveries_send_again(*, ids: list[int]) -> list[int]:
    """Failed deliveries given a new round of attempts (a receiver that was down longer than the
    retries lasted, a mail server fixed since): pending again, due now, their sends published
    after commit. A delivery sent is never sent again, and one whose endpoint was deleted,
    deactivated or moved to another group (its attempt would end it failed at once, the lead's
    data not for that receiver) stays failed. Returns the ids sent again."""
    now = timezone.now()
    again = list(
        Delivery.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(pk__in=ids, status=Delivery.Status.FAILED)
        .exclude(channel=Delivery.Channel.WEBHOOK, endpoint__isnull=True)
        .exclude(channel=Delivery.Channel.WEBHOOK, endpoint__active=False)
        .exclude(Q(channel=Delivery.Channel.WEBHOOK) & ~Q(endpoint__group_id=F("message__group_id")))
        .order_by("id")
        .values_list("id", flat=True)
    )
    if again:
        Delivery.objects.filter(pk__in=again).update(status=Delivery.Status.PENDING, attempts=0, next_attempt_at=now)
        # Sent again now means now: not after a hold another delivery's unanswered try put on the
        # endpoint (up to NOTIFY_BACKOFF_MAX_S), which would keep these waiting without a try.
        WebhookEndpoint.objects.filter(
            pk__in=Delivery.objects.filter(pk__in=again, endpoint__isnull=False).values("endpoint_id")
        ).update(unreachable_until=None)
    _publish_on_commit(again)
    return again


def deliveries_due(*, older_than_s: float, limit: int = 500) -> list[int]:
    """Pending deliveries whose retry is overdue by more than `older_than_s` (timer lost)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    return list(
        Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=cutoff)
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )


def purge(*, now: datetime | None = None, batch: int = 5000, budget_s: float | None = None) -> tuple[int, bool]:
    """Deletes the messages announced more than NOTIFY_RETENTION_DAYS ago whose deliveries are
    all finished (sent or failed), with those deliveries: the outbox and the delivery log keep
    a window, not every lead ever announced. A message with a delivery still pending stays.
    In batches (short transactions), until none is left or `budget_s` has been spent. Returns
    the number of messages deleted, and whether none is left."""
    started = time.monotonic()
    cutoff = (now or timezone.now()) - timedelta(days=settings.NOTIFY_RETENTION_DAYS)
    finished = OutboxMessage.objects.filter(created_at__lt=cutoff, dispatched_at__isnull=False).exclude(
        deliveries__status=Delivery.Status.PENDING
    )
    deleted = 0
    while ids := list(finished.order_by("id").values_list("id", flat=True)[:batch]):
        with transaction.atomic():
            Delivery.objects.filter(message_id__in=ids).delete()
            OutboxMessage.objects.filter(id__in=ids).delete()
        deleted += len(ids)
        if budget_s is not None and time.monotonic() - started >= budget_s:
            return deleted, False
    return deleted, True


def sign(secret: str, body: bytes, at: int | None = None, *, previous: Sequence[str] = ()) -> str:
    """The same scheme as signed intake: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">,
    then one more v1 under each replaced secret still in its grace period (a receiver that has
    not switched yet still finds its signature)."""
    t = int(time.time()) if at is None else at
    macs = [hmac.new(key.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest() for key in (secret, *previous)]
    return ",".join([f"t={t}", *(f"v1={mac}" for mac in macs)])


def endpoint_signing_secrets(endpoint: WebhookEndpoint, *, now: datetime | None = None) -> tuple[str, list[str]]:
    """The secret deliveries are signed with and the replaced ones still in their grace period."""
    previous = secret_rotation.still_valid(
        endpoint.previous_secret, endpoint.previous_secret_expires_at, now=now or timezone.now()
    )
    return endpoint.secret, [old for old, _ends in previous]


def endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, actor: str, grace: timedelta = secret_rotation.ROTATION_GRACE
) -> str:
    """Gives the endpoint a new secret and returns it. For `grace` deliveries are signed under
    the old one too, so the receiver can take the new secret at its own pace; rotating again
    meanwhile keeps each replaced secret for the rest of its own grace period."""
    secret = new_secret()
    now = timezone.now()
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update(of=("self",)).select_related("group").get(pk=endpoint.pk)
        locked.previous_secret, locked.previous_secret_expires_at = secret_rotation.replaced(
            locked.secret, locked.previous_secret, locked.previous_secret_expires_at, now=now, grace=grace
        )
        locked.secret, locked.secret_rotated_at = secret, now
        locked.save(update_fields=["previous_secret", "previous_secret_expires_at", "secret", "secret_rotated_at"])
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED,
            actor=actor,
            group=locked.group.slug,
            explanation={
                "webhook_endpoint": locked.pk,
                "change": "secret rotated",
                "grace_hours": grace / timedelta(hours=1),
            },
        )
    return secret


def endpoint_revoke_previous_secrets(*, endpoint: WebhookEndpoint, actor: str) -> int:
    """Stops signing under the replaced secrets now (the receiver has switched, or an old secret
    leaked: anyone holding it could forge deliveries the receiver still trusts). Returns how
    many were dropped."""
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update(of=("self",)).select_related("group").get(pk=endpoint.pk)
        dropped = len(endpoint_signing_secrets(locked)[1])
        locked.previous_secret, locked.previous_secret_expires_at = "", None
        locked.save(update_fields=["previous_secret", "previous_secret_expires_at"])
        if dropped:
            audit_record(
                type=AuditEvent.Type.CLIENT_CHANGED,
                actor=actor,
                group=locked.group.slug,
                explanation={"webhook_endpoint": locked.pk, "change": "previous secrets revoked", "revoked": dropped},
            )
    return dropped


def webhook_body(d: Delivery) -> bytes:
    m = d.message
    owner = {"id": d.rep.id, "name": d.rep.name, "email": d.rep.email} if d.rep is not None else None
    lead = {**m.payload.get("lead", {}), "owner": owner}
    document = {
        "id": f"msg_{m.id}",
        # Deliveries are retried each on its own, so after a receiver's outage a lead's
        # messages can arrive out of order: the number its events were written in (message ids
        # are written in commit order for each lead, under its lock) lets a receiver keep the
        # latest and drop an older one arriving late.
        "sequence": m.id,
        "event": m.event,
        "created_at": m.created_at.isoformat(),
        "lead": lead,
        **{k: v for k, v in m.payload.items() if k != "lead"},
    }
    return json.dumps(document, separators=(",", ":"), default=str).encode()


def _send_webhook(d: Delivery) -> int:
    if d.endpoint is None:
        raise DeliveryError("the endpoint was deleted")
    body = webhook_body(d)
    try:
        secret, previous = endpoint_signing_secrets(d.endpoint)
    except ImproperlyConfigured as exc:
        # A secret sealed under a key this process no longer has: this endpoint's deliveries
        # fail, in the delivery log with the reason, and are retried; no other is held up.
        logger.error("webhook endpoint %s: %s", d.endpoint.pk, exc)
        raise DeliveryError(f"not sent: {exc}") from None
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "lead-router-webhooks/1",
        SIGNATURE_HEADER: sign(secret, body, previous=previous),
        "X-Event": d.message.event,
        "X-Delivery-Id": str(d.id),
        "X-Message-Id": f"msg_{d.message_id}",
    }
    status, detail = webhook_post(d.endpoint.url, body, headers, timeout=settings.NOTIFY_WEBHOOK_TIMEOUT_S)
    if not 200 <= status < 300:
        # A 3xx is not followed: it would be a GET without the body (the signature along, to
        # wherever it points), logged as sent. It is a failed attempt like any other.
        raise DeliveryError(f"HTTP {status}: {detail}".strip(), status_code=status)
    return status


def webhook_post(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> tuple[int, str]:
    """POSTs `body` and returns (status, the first 300 characters of an error answer's body).

    `timeout` bounds the whole exchange, not each socket read: a receiver that trickles its
    answer a byte at a time would otherwise hold the worker for as long as it likes. A timer
    shuts the socket down at the deadline, which ends any read or write in progress.
    Every failure to get an answer is a DeliveryError without a status code."""
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DeliveryError("only http and https URLs with a host are delivered")
        port = parts.port
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        kwargs: dict[str, Any] = {"context": ssl.create_default_context()} if parts.scheme == "https" else {}
        conn = connection_class(parts.hostname, port, timeout=timeout, **kwargs)
    except (ValueError, http.client.HTTPException) as exc:  # a port out of range, a malformed host
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if parts.username is not None:
        # A user and password in the address (https://crm:<password>@host/...) are sent as HTTP
        # Basic authentication, as curl or a browser sends them: http.client alone drops them,
        # and the receiver answered every delivery 401.
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers = {**headers, "Authorization": f"Basic {base64.b64encode(credentials).decode('ascii')}"}
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock  # once: the sending thread may be closing it
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    deadline = time.monotonic() + timeout
    try:
        # The name's lookup counts against the same deadline: getaddrinfo has no timeout of its
        # own, and a resolver that does not answer would hold the worker past it. The socket
        # then connects to the addresses found; TLS still checks the certificate by name.
        addresses = _resolved(parts.hostname, port or conn.default_port, deadline)
        conn._create_connection = lambda address, timeout=None, source_address=None: _connected(  # type: ignore[attr-defined]
            addresses, address[1], timeout, source_address
        )
        conn.connect()
        if expired.is_set():  # the connect took the whole time
            raise TimeoutError("timed out")
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body, headers)
        response = conn.getresponse()
        detail = ""
        if not 200 <= response.status < 300:
            detail = response.read(300).decode("utf-8", "replace")
            location = response.getheader("Location") if 300 <= response.status < 400 else None
            if location:  # where the receiver says it moved: the endpoint's URL to correct
                detail = f"Location: {url_shown(location)[:300]} {detail}".strip()
        return response.status, detail
    except (OSError, http.client.HTTPException, ValueError, UnicodeError) as exc:
        if expired.is_set():
            raise DeliveryError(f"no complete answer within {timeout:g} s") from exc
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        timer.cancel()
        conn.close()


def _resolved(host: str, port: int, deadline: float) -> list[str]:
    """The host's addresses, or DeliveryError once `deadline` (time.monotonic()) passes. The
    lookup runs in a daemon thread, left behind if the resolver never answers."""
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:  # socket.gaierror: no such name
            found.append(exc)

    thread = threading.Thread(target=lookup, daemon=True, name="webhook-dns")
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not found:
        raise DeliveryError(f"the host name {host!r} did not resolve in time")
    if isinstance(found[0], OSError):
        raise DeliveryError(f"{type(found[0]).__name__}: {found[0]}")
    return list(dict.fromkeys(info[4][0] for info in found[0]))


def _connected(addresses: list[str], port: int, timeout: float | None, source: Any) -> socket.socket:
    """The first of `addresses` that accepts a connection, as socket.create_connection tries
    a name's addresses in turn (an IP address needs no lookup)."""
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout, source)
        except OSError as exc:
            error = exc
    raise error or OSError("no address to connect to")


def email_content(d: Delivery) -> tuple[str, str]:
    """Subject and body. Contact details stay in the app (the link), not in the mail."""
    m = d.message
    lead = m.payload.get("lead", {})
    if m.event == MOVED_AWAY:
        # What it says of why is the product's own text, never a lead's or a manager's.
        subject = f"Lead #{m.lead_id} is no longer yours"
        # No group named: after a reroute the lead's group is the one it went to, not the rep's.
        first = f"Lead #{m.lead_id} is no longer yours: {m.payload.get('why')}."
    else:
        verb = {"lead.assigned": "assigned to you", "lead.escalated": "escalated to you"}.get(m.event, m.event)
        subject = f"Lead #{m.lead_id} {verb}"
        first = f"Lead #{m.lead_id} was {verb} in group {lead.get('group') or '-'}."
    lines = [
        first,
        "",
        *(
            f"{label}: {_email_value(d, key, lead[key])}"
            for key, label in _EMAIL_FIELDS
            # The due time is the new owner's: nothing to accept for the rep it moved from.
            if lead.get(key) not in (None, "") and not (key == "sla_due_at" and m.event == MOVED_AWAY)
        ),
        "",
    ]
    if m.rep_id is not None and m.event in EMAILED_EVENTS:
        from leads.accept_link import accept_url

        lines.append(f"Accept it: {accept_url(lead_id=m.lead_id, rep_id=m.rep_id)}")
    lines.append(f"In the admin: {settings.PUBLIC_BASE_URL.rstrip('/')}/admin/leads/lead/{m.lead_id}/change/")
    return subject, "\n".join(lines)


# Line breaks and other control characters (and Unicode's line and paragraph separators).
_NOT_ON_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Invisible characters that reorder or hide text (bidirectional overrides and isolates, the
# zero-width space). The marks a script needs stay, as in names (rotation.models): the
# non-joiner of a Persian word, the joiner of an emoji, left-to-right and right-to-left marks.
_HIDDEN = re.compile(r"[\u200b\u202a-\u202e\u2060-\u2069\ufeff]")
# What a mail client would make a link of: a scheme's "://", "www.", or a host name (labels
# and dots, ending in a lower-case top-level name: "acme.io", not "v2.0", "e.g." or the
# capitalised words of a name, "J.P.Morgan", "Dr.Oetker").
_LINKISH = re.compile(r"(?i:[a-z][a-z0-9+.-]*://)\S*|(?i:\bwww\.)\S*|\b[\w-]+(?:\.[\w-]+)*\.[a-z]{2,}\b")


def _defanged(text: str) -> str:
    """`https://evil.example/x` as `https[:]//evil[.]example/x`: read as the sender wrote it,
    never a link the rep's mail client makes, beside the e-mail's own (the accept link)."""
    return _LINKISH.sub(lambda m: m.group(0).replace("://", "[:]//").replace(".", "[.]"), text)


def _email_value(d: Delivery, key: str, value: Any) -> Any:
    """A lead's value on its own line: what the lead's sender wrote cannot start a line of the
    rep's e-mail (a fake "Accept it:" link above the real one), nor be a link. The due time on
    the rep's clock (the payload holds it in UTC, to the microsecond), to the second."""
    if key != "sla_due_at":
        return _defanged(_NOT_ON_ONE_LINE.sub(" ", _HIDDEN.sub("", str(value))).strip())
    zone = d.rep.timezone if d.rep is not None else "UTC"
    try:
        local = datetime.fromisoformat(value).astimezone(ZoneInfo(zone))
    except (ValueError, TypeError, ZoneInfoNotFoundError):
        return value
    # To the second, unless on the minute: due at 00:22:45, "before 00:22" read as past already,
    # and "before 00:23" promised 15 s the escalation does not wait.
    return f"{local:%Y-%m-%d %H:%M:%S} ({zone})" if local.second else f"{local:%Y-%m-%d %H:%M} ({zone})"


_EMAIL_FIELDS = (
    ("company", "Company"),
    ("country", "Country"),
    ("source", "Source"),
    ("product", "Product"),
    ("sla_due_at", "Accept before"),
)


def _send_email(d: Delivery) -> None:
    subject, body = email_content(d)
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [d.target], fail_silently=False)
    except Exception as exc:  # noqa: BLE001 - SMTP and socket errors alike are retried
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
