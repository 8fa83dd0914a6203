"""Every answer carries the security headers, the API's and the admin's, including those that
middleware gives before any view runs (a body too large, a path without its slash)."""

from __future__ import annotations

import pytest
from django.test import Client

from leads.accept_link import accept_path
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db

HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def assert_secured(response) -> None:
    for name, value in HEADERS.items():
        assert response.get(name) == value, (response.status_code, name, dict(response.headers))


def test_admin_and_api_answers_carry_the_security_headers(api):
    login = Client().get("/admin/login/")
    assert_secured(login)
    assert login["X-Frame-Options"] == "DENY"
    assert_secured(api.get("/api/v1/queue/"))
    assert_secured(Client().get("/api/v1/queue/"))  # 401


def test_answers_given_before_any_view_carry_them_too(api, settings):
    too_large = api.post("/api/v1/leads/", "x" * (settings.MAX_REQUEST_BODY_BYTES + 1), content_type="application/json")
    assert too_large.status_code == 413
    assert_secured(too_large)
    no_slash = api.post("/api/v1/leads", {}, format="json")
    assert no_slash.status_code == 308
    assert_secured(no_slash)
    chunked = api.post("/api/v1/leads/", "{}", content_type="application/json", HTTP_TRANSFER_ENCODING="chunked")
    assert chunked.status_code == 411
    assert_secured(chunked)


def test_an_unknown_host_is_refused():
    assert Client().get("/admin/login/", HTTP_HOST="evil.example").status_code == 400
    assert Client().get("/api/v1/queue/", HTTP_HOST="evil.example").status_code == 400


def test_answers_holding_contact_data_are_not_stored_by_caches(api, make_group):
    """The API's answers and the rep's accept page carry leads' contact details: no browser or
    proxy cache keeps a copy (`no-store`). The schema and the docs may be cached."""
    make_group(2, slug="emea")
    created = api.post("/api/v1/leads/", lead_body(group="emea", phone="+33 1 23 45 67 89"), format="json")
    lead = created.json()
    answers = [
        created,
        api.get(f"/api/v1/leads/{lead['id']}/"),
        api.get("/api/v1/leads/"),
        api.get("/api/v1/queue/"),
        Client().get("/api/v1/leads/"),  # 401
        Client().get(accept_path(lead_id=lead["id"], rep_id=lead["owner"]["id"])),
    ]
    for response in answers:
        assert response.status_code in (200, 201, 401), response.status_code
        assert "no-store" in response.get("Cache-Control", ""), (response.status_code, dict(response.headers))
    assert "no-store" not in Client().get("/api/schema/").get("Cache-Control", "")
