"""POST /api/v1/hooks/{source}/ (SPEC 7): signed, fresh, once; JSON or form; mapped fields."""

import json
import time
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from hooks import services
from hooks.models import HookDelivery, IntakeSource
from leads.models import Lead
from security.ratelimit import rate_limit_reset
from tests.conftest import start_of_a_window

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_earlier_failures():
    """Bad signatures are counted per address (the test client's is 127.0.0.1) and minute."""
    rate_limit_reset(key="hookfail:127.0.0.1")
    yield
    rate_limit_reset(key="hookfail:127.0.0.1")


@pytest.fixture
def source(db):
    src, secret = services.source_create(
        slug="webform",
        name="Web form",
        actor="test",
        field_map={"your-email": "email", "fname": "first_name", "utm_campaign": "attributes.campaign"},
    )
    src.test_secret = secret
    return src


def post_signed(
    source: IntakeSource,
    body: bytes,
    *,
    content_type: str = "application/json",
    timestamp: int | None = None,
    secret: str | None = None,
    header: str | None = None,
    slug: str | None = None,
):
    ts = int(time.time()) if timestamp is None else timestamp
    signature = (
        header if header is not None else services.sign(secret=secret or source.test_secret, body=body, timestamp=ts)
    )
    # generic(): the bytes as signed (post() re-encodes a body into the charset it names).
    return Client().generic(
        "POST",
        f"/api/v1/hooks/{slug or source.slug}/",
        body,
        content_type=content_type,
        headers={"X-Signature": signature},
    )


def test_signed_json_is_mapped_and_routed_like_the_api(source, make_group):
    group, reps = make_group(2, slug="emea", is_default=True)
    body = json.dumps({"your-email": "jane@acme.example", "fname": "Jane", "country": "fr", "utm_campaign": "spring"})
    r = post_signed(source, body.encode())
    assert r.status_code == 201, r.content
    out = r.json()
    assert out["status"] == "assigned" and out["group"] == "emea" and out["duplicate_of"] is None
    lead = Lead.objects.get(pk=out["id"])
    assert lead.email == "jane@acme.example" and lead.first_name == "Jane" and lead.country == "FR"
    assert lead.attributes == {"campaign": "spring"} and lead.source == "webform"
    assert lead.owner_id == reps[0].id and lead.raw_payload["your-email"] == "jane@acme.example"
    actors = set(AuditEvent.objects.filter(lead_id=lead.id).values_list("actor", flat=True))
    assert actors == {"hook:webform"}
    # The form service gets the outcome, not the rep's contact details.
    assert "owner" not in out and "email" not in out
    source.refresh_from_db()
    assert source.last_used_at is not None


@pytest.mark.parametrize("accept", ["text/html", "application/xml", "text/html, application/xhtml+xml"])
def test_a_sender_asking_for_another_format_still_has_its_lead_taken(source, make_group, accept):
    """The hook answers JSON whatever the Accept header says: a form service that asks for
    HTML must not have its visitor's lead refused (406) over the format of the receipt."""
    make_group(1, slug="emea", is_default=True)
    body = json.dumps({"your-email": "jane@acme.example"}).encode()
    ts = int(time.time())
    r = Client().post(
        f"/api/v1/hooks/{source.slug}/",
        body,
        content_type="application/json",
        headers={"X-Signature": services.sign(secret=source.test_secret, body=body, timestamp=ts), "Accept": accept},
    )
    assert r.status_code == 201, r.content
    assert r["Content-Type"] == "application/json" and Lead.objects.count() == 1
    # Its refusals are JSON too.
    bad = Client().post(
        f"/api/v1/hooks/{source.slug}/",
        body,
        content_type="application/json",
        headers={"X-Signature": "x", "Accept": accept},
    )
    assert bad.status_code == 401 and bad.json()["detail"]


