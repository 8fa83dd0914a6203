"""Gunicorn settings for the web process.

Routing is I/O bound (one short transaction per lead), so a few sync workers per core with
a couple of threads each keep the database busy without convoys on a hot group's row lock.
"""

import multiprocessing
import os

workers = int(os.environ.get("WEB_WORKERS", multiprocessing.cpu_count() * 2))
threads = int(os.environ.get("WEB_THREADS", 2))
worker_class = "gthread"
timeout = int(os.environ.get("WEB_TIMEOUT", 30))
keepalive = 5
max_requests = 10000
max_requests_jitter = 1000
accesslog = os.environ.get("WEB_ACCESS_LOG", None)
