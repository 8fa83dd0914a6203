"""Signed web-form intake: verify the signature, reject replays, map the form's fields, then
hand the lead to the same intake service the API uses."""

from __future__ import annotations

import codecs
import hashlib
import hmac
import logging
import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_record
from routing_project.api import json_loads_client
from routing_project.db import on_a_live_connection
from security import secret_rotation

from .models import HookDelivery, IntakeSource, field_map_problems

logger = logging.getLogger(__name__)

SIGNATURE_TOLERANCE = timedelta(minutes=5)
MAX_SIGNATURE_HEADER = 1024


class SignatureError(Exception):
    """The request is not signed by the source (401); the message says why, without secrets."""


class UnsupportedBody(Exception):
    """Neither JSON nor form-encoded (415)."""


class BadBody(Exception):
    """The body does not parse (400)."""


@dataclass(frozen=True)
class VerifiedSignature:
    signed_at: datetime
    digest: str  # sha256 of the signed message ("<t>.<raw body>"): what the replay guard stores


# --- sources and secrets ---------------------------------------------------------------------


def _new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def source_create(
    *,
    slug: str,
    name: str,
    actor: str,
    field_map: dict[str, str] | None = None,
    rate_limit_per_minute: int = 120,
    active: bool = True,
) -> tuple[IntakeSource, str]:
    """Creates a source and returns it with its secret (the only time the secret is shown)."""
    problems = field_map_problems(field_map or {})
    if problems:
        raise ValueError("; ".join(problems))
    secret = _new_secret()
    with transaction.atomic():
        source = IntakeSource.objects.create(
            slug=slug,
            name=name,
            secret=secret,
            secret_prefix=secret[:12],
            field_map=field_map or {},
            rate_limit_per_minute=rate_limit_per_minute,
            active=active,
        )
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED,
            actor=actor,
            explanation={"intake_source": slug, "change": "created"},
        )
    return source, secret


def previous_secrets(*, source: IntakeSource, now: datetime) -> list[tuple[str, datetime]]:
    """The replaced secrets still within their grace period, newest first, with when each ends."""
    return secret_rotation.still_valid(source.previous_secret, source.previous_secret_expires_at, now=now)


def source_rotate_secret(*, source: IntakeSource, actor: str, grace: timedelta = secret_rotation.ROTATION_GRACE) -> str:
    """Gives the source a new secret; the old one stays valid for `grace` so senders can switch.
    A secret replaced by an earlier rotation keeps the rest of its own grace period: rotating
    again (the new secret was lost) must not cut off the forms still signing with the old one."""
    secret = _new_secret()
    now = timezone.now()
    with transaction.atomic():
        locked = IntakeSource.objects.select_for_update().get(pk=source.pk)
        locked.previous_secret, locked.previous_secret_expires_at = secret_rotation.replaced(
            locked.secret, locked.previous_secret, locked.previous_secret_expires_at, now=now, grace=grace
        )
        locked.secret, locked.secret_prefix, locked.secret_rotated_at = secret, secret[:12], now
        locked.save(
            update_fields=[
                "previous_secret",
                "previous_secret_expires_at",
                "secret",
                "secret_prefix",
                "secret_rotated_at",
            ]
        )
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED,
            actor=actor,
            explanation={
                "intake_source": source.slug,
                "change": "secret rotated",
                "grace_hours": grace / timedelta(hours=1),
            },
        )
    return secret


def source_revoke_previous_secrets(*, source: IntakeSource, actor: str) -> int:
    """Ends the grace period of the replaced secrets now: after a leak, a rotation alone would
    leave the leaked secret signing leads for another day. Returns how many stopped working."""
    with transaction.atomic():
        locked = IntakeSource.objects.select_for_update().get(pk=source.pk)
        revoked = len(previous_secrets(source=locked, now=timezone.now()))
        locked.previous_secret, locked.previous_secret_expires_at = "", None
        locked.save(update_fields=["previous_secret", "previous_secret_expires_at"])
        if revoked:
            audit_record(
                type=AuditEvent.Type.CLIENT_CHANGED,
                actor=actor,
                explanation={"intake_source": source.slug, "change": "previous secrets revoked", "revoked": revoked},
            )
    return revoked


# The fields an edit may change; the secrets are changed by rotation only.
EDITABLE_FIELDS = ("slug", "name", "field_map", "active", "rate_limit_per_minute")


def source_update(*, source: IntakeSource, fields: list[str], actor: str) -> None:
    """Saves `fields` of an edited source and records what they now hold: a source switched
    off, re-mapped or allowed more requests is audited as creating or rotating it is."""
    fields = [f for f in fields if f in EDITABLE_FIELDS]
    if not fields:
        return
    with transaction.atomic():
        source.save(update_fields=fields)
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED,
            actor=actor,
            explanation={
                "intake_source": source.slug,
                "change": "edited",
                "fields": {f: getattr(source, f) for f in fields},
            },
        )


