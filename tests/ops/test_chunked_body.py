"""A chunked request body, sent to the real web server: a clear 411, never a body read as
empty (Django reads bodies by their Content-Length)."""

import http.client
import json

import pytest

from tests.ops.webserver import gunicorn

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("web-server")]


def test_a_chunked_post_is_a_411_naming_the_content_length(tmp_path):
    body = json.dumps({"email": "chunked@customer.example"}).encode()
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request(
            "POST",
            "/api/v1/leads/",
            body=iter([body]),  # no length: http.client sends it chunked
            headers={"Content-Type": "application/json", "Authorization": "Bearer lr_none"},
            encode_chunked=True,
        )
        response = conn.getresponse()
        answer = response.read()
        conn.close()
    assert response.status == 411, answer
    assert "Content-Length" in json.loads(answer)["detail"]
