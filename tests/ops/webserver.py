"""gunicorn as production runs it (gunicorn.conf.py, the production settings), for the tests
that need the real web server: its worker class, its connection pool."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class WebServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def healthz(port: int, timeout: float = 2) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def live_database_url() -> str:
    """The URL of the database this test runs on, for a server that must see its rows (the
    test commits them: `django_db(transaction=True)`)."""
    from django.db import connection

    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@contextmanager
def gunicorn(tmp_path: Path, **env: str) -> Iterator[WebServer]:
    """gunicorn on a free port with `env` over the production settings, answering /healthz
    when this yields; stopped afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": "test-only-secret-key-for-the-web-server-tests",
        "ALLOWED_HOSTS": "127.0.0.1",
        "LOG_FORMAT": "json",
        **env,
    }
    full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # gunicorn.conf.py makes a private one
    executable = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    log = tmp_path / "web.log"
    process = subprocess.Popen(
        [executable, "routing_project.wsgi:application", "--config", "gunicorn.conf.py", "--bind", f"127.0.0.1:{port}"],
        env=full_env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = WebServer(process, port, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if healthz(port) == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
