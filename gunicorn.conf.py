"""Gunicorn settings for the web process.

One process per core, two threads each (gthread). Intake costs about 10-15 ms of CPU per lead
on a small machine (Django, DRF) around a transaction of a few milliseconds, so the web tier
is CPU-bound: two threads per process overlap the database round trips, and more processes
than cores only make the request that holds a group's rotation lock wait for a CPU, which
lengthens the lock for everybody behind it (`make bench`: 2 x 2 beat 4 x 2 on 2 cores, on
both rate and p99). Raise WEB_WORKERS with the cores, not beyond.
"""

import multiprocessing
import os
import shutil
import tempfile

workers = int(os.environ.get("WEB_WORKERS", multiprocessing.cpu_count()))
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
