"""Every answer carries the security headers, the API's and the admin's, including those that
middleware gives before any view runs (a body too large, a path without its slash)."""

from __future__ import annotations

import pytest
from django.test import Client

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
