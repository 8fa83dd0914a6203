"""Regressions for what schemathesis found: each was a 500 or an undocumented answer."""

import pytest
from django.utils import timezone

from leads.models import Lead

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/v1/leads/abc/", "/api/v1/leads/null,null/events/", "/api/v1/leads/0.5/accept/"])
def test_non_numeric_lead_ids_are_json_404s(api, url):
    r = api.post(url, {}, format="json") if url.endswith("accept/") else api.get(url)
    assert r.status_code == 404 and r["Content-Type"] == "application/json"
    assert r.json() == {"detail": "Not found."}


def test_unmatched_api_urls_are_json_404s_and_the_rest_html(api, client):
    r = api.get("/api/v1/groups/%C2%84/members/")
    assert r.status_code == 404 and r.json()["detail"]
    assert client.get("/nowhere/").status_code == 404
    assert "text/html" in client.get("/nowhere/")["Content-Type"]


def test_unmatched_api_urls_are_json_404s_with_debug_on_too(api, client, settings):
    settings.DEBUG = True  # as `make run` serves: Django's own 404 page is HTML there
    for url in ("/api/v1/leads/abc/", "/api/v1/groups/%C2%84/", "/api/v2/nothing/"):
        r = api.get(url)
        assert r.status_code == 404 and r["Content-Type"] == "application/json", url
        assert r.json() == {"detail": "Not found."}
    assert api.post("/api/v1/leads", {}, format="json").status_code == 308  # the slash redirect stays


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/leads.json"),
        ("get", "/api/v1/leads/{lead}.json"),
        ("get", "/api/v1/leads/{lead}/events.json"),
        ("post", "/api/v1/leads/{lead}/close.json"),
        ("post", "/api/v1/leads/{lead}/accept.json"),
        ("get", "/api/v1/groups.json"),
        ("get", "/api/v1/rules.json"),
    ],
)
def test_format_suffixed_paths_are_json_404s(api, method, url):
    """The API's paths are the contract's, ending with a slash: a `.json` suffix names no
    endpoint (the router's suffix variants answered some actions with a 500)."""
    lead = api.post("/api/v1/leads/", {"email": "suffix@customer.example"}, format="json").json()["id"]
    r = getattr(api, method)(url.format(lead=lead), {"outcome": "won"} if method == "post" else None, format="json")
    assert r.status_code == 404 and r["Content-Type"] == "application/json", (url, r.status_code)
    assert r.json() == {"detail": "Not found."}


def test_created_after_takes_any_offset_and_refuses_out_of_range(api):
    Lead.objects.create(email="a@b.example", email_normalized="a@b.example", status="queued", created_at=timezone.now())
    r = api.get("/api/v1/leads/", {"created_after": "2000-01-01T00:00:00-21:45"})
    assert r.status_code == 200 and r.json()["count"] == 1
    r = api.get("/api/v1/leads/", {"created_after": "9999-12-31T23:59:59-23:00"})
    assert r.status_code == 400 and "created_after" in r.json()


def test_created_after_takes_a_positive_offset_whose_plus_was_not_url_encoded(api):
    # `f"?created_after={when.isoformat()}"`: the "+" of "+01:00" arrives as a space.
    Lead.objects.create(email="a@b.example", email_normalized="a@b.example", status="queued", created_at=timezone.now())
    for when in ("2000-01-01T01:00:00+01:00", "2000-01-01T01:00:00.123456+01:00", "2000-01-01T01:00+0100"):
        r = api.get(f"/api/v1/leads/?created_after={when}")
        assert r.status_code == 200 and r.json()["count"] == 1, (when, r.content)
    r = api.get("/api/v1/leads/?created_after=2999-01-01T01:00:00+01:00")
    assert r.status_code == 200 and r.json()["count"] == 0
    assert api.get("/api/v1/leads/?created_after=2000-01-01 00:00").json()["count"] == 1  # a space before the time
    assert api.get("/api/v1/leads/?created_after=2000-01-01T01:00:00+99").status_code == 400


