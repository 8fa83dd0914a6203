"""Requests the real web server sees differently from Django's test client: a chunked body
(a clear 411, never a body read as empty: Django reads bodies by their Content-Length), HEAD
(the GET headers, no body), and requests gunicorn refuses itself (answered in JSON)."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time

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


def _raw(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return status, headers, body


def test_requests_the_server_cannot_parse_are_answered_in_json(tmp_path):
    """A request line or headers too long, or malformed, never reach Django: gunicorn answered
    them with an HTML page; API clients read every error as JSON with a `detail`."""
    long_url = b"/api/v1/leads/?q=" + b"a" * 5000
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        answers = [
            _raw(server.port, b"GET " + long_url + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
            _raw(server.port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: b\r\n" * 200 + b"\r\n"),
            _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n"),
        ]
    statuses = [status.split(" ", 2)[1] for status, _, _ in answers]
    assert statuses == ["414", "431", "400"], answers
    for _status, headers, body in answers:
        assert headers["content-type"] == "application/json"
        assert int(headers["content-length"]) == len(body)
        assert json.loads(body)["detail"]
    assert json.loads(answers[0][2])["detail"].startswith("URI Too Long: ")


def test_a_413_keeps_the_keep_alive_connection_it_announces(tmp_path):
    """The refused body was left unread and gunicorn closed the connection after a 413 that
    said keep-alive: a pooled client's next request on it failed."""
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        for size in (70_000, 900_000):
            conn.request("POST", "/api/v1/leads/", body=b"x" * size, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 413
            assert response.getheader("Connection") == "keep-alive"
            conn.request("GET", "/healthz")  # the same connection
            again = conn.getresponse()
            again.read()
            assert again.status == 200
        conn.close()


def test_head_probes_get_the_get_headers_and_no_body_and_no_warning(tmp_path):
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        answers = {}
        for method in ("GET", "HEAD"):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request(method, "/healthz")
            response = conn.getresponse()
            answers[method] = (response.status, response.getheader("Content-Length"), response.read())
            conn.close()
        log = server.log.read_text(errors="replace")
    assert answers["HEAD"] == (200, answers["GET"][1], b"")
    assert answers["GET"][2] and int(answers["GET"][1]) == len(answers["GET"][2])
    assert "no-body response" not in log, log


def test_gunicorns_access_log_is_redacted_as_every_other_log(tmp_path):
    access = tmp_path / "access.log"
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2", WEB_ACCESS_LOG=str(access)) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/admin/leads/lead/?q=zelda%40customer.example&phone=555-123-4567")
        conn.getresponse().read()
        conn.close()
        deadline = time.monotonic() + 5
        while "[redacted]" not in access.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    logged = access.read_text()
    assert "GET " in logged and "[redacted]" in logged, logged
    assert "zelda" not in logged and "555-123-4567" not in logged, logged


def test_gunicorns_access_lines_carry_the_request_id(tmp_path):
    """Every line of a request carries its id: gunicorn's access line too (WEB_ACCESS_LOG),
    although gunicorn writes it after the application has let go of the request."""
    access = tmp_path / "access.log"
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2", WEB_ACCESS_LOG=str(access)) as server:
        echoed = []
        for headers in ({"X-Request-ID": "probe-access-1"}, {}):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("GET", "/api/v1/leads/", headers=headers)
            response = conn.getresponse()
            response.read()
            echoed.append(response.getheader("X-Request-ID"))
            conn.close()
        deadline = time.monotonic() + 5
        while access.read_text().count("/api/v1/leads/") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = [json.loads(line) for line in access.read_text().splitlines() if "/api/v1/leads/" in line]
    assert echoed[0] == "probe-access-1" and echoed[1]
    # Each request's line with its id; in either order (two threads: gunicorn writes a line
    # once its request is let go, and the second may be let go first).
    assert sorted(line["request_id"] for line in lines) == sorted(echoed), lines


def test_the_web_servers_own_lines_are_json_and_redacted(tmp_path):
    # gunicorn logs a malformed request with the part it could not parse: its own lines must
    # go through the product's handler (JSON, redaction), never to stderr as they are.
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        for raw in (b"GET /x?email=leaked@customer.example\r\n\r\n", b"JANE@CUSTOMER.EXAMPLE /x HTTP/1.1\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
                conn.sendall(raw)
                assert conn.recv(100).startswith(b"HTTP/1.1 400")
        deadline = time.monotonic() + 10
        while server.log.read_text(errors="replace").count("Invalid") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        log = server.log.read_text(errors="replace")
    assert "customer.example" not in log.lower(), log
    lines = [json.loads(line) for line in log.splitlines() if "Invalid" in line]
    assert len(lines) == 2 and all(line["logger"] == "gunicorn.error" for line in lines), log


def test_without_an_access_log_gunicorn_writes_no_access_lines_of_its_own(tmp_path):
    """The product writes one access line per request; gunicorn, handed the logging settings,
    took them as a wish for its own and doubled every request's log (and its cost)."""
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/api/v1/leads/")
        conn.getresponse().read()
        conn.close()
        deadline = time.monotonic() + 5
        while "/api/v1/leads/" not in server.log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.05)
        log = server.log.read_text(errors="replace")
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    access = [line["logger"] for line in lines if line["logger"].endswith(".access")]
    assert access == ["routing_project.access"], log
    assert not [line for line in lines if line["logger"] == "gunicorn.access"], log


@pytest.mark.parametrize(
    ("name", "value"),
    [("WEB_WORKERS", "0"), ("WEB_WORKERS", "two"), ("WEB_THREADS", "0"), ("WEB_TIMEOUT", "-1"), ("WEB_KEEPALIVE", "0")],
)
def test_a_web_setting_out_of_range_stops_the_start_by_name(name, value):
    # WEB_WORKERS=0 started a master that listened with no worker to answer (clients hung);
    # WEB_THREADS=0 had every worker fail to boot; "two" was a traceback naming no setting.
    _assert_start_refused(name, value)


def test_a_metrics_directory_that_cannot_be_written_stops_the_start_by_name(tmp_path):
    # It was a FileNotFoundError (or, for a directory it may not write, workers that failed
    # to boot on their first sample) at the end of a traceback naming no setting.
    not_a_directory = tmp_path / "metrics"
    not_a_directory.write_text("")
    _assert_start_refused("PROMETHEUS_MULTIPROC_DIR", str(not_a_directory))


def _assert_start_refused(name: str, value: str) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": "test-only-secret-key-for-the-web-server-tests",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env[name] = value
    executable = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        done = subprocess.run(
            [
                executable,
                "routing_project.wsgi:application",
                "--config",
                "gunicorn.conf.py",
                "--bind",
                f"127.0.0.1:{port}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"gunicorn kept running with {name}={value}: {exc.stderr!r}")
    assert done.returncode != 0
    assert f"Configuration error: {name} is {value!r}" in done.stderr
    assert "Traceback" not in done.stderr
