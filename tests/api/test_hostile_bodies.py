"""Bodies and paths a client can send that Python's JSON parser or Django's defaults would turn
into a 500 or a silently lost lead: each gets a clear 4xx (or a 308 to the right path), and
nothing is written."""

import json
import time

import pytest
from django.test import Client

from hooks import services as hook_services
from leads.models import Lead
from rotation.models import Group, RoutingRule

pytestmark = pytest.mark.django_db

DEEP = b'{"email": "deep@customer.example", "attributes": ' + b"[" * 5000 + b"]" * 5000 + b"}"
LONE = '{"email": "lone@customer.example", "attributes": {"k": "\\ud800"}}'


@pytest.mark.parametrize(
    "path",
    ["/api/v1/leads/", "/api/v1/routing/simulate/", "/api/v1/rules/", "/api/v1/groups/", "/api/v1/reps/"],
)
def test_json_nested_too_deeply_is_a_400(api, path):
    r = api.post(path, DEEP, content_type="application/json")
    assert r.status_code == 400, r.content
    assert "nested too deeply" in r.json()["detail"]
    assert not Lead.objects.exists() and not Group.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        LONE,
        '{"email": "lone@customer.example", "\\udfff": 1}',  # as a key, echoed by the unknown-field error
        '{"email": "lone@customer.example", "first_name": "\\ud83d"}',  # a pair's first half alone
    ],
)
def test_a_lone_surrogate_is_a_400_with_or_without_an_idempotency_key(api, body):
    for headers in ({}, {"Idempotency-Key": "lone-1"}):
        r = api.post("/api/v1/leads/", body, content_type="application/json", headers=headers)
        assert r.status_code == 400, r.content
        assert "surrogate" in r.json()["detail"]
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ('{"email": "a@customer.example", "group": "north", "email": "b@other.example"}', "email"),
        ('{"email": "a@customer.example", "attributes": {"plan": "pro", "plan": "free"}}', "plan"),
    ],
)
def test_a_name_given_twice_in_one_object_is_a_400_naming_it(api, make_group, body, name):
    """Parsers disagree on which of the two counts: a proxy that checked one and the router
    that took the other would tell two stories."""
    make_group(1, slug="north", is_default=True)
    for headers in ({}, {"Idempotency-Key": "twice-1"}):
        r = api.post("/api/v1/leads/", body, content_type="application/json", headers=headers)
        assert r.status_code == 400, r.content
        assert f"'{name}' appears more than once" in r.json()["detail"]
    assert not Lead.objects.exists()


def test_a_lone_surrogate_in_a_rule_is_a_400(api, make_group):
    make_group(1, slug="north")
    condition = '{"field": "country", "op": "equals", "value": "\\ud800"}'
    body = '{"name": "x", "priority": 1, "group": "north", "conditions": [' + condition + "]}"
    r = api.post("/api/v1/rules/", body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert not RoutingRule.objects.exists()


def test_an_escaped_surrogate_pair_and_an_escaped_backslash_are_valid(api, make_group):
    make_group(1, slug="north")
    body = (
        '{"email": "pair@customer.example", "group": "north", "first_name": "\\ud83d\\ude00", "company": "a\\\\ud800"}'
    )
    r = api.post("/api/v1/leads/", body, content_type="application/json")
    assert r.status_code == 201, r.content
    lead = Lead.objects.get()
    assert lead.first_name == "\U0001f600" and lead.company == "a\\ud800"


def test_the_signed_hook_refuses_deep_nesting_and_lone_surrogates(make_group):
    make_group(1, slug="north", is_default=True)
    source, secret = hook_services.source_create(slug="form", name="Form", actor="test", field_map={})
    for body in (DEEP, b'{"email": "lone@customer.example", "other": "\\ud800"}'):
        signature = hook_services.sign(secret=secret, body=body, timestamp=int(time.time()))
        r = Client().post(
            "/api/v1/hooks/form/", body, content_type="application/json", headers={"X-Signature": signature}
        )
        assert r.status_code == 400, r.content
    assert not Lead.objects.exists()


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "get"])
def test_an_api_path_without_its_slash_is_a_308_to_it(api, method):
    if method == "get":
        r = api.get("/api/v1/leads?x=1")
    else:
        body = json.dumps({"email": "a@b.example"})
        r = getattr(api, method)("/api/v1/leads?x=1", body, content_type="application/json")
    assert r.status_code == 308, r.content
    assert r["Location"] == "/api/v1/leads/?x=1"
    assert "/api/v1/leads/" in r.json()["detail"]
    assert not Lead.objects.exists()


def test_a_post_without_the_slash_followed_as_clients_do_takes_the_lead_in(api, make_group):
    make_group(1, slug="north")
    r = api.post("/api/v1/leads", {"email": "follow@customer.example", "group": "north"}, format="json", follow=True)
    assert r.status_code == 201, r.content
    assert Lead.objects.get().email == "follow@customer.example"


