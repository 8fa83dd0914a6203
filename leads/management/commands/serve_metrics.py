"""manage.py serve_metrics: the Prometheus samples of this host's processes, for a machine that
runs Celery workers (or beat) and no web server, whose `/metrics` would otherwise be nowhere."""

from __future__ import annotations

import os
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape every few seconds is not worth a line


class Command(BaseCommand):
    help = (
        "Serves the Prometheus samples the processes of this host write to PROMETHEUS_MULTIPROC_DIR "
        "(Celery workers and beat: escalations, SLA breaches, routing of queue drains), for a host "
        "without a web server. The database gauges (queue depth, overdue SLAs) come from any web's /metrics."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=9102, help="port to listen on (default 9102)")
        parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")

    def handle(self, *args: Any, **options: Any) -> None:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory or not os.path.isdir(directory):
            raise CommandError(
                "Set PROMETHEUS_MULTIPROC_DIR to the directory this host's workers write their samples to "
                "(the same value as theirs)."
            )
        if not 0 <= options["port"] <= 65535:
            raise CommandError(f"--port {options['port']}: a TCP port is 0 to 65535.")
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        try:
            server = make_server(options["bind"], options["port"], make_wsgi_app(registry), handler_class=_QuietHandler)
        except OSError as exc:
            raise CommandError(f"Cannot listen on {options['bind']}:{options['port']}: {exc.strerror}.") from None
        self.stdout.write(f"Serving {directory}'s samples on http://{options['bind']}:{options['port']}/metrics")
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
