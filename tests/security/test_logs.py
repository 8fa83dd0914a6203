"""No contact data or secrets in logs: every record of full intakes (API and signed hook,
accepted, duplicate, rejected), captured at DEBUG from every logger, is checked for the lead's
email, phone, names, the API token, the hook secret and its signatures. The redaction filter
is the safety net under that and is tested on its own."""

from __future__ import annotations

import json
import logging
import time

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.test import Client

from hooks import services as hook_services
from leads.models import Lead
from routing_project.logging import JsonFormatter
from security.redaction import RedactingFilter, redact
from tests.factories import api_client_with

EMAIL = "Zelda.Quixote@Secretmail.example"
PHONE = "+33 6 98 76 54 32"
FIRST, LAST, COMPANY = "Zeldaname", "Quixotesurname", "Hushhush Corp"


class Everything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured():
    """Every logger at DEBUG, every record kept (no filter of ours in the way)."""
    handler = Everything()
    root = logging.getLogger()
    loggers = [root, *[logging.getLogger(n) for n in logging.root.manager.loggerDict]]
    levels = {lg: lg.level for lg in loggers}
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    root.addHandler(handler)
    yield handler.records
    root.removeHandler(handler)
    for lg, level in levels.items():
        lg.setLevel(level)


def text_of(record: logging.LogRecord) -> str:
    parts = [record.getMessage(), str(record.args or "")]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    parts.extend(str(v) for k, v in record.__dict__.items() if k not in ("msg", "args", "exc_info"))
    return "\n".join(parts)


@pytest.mark.django_db
def test_a_full_intake_logs_no_contact_data_or_secret(captured, make_group, django_capture_on_commit_callbacks):
    _, reps = make_group(2, slug="emea", is_default=True, sla_minutes="30")
    _, token = api_client_with(["intake", "read", "manage"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"email": EMAIL, "first_name": FIRST, "last_name": LAST, "company": COMPANY, "phone": PHONE}
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post("/api/v1/leads/", body, content_type="application/json", headers={"Idempotency-Key": "k-1"})
        assert first.status_code == 201
        lead_id = first.json()["id"]
        assert (
            api.post(
                "/api/v1/leads/", body, content_type="application/json", headers={"Idempotency-Key": "k-1"}
            ).status_code
            == 200
        )
        assert api.post("/api/v1/leads/", {**body, "country": "??"}, content_type="application/json").status_code == 400
        assert api.post(
            "/api/v1/leads/", {**body, "email": f"{EMAIL}x"}, content_type="application/json"
        ).status_code in (200, 201)
        assert api.get(f"/api/v1/leads/{lead_id}/").status_code == 200
        assert api.get(f"/api/v1/leads/{lead_id}/events/").status_code == 200
        assert Client(HTTP_AUTHORIZATION=f"Bearer {token}x").get("/api/v1/queue/").status_code == 401

        source, secret = hook_services.source_create(slug="site", name="Site", actor="test")
        raw = json.dumps({"email": "hook." + EMAIL, "first_name": FIRST, "phone": PHONE}).encode()
        header = hook_services.sign(secret=secret, body=raw, timestamp=int(time.time()))
        hook = Client()
        url = "/api/v1/hooks/site/"
        assert hook.post(url, raw, content_type="application/json", headers={"X-Signature": header}).status_code == 201
        assert hook.post(url, raw, content_type="application/json", headers={"X-Signature": header}).status_code == 401
        forged = header[:-4] + "0000"
        assert hook.post(url, raw, content_type="application/json", headers={"X-Signature": forged}).status_code == 401

    assert len(captured) >= 5, "the capture saw nothing: the test would prove nothing"
    forbidden = [
        EMAIL,
        EMAIL.lower(),
        "hook." + EMAIL.lower(),
        PHONE,
        "698765432",
        FIRST,
        LAST,
        COMPANY,
        token,
        token[3:],
        secret,
        header.split("v1=")[1],
        forged.split("v1=")[1],
    ]
    forbidden += [rep.email for rep in reps]  # the reps' contact data too
    for record in captured:
        text = text_of(record)
        for value in forbidden:
            assert value.lower() not in text.lower(), f"{record.name}: {record.getMessage()[:200]}"


def test_the_filter_redacts_what_slips_through():
    record = logging.LogRecord(
        "x",
        logging.INFO,
        __file__,
        1,
        "lead %s phone %s token %s sig %s",
        (EMAIL, PHONE, "lr_abcdefghijklmnopqrstuvwxyz", "t=1700000000,v1=" + "ab" * 32),
        None,
    )
    record.contact = f"{EMAIL}"
    assert RedactingFilter().filter(record)
    text = record.getMessage() + record.contact
    for value in (EMAIL, PHONE, "lr_abc", "abab"):
        assert value not in text
    assert "lead [redacted] phone [redacted]" in text


def test_the_filter_keeps_what_operators_need():
    line = "POST /api/v1/leads/ 201 12.5ms lead=123456 group=emea at 2026-11-29T20:00:00+00:00"
    assert redact(line) == line
    for phone in ("(555) 123-4567", "555-123-4567", "06 12 34 56 78", "+1 555 123 4567"):
        assert redact(f"call {phone} now") == "call [redacted] now"


def test_tracebacks_are_redacted_too():
    try:
        raise ValueError(f"duplicate key (email)=({EMAIL})")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, __import__("sys").exc_info())
    RedactingFilter().filter(record)
    assert EMAIL not in logging.Formatter().format(record)


