"""Gunicorn settings for the web process.

Routing is I/O bound (one short transaction per lead), so a few sync workers per core with
a couple of threads each keep the database busy without convoys on a hot group's row lock.
"""

import multiprocessing
import os
import shutil
import tempfile

workers = int(os.environ.get("WEB_WORKERS", multiprocessing.cpu_count() * 2))
threads = int(os.environ.get("WEB_THREADS", 2))
worker_class = "gthread"
timeout = int(os.environ.get("WEB_TIMEOUT", 30))
keepalive = 5
max_requests = 10000
max_requests_jitter = 1000
accesslog = os.environ.get("WEB_ACCESS_LOG", None)

# Prometheus multiprocess mode: each worker writes its samples to files in this directory and
# a scrape of /metrics (in any worker) sums them. It must be set before a worker imports
# prometheus_client, hence here, in the master. scripts/run.sh sets it for web, worker and
# beat together; otherwise each gunicorn master gets its own directory.
_own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _own_metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="leadrouter-metrics-")


def on_starting(server):  # type: ignore[no-untyped-def]
    # A directory given from outside is shared (and emptied by whoever starts the whole set).
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):  # type: ignore[no-untyped-def]
    if _own_metrics_dir:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