def test_form_encoded_body_is_accepted(source, make_group):
    make_group(1, slug="emea", is_default=True)
    body = urlencode({"your-email": "form@acme.example", "company": "Acme", "score": "42", "junk": "x"}).encode()
    r = post_signed(source, body, content_type="application/x-www-form-urlencoded")
    assert r.status_code == 201, r.content
    lead = Lead.objects.get(pk=r.json()["id"])
    assert (lead.email, lead.company, lead.score) == ("form@acme.example", "Acme", 42)
    assert lead.raw_payload["junk"] == "x"  # unmapped fields are kept, not routed on


@pytest.mark.parametrize(
    "fields",
    [
        [("your-email", "mapped@acme.example"), ("email", "named@acme.example")],
        [("email", "named@acme.example"), ("your-email", "mapped@acme.example")],
    ],
)
def test_the_sources_map_wins_over_a_form_field_named_like_the_lead_field(source, make_group, fields):
    """Sales ops mapped `your-email` to the lead's email: a form that also has a field named
    `email` (a newsletter box, a referrer's address) does not override it, in either order."""
    make_group(1, slug="emea", is_default=True)
    fields = [*fields, ("fname", "Mapped"), ("first_name", "Named")]
    r = post_signed(source, urlencode(fields).encode(), content_type="application/x-www-form-urlencoded")
    assert r.status_code == 201, r.content
    lead = Lead.objects.get(pk=r.json()["id"])
    assert (lead.email, lead.first_name) == ("mapped@acme.example", "Mapped")
    assert lead.raw_payload["email"] == "named@acme.example"  # kept as posted


def test_a_repeated_form_field_left_empty_does_not_erase_the_value_typed_in_another(source, make_group):
    """A form holding a field twice (a visible box and a hidden one, two steps of a wizard)
    posts `fname=Jane&fname=`: the visitor's answer is kept, in the lead and in its raw
    payload. Of two values, the last one still wins (a hidden 0 before a checked box's 1)."""
    make_group(1, slug="emea", is_default=True)
    body = b"your-email=&your-email=jane%40acme.example&fname=Jane&fname=&consent=0&consent=1"
    r = post_signed(source, body, content_type="application/x-www-form-urlencoded")
    assert r.status_code == 201, r.content
    lead = Lead.objects.get(pk=r.json()["id"])
    assert (lead.email, lead.first_name) == ("jane@acme.example", "Jane")
    assert lead.raw_payload == {"your-email": "jane@acme.example", "fname": "Jane", "consent": "1"}


def test_form_escapes_that_are_not_utf8_are_a_400_not_replacement_characters(source, make_group):
    make_group(1, slug="emea", is_default=True)
    r = post_signed(
        source, b"your-email=rene%40acme.example&fname=Ren%E9", content_type="application/x-www-form-urlencoded"
    )
    assert r.status_code == 400 and "UTF-8" in json.dumps(r.json()), r.content
    assert not Lead.objects.exists()
    ok = post_signed(
        source, b"your-email=rene%40acme.example&fname=Ren%C3%A9", content_type="application/x-www-form-urlencoded"
    )
    assert ok.status_code == 201 and Lead.objects.get().first_name == "René"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"your-email=rene%40acme.example&fname=Ren%E9", "application/x-www-form-urlencoded; charset=ISO-8859-1"),
        ('{"your-email": "rene@acme.example", "fname": "René"}'.encode("latin-1"), "application/json; charset=latin-1"),
    ],
)
def test_a_body_in_the_charset_it_names_is_taken(source, make_group, body, content_type):
    """A form whose page is in Latin-1 posts its fields in Latin-1 and says so: read as the
    sender wrote them, as the API reads a body in the charset it names."""
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, body, content_type=content_type)
    assert r.status_code == 201, r.content
    assert Lead.objects.get().first_name == "René"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"your-email": "x@acme.example"}', "application/json; charset=rot13"),
        (b'{"your-email": "x@acme.example"}', "application/json; charset=no-such-charset"),
        (b"your-email=x%40acme.example", "application/x-www-form-urlencoded; charset=base64"),
        (b'{"your-email": "x@acme.example", "fname": "+2AA-"}', "application/json; charset=utf-7"),
    ],
)
def test_a_charset_that_cannot_be_read_is_a_400(source, make_group, body, content_type):
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, body, content_type=content_type)
    assert r.status_code == 400, r.content
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"your-email": "nul@acme.example", "junk": "a\\u0000b"}', "application/json"),
        (b'{"your-email": "nul@acme.example", "ju\\u0000nk": "x"}', "application/json"),
        (b'{"your-email": "nul@acme.example", "junk": {"deep": ["\\u0000"]}}', "application/json"),
        (b"your-email=nul%40acme.example&junk=a%00b", "application/x-www-form-urlencoded"),
    ],
)
def test_a_nul_in_a_field_the_map_drops_is_a_400_not_a_500(source, make_group, body, content_type):
    """Unmapped fields are kept in the raw payload (jsonb, which cannot hold a NUL)."""
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, body, content_type=content_type)
    assert r.status_code == 400 and "NUL" in r.json()["detail"], r.content
    assert not Lead.objects.exists()
    # A literal backslash before "u0000" is text, not a NUL.
    r = post_signed(source, b'{"your-email": "nul@acme.example", "junk": "a\\\\u0000b"}')
    assert r.status_code == 201, r.content
    assert Lead.objects.get().raw_payload["junk"] == "a\\u0000b"


