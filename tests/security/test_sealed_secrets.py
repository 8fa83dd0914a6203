"""HMAC secrets (signed intake, outbound webhooks) are encrypted in the database and plain in
Python; keys rotate without losing them."""

import io

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection

from hooks import services as hook_services
from hooks.models import IntakeSource
from notifications.models import WebhookEndpoint
from security.fields import PREFIX

pytestmark = pytest.mark.django_db


def stored(table: str, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT "{column}" FROM {table} WHERE id = %s', [pk])  # noqa: S608 - test tables
        return cursor.fetchone()[0]


def test_secrets_are_encrypted_at_rest_and_plain_in_python(make_group):
    group, _reps = make_group(1)
    source, secret = hook_services.source_create(slug="form", name="Form", actor="test", field_map={})
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://hooks.example/in")

    raw = stored("hooks_intakesource", "secret", source.pk)
    assert raw.startswith(PREFIX) and secret not in raw
    assert IntakeSource.objects.get(pk=source.pk).secret == secret
    raw = stored("notifications_webhookendpoint", "secret", endpoint.pk)
    assert raw.startswith(PREFIX) and endpoint.secret not in raw
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret

    # Rotation keeps the previous secret, encrypted too.
    new = hook_services.source_rotate_secret(source=IntakeSource.objects.get(pk=source.pk), actor="test")
    reloaded = IntakeSource.objects.get(pk=source.pk)
    assert (reloaded.secret, reloaded.previous_secret) == (new, secret)
    assert secret not in stored("hooks_intakesource", "previous_secret", source.pk)


def test_keys_rotate_and_a_missing_key_is_a_clear_error(make_group, settings):
    group, _reps = make_group(1)
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRET_BOX_KEYS = [old_key]
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://hooks.example/in")
    before = stored("notifications_webhookendpoint", "secret", endpoint.pk)

    settings.SECRET_BOX_KEYS = [new_key, old_key]  # the new key first: both decrypt
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret
    out = io.StringIO()
    call_command("reseal_secrets", stdout=out)
    assert "re-encrypted" in out.getvalue()
    assert stored("notifications_webhookendpoint", "secret", endpoint.pk) != before

    settings.SECRET_BOX_KEYS = [new_key]  # the old key dropped after resealing
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret
    settings.SECRET_BOX_KEYS = [old_key]  # the wrong key: refused, naming the setting
    with pytest.raises(ImproperlyConfigured, match="SECRET_BOX_KEYS"):
        WebhookEndpoint.objects.get(pk=endpoint.pk)


def test_a_hook_whose_secret_the_keys_no_longer_open_is_a_503_saying_so(make_group, settings, caplog):
    """SECRET_KEY changed without SECRET_BOX_KEYS: the form service gets a JSON 503 it retries
    (not an HTML 500), and the log names the setting for the operator."""
    import json
    import time

    from django.test import Client

    make_group(1, slug="emea", is_default=True)
    source, secret = hook_services.source_create(slug="form", name="Form", actor="test", field_map={})
    settings.SECRET_BOX_KEYS = []
    settings.SECRET_KEY = "another-key-" + "x" * 50
    body = json.dumps({"email": "jane@acme.example"}).encode()
    signature = hook_services.sign(secret=secret, body=body, timestamp=int(time.time()))
    r = Client().post("/api/v1/hooks/form/", body, content_type="application/json", headers={"X-Signature": signature})
    assert r.status_code == 503 and r["Content-Type"] == "application/json" and r["Retry-After"]
    assert "misconfigured" in r.json()["detail"] and "SECRET_BOX_KEYS" not in r.json()["detail"]
    assert any("SECRET_BOX_KEYS" in rec.getMessage() for rec in caplog.records)


def test_a_new_secret_key_with_the_old_one_among_the_fallbacks_reads_and_reseals(make_group, settings):
    """Without SECRET_BOX_KEYS the box key is derived from SECRET_KEY: Django's rotation of
    the key (SECRET_KEY_FALLBACKS) keeps the stored secrets readable until resealed."""
    group, _reps = make_group(1)
    settings.SECRET_BOX_KEYS = []
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "old-key-" + "x" * 50, []
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://hooks.example/in")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key-" + "y" * 50, ["old-key-" + "x" * 50]
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret
    call_command("reseal_secrets", stdout=io.StringIO())
    settings.SECRET_KEY_FALLBACKS = []  # the old key dropped after resealing
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret
    settings.SECRET_KEY = "old-key-" + "x" * 50
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY_FALLBACKS"):
        WebhookEndpoint.objects.get(pk=endpoint.pk)


def test_a_checkout_that_now_keeps_a_key_of_its_own_still_opens_what_the_development_key_sealed(make_group, settings):
    """The local settings' development key sealed a checkout's webhook and web-form secrets
    before it kept a key of its own: they stay readable (decrypt only, no signing)."""
    group, _reps = make_group(1)
    settings.SECRET_BOX_KEYS, settings.SECRET_KEY_FALLBACKS = [], []
    settings.SECRET_KEY, settings.SECRET_BOX_EARLIER_KEYS = "dev-insecure-key-change-me", []
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://hooks.example/in")
    settings.SECRET_KEY, settings.SECRET_BOX_EARLIER_KEYS = "own-key-" + "z" * 50, ["dev-insecure-key-change-me"]
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret
    call_command("reseal_secrets", stdout=io.StringIO())
    settings.SECRET_BOX_EARLIER_KEYS = []
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == endpoint.secret  # sealed again under its own


def test_a_secret_stored_before_encryption_reads_as_it_is_and_is_sealed_by_reseal(make_group):
    group, _reps = make_group(1)
    endpoint = WebhookEndpoint.objects.create(group=group, url="https://hooks.example/in")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE notifications_webhookendpoint SET secret = 'legacy-plain' WHERE id = %s", [endpoint.pk])
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == "legacy-plain"
    call_command("reseal_secrets", stdout=io.StringIO())
    assert stored("notifications_webhookendpoint", "secret", endpoint.pk).startswith(PREFIX)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == "legacy-plain"