def test_json_lines_carry_the_redacted_traceback():
    from routing_project.logging import JsonFormatter

    try:
        raise ValueError(f"duplicate key (email)=({EMAIL})")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed for %s", (EMAIL,), __import__("sys").exc_info()
        )
    RedactingFilter().filter(record)
    line = JsonFormatter().format(record)
    assert EMAIL not in line and "ValueError" in line and json.loads(line)["message"] == "failed for [redacted]"


@pytest.mark.parametrize(
    "address",
    [
        "jane@exämple.com",  # a non-ASCII domain, as the API accepts it
        "jane@ex\\xe4mple.com",  # as django.request's "Not Found: <path>" writes it
        "jane%40example.com",  # percent-encoded, as in a query string
        "zoë.o'neil@bücher.example",
        "jane.leak@localhost",  # no dotted domain: the API accepts these two
        "jane.leak@[192.0.2.1]",
        "jane.leak%40%5B192.0.2.1%5D",
    ],
)
def test_the_filter_redacts_addresses_in_every_spelling_the_product_meets(address):
    line = redact(f"GET /api/v1/leads/{address}/ 404")
    assert "[redacted]" in line and line.endswith("/ 404")
    for fragment in ("jane", "zo", "mple", "cher", "192.0"):
        assert fragment not in line, line


@pytest.mark.parametrize(
    "query",
    [
        "phone=%2B33612345678",  # the "+" percent-encoded
        "phone=%2B33%206%2012%2034%2056%2078",
        "phone=+33+6+12+34+56+78",  # form-encoded spaces
        "phone=06%2012%2034%2056%2078",
        "phone=%28555%29%20123-4567",
        "phone=555%20123%204567",
    ],
)
def test_the_filter_redacts_phone_numbers_as_a_query_string_spells_them(query):
    """gunicorn's request line (WEB_ACCESS_LOG, its "Invalid request" errors) and runserver's
    log the query string as the client sent it: a phone number there is percent-encoded."""
    line = redact(f'127.0.0.1 - - "GET /api/v1/leads/?{query} HTTP/1.1" 400 80')
    assert line == '127.0.0.1 - - "GET /api/v1/leads/?phone=[redacted] HTTP/1.1" 400 80'


@pytest.mark.parametrize(
    ("query", "redacted"),
    [
        ("phone=020%207946%200958", "phone=[redacted]"),  # a UK number: no pattern knows its shape
        ("phone=4155550123&status=queued", "phone=[redacted]&status=queued"),
        ("first_name=Zeldaname&last_name=Quixotesurname", "first_name=[redacted]&last_name=[redacted]"),
        ("q=Zeldaname+Quixotesurname", "q=[redacted]"),  # the admin's search box
        ("status=queued&Phone=07700+900123", "status=queued&Phone=[redacted]"),
        # Any name but the product's own filters: a client's own names for contact data too.
        (
            "search=Jane%20Roe&surname=Roe&contact=jane.roe&page=2",
            "search=[redacted]&surname=[redacted]&contact=[redacted]&page=2",
        ),
        ("owner__id__exact=4&created_at__gte=2026-11-01", "owner__id__exact=4&created_at__gte=2026-11-01"),
        ("first%20name=Zelda&contact%5Bcity%5D=Paris", "first%20name=[redacted]&contact%5Bcity%5D=[redacted]"),
        # The admin's login redirect keeps the search, percent-encoded, in `next`.
        ("next=/admin/leads/lead/%3Fq%3D020%2B7946%2B0958%26o%3D1", "next=/admin/leads/lead/%3Fq%3D[redacted]%26o%3D1"),
    ],
)
def test_the_filter_redacts_contact_query_parameters_whatever_their_value(query, redacted):
    """A query parameter other than the product's own filters may hold contact data in any
    spelling: national phone formats and names match no pattern, so the name decides."""
    line = redact(f'127.0.0.1 - - "GET /admin/leads/lead/?{query} HTTP/1.1" 200 80 "http://host/x?{query}"')
    assert line == f'127.0.0.1 - - "GET /admin/leads/lead/?{redacted} HTTP/1.1" 200 80 "http://host/x?{redacted}"'


