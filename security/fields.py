"""Secrets the product must read back (HMAC keys of signed intake and outbound webhooks),
stored encrypted.

A token can be hashed, since it is only compared. An HMAC key cannot: verifying or signing
needs the key itself. So these columns hold a Fernet token (AES-128-CBC with HMAC-SHA256,
`cryptography`), and a database dump or a read-only replica gives nothing usable.

Keys: SECRET_BOX_KEYS (comma-separated Fernet keys, `Fernet.generate_key()`); the first one
encrypts, every one decrypts, so a key is rotated by putting a new one first and re-saving
(`manage.py reseal_secrets`). Without SECRET_BOX_KEYS the key is derived from SECRET_KEY
(and those of SECRET_KEY_FALLBACKS decrypt): then changing SECRET_KEY without keeping the old
one among the fallbacks makes the stored secrets unreadable, so production should set
SECRET_BOX_KEYS.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

PREFIX = "fernet:"


def _derived(secret_key: str) -> str:
    return base64.urlsafe_b64encode(
        hashlib.sha256(b"leadrouter secret box\x00" + secret_key.encode()).digest()
    ).decode()


@cache
def _box(keys: tuple[str, ...], secret_key: str, fallbacks: tuple[str, ...] = ()) -> MultiFernet:
    if not keys:
        # Derived from SECRET_KEY; those of SECRET_KEY_FALLBACKS (Django's rotation of the key)
        # still decrypt, so a new SECRET_KEY leaves the stored secrets readable until
        # `reseal_secrets` has sealed them again under it.
        keys = (_derived(secret_key), *(_derived(old) for old in fallbacks))
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(f"SECRET_BOX_KEYS: {exc}") from None


def box() -> MultiFernet:
    # SECRET_BOX_EARLIER_KEYS: secret keys whose box keys still decrypt, but which sign nothing
    # (unlike SECRET_KEY_FALLBACKS): the local settings' development key, under which a
    # checkout sealed its secrets before it had a key of its own.
    return _box(
        tuple(getattr(settings, "SECRET_BOX_KEYS", ())),
        settings.SECRET_KEY,
        (*getattr(settings, "SECRET_KEY_FALLBACKS", ()), *getattr(settings, "SECRET_BOX_EARLIER_KEYS", ())),
    )


def seal(plain: str) -> str:
    return PREFIX + box().encrypt(plain.encode()).decode()


def unseal(stored: str) -> str:
    """The plain secret; a value stored before encryption (no prefix) is returned as it is."""
    if not stored.startswith(PREFIX):
        return stored
    try:
        return box().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise ImproperlyConfigured(
            "A stored secret cannot be decrypted: SECRET_BOX_KEYS (or SECRET_KEY and SECRET_KEY_FALLBACKS, "
            "when it is not set) no longer holds the key it was encrypted with."
        ) from None


class SealedField(models.TextField):
    """A text secret, encrypted in the database and plain in Python. Only equality with the
    empty string can be looked up (each encryption differs)."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return unseal(value) if value else value

    def to_python(self, value: Any) -> Any:
        return unseal(value) if isinstance(value, str) and value else value

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if not value or value.startswith(PREFIX):
            return value
        return seal(value)


def migration_seal(app_label: str, model_name: str, fields: list[str]) -> tuple[Any, Any]:
    """The RunPython pair of a migration that turns `fields` into SealedFields: forward,
    existing plain secrets encrypted in place (the field seals on save); backward, plain text
    again (run before the columns go back to their old type)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        model = apps.get_model(app_label, model_name)
        for row in model.objects.values("pk", *fields):
            model.objects.filter(pk=row.pop("pk")).update(**{f: v for f, v in row.items() if v})

    def backward(apps: Any, schema_editor: Any) -> None:
        model = apps.get_model(app_label, model_name)
        table = schema_editor.quote_name(model._meta.db_table)
        with schema_editor.connection.cursor() as cursor:
            for field in fields:
                column = schema_editor.quote_name(field)
                cursor.execute(f"SELECT id, {column} FROM {table}")  # noqa: S608 - identifiers from the model
                for pk, value in cursor.fetchall():
                    if value:
                        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [unseal(value), pk])  # noqa: S608

    return forward, backward