def test_an_unknown_api_path_without_a_slash_is_still_a_404():
    assert Client().post("/api/v1/nothing-here").status_code == 404


def test_options_on_the_docs_page_is_not_a_500():
    r = Client().options("/api/docs/")
    assert r.status_code == 405
    assert Client().get("/api/docs/").status_code == 200


@pytest.mark.parametrize("charset", ["rot13", "zlib", "bz2", "quopri", "base64"])
@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/routing/simulate/", "/api/v1/groups/"])
def test_a_charset_that_is_no_text_encoding_is_a_400(api, path, charset):
    """Python knows these codecs, so Django keeps them as the request's encoding, but they turn
    bytes into bytes (or text into text): a 400 naming the charset, never a 500."""
    body = json.dumps({"email": "codec@customer.example", "slug": "g", "name": "G"})
    r = api.post(path, body, content_type=f"application/json; charset={charset}")
    assert r.status_code == 400, r.content
    assert f"'{charset}' is not a text encoding" in r.json()["detail"]
    assert not Lead.objects.exists() and not Group.objects.exists()


def test_a_body_in_the_charset_it_names_is_taken(api, make_group):
    make_group(1, slug="north")
    body = json.dumps({"email": "latin@customer.example", "group": "north", "first_name": "Zoé"}, ensure_ascii=False)
    r = api.post("/api/v1/leads/", body.encode("latin-1"), content_type="application/json; charset=latin-1")
    assert r.status_code == 201, r.content
    assert Lead.objects.get().first_name == "Zoé"


@pytest.mark.parametrize(
    ("charset", "body"),
    [
        # These codecs turn what is plain ASCII on the wire into a lone surrogate in the text,
        # with no "\ud800" escape left for the JSON checks to see.
        ("unicode_escape", rb'{"email": "esc@customer.example", "attributes": {"k": "\ud800"}}'),
        ("raw_unicode_escape", rb'{"email": "esc@customer.example", "\udfff": 1}'),
        ("utf-7", b'{"email": "esc@customer.example", "attributes": {"k": "+2AA-"}}'),
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/routing/simulate/", "/api/v1/groups/"])
def test_a_lone_surrogate_made_by_the_named_charset_is_a_400(api, make_group, path, charset, body):
    make_group(1, slug="north", is_default=True)
    for headers in ({}, {"Idempotency-Key": "charset-1"}):
        r = api.post(path, body, content_type=f"application/json; charset={charset}", headers=headers)
        assert r.status_code == 400, r.content
        assert "surrogate" in r.json()["detail"]
    assert not Lead.objects.exists() and Group.objects.count() == 1


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/api/v1/leads/"), ("post", "/api/v1/leads/"), ("get", "/api/v1/groups/north/rotation/")],
)
def test_a_query_string_of_too_many_parameters_is_a_json_400(api, make_group, settings, debug, method, path):
    """Django refuses to parse more than DATA_UPLOAD_MAX_NUMBER_FIELDS parameters: an HTML 400
    with DEBUG off, and a 500 with DEBUG on (`make run`), whose debug page reads them again."""
    settings.DEBUG = debug
    make_group(1, slug="north")
    query = "&".join(["a"] * (settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    if method == "post":
        r = api.post(f"{path}?{query}", {"email": "many@customer.example", "group": "north"}, format="json")
    else:
        r = api.get(f"{path}?{query}")
    assert r.status_code == 400, r.content
    assert r["Content-Type"] == "application/json"
    assert "Too many query parameters" in r.json()["detail"]
    assert not Lead.objects.exists()
    few = "&".join(["a"] * 10)
    if method == "post":
        r = api.post(f"{path}?{few}", {"email": "many@customer.example", "group": "north"}, format="json")
        assert r.status_code == 201, r.content
    else:
        assert api.get(f"{path}?{few}").status_code == 200


def test_a_host_header_the_server_does_not_answer_for_is_a_json_400_under_the_api(api, settings):
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["leads.example"]
    r = api.get("/api/v1/leads/", headers={"Host": "evil.example"})
    assert r.status_code == 400 and r["Content-Type"] == "application/json"
    assert "Host" in r.json()["detail"] and "evil.example" not in r.json()["detail"]
    assert Client().get("/admin/", headers={"Host": "evil.example"})["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/hooks/webform/", "/admin/", "/healthz"])
def test_a_host_header_the_server_does_not_answer_for_gets_no_debug_page_with_debug_on(api, settings, path):
    """Django's debug page (DEBUG on, as `make run` has it) lists the settings, the database
    URL with its password among them: a page of a host name resolving to this server (DNS
    rebinding) could read it."""
    settings.DEBUG = True
    settings.ALLOWED_HOSTS = ["leads.example"]
    r = Client().get(path, headers={"Host": "evil.example"})
    assert r.status_code == 400
    assert b"DATABASES" not in r.content and b"Traceback" not in r.content and len(r.content) < 2_000
    if path.startswith("/api/"):
        assert r["Content-Type"] == "application/json" and "Host" in r.json()["detail"]