def test_form_values_as_json_text_or_numbers_are_taken_as_they_come(source, make_group):
    """A form service's JSON carries what the visitor typed, as text or numbers: coerced here,
    unlike the typed REST API, which answers a number for a string field with a 400."""
    make_group(1, slug="emea", is_default=True)
    body = json.dumps({"your-email": "typed@acme.example", "company": 1234, "score": "42"}).encode()
    r = post_signed(source, body)
    assert r.status_code == 201, r.content
    lead = Lead.objects.get(pk=r.json()["id"])
    assert (lead.company, lead.score) == ("1234", 42)


def test_duplicate_email_answers_200_with_duplicate_of(source, make_group):
    make_group(1, slug="emea", is_default=True)
    first = post_signed(source, b'{"email": "dup@acme.example"}').json()
    r = post_signed(source, b'{"email": "DUP@acme.example "}')
    assert r.status_code == 200 and r.json()["duplicate_of"] == first["id"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("", "Missing X-Signature"),
        ("garbage", "Malformed"),
        ("t=abc,v1=00", "Malformed"),
        ("t=123", "Malformed"),
        ("v1=00", "Malformed"),
    ],
)
def test_missing_or_malformed_signature_is_401(source, header, message):
    r = post_signed(source, b'{"email": "a@b.example"}', header=header)
    assert r.status_code == 401 and message in r.json()["detail"]
    assert Lead.objects.count() == 0


def test_wrong_secret_or_tampered_body_is_401(source):
    r = post_signed(source, b'{"email": "a@b.example"}', secret="whsec_wrong")
    assert r.status_code == 401 and "does not match" in r.json()["detail"]
    ts = int(time.time())
    header = services.sign(secret=source.test_secret, body=b'{"email": "a@b.example"}', timestamp=ts)
    r = post_signed(source, b'{"email": "evil@b.example"}', header=header)
    assert r.status_code == 401
    # The signature covers the timestamp too: the same MAC under another t fails.
    mac = header.split("v1=")[1]
    r = post_signed(source, b'{"email": "a@b.example"}', header=f"t={ts + 1},v1={mac}")
    assert r.status_code == 401
    assert Lead.objects.count() == 0


@pytest.mark.parametrize("age", [301, -301, 3600])
def test_stale_or_future_signature_is_401(source, make_group, age):
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, b'{"email": "a@b.example"}', timestamp=int(time.time()) - age)
    assert r.status_code == 401 and "5-minute" in r.json()["detail"]
    assert Lead.objects.count() == 0


