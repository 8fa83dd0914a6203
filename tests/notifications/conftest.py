import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that records what it is sent and answers with the
    next status in `statuses` (the last one repeats)."""

    url: str = ""
    statuses: list[int] = field(default_factory=lambda: [200])
    requests: list[dict] = field(default_factory=list)
    # Cleared: each request waits (up to a minute) until it is set again, a receiver slow to answer.
    answering: threading.Event = field(default_factory=lambda: _set(threading.Event()))

    def next_status(self) -> int:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            rec.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            rec.answering.wait(timeout=60)
            status = rec.next_status()
            payload = json.dumps({"ok": status < 300}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/leads"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        rec.answering.set()
        server.shutdown()
        server.server_close()
