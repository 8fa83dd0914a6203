"""docker-compose.yml's proxy (deploy/nginx.conf) in front of gunicorn, run for real: nginx
from Debian, gunicorn as production runs it. gunicorn's threads each read one request to its
end: a few connections sending slowly held them all, and /healthz with them."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.webserver import gunicorn, healthz

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("web-server")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def nginx(tmp_path: Path, upstream_port: int) -> Iterator[int]:
    """deploy/nginx.conf as compose mounts it, its upstream and port pointed here."""
    executable = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(executable).exists(), "nginx is missing: `make test` installs it (scripts/test-tools.sh)"
    port = _free_port()
    server = (ROOT / "deploy" / "nginx.conf").read_text()
    assert server.count("proxy_pass http://web:8000;") == 2 and "listen 8000;" in server
    server = server.replace("http://web:8000", f"http://127.0.0.1:{upstream_port}").replace(
        "listen 8000;", f"listen 127.0.0.1:{port};"
    )
    (tmp_path / "server.conf").write_text(server)
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    # As root, nginx's workers would run as nobody, who cannot write its temporary files here.
    user = "user root;" if os.geteuid() == 0 else ""
    (tmp_path / "nginx.conf").write_text(
        f"""
        {user}
        pid {tmp_path}/nginx.pid;
        error_log {tmp_path}/nginx-error.log;
        events {{}}
        http {{
            access_log off;
            client_body_temp_path {temp}/body;
            proxy_temp_path {temp}/proxy;
            fastcgi_temp_path {temp}/fastcgi;
            uwsgi_temp_path {temp}/uwsgi;
            scgi_temp_path {temp}/scgi;
            include {tmp_path}/server.conf;
        }}
        """
    )
    process = subprocess.Popen(
        [executable, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"]
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                if healthz(port) == 200:
                    break
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "nginx-error.log").read_text()
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def slow_requests(port: int, count: int) -> list[socket.socket]:
    """Connections that send a request's head and one byte of its body, then nothing."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(
            b"POST /api/v1/hooks/webform/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        held.append(sock)
    return held


def answers(port: int) -> bool:
    try:
        return healthz(port, timeout=2) == 200
    except OSError:  # timed out
        return False


def test_slow_clients_hold_no_web_thread_behind_the_proxy(tmp_path):
    with gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2", TRUSTED_PROXY_COUNT="1") as web:
        # Straight at gunicorn, as compose published it: two slow connections hold both threads.
        held = slow_requests(web.port, 2)
        time.sleep(0.5)
        try:
            assert not answers(web.port)
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 30
        while not answers(web.port):  # back once they are gone
            assert time.monotonic() < deadline, web.log_tail()
        with nginx(tmp_path, web.port) as proxy:
            held = slow_requests(proxy, 40)
            time.sleep(0.5)
            try:
                assert all(answers(proxy) for _ in range(5))
            finally:
                for sock in held:
                    sock.close()


def test_the_proxy_passes_a_large_csv_upload_and_refuses_a_large_api_body(tmp_path):
    """The proxy's 1 MB limit refused the admin's CSV upload past about 15,000 rows with nginx's
    own bare 413 page; the API keeps its limit (the web's own 64 KiB 413 up to 1 MB)."""
    import http.client

    def post(port: int, path: str, size: int) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", path, body=b"x" * size, headers={"Content-Type": "text/csv"})
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    with (
        gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="2", TRUSTED_PROXY_COUNT="1") as web,
        nginx(tmp_path, web.port) as proxy,
    ):
        status, body = post(proxy, "/admin/lead-import/", 3 * 1024 * 1024)
        assert status != 413 and "nginx" not in body, (status, body[:300])  # the web's answer (CSRF, login)
        status, body = post(proxy, "/api/v1/leads/", 200 * 1024)
        assert status == 413 and "nginx" not in body, (status, body[:300])  # the web's own, in JSON
        status, body = post(proxy, "/api/v1/leads/", 3 * 1024 * 1024)
        assert status == 413, status