@pytest.mark.parametrize(
    "query", ["created_after=", "owner=", "status=", "group=", "owner=1&owner=2", "group=a&group=b", "page_size=0"]
)
@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/queue/"])
def test_empty_repeated_or_out_of_range_parameters_are_400s(api, path, query):
    # `?group=` (a client's template with its slug left blank) listed every lead.
    r = api.get(f"{path}?{query}")
    assert r.status_code == 400
    assert query.split("=")[0] in r.json()


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("status=bad&owner=x&page=0&page_size=0", {"status", "owner", "page", "page_size"}),
        ("created_after=soon&page_size=501", {"created_after", "page_size"}),
        ("page=0&page_size=0", {"page", "page_size"}),
        ("page=last&page_size=ten", {"page_size"}),
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/queue/"])
def test_a_400_names_every_bad_filter_and_page_parameter(api, path, query, named):
    """The filters were checked first and the page parameters only once they passed: each
    400 named some of the bad parameters, the next try the others."""
    r = api.get(f"{path}?{query}")
    assert r.status_code == 400 and set(r.json()) == named, r.content


def test_page_parameters_alone_are_named_together_on_every_list(api):
    for path in ("/api/v1/rules/", "/api/v1/groups/", "/api/v1/reps/"):
        r = api.get(f"{path}?page=x&page_size=x")
        assert r.status_code == 400 and set(r.json()) == {"page", "page_size"}, (path, r.content)


@pytest.mark.parametrize("owner", ["\u0661", "1.0", "+1", "1_0"])
@pytest.mark.parametrize("path", ["/api/v1/leads/", "/api/v1/queue/"])
def test_an_owner_filter_is_a_rep_id_written_in_ascii_digits(api, path, owner):
    """`?owner=` takes a rep id as the API writes it: Arabic-Indic digits, a decimal point or a
    sign are a 400 naming the parameter, never rep 1 (or rep 10)."""
    r = api.get(path, {"owner": owner})
    assert r.status_code == 400, (owner, r.content)
    assert "owner" in r.json()


@pytest.mark.parametrize("owner", ["-1", "0"])
def test_an_owner_filter_out_of_range_says_so(api, owner):
    """A negative id was answered "Enter a whole number.", which it is."""
    r = api.get("/api/v1/leads/", {"owner": owner})
    assert r.status_code == 400 and "greater than or equal to 1" in r.json()["owner"][0], r.content


def test_json_types_follow_the_schema_a_field_is_documented_with():
    from decimal import Decimal

    from rest_framework import serializers

    from routing_project.api import DecimalField, json_type_error

    assert json_type_error(serializers.CharField(), 12) == "Not a valid string."
    assert json_type_error(serializers.IntegerField(), "5") == "A valid integer is required."
    assert json_type_error(serializers.IntegerField(), True) == "A valid integer is required."
    assert json_type_error(serializers.BooleanField(), "true") == "Must be a valid boolean."
    assert json_type_error(serializers.IntegerField(), None) is None  # left to allow_null
    number = serializers.DecimalField(max_digits=5, decimal_places=2, coerce_to_string=False)
    assert json_type_error(number, "1.50") == "A valid number is required."
    assert json_type_error(number, 1.5) is None
    text = serializers.DecimalField(max_digits=5, decimal_places=2, coerce_to_string=True)
    assert json_type_error(text, "1.50") is None and json_type_error(text, Decimal("1.5")) is not None
    either = DecimalField(max_digits=5, decimal_places=2)  # documented as a number or as text
    assert json_type_error(either, "1.50") is None and json_type_error(either, 1.5) is None


@pytest.mark.parametrize("method", ["get", "patch", "put", "delete"])
def test_a_group_slug_with_a_nul_names_no_group(api, method):
    r = getattr(api, method)("/api/v1/groups/a%00b/", {}, format="json")
    assert r.status_code == 404 and r["Content-Type"] == "application/json"


@pytest.mark.parametrize("slug", ["a\x00b", "no such", "x" * 300, 5])
def test_a_rule_naming_a_group_that_cannot_exist_is_a_400(api, make_group, slug):
    make_group(1, slug="emea")
    body = {
        "name": "n",
        "priority": 1,
        "group": slug,
        "conditions": [{"field": "country", "op": "in", "value": ["FR"]}],
    }
    r = api.post("/api/v1/rules/", body, format="json")
    assert r.status_code == 400 and "group" in r.json(), r.content


@pytest.mark.parametrize("url", ["/api/v1/groups/emea/", "/api/v1/groups/emea/members/{rep}/", "/api/v1/reps/{rep}/"])
def test_configuration_is_updated_with_patch_put_is_a_405(api, make_group, url):
    _, (rep,) = make_group(1, slug="emea")
    assert api.put(url.format(rep=rep.pk), {}, format="json").status_code == 405