def test_signature_within_tolerance_is_accepted(source, make_group):
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, b'{"email": "a@b.example"}', timestamp=int(time.time()) - 290)
    assert r.status_code == 201


def test_replayed_signature_is_401_and_writes_nothing(source, make_group):
    make_group(1, slug="emea", is_default=True)
    body = b'{"email": "once@acme.example"}'
    header = services.sign(secret=source.test_secret, body=body, timestamp=int(time.time()))
    assert post_signed(source, body, header=header).status_code == 201
    r = post_signed(source, body, header=header)
    assert r.status_code == 401 and "replay" in r.json()["detail"]
    assert Lead.objects.count() == 1 and HookDelivery.objects.count() == 1


def test_unknown_or_inactive_source_is_404(source):
    r = post_signed(source, b'{"email": "a@b.example"}', slug="nope")
    assert r.status_code == 404
    IntakeSource.objects.filter(pk=source.pk).update(active=False)
    assert post_signed(source, b'{"email": "a@b.example"}').status_code == 404


def test_validation_errors_are_400_naming_the_field_and_keep_the_signature_used(source, make_group):
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, b'{"fname": "NoEmail", "score": "900"}')
    assert r.status_code == 400
    assert set(r.json()) == {"email", "score"}
    assert Lead.objects.count() == 0 and HookDelivery.objects.count() == 1


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_400_names_the_form_fields_that_carried_the_bad_values(source, make_group, content_type):
    """The form posted `your-email` and `fname` (mapped to email and first_name): the error
    names them as posted, so the sender can tell what to fix; fields posted under a lead
    field's own name keep it."""
    make_group(1, slug="emea", is_default=True)
    fields = {"your-email": "not-an-address", "fname": "x" * 101, "score": "900"}
    body = json.dumps(fields) if content_type == "application/json" else urlencode(fields)
    r = post_signed(source, body.encode(), content_type=content_type)
    assert r.status_code == 400, r.content
    assert set(r.json()) == {"your-email", "fname", "score"}, r.json()
    assert "valid email" in r.json()["your-email"][0]
    assert not Lead.objects.exists()


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_400_names_a_mapped_field_left_empty_and_a_mapped_attribute(source, make_group, content_type):
    """The visitor left `your-email` empty: the form must fill `your-email`, not `email`, which
    it never posted. A bad value of `utm_campaign` (mapped to attributes.campaign) is named
    `utm_campaign` too."""
    make_group(1, slug="emea", is_default=True)
    fields = {"your-email": "", "fname": "Jane", "utm_campaign": "x" * 1001}
    body = json.dumps(fields) if content_type == "application/json" else urlencode(fields)
    r = post_signed(source, body.encode(), content_type=content_type)
    assert r.status_code == 400, r.content
    assert set(r.json()) == {"your-email", "utm_campaign"}, r.json()
    assert "required" in r.json()["your-email"][0]
    # Sent under the lead field's own name, the field keeps that name.
    r = post_signed(source, json.dumps({"your-email": "", "email": "nope"}).encode())
    assert set(r.json()) == {"email"}, r.json()
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"email": "jane@acme.example", "attributes": "campaign=spring"}', "application/json"),
        (b'{"email": "jane@acme.example", "attributes": ["spring"], "utm_campaign": "x"}', "application/json"),
        (b'{"email": "jane@acme.example", "attributes": 7}', "application/json"),
        (b"email=jane%40acme.example&attributes=spring", "application/x-www-form-urlencoded"),
    ],
)
def test_attributes_that_are_not_an_object_are_a_400_naming_them_not_dropped(source, make_group, body, content_type):
    """The API refuses such attributes; the hook used to drop them and take the lead."""
    make_group(1, slug="emea", is_default=True)
    r = post_signed(source, body, content_type=content_type)
    assert r.status_code == 400, r.content
    assert list(r.json()) == ["attributes"], r.json()
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"not json", "application/json", 400),
        (b"[1, 2]", "application/json", 400),
        (b"\xff\xfe", "application/json", 400),
        (b"<lead/>", "application/xml", 415),
        (b"email=a@b.example", "text/plain", 415),
    ],
)
def test_bad_bodies_are_clear_4xx(source, body, content_type, status):
    r = post_signed(source, body, content_type=content_type)
    assert r.status_code == status, r.content
    assert "detail" in r.json()


