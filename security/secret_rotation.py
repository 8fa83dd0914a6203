"""Rotating an HMAC secret without cutting off whoever still uses the old one.

Signed intake and outbound webhooks share one scheme: a secret replaced by a rotation stays in
use for a grace period (intake: signatures under it are still accepted; webhooks: deliveries
carry a second signature under it), so the other side can switch at its own pace. Rotating
again within the grace period (say the new secret was lost) keeps each replaced secret for the
rest of its own grace period.

The replaced secrets are kept in one sealed text column, one per line: the newest alone (it
ends at the `..._expires_at` column beside it), older ones as "<secret> <unix seconds it
ends>".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

ROTATION_GRACE = timedelta(hours=24)
MAX_PREVIOUS_SECRETS = 4  # replaced secrets still in their grace period, checked or signed with each time


def still_valid(stored: str, expires_at: datetime | None, *, now: datetime) -> list[tuple[str, datetime]]:
    """The replaced secrets still within their grace period, newest first, with when each ends."""
    if not stored or expires_at is None:
        return []
    kept = []
    for i, line in enumerate(stored.split("\n")):
        secret, _, ends = line.partition(" ")
        if i == 0:
            expires = expires_at
        elif ends.isascii() and ends.isdigit():
            expires = datetime.fromtimestamp(int(ends), tz=UTC)
        else:
            continue
        if secret and expires > now:
            kept.append((secret, expires))
    return kept


def replaced(
    current: str, stored: str, expires_at: datetime | None, *, now: datetime, grace: timedelta = ROTATION_GRACE
) -> tuple[str, datetime]:
    """What the two columns hold once `current` is replaced: (the text column, its expiry)."""
    older = still_valid(stored, expires_at, now=now)[: MAX_PREVIOUS_SECRETS - 1]
    text = "\n".join([current, *(f"{old} {int(expires.timestamp())}" for old, expires in older)])
    return text, now + grace