def source_delete(*, source: IntakeSource, actor: str) -> None:
    """Deletes a source (its form's posts are refused from then on), audited as creating it is."""
    with transaction.atomic():
        slug = source.slug
        source.delete()
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED, actor=actor, explanation={"intake_source": slug, "change": "deleted"}
        )


# --- signatures ------------------------------------------------------------------------------


def sign(*, secret: str, body: bytes, timestamp: int) -> str:
    """The X-Signature header value a sender computes (documented in the README)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _parse_header(header: str) -> tuple[int, list[str]]:
    if not header:
        raise SignatureError("Missing X-Signature header.")
    if len(header) > MAX_SIGNATURE_HEADER:
        raise SignatureError("Malformed X-Signature header.")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError("Malformed X-Signature header: use t=<unix seconds>,v1=<hex HMAC-SHA256>.")
        if key == "t":
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                raise SignatureError("Malformed X-Signature timestamp.")
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value.lower())
    if timestamp is None or not candidates:
        raise SignatureError("Malformed X-Signature header: use t=<unix seconds>,v1=<hex HMAC-SHA256>.")
    return timestamp, candidates


def hook_verify(*, source: IntakeSource, header: str, body: bytes, now: datetime | None = None) -> VerifiedSignature:
    """Checks `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">` against the source's
    secret (or its previous one, during the rotation grace period), in constant time, and that
    `t` is within 5 minutes of now."""
    now = now or timezone.now()
    timestamp, candidates = _parse_header(header)
    if abs(now.timestamp() - timestamp) > SIGNATURE_TOLERANCE.total_seconds():
        raise SignatureError("The signature's timestamp is outside the 5-minute tolerance.")
    secrets_ = [source.secret, *(old for old, _expires in previous_secrets(source=source, now=now))]
    signed = f"{timestamp}.".encode() + body
    matched = None
    for secret in secrets_:
        expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        for candidate in candidates:
            # compare_digest on every pair: no early exit that would time the secret.
            if hmac.compare_digest(expected.encode(), candidate.encode("ascii", "replace")):
                matched = candidate
    if matched is None:
        raise SignatureError("The signature does not match.")
    signed_at = datetime.fromtimestamp(timestamp, tz=now.tzinfo)
    # The message, not the v1 value that matched: during a rotation a sender signs with both
    # secrets, and a replay keeping only the other v1 value would otherwise pass as new.
    return VerifiedSignature(signed_at=signed_at, digest=hashlib.sha256(signed).hexdigest())


def hook_replayed(*, source: IntakeSource, signature: VerifiedSignature) -> bool:
    """True when the signature was used already: refused before it counts against the
    source's rate limit (`hook_claim` still settles a replay racing the original)."""
    return HookDelivery.objects.filter(source=source, signature_hash=signature.digest).exists()


def hook_claim(*, source: IntakeSource, signature: VerifiedSignature) -> HookDelivery:
    """Records the signature as used, committed on its own so every other process sees it;
    the same signature again (within the tolerance window, which bounds replays) is refused."""
    now = timezone.now()
    if random.random() < 0.02:  # noqa: S311 - housekeeping, not security
        # Older than the tolerance window, a replay fails the timestamp check anyway.
        HookDelivery.objects.filter(received_at__lt=now - 2 * SIGNATURE_TOLERANCE).delete()
    try:
        with transaction.atomic():
            return HookDelivery.objects.create(
                source=source, signature_hash=signature.digest, signed_at=signature.signed_at, received_at=now
            )
    except IntegrityError:
        raise SignatureError("This signature was used already (replay).") from None


def hook_release(*, delivery: HookDelivery) -> None:
    """The request failed without writing a lead: the sender may retry with the same signature.
    On a new connection if the failure was the connection's (PostgreSQL restarted): a claim
    left behind would refuse the very retry the 503 asks for as a replay, losing the lead."""
    on_a_live_connection(lambda: HookDelivery.objects.filter(pk=delivery.pk).delete())


# --- bodies and field mapping ----------------------------------------------------------------


_NUL = "The body holds a NUL character (\\u0000), which cannot be stored."