def test_body_over_64_kib_is_413(source):
    body = json.dumps({"email": "a@b.example", "company": "x" * 70_000}).encode()
    assert post_signed(source, body).status_code == 413


def test_rotation_keeps_the_previous_secret_for_the_grace_period(source, make_group):
    make_group(1, slug="emea", is_default=True)
    old = source.test_secret
    new = services.source_rotate_secret(source=source, actor="test")
    source.refresh_from_db()
    assert new != old and source.secret == new
    assert post_signed(source, b'{"email": "old@acme.example"}', secret=old).status_code == 201
    assert post_signed(source, b'{"email": "new@acme.example"}', secret=new).status_code == 201
    IntakeSource.objects.filter(pk=source.pk).update(previous_secret_expires_at=timezone.now() - timedelta(seconds=1))
    assert post_signed(source, b'{"email": "late@acme.example"}', secret=old).status_code == 401
    assert AuditEvent.objects.filter(type="client.changed", explanation__change="secret rotated").exists()


def test_rotating_again_within_the_grace_period_keeps_every_replaced_secret_for_its_24_hours(
    source, make_group, monkeypatch
):
    """The secret shown at a rotation was lost, so sales ops rotate again (as the page says):
    the form still signs with the first secret, which keeps its 24 hours."""
    make_group(1, slug="emea", is_default=True)
    first = source.test_secret
    lost = services.source_rotate_secret(source=source, actor="test")
    later = timezone.now() + timedelta(hours=2)
    monkeypatch.setattr(services.timezone, "now", lambda: later)
    third = services.source_rotate_secret(source=source, actor="test")
    source.refresh_from_db()
    now = int(later.timestamp())
    for i, secret in enumerate((first, lost, third)):
        r = post_signed(source, f'{{"email": "s{i}@acme.example"}}'.encode(), secret=secret, timestamp=now)
        assert r.status_code == 201, (i, r.content)
    # Each replaced secret ends 24 hours after the rotation that replaced it.
    monkeypatch.setattr(services.timezone, "now", lambda: later + timedelta(hours=22, minutes=1))
    now = int((later + timedelta(hours=22, minutes=1)).timestamp())
    assert post_signed(source, b'{"email": "f@acme.example"}', secret=first, timestamp=now).status_code == 401
    assert post_signed(source, b'{"email": "l@acme.example"}', secret=lost, timestamp=now).status_code == 201
    monkeypatch.setattr(services.timezone, "now", lambda: later + timedelta(hours=24, minutes=1))
    now = int((later + timedelta(hours=24, minutes=1)).timestamp())
    assert post_signed(source, b'{"email": "l2@acme.example"}', secret=lost, timestamp=now).status_code == 401
    assert post_signed(source, b'{"email": "t@acme.example"}', secret=third, timestamp=now).status_code == 201


