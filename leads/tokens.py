import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from .models import ApiClient

VALID_SCOPES = {s.value for s in ApiClient.Scope}


def api_client_create(
    *, name: str, scopes: list[str], rate_limit_per_minute: int | None = None
) -> tuple[ApiClient, str]:
    """Creates a client and returns it with its token; only the token's hash is kept.
    `rate_limit_per_minute` None: the API_RATE_LIMIT_PER_MINUTE setting applies."""
    unknown = set(scopes) - VALID_SCOPES
    if unknown:
        raise ValueError(f"Unknown scopes: {', '.join(sorted(unknown))} (use {', '.join(sorted(VALID_SCOPES))}).")
    token = "lr_" + secrets.token_urlsafe(32)
    client = ApiClient.objects.create(
        name=name,
        token_hash=ApiClient.hash_token(token),
        token_prefix=token[:10],
        scopes=sorted(set(scopes)),
        rate_limit_per_minute=rate_limit_per_minute,
    )
    return client, token


def api_client_revoke(*, client: ApiClient, actor: str) -> None:
    """Revokes a token for good: the next request with it gets 401."""
    from audit.models import AuditEvent
    from audit.services import audit_record

    ApiClient.objects.filter(pk=client.pk).update(active=False, revoked_at=timezone.now())
    audit_record(
        type=AuditEvent.Type.CLIENT_CHANGED, actor=actor, explanation={"api_client": client.name, "change": "revoked"}
    )


def api_client_delete(*, client: ApiClient, actor: str) -> None:
    """Deletes a client (its token with it, and its stored idempotent answers), audited as
    revoking is: who may call the API is a change the trail keeps."""
    from audit.models import AuditEvent
    from audit.services import audit_record

    with transaction.atomic():
        name = client.name
        client.delete()
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED, actor=actor, explanation={"api_client": name, "change": "deleted"}
        )


# The fields an edit may change; none of them is secret (only the token's hash is, never edited).
EDITABLE_FIELDS = ("name", "scopes", "rate_limit_per_minute", "active")


def api_client_audit_created(*, client: ApiClient, actor: str) -> None:
    """Records who created a client and with which scopes (never the token)."""
    from audit.models import AuditEvent
    from audit.services import audit_record

    audit_record(
        type=AuditEvent.Type.CLIENT_CHANGED,
        actor=actor,
        explanation={"api_client": client.name, "change": "created", "scopes": list(client.scopes)},
    )


def api_client_update(*, client: ApiClient, fields: list[str], actor: str) -> None:
    """Saves `fields` of an edited client and records what they now hold: granting a scope
    or switching a token off is a change to who may do what, audited as revoking is."""
    from audit.models import AuditEvent
    from audit.services import audit_record

    fields = [f for f in fields if f in EDITABLE_FIELDS]
    revoked = ApiClient.objects.filter(pk=client.pk, revoked_at__isnull=False).exists()
    if "active" in fields and client.active and revoked:
        raise ValidationError({"active": "This token was revoked for good; create another client for a new token."})
    if not fields:
        return
    if "scopes" in fields:
        client.scopes = sorted(set(client.scopes))
    values: dict[str, Any] = {f: getattr(client, f) for f in fields}
    with transaction.atomic():
        client.save(update_fields=fields)
        audit_record(
            type=AuditEvent.Type.CLIENT_CHANGED,
            actor=actor,
            explanation={"api_client": client.name, "change": "edited", "fields": values},
        )