def _holds_nul(payload: Any) -> bool:
    """Whether a NUL is in any key or string of the payload, at any depth (iteratively: a
    payload nested as deep as the parser allows is walked without recursion)."""
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _charset(content_type: str) -> str:
    """The charset the Content-Type names (UTF-8 when none)."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"'):
            return value.strip().strip('"')
    return "UTF-8"


def _decode(body: bytes, charset: str) -> str:
    """The body as text, in the charset it names (a form page in Latin-1 posts in Latin-1).
    Text encodings only (bytes.decode refuses rot13, base64...), and no lone UTF-16 surrogate,
    which utf-7 or unicode_escape can make from plain ASCII and no UTF-8 text can hold."""
    try:
        text = body.decode(charset)
        if codecs.lookup(charset).name != "utf-8":
            text.encode("utf-8")
    except LookupError:
        raise BadBody(f"'{charset[:40]}' is not a text encoding: send UTF-8.") from None
    except UnicodeEncodeError:
        raise BadBody("The body holds a lone UTF-16 surrogate (\\ud800-\\udfff).") from None
    return text


def hook_parse(*, body: bytes, content_type: str) -> dict[str, Any]:
    """The posted fields. A NUL anywhere is refused: the payload is kept as posted (jsonb on
    PostgreSQL, which cannot hold one), including the fields the source's map drops."""
    media = content_type.split(";")[0].strip().lower()
    charset = _charset(content_type)
    if media == "application/json" or media.endswith("+json"):
        try:
            text = _decode(body, charset)
            payload = json_loads_client(text)
        except ValueError as exc:  # UnicodeDecodeError included
            raise BadBody(f"The body is not valid JSON: {exc}.") from None
        if not isinstance(payload, dict):
            raise BadBody("The body must be a JSON object.")
        # A NUL can only arrive escaped: walk the payload only when the text has such an escape.
        if "\\u0000" in text and _holds_nul(payload):
            raise BadBody(_NUL)
        return payload
    if media == "application/x-www-form-urlencoded":
        try:
            # Percent-escapes decoded strictly too, in the body's charset: %E9 (Latin-1) in a
            # body that names no charset (UTF-8) is refused, never stored as U+FFFD.
            pairs = parse_qsl(
                _decode(body, charset), keep_blank_values=True, max_num_fields=200, encoding=charset, errors="strict"
            )
        except (UnicodeDecodeError, ValueError):
            raise BadBody(f"The body is not valid form data ({charset[:40]}, at most 200 fields).") from None
        try:
            "".join(key + value for key, value in pairs).encode("utf-8")  # escapes in utf-7...
        except UnicodeEncodeError:
            raise BadBody("The body holds a lone UTF-16 surrogate (\\ud800-\\udfff).") from None
        if any("\x00" in key or "\x00" in value for key, value in pairs):
            raise BadBody(_NUL)
        # A repeated field keeps its last value, but an empty one never erases a value typed
        # in another of its boxes (`fname=Jane&fname=`).
        fields: dict[str, str] = {}
        for key, value in pairs:
            if value or key not in fields:
                fields[key] = value
        return fields
    raise UnsupportedBody(f"Unsupported content type '{media[:100]}': send application/json or form data.")


def hook_map(*, source: IntakeSource, payload: dict[str, Any]) -> dict[str, Any]:
    """Turns a form's fields into the lead fields of `POST /api/v1/leads/`: mapped fields by the
    source's map, fields already named like a lead field as they are, the rest dropped (they
    stay in the raw payload). A mapped field wins over a field named like its lead field,
    whatever their order in the form. Empty values are left out; `source` defaults to the
    source slug."""
    from .models import LEAD_FIELDS

    data: dict[str, Any] = {}
    mapped: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    field_map = source.field_map or {}
    for key, value in payload.items():
        target = field_map.get(key) or (key if key in LEAD_FIELDS else None)
        if target is None or value is None or value == "":
            continue
        if target.startswith("attributes."):
            attributes[target[len("attributes.") :]] = value
        elif field_map.get(key):
            mapped[target] = value
        else:
            data[target] = value
    data.update(mapped)
    posted = payload.get("attributes") if "attributes" not in field_map else None
    if isinstance(posted, dict):
        attributes = {**posted, **attributes}
    if posted not in (None, "") and not isinstance(posted, dict):
        # Not an object (text, a list, a number): handed on as posted, so that validation
        # refuses it with a 400 naming `attributes`, as the API does, not dropped unseen.
        data["attributes"] = posted
    elif attributes:
        data["attributes"] = attributes
    data.setdefault("source", source.slug)
    return data


def hook_errors_named(*, source: IntakeSource, payload: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """The lead's validation errors keyed by the form fields that carried the bad values: a
    mapped field by the name the form posted it under (`your-email`, not `email`), so that the
    sender can tell what to fix. A field sent under the lead field's own name, or not sent,
    keeps that name. A mapped field left empty is the one to fill in (`your-email` for a
    missing email), unless the lead field came under its own name; an attribute's problem
    (`'campaign': ...`) goes to the form field mapped to `attributes.campaign`."""
    field_map = source.field_map or {}
    carried: dict[str, str] = {}
    left_empty: dict[str, str] = {}
    for key, value in payload.items():
        target = field_map.get(key)
        if not target:
            continue
        if value is not None and value != "":
            carried[target] = key  # the last one, as hook_map takes
        else:
            left_empty.setdefault(target, key)
    for target, key in left_empty.items():
        if target not in carried and payload.get(target) in (None, ""):
            carried[target] = key
    named: dict[str, Any] = {}
    for name, messages in errors.items():
        for message in messages if isinstance(messages, list) else [messages]:
            field = carried.get(name, name)
            if name == "attributes" and isinstance(message, str) and message.startswith("'"):
                key = message[1:].partition("': ")[0]
                field = carried.get(f"attributes.{key}", field)
            named.setdefault(field, []).append(message)
    return named


def source_touch(*, source: IntakeSource) -> None:
    now = timezone.now()
    if source.last_used_at is None or now - source.last_used_at > timedelta(minutes=1):
        IntakeSource.objects.filter(pk=source.pk).update(last_used_at=now)