def test_old_secrets_can_be_revoked_at_once_when_one_has_leaked(source, make_group, admin_client):
    """A rotation keeps the replaced secret valid for a day: after a leak sales ops end that
    day at once, and only the current secret signs leads from then on."""
    make_group(1, slug="emea", is_default=True)
    first = source.test_secret
    second = services.source_rotate_secret(source=source, actor="test")
    current = services.source_rotate_secret(source=source, actor="test")
    source.refresh_from_db()
    assert post_signed(source, b'{"email": "before@acme.example"}', secret=first).status_code == 201

    r = admin_client.post(
        "/admin/hooks/intakesource/",
        {"action": "revoke_previous_secrets", "_selected_action": [source.pk]},
        follow=True,
    )
    assert "1 source(s) now accept signatures under their current secret only." in r.content.decode()
    source.refresh_from_db()
    for i, old in enumerate((first, second)):
        r = post_signed(source, f'{{"email": "old{i}@acme.example"}}'.encode(), secret=old)
        assert r.status_code == 401, (i, r.content)
    assert post_signed(source, b'{"email": "now@acme.example"}', secret=current).status_code == 201
    [event] = AuditEvent.objects.filter(explanation__change="previous secrets revoked")
    assert event.actor.startswith("admin:") and event.explanation["revoked"] == 2
    assert first not in str(event.explanation) and second not in str(event.explanation)

    # Nothing left to revoke: said so, and nothing more is audited.
    r = admin_client.post(
        "/admin/hooks/intakesource/",
        {"action": "revoke_previous_secrets", "_selected_action": [source.pk]},
        follow=True,
    )
    assert "None of these sources had an old secret still valid." in r.content.decode()
    assert AuditEvent.objects.filter(explanation__change="previous secrets revoked").count() == 1


def test_a_request_signed_with_both_secrets_cannot_be_replayed_with_one_of_them(source, make_group):
    """During a rotation's grace period a sender signs with the new and the old secret (one
    v1 each). Whichever of its signatures a replay keeps, the message was taken once."""
    make_group(1, slug="emea", is_default=True)
    old = source.test_secret
    new = services.source_rotate_secret(source=source, actor="test")
    source.refresh_from_db()
    body = b'{"email": "both@acme.example"}'
    ts = int(time.time())
    by_new = services.sign(secret=new, body=body, timestamp=ts).split(",")[1]
    by_old = services.sign(secret=old, body=body, timestamp=ts).split(",")[1]
    assert post_signed(source, body, header=f"t={ts},{by_new},{by_old}").status_code == 201
    for kept in (by_new, by_old, f"{by_old},{by_new}"):
        r = post_signed(source, body, header=f"t={ts},{kept}")
        assert r.status_code == 401 and "replay" in r.json()["detail"], (kept, r.content)
    assert Lead.objects.count() == 1 and HookDelivery.objects.count() == 1
    assert not AuditEvent.objects.filter(type="lead.duplicate").exists()


def test_source_rate_limit_gives_429_with_retry_after(source, make_group):
    make_group(1, slug="emea", is_default=True)
    IntakeSource.objects.filter(pk=source.pk).update(rate_limit_per_minute=2)
    start_of_a_window(3)
    codes = [post_signed(source, f'{{"email": "rl{i}@acme.example"}}'.encode()) for i in range(3)]
    assert [r.status_code for r in codes[:2]] == [201, 201]
    assert codes[2].status_code == 429 and 1 <= int(codes[2]["Retry-After"]) <= 60
    # Bad signatures are refused before the limit: they cannot use up the source's budget.
    assert post_signed(source, b"{}", secret="whsec_wrong").status_code == 401


def test_replays_of_a_captured_request_cannot_use_up_the_sources_budget(source, make_group):
    """A replayed signature verifies (it is genuine) and was counted against the source's
    limit before being refused as a replay: whoever captured one signed request could replay
    it for five minutes and have every real form post answered 429 meanwhile."""
    make_group(1, slug="emea", is_default=True)
    IntakeSource.objects.filter(pk=source.pk).update(rate_limit_per_minute=3)
    start_of_a_window(3)
    body = b'{"email": "captured@acme.example"}'
    header = services.sign(secret=source.test_secret, body=body, timestamp=int(time.time()))
    codes = [post_signed(source, body, header=header).status_code for _ in range(6)]
    assert codes == [201, 401, 401, 401, 401, 401]
    # The source has used one of its three posts this minute: real forms still get through.
    assert [post_signed(source, f'{{"email": "real{i}@acme.example"}}'.encode()).status_code for i in range(2)] == [
        201,
        201,
    ]
    assert Lead.objects.count() == 3