def test_the_filter_keeps_encoded_query_strings_without_a_phone_number():
    for line in ("GET /x?since=2026-11-29T20%3A00%3A00%2B00%3A00&lead=12345678901234 200", "GET /x?o=1+2&p=50%25 200"):
        assert redact(line) == line


@pytest.mark.django_db
def test_an_address_in_a_request_path_reaches_no_log_line(make_group):
    """A client looking a lead up by its address (/leads/<email>/: a 404) puts the address in
    the access line and in Django's "Not Found" line; a non-ASCII domain passed the filter."""
    lines = []

    class Formatted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Formatted()
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        _, token = api_client_with(["read"])
        assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/leads/zelda@exämple.com/").status_code == 404
    finally:
        root.removeHandler(handler)
    assert len(lines) >= 2
    for line in lines:
        assert "zelda" not in line and "mple.com" not in line, line


def test_a_long_line_without_an_address_is_redacted_in_linear_time():
    """Every log line passes the filter: an address pattern retried at each character of a
    long run (x.x.x. ... @, 40 KB) took seconds on a line a client can shape (a path)."""
    import time

    started = time.perf_counter()
    for line in ("x." * 20_000 + "@", "a%" * 20_000 + "@b", "\\x41" * 10_000 + "@c"):
        redact(line)
    assert time.perf_counter() - started < 1.0


@pytest.mark.postgres  # PostgreSQL's own error texts (and its `::integer` cast)
@pytest.mark.django_db
def test_a_database_error_quoting_a_leads_values_reaches_no_log_line(make_group, post_lead):
    """PostgreSQL quotes the row at fault in a constraint error ("Failing row contains (...)":
    every column of the lead) and the text it could not read (with the statement, its values
    inlined): a traceback, a 500's record or a Celery task's failure message ("raised
    unexpected: %r") carried the lead's names, company and a phone in its national shape."""
    make_group(1, slug="emea", is_default=True)
    national = "020 7946 0958"  # a shape the phone patterns do not know
    created = post_lead(email=EMAIL, first_name=FIRST, last_name=LAST, company=COMPANY, phone=national)
    assert created.status_code == 201
    errors: list[Exception] = []
    try:
        with transaction.atomic():  # an assigned lead queued with its owner: queued_lead_has_no_owner
            Lead.objects.filter(pk=created.json()["id"]).update(status="queued")
    except IntegrityError as exc:
        errors.append(exc)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::integer", [COMPANY])
    except DataError as exc:
        errors.append(exc)
    assert len(errors) == 2 and FIRST in str(errors[0]) and COMPANY in str(errors[1])  # what the filter is for

    for error in errors:
        as_traceback = logging.LogRecord(
            "leads.actions", logging.ERROR, __file__, 1, "escalation failed", None, (type(error), error, None)
        )
        as_task_failure = logging.LogRecord(
            "celery.app.trace", logging.ERROR, __file__, 1, "Task x[1] raised unexpected: %r", (error,), None
        )
        as_task_failure.data = {"exc": repr(error)}  # Celery's structured context
        for record in (as_traceback, as_task_failure):
            RedactingFilter().filter(record)
            line = JsonFormatter().format(record)
            for value in (FIRST, LAST, COMPANY, national, EMAIL):
                assert value.lower() not in line.lower(), line
            # What an operator needs stays: the error, the constraint, the type.
            assert "queued_lead_has_no_owner" in line or "invalid input syntax for type integer" in line, line


@pytest.mark.parametrize(
    ("detail", "kept"),
    [
        ("Key (lower(email::text))=(020 7946 0958) already exists.", "Key (lower(email::text))=([redacted]) already"),
        (
            "Key (phone)=(020 7946 0958) conflicts with existing key (phone)=(020 7946 0958).",
            "key (phone)=([redacted]).",
        ),
        ('Key (owner_id)=(12) is not present in table "rotation_rep".', "Key (owner_id)=(12) is not present"),
    ],
)
def test_the_filter_redacts_a_keys_values_and_keeps_ids(detail, kept):
    assert "7946" not in redact(detail) and kept in redact(detail)


def test_database_values_are_redacted_in_linear_time():
    import time

    started = time.perf_counter()
    for line in (
        "Failing row contains (" * 5_000,
        "Key (a)=(" * 5_000,
        "Key (" * 10_000,
        "LINE 1: x" * 5_000,
        "invalid input syntax for " * 5_000,
    ):
        redact(line)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    "line",
    [
        "'eta': '2026-12-03T08:13:07.123456+00:00'",  # Celery's received line of a retry
        "eta 2026-12-03 08:15:00.100000+00:00",
        "GET /x?since=2026-12-03T08:13:07.123456+00:00 200",
    ],
)
def test_the_filter_keeps_a_times_seconds(line):
    assert redact(line) == line
