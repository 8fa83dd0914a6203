"""Test settings: PostgreSQL and Redis by default, as CI runs them.

Set DATABASE_URL=sqlite:// ... to run the routing and API tests on the embedded default.
"""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from .base import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Generous: CI runs tests in parallel on 2 cores; the lock-timeout tests set their own.
ROUTING_LOCK_TIMEOUT_MS = 5000
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# Tests post many leads a minute through one client; the rate-limit tests set their own limits.
API_RATE_LIMIT_PER_MINUTE = 1_000_000
# Celery on Redis, isolated per pytest-xdist worker (CI shares one Redis database): every
# key the broker writes carries this prefix, and the real-worker tests start their worker
# subprocess with the same environment, so it consumes exactly this process's tasks.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
    "global_keyprefix": f"lr-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:",
}
# The same for the embedded default: SQLite's flush DELETEs, which the audit table's trigger
# allows only when this says so (audit/migrations/0006_sqlite_append_only.py).
AUDIT_FLUSH_ALLOWED = True
if DATABASES["default"]["ENGINE"] == "routing_project.postgresql":  # noqa: F405
    # Django's flush between transactional tests TRUNCATEs every table; the audit table
    # rejects that unless the connection says so (audit/migrations/0004_no_truncate.py).
    _options = DATABASES["default"].setdefault("OPTIONS", {})  # noqa: F405
    _options["options"] = (_options.get("options", "") + " -c leadrouter.allow_audit_truncate=on").strip()
