"""Scopes on every endpoint, read from the URL conf itself: an endpoint added later is covered
(and fails here if it forgets to name its scope)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from leads.api.auth import required_scope
from tests.conftest import api_for

SCOPES = ("intake", "read", "manage")
# Signed with the source's secret instead of a token (tests/hooks).
PUBLIC_API = {"hook-intake"}


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    url: str
    scope: str | None

    def __str__(self) -> str:
        return f"{self.method} {self.url} [{self.scope}]"


def _dummy(kwarg: str, regex: str) -> str:
    if kwarg in ("pk", "id") or kwarg.endswith("_id") or "0-9" in regex or "\\d" in regex:
        return "987654"
    return "no-such-thing"


def _patterns(resolver: URLResolver, prefix: str = "") -> list[tuple[str, URLPattern]]:
    out = []
    for p in resolver.url_patterns:
        if isinstance(p, URLResolver):
            out.extend(_patterns(p, prefix + str(p.pattern)))
        else:
            out.append((prefix + str(p.pattern), p))
    return out


def api_endpoints() -> list[Endpoint]:
    endpoints = []
    factory = APIRequestFactory()
    for route, pattern in _patterns(get_resolver()):
        if not route.lstrip("^").startswith("api/v1/") or pattern.name is None:
            continue
        callback: Any = pattern.callback
        cls = getattr(callback, "cls", None)
        if cls is None:
            continue
        kwargs_names = re.findall(r"\(\?P<(\w+)>([^)]*)\)|<(?:\w+:)?(\w+)>", route)
        kwargs = {}
        for regex_name, regex, route_name in kwargs_names:
            name = regex_name or route_name
            kwargs[name] = _dummy(name, regex)
        url = reverse(pattern.name, kwargs=kwargs)
        actions: dict[str, str] = getattr(callback, "actions", None) or {
            m: m for m in cls.http_method_names if m not in ("options", "head") and hasattr(cls, m)
        }
        for method, action in actions.items():
            if method in ("options", "head"):
                continue
            view = cls(**getattr(callback, "initkwargs", {}))
            view.action = action if getattr(callback, "actions", None) else None
            request = Request(getattr(factory, method)(url))
            endpoints.append(Endpoint(pattern.name, method.upper(), url, required_scope(view, request)))
    return endpoints


ENDPOINTS = api_endpoints()
PROTECTED = [e for e in ENDPOINTS if e.name not in PUBLIC_API]


def test_the_url_conf_was_read():
    names = {e.name for e in ENDPOINTS}
    assert {"lead-list", "lead-detail", "queue", "group-list", "hook-intake"} <= names
    assert len(PROTECTED) >= 15


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_every_endpoint_names_a_known_scope(endpoint):
    assert endpoint.scope in SCOPES, f"{endpoint} has no scope: anyone could call it"


def _call(client, endpoint: Endpoint):
    return getattr(client, endpoint.method.lower())(endpoint.url, {}, format="json")


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_no_token_is_401(client, endpoint):
    from rest_framework.test import APIClient

    r = _call(APIClient(), endpoint)
    assert r.status_code == 401, r.content
    assert r["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db
@pytest.mark.parametrize("url", sorted({e.url for e in PROTECTED}))
def test_options_needs_a_token_too(url):
    """OPTIONS describes the endpoint: not to anyone (an action a view forgets to name needs
    the widest scope)."""
    from rest_framework.test import APIClient

    assert APIClient().options(url).status_code == 401
    if url == "/api/v1/leads/":  # describing the lead resource needs the read scope
        assert api_for(["intake", "manage"]).options(url).status_code == 403
        assert api_for(["read"]).options(url).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_revoked_or_unknown_token_is_401(endpoint):
    from leads.models import ApiClient

    api = api_for(list(SCOPES))
    ApiClient.objects.update(active=False)
    assert _call(api, endpoint).status_code == 401
    from rest_framework.test import APIClient

    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer lr_not-a-token")
    assert _call(stranger, endpoint).status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("endpoint", "scope"),
    [(e, s) for e in PROTECTED for s in SCOPES if s != e.scope],
    ids=lambda v: str(v),
)
def test_a_token_without_the_scope_is_403(endpoint, scope):
    r = _call(api_for([scope]), endpoint)
    assert r.status_code == 403, r.content
    assert endpoint.scope in r.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_the_scope_alone_lets_the_request_through(endpoint):
    r = _call(api_for([endpoint.scope]), endpoint)
    assert r.status_code not in (401, 403), (str(endpoint), r.status_code, r.content)
    assert r.status_code < 500


@pytest.mark.django_db
def test_last_used_time_is_recorded():
    from leads.models import ApiClient

    api = api_for(["read"])
    client = ApiClient.objects.get()
    assert client.last_used_at is None
    assert api.get("/api/v1/queue/").status_code == 200
    client.refresh_from_db()
    assert client.last_used_at is not None
    # Only the token's SHA-256 is stored.
    assert len(client.token_hash) == 64 and not client.token_hash.startswith("lr_")


@pytest.mark.django_db
def test_a_duplicate_shows_the_open_leads_contact_data_to_a_reader_only(make_group):
    """A duplicate is answered with the open lead that another request sent: a token that may
    only take leads in (a web form's) learns that the lead exists and where it went, not what
    the other sender said about the contact."""
    make_group(2, slug="emea", is_default=True)
    first = {"email": "jane@acme.example", "first_name": "Jane", "phone": "+33 6 12 34 56 78", "company": "Acme"}
    first |= {"country": "FR", "score": 80, "external_id": "crm-1", "attributes": {"plan": "gold"}}
    lead = api_for(["intake"]).post("/api/v1/leads/", first, format="json").json()
    assert lead["first_name"] == "Jane"  # its own sender sees what it sent

    intake_only = api_for(["intake"]).post("/api/v1/leads/", {"email": "Jane@Acme.example"}, format="json")
    assert intake_only.status_code == 200
    body = intake_only.json()
    assert body["duplicate_of"] == lead["id"] and body["id"] == lead["id"]
    assert body["owner"] == lead["owner"] and body["status"] == lead["status"]
    for field in ("first_name", "phone", "company", "country", "score", "external_id", "attributes"):
        assert body[field] in ("", None, {}), field

    reader = api_for(["intake", "read"]).post("/api/v1/leads/", {"email": "jane@acme.example"}, format="json")
    assert reader.status_code == 200
    assert {k: reader.json()[k] for k in first} == {**first, "email": "jane@acme.example"}
