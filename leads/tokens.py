import secrets

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

    ApiClient.objects.filter(pk=client.pk).update(active=False)
    audit_record(
        type=AuditEvent.Type.CLIENT_CHANGED, actor=actor, explanation={"api_client": client.name, "change": "revoked"}
    )