def test_replays_of_a_refused_request_cannot_use_up_the_sources_budget(source, make_group):
    """A body refused (400, 415) kept its signature free: a captured one could be replayed for
    five minutes, each replay spending one of the source's posts."""
    make_group(1, slug="emea", is_default=True)
    IntakeSource.objects.filter(pk=source.pk).update(rate_limit_per_minute=3)
    start_of_a_window(3)
    for body, content_type, refused in (
        (b'{"email": "not-an-address"}', "application/json", 400),
        (b"email=x", "text/plain", 415),
    ):
        header = services.sign(secret=source.test_secret, body=body, timestamp=int(time.time()))
        codes = [post_signed(source, body, header=header, content_type=content_type).status_code for _ in range(3)]
        assert codes == [refused, 401, 401]
    assert post_signed(source, b'{"email": "real@acme.example"}').status_code == 201
    assert Lead.objects.count() == 1


def test_field_map_is_validated():
    with pytest.raises(ValueError, match="not a lead field"):
        services.source_create(slug="bad", name="Bad", actor="test", field_map={"x": "password"})


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_replay_racing_the_original_is_refused(make_group):
    """Two connections post the same signed request at once: one lead, one 401."""
    import threading

    from django.db import connections

    make_group(1, slug="emea", is_default=True)
    src, secret = services.source_create(slug="race", name="Race", actor="test")
    body = b'{"email": "race@acme.example"}'
    header = services.sign(secret=secret, body=body, timestamp=int(time.time()))
    barrier = threading.Barrier(4)
    codes: list[int] = []

    def post() -> None:
        try:
            barrier.wait(timeout=10)
            r = Client().post(
                "/api/v1/hooks/race/", body, content_type="application/json", headers={"X-Signature": header}
            )
            codes.append(r.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(codes) == [201, 401, 401, 401]
    assert Lead.objects.filter(email="race@acme.example").count() == 1


def test_bad_signatures_from_an_address_are_cut_off_for_the_minute_good_ones_pass(source, make_group, settings):
    make_group(1, slug="emea", is_default=True)
    settings.HOOK_SIGNATURE_FAILURES_PER_ADDRESS = 3
    start_of_a_window(3)
    codes = [post_signed(source, b'{"email": "g@acme.example"}', secret="whsec_guess").status_code for _ in range(3)]
    assert codes == [401, 401, 401]
    # Past the limit a bad signature from that address gets no verdict until the next minute.
    r = post_signed(source, b'{"email": "g@acme.example"}', secret="whsec_guess")
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60
    assert not Lead.objects.exists()
    # A good one is taken: behind a proxy every form posts from the same address.
    assert post_signed(source, b'{"email": "good@acme.example"}').status_code == 201
    assert Lead.objects.get().email == "good@acme.example"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_connection_dropped_during_intake_leaves_the_signature_free_for_the_retry(make_group, monkeypatch):
    """PostgreSQL restarted (here: this request's connection terminated) after the signature
    was claimed and before the lead was written: the answer is a 503 to retry, so the claim
    must not outlive the request. Released on the dead connection it did, and the retry the
    503 asked for was refused as a replay: the lead was never taken in."""
    from django.db import connection

    from tests.ops.test_pool_check import drop_connection_before_intake

    make_group(1, slug="emea", is_default=True)
    src, secret = services.source_create(slug="site", name="Site", actor="test")
    dropped = drop_connection_before_intake(monkeypatch)
    body = b'{"email": "restart@acme.example"}'
    header = services.sign(secret=secret, body=body, timestamp=int(time.time()))
    client = Client()
    first = client.post("/api/v1/hooks/site/", body, content_type="application/json", headers={"X-Signature": header})
    assert first.status_code == 503 and first["Retry-After"]
    connection.close()  # this thread's connection is the request's: the dead one
    assert dropped and not HookDelivery.objects.exists()
    retry = client.post("/api/v1/hooks/site/", body, content_type="application/json", headers={"X-Signature": header})
    assert retry.status_code == 201, retry.content
    assert Lead.objects.filter(email="restart@acme.example").count() == 1
