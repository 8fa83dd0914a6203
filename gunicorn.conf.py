"""Gunicorn settings for the web process.

One process per core, eight threads each (gthread). Intake is CPU-bound in the web tier on a
small machine (a few milliseconds of CPU per lead: Django, DRF, the routing), so more
processes than cores only make the request that holds a group's rotation lock wait for a CPU.
The threads are there for batching (leads/batching.py): the requests of one process that
arrive while a routing transaction runs are routed together in the next one, so a hot group
routes many leads per hold of its lock. With two threads there is rarely anyone to batch
with; `make bench` on 2 cores: 2 x 8 routes a hot group about 1.6 times as fast as 2 x 2,
and 1 x 16 or 2 x 16 do no better. Raise WEB_WORKERS with the cores, not beyond; size the
database pool (DB_POOL_MAX_SIZE) to the threads.

The worker class is gthread's, taking new connections in turn with its siblings (least
connections) so that keep-alive clients spread evenly: routing_project/web_worker.py.
"""

import copy
import multiprocessing
import os
import shutil
import sys
import tempfile
from typing import Any


def _whole_number(name: str, default: int, least: int) -> int:
    """A WEB_* setting, at least `least`. A bad one stops the start with one line naming it
    (SystemExit: gunicorn prints any other error of this file as a traceback naming none):
    WEB_WORKERS=0 started a master that listened with no worker to answer, WEB_THREADS=0
    had every worker fail to boot."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        sys.exit(f"Configuration error: {name} is {raw!r}: give a whole number of at least {least}.")
    return value


workers = _whole_number("WEB_WORKERS", multiprocessing.cpu_count(), 1)
threads = _whole_number("WEB_THREADS", 8, 1)
worker_class = "routing_project.web_worker.BalancedThreadWorker"  # gthread, see its docstring
timeout = _whole_number("WEB_TIMEOUT", 30, 0)  # 0: gunicorn's "no timeout"
# Seconds an idle keep-alive connection stays open. Behind a load balancer that reuses its
# connections, keep it above the balancer's idle timeout: else gunicorn may close a connection
# as the balancer sends on it, and that request is a 502.
keepalive = _whole_number("WEB_KEEPALIVE", 5, 1)
max_requests = _whole_number("WEB_MAX_REQUESTS", 100000, 0)  # see the README (web server); 0: never
max_requests_jitter = max_requests // 10
accesslog = os.environ.get("WEB_ACCESS_LOG", None)
logger_class = "routing_project.web_worker.AccessLogger"  # its access lines only on WEB_ACCESS_LOG
# gunicorn's control socket defaults to one path per user (~/.gunicorn/gunicorn.ctl), shared by
# every instance on the host: stopping one removed another's. Nothing here uses it.
control_socket_disable = os.environ.get("WEB_CONTROL_SOCKET", "") == ""
control_socket = os.environ.get("WEB_CONTROL_SOCKET") or os.path.join(tempfile.gettempdir(), "unused-gunicorn.ctl")

# Prometheus multiprocess mode: each worker writes its samples to files in this directory and
# a scrape of /metrics (in any worker) sums them. It must be set before a worker imports
# prometheus_client, hence here, in the master. scripts/run.sh sets it for web, worker and
# beat together; otherwise each gunicorn master gets its own directory.
_own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _own_metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="leadrouter-metrics-")


def _logconfig() -> dict[str, Any]:
    """The product's logging (settings.LOGGING: JSON under LOG_FORMAT=json, the redacting
    filter) for gunicorn's own lines too. They would otherwise go to stderr as they are, and
    a malformed request is logged with the part gunicorn could not parse: an email in a URL or
    a header, unredacted."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routing_project.settings.local")  # as wsgi.py
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        config = copy.deepcopy(settings.LOGGING)
    except ImproperlyConfigured as exc:  # a setting that cannot work: one line naming it
        sys.exit(f"Configuration error: {exc}")
    own = {"handlers": ["console"], "level": "INFO", "propagate": False}
    access = dict(own)
    if accesslog:  # WEB_ACCESS_LOG: gunicorn's access lines to a file ("-": stdout), redacted too
        config["handlers"]["access"] = {
            **config["handlers"]["console"],
            **(
                {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}
                if accesslog == "-"
                else {"class": "logging.FileHandler", "filename": accesslog}
            ),
        }
        access["handlers"] = ["access"]
    config["loggers"] = {**config.get("loggers", {}), "gunicorn.error": own, "gunicorn.access": access}
    return config


logconfig_dict = _logconfig()


def on_starting(server):  # type: ignore[no-untyped-def]
    # A directory given from outside is shared (and emptied by whoever starts the whole set).
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        sys.exit(
            f"Configuration error: PROMETHEUS_MULTIPROC_DIR is {directory!r}: "
            f"it cannot be made a directory ({exc.strerror})."
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        # Else every worker fails to boot on its first sample, in a traceback naming no setting.
        sys.exit(f"Configuration error: PROMETHEUS_MULTIPROC_DIR is {directory!r}: this user cannot write in it.")


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    from prometheus_client import multiprocess

    from routing_project.metrics import process_identifier
    from routing_project.web_worker import release_row

    multiprocess.mark_process_dead(process_identifier(worker.pid))
    release_row(worker.pid)


def on_exit(server):  # type: ignore[no-untyped-def]
    if _own_metrics_dir:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    import gc

    from routing_project.web_worker import warm

    # Every view imported and every URL and validator pattern compiled now, not by the first
    # requests (routing_project.web_worker.warm). Then the application as loaded (URLs, views,
    # serializers: about 120,000 objects) is set apart from the garbage collector: a full
    # collection then scans only what requests left behind. Scanning them all paused the
    # worker, every thread of it, for 100-250 ms on a 2-core machine, a few times a minute
    # under load, rotation locks held meanwhile.
    warm()
    gc.collect()
    gc.freeze()
