"""Settings shared by every environment.

Everything that differs between machines comes from the environment (django-environ).
With no DATABASE_URL the product runs on an embedded SQLite database with immediate
transactions (so writers serialize and the rotation stays exact); with no REDIS_URL Celery
uses a broker that needs no server (kombu's filesystem transport).
"""

import logging
import os
from pathlib import Path
from typing import Any

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = BASE_DIR / "var"


class _Env(environ.Env):
    """django-environ's, naming the variable when its value is not of the setting's type: its
    own error is a bare "invalid literal for int() with base 10: '2s'", which leaves an operator
    to guess which setting it was."""

    _KINDS = {int: "a whole number", float: "a number"}
    # Any other word reads as false in django-environ: a typo (SESSION_COOKIE_SECURE=ture)
    # turned a switch off without a word. An empty value stays false, as before.
    _WORDS = (*environ.Env.BOOLEAN_TRUE_STRINGS, "false", "off", "no", "n", "0", "")

    def get_value(
        self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET, parse_default: bool = False
    ) -> Any:
        raw = self.ENVIRON.get(var)
        if cast is bool and raw is not None and raw.strip().lower() not in self._WORDS:
            try:
                int(raw)  # as django-environ: a number is true unless 0
            except ValueError:
                raise ImproperlyConfigured(f"{var} is {raw!r}: give true or false.") from None
        try:
            return super().get_value(var, cast=cast, default=default, parse_default=parse_default)
        except ValueError:
            kind = self._KINDS.get(cast, "a valid value")
            raise ImproperlyConfigured(f"{var} is {self.ENVIRON.get(var)!r}: give {kind}.") from None


env = _Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)


def _require(ok: bool, name: str, value: Any, want: str) -> None:
    """Stops the start naming the setting when its value cannot work: each of these was taken
    without a word and showed only as a symptom (every request a 429, every delivery a
    failure, timers delivered twice)."""
    if not ok:
        raise ImproperlyConfigured(f"{name} is {value}: give {want}.")


_DATABASE_SCHEMES = ("postgres", "postgresql", "pgsql", "postgis", "sqlite")


def _database_url(name: str, default: str) -> dict[str, Any]:
    """env.db, refusing a URL of no database it knows by name: django-environ's own error is a
    KeyError 'ENGINE' (a URL with no scheme) or Django's "isn't an available database backend"
    (the Redis URL given here), both as tracebacks naming no setting."""
    raw = env.str(name, default=default)
    scheme = raw.partition("://")[0].lower() if "://" in raw else ""
    if scheme not in _DATABASE_SCHEMES:
        # Not the value itself: it may hold a password.
        raise ImproperlyConfigured(
            f"{name} is not a postgres:// or sqlite:// URL: give one (postgres://user@host:5432/name)."
        )
    return env.db_url_config(raw)


def _redis_url(name: str, url: str) -> None:
    """A Redis URL that redis-py and kombu can use: scheme, port and database number. A port or
    database that is not a number passed a check of the scheme alone, then every rate-limited
    request was a 500 (the client is made on first use) or the worker stopped at its start,
    while /readyz said ok."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        # Else the server starts and every publish fails (no SLA timer, no queue drain from the
        # web), the rate limits fail open and /readyz says "degraded", for a typo.
        # Not the value itself: it may hold a password.
        raise ImproperlyConfigured(
            f"{name} is not a redis://, rediss:// or unix:// URL: give one (redis://host:6379/0)."
        )
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError when it is not a port number
        # redis-py reads a database that is not a number as 0, kombu refuses it: the web and the
        # worker would part ways.
        db = parse_qs(parts.query).get("db", [parts.path.strip("/") if parts.scheme != "unix" else ""])[0]
        ok = db == "" or db.isascii() and db.isdigit()
    except ValueError:
        ok = False
    if not ok:
        raise ImproperlyConfigured(
            f"{name} has a port or database number that is not a whole number: give one (redis://host:6379/0)."
        )


SECRET_KEY = env("SECRET_KEY", default="dev-insecure-key-change-me")
# Earlier keys, while links and sessions signed with them (and secrets sealed under them) are
# still about: Django's rotation of SECRET_KEY.
SECRET_KEY_FALLBACKS = env.list("SECRET_KEY_FALLBACKS", default=[])
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "routing_project.admin_site.RouterAdminConfig",  # django.contrib.admin, autocomplete labels
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "audit",
    "rotation",
    "leads",
    "hooks",
    "security",
    "notifications",
]

MIDDLEWARE = [
    "routing_project.middleware.HeadWithoutBodyMiddleware",
    "routing_project.middleware.ClientAddressMiddleware",
    "routing_project.middleware.RequestIdMiddleware",
    "routing_project.middleware.AccessLogMiddleware",
    "routing_project.middleware.AllowedHostMiddleware",
    # Before the middleware below that answers on its own (413, 411, 308): those answers
    # carry the security headers too.
    "django.middleware.security.SecurityMiddleware",
    "routing_project.middleware.NoStoreMiddleware",
    "routing_project.middleware.BodySizeLimitMiddleware",
    "routing_project.middleware.ApiTrailingSlashMiddleware",
    # process_exception runs bottom-up: the admin's own answers first, then any page's 503.
    "routing_project.middleware.DatabaseUnavailableMiddleware",
    "routing_project.middleware.AdminListGuardMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "routing_project.urls"
WSGI_APPLICATION = "routing_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
EMBEDDED_DATABASE_URL = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASES = {"default": _database_url("DATABASE_URL", EMBEDDED_DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, with a pool check that costs no round trip (routing_project/postgresql).
    DATABASES["default"]["ENGINE"] = "routing_project.postgresql"
    # A database host that drops off the network (a partition, a failover moving the address)
    # answers nothing, not even a refusal: without these a request waited on it for as long
    # as the kernel retransmits (about 15 minutes), every thread of the web in turn. A connect
    # gives up after 5 s; data unacknowledged for 20 s, or an idle connection whose keepalives
    # go unanswered, ends the connection, and the request gets its 503. What DATABASE_URL's
    # query string sets (?connect_timeout=10) wins.
    _db_options = DATABASES["default"].setdefault("OPTIONS", {})
    for _option, _value in (
        ("connect_timeout", 5),
        ("keepalives", 1),
        ("keepalives_idle", 30),
        ("keepalives_interval", 10),
        ("keepalives_count", 3),
        ("tcp_user_timeout", 20_000),
    ):
        _db_options.setdefault(_option, _value)
# Every database setting is read and checked whichever branch below uses it: a typo in one
# that does not apply yet (the pool's, while the pool is off) would otherwise wait, unseen,
# for the day it does.
# SQLite hands its write lock to no waiter in order: the wait is long (under gunicorn's 30 s
# timeout) so that a burst of intake waits its turn rather than failing as "busy".
_busy_timeout = env.float("SQLITE_BUSY_TIMEOUT", default=20.0)
_require(_busy_timeout > 0, "SQLITE_BUSY_TIMEOUT", _busy_timeout, "a number of seconds above 0")
_pool_min, _pool_max = env.int("DB_POOL_MIN_SIZE", default=2), env.int("DB_POOL_MAX_SIZE", default=8)
if _pool_min < 0 or _pool_max < max(_pool_min, 1):
    # psycopg refuses such a pool only when the first request opens it: every request would
    # be a 500 while /readyz, on a connection of its own, said ok.
    raise ImproperlyConfigured(
        f"DB_POOL_MIN_SIZE is {_pool_min} and DB_POOL_MAX_SIZE is {_pool_max}: "
        "give a minimum of 0 or more and a maximum of at least 1 and at least the minimum."
    )
_pool_timeout = env.float("DB_POOL_TIMEOUT", default=10.0)
# 0 or less: a request finding every connection borrowed fails at once, a 503 under any load.
_require(_pool_timeout > 0, "DB_POOL_TIMEOUT", _pool_timeout, "a number of seconds above 0")
_conn_max_age = env.int("CONN_MAX_AGE", default=60)
_require(_conn_max_age >= 0, "CONN_MAX_AGE", _conn_max_age, "0 or more (s)")
_pool_on = env.bool("DB_POOL", default=False)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock when the transaction begins, so two routing
    # transactions never interleave: SQLite's stand-in for the rotation row lock.
    # WAL: readers never wait for the writer, and a commit is an append, not a journal
    # rewrite, so the write lock is held briefly.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": _busy_timeout,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif _pool_on:
    # psycopg's connection pool, one per process (production turns it on): a request borrows
    # a connection and gives it back at its end, checked first (CONN_HEALTH_CHECKS: a look at
    # its socket, a round trip only when the server has spoken), so a restarted PostgreSQL
    # costs no failed request. Size it to the process's threads.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": _pool_min,
        "max_size": _pool_max,
        "timeout": _pool_timeout,
    }
else:
    DATABASES["default"]["CONN_MAX_AGE"] = _conn_max_age
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Routing --------------------------------------------------------------------------------
# How long a routing transaction waits for a group's rotation row before giving up with 503.
ROUTING_LOCK_TIMEOUT_MS = env.int("ROUTING_LOCK_TIMEOUT_MS", default=2000)
if ROUTING_LOCK_TIMEOUT_MS < 1:
    # PostgreSQL reads a lock_timeout of 0 as "wait for ever": intake would hang, not 503.
    raise ImproperlyConfigured(f"ROUTING_LOCK_TIMEOUT_MS is {ROUTING_LOCK_TIMEOUT_MS}: give at least 1 (ms).")
# Deadlocks and serialization failures are retried this many times before a 503.
ROUTING_MAX_RETRIES = env.int("ROUTING_MAX_RETRIES", default=3)
if ROUTING_MAX_RETRIES < 0:
    # Below 0 a routing transaction would not even be tried once.
    raise ImproperlyConfigured(f"ROUTING_MAX_RETRIES is {ROUTING_MAX_RETRIES}: give 0 or more.")
# Concurrent intakes of one web process share one routing transaction, up to this many leads
# (leads/batching.py; PostgreSQL only). 1 turns batching off.
INTAKE_BATCH_MAX = env.int("INTAKE_BATCH_MAX", default=32)
# Idempotency keys are kept at least this long (SPEC: at least 24 hours).
IDEMPOTENCY_TTL_HOURS = env.int("IDEMPOTENCY_TTL_HOURS", default=48)
if IDEMPOTENCY_TTL_HOURS < 24:
    # A retry the day after must still be answered from its key, never taken in again.
    raise ImproperlyConfigured(f"IDEMPOTENCY_TTL_HOURS is {IDEMPOTENCY_TTL_HOURS}: keys are kept at least 24 hours.")
# An in-flight idempotency record older than this is considered abandoned (crashed worker).
IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S = env.int("IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S", default=60)
if IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S < 1:
    # At 0 or less every claim would be abandoned at once: a request with a key still in
    # flight would be taken over by its retry (and answered 409 itself) instead of the retry
    # getting the 409, and retries coming faster than a routing transaction would starve it.
    raise ImproperlyConfigured(
        f"IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S is {IDEMPOTENCY_IN_FLIGHT_TIMEOUT_S}: give at least 1 (s)."
    )
MAX_REQUEST_BODY_BYTES = 64 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES

# Where the processes write their metric samples (routing_project/metrics.py), when set: made
# if missing, refused by name if this user cannot write in it. Checked by gunicorn.conf.py for
# the web; here for the rest (manage.py, the Celery worker and beat), which otherwise stopped
# on their first sample in a fifty-line traceback.
_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
if _metrics_dir:
    try:
        os.makedirs(_metrics_dir, exist_ok=True)
    except OSError as _exc:
        raise ImproperlyConfigured(
            f"PROMETHEUS_MULTIPROC_DIR is {_metrics_dir!r}: it cannot be made a directory ({_exc.strerror})."
        ) from None
    if not os.access(_metrics_dir, os.W_OK | os.X_OK):
        raise ImproperlyConfigured(f"PROMETHEUS_MULTIPROC_DIR is {_metrics_dir!r}: this user cannot write in it.")

# --- Celery ---------------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    _redis_url("REDIS_URL", REDIS_URL)
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://localhost/")
if CELERY_BROKER_URL != REDIS_URL and not CELERY_BROKER_URL.startswith("filesystem://"):
    # Redis, or the embedded default: an amqp:// or http:// broker passed, and every timer
    # and drain was published where nothing listened.
    _redis_url("CELERY_BROKER_URL", CELERY_BROKER_URL)
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _folder in ("out", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),  # else ./control, in the working tree
        "store_processed": False,
    }
    # kombu's filesystem transport, writing each message whole before a worker can see it
    # (routing_project/broker.py: kombu's own let a worker read an empty file and stop).
    CELERY_BROKER_TRANSPORT = "routing_project.broker:Transport"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One message at a time per worker process on Redis (late acks: a killed worker loses none).
# The embedded broker acknowledges only between its polls of the folder, so one at a time
# there is one task per poll: a burst of intake queued escalations for a minute. It takes
# many at a time. The notify worker's threads take theirs on its command line (8 each, on either
# broker: scripts/run.sh, docker-compose.yml).
CELERY_WORKER_PREFETCH_MULTIPLIER = 64 if CELERY_BROKER_URL.startswith("filesystem://") else 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE: dict = {}
# Notifications (webhook and e-mail deliveries: network calls of up to
# NOTIFY_WEBHOOK_TIMEOUT_S to receivers we do not run) have a queue of their own, served by
# worker processes of their own (scripts/run.sh, docker-compose.yml): a receiver that hangs
# must not hold back SLA timers and queue drains, which the `celery` queue carries.
CELERY_TASK_DEFAULT_QUEUE = "celery"
# Notifications run in their own worker (threads: a slow receiver holds a thread, not the
# routing worker). Their sweep and purge do no delivery, only database work: in the routing
# worker, so that the safety net still runs while the notify queue is backed up behind a burst.
CELERY_TASK_ROUTES = {
    "notifications.outbox_sweep": {"queue": "celery"},
    "notifications.purge": {"queue": "celery"},
    "notifications.*": {"queue": "notify"},
}
# Redis down must never block intake: publishing gives up fast and the sweep catches up.
CELERY_BROKER_CONNECTION_TIMEOUT = 1.0
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_PUBLISH_RETRY = False
# A worker (and beat) whose broker went away tries again every BROKER_RECONNECT_EVERY_S, for as
# long as it takes (Celery's own back off to 30 s between tries and exit after 100): they work
# again within a second of the broker's return (routing_project/celery_reconnect.py).
CELERY_WORKER_CONSUMER = "routing_project.celery_reconnect:Consumer"
CELERY_BEAT_SCHEDULER = "routing_project.celery_reconnect:PersistentScheduler"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
BROKER_RECONNECT_EVERY_S = env.float("BROKER_RECONNECT_EVERY_S", default=1.0)

# --- Escalation and the fallback queue (SPEC 5) --------------------------------------------
# The due time stored on the assignment is the truth; a Celery timer only makes escalation
# prompt, and a beat sweep over overdue assignments (SKIP LOCKED) is the safety net.
# Two traps of ETA tasks on Redis decide the numbers:
# - a message not acknowledged within the visibility timeout is delivered again, and an ETA
#   task stays unacknowledged until it has run (late ack). Timers are therefore published
#   only when due within ESCALATION_TIMER_HORIZON_S (at commit, or later by the
#   escalation-arm beat task), and the visibility timeout is far above that horizon plus the
#   longest task: no timer is ever redelivered in normal operation, while the messages of a
#   worker killed outright come back after 10 minutes (the sweep has long caught them);
# - a worker holds every ETA task it has received in memory. With the horizon, it holds the
#   timers of the next two minutes (at most ESCALATION_ARM_MAX per arm run), not every pending
#   assignment: 100,000 pending assignments stay in PostgreSQL, not in the worker. Measured
#   (`manage.py measure_escalation`): about 9 KiB of worker memory per held timer; 100,000
#   pending over 30 minutes -> ~4,200 in the window, +37 MiB one timer each, +2.5 MiB as the
#   groups' slices (ESCALATION_TIMER_SLICE_S below). Past ESCALATION_ARM_MAX timers in one
#   window, the rest escalate by the sweep (at most one sweep period late) instead.
# Escalation is idempotent (locks, then re-read), so a duplicate timer costs one read.
ESCALATION_TIMER_HORIZON_S = env.float("ESCALATION_TIMER_HORIZON_S", default=120.0)
ESCALATION_ARM_EVERY_S = env.float("ESCALATION_ARM_EVERY_S", default=60.0)
ESCALATION_ARM_OVERLAP_S = env.float("ESCALATION_ARM_OVERLAP_S", default=15.0)
ESCALATION_ARM_MAX = env.int("ESCALATION_ARM_MAX", default=10_000)
# Timers of one group due within the same slice of this many seconds share one task, published
# once per web or worker process, due at the slice's end: a burst of leads into one group
# (600 due within 2 s) costs the worker a few tasks, each escalating the group's whole due
# backlog under one lock, not one task per lead, and a worker holds a few timers per group
# and slice, not one per pending assignment. An escalation is at most this much later than
# its due time for it. 0: one timer per assignment.
ESCALATION_TIMER_SLICE_S = env.float("ESCALATION_TIMER_SLICE_S", default=0.25)
if not 0 <= ESCALATION_TIMER_SLICE_S <= 5:
    raise ImproperlyConfigured(
        f"ESCALATION_TIMER_SLICE_S is {ESCALATION_TIMER_SLICE_S}: give 0 to 5 seconds (the SLA timer's slack)."
    )
# The safety net's period: a lost timer escalates at most this late (plus the sweep's run).
ESCALATION_SWEEP_EVERY_S = env.float("ESCALATION_SWEEP_EVERY_S", default=5.0)
ESCALATION_SWEEP_BATCH = env.int("ESCALATION_SWEEP_BATCH", default=500)
# An escalation also escalates up to this many - 1 other overdue assignments of its group under
# the same rotation lock (a burst of due times is worked off in a few transactions, not one per
# lead); it bounds how long intake into that group waits for the lock meanwhile. 1: one each.
ESCALATION_BATCH = env.int("ESCALATION_BATCH", default=50)
if ESCALATION_BATCH < 1:
    raise ImproperlyConfigured(f"ESCALATION_BATCH is {ESCALATION_BATCH}: give at least 1.")
# Queues drain after commit of the change that freed capacity; this sweep is the backstop
# (an absence that simply ends is announced by no write).
QUEUE_DRAIN_SWEEP_EVERY_S = env.float("QUEUE_DRAIN_SWEEP_EVERY_S", default=30.0)
# An absence's end (and working hours that begin, a new day under max_per_day) publishes its
# groups' drains (with the timers, by escalation-arm) this long after it, so that the rep is
# back when the drain reads eligibility.
ABSENCE_END_DRAIN_DELAY_S = env.float("ABSENCE_END_DRAIN_DELAY_S", default=0.5)
QUEUE_DRAIN_BATCH = env.int("QUEUE_DRAIN_BATCH", default=500)
# The change that freed capacity routes up to this many queued leads itself, once committed
# (in its request or task); the worker routes the rest.
QUEUE_DRAIN_INLINE = env.int("QUEUE_DRAIN_INLINE", default=20)
# After a failed publish (broker down), requests skip publishing for this long: an outage
# costs intake nothing, and the sweep escalates on time from the database.
BROKER_PUBLISH_BACKOFF_S = env.float("BROKER_PUBLISH_BACKOFF_S", default=5.0)
for _name, _period in (
    ("ESCALATION_SWEEP_EVERY_S", ESCALATION_SWEEP_EVERY_S),
    ("ESCALATION_ARM_EVERY_S", ESCALATION_ARM_EVERY_S),
    ("QUEUE_DRAIN_SWEEP_EVERY_S", QUEUE_DRAIN_SWEEP_EVERY_S),
):
    if _period <= 0:
        # A period is also its beat task's `expires` (below): at 0 every run would have expired
        # when a worker got it, the safety net silently off, and beat would publish non-stop.
        raise ImproperlyConfigured(f"{_name} is {_period}: give a period above 0 (s).")
if not CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT_S", default=600),
        # Publishing from a web request: fail within about a second when Redis is away,
        # instead of kombu's default of retrying the connection forever.
        "socket_connect_timeout": 1.0,
        "socket_timeout": 5.0,
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
        **CELERY_BROKER_TRANSPORT_OPTIONS,
    }
else:
    # The embedded broker polls its folder: 0.2 s keeps timers within the 2 s target there too.
    CELERY_BROKER_TRANSPORT_OPTIONS.setdefault("polling_interval", 0.2)
CELERY_BEAT_SCHEDULE.update(
    {
        "idempotency-purge": {
            "task": "leads.tasks.idempotency_purge",
            "schedule": 3600.0,
            "options": {"expires": 3600},
        },
        # `expires`: a beat that piles up while the worker is busy or away is dropped, not replayed.
        "escalation-sweep": {
            "task": "leads.tasks.escalation_sweep",
            "schedule": ESCALATION_SWEEP_EVERY_S,
            "options": {"expires": ESCALATION_SWEEP_EVERY_S},
        },
        "escalation-arm": {
            "task": "leads.tasks.escalation_arm",
            "schedule": ESCALATION_ARM_EVERY_S,
            "options": {"expires": ESCALATION_ARM_EVERY_S},
        },
        "queue-drain-sweep": {
            "task": "leads.tasks.queue_drain_sweep",
            "schedule": QUEUE_DRAIN_SWEEP_EVERY_S,
            "options": {"expires": QUEUE_DRAIN_SWEEP_EVERY_S},
        },
    }
)

# --- Notifications (outbound webhooks per group, e-mail to the rep) ------------------------
# By default each e-mail is a file in EMAIL_FILE_PATH, never a log line: an e-mail names its
# rep and carries an accept link, and logs hold no contact data. Name SMTP for real delivery.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.filebased.EmailBackend")
EMAIL_FILE_PATH = env("EMAIL_FILE_PATH", default=str(BASE_DIR / "var" / "mail"))
EMAIL_HOST = env("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="lead-router@localhost")
# Links in e-mails point here.
PUBLIC_BASE_URL = env("PUBLIC_BASE_URL", default="http://127.0.0.1:8000")
# How long the accept link of a notification e-mail works (leads/accept_link.py).
ACCEPT_LINK_MAX_AGE_S = env.int("ACCEPT_LINK_MAX_AGE_S", default=7 * 24 * 3600)
NOTIFY_REP_EMAIL = env.bool("NOTIFY_REP_EMAIL", default=True)
# Retries: 5 s, 10 s, 20 s ... doubling up to 30 min, 15 attempts in all: a receiver down for
# up to about three hours still gets every message.
NOTIFY_MAX_ATTEMPTS = env.int("NOTIFY_MAX_ATTEMPTS", default=15)
NOTIFY_BACKOFF_BASE_S = env.float("NOTIFY_BACKOFF_BASE_S", default=5.0)
NOTIFY_BACKOFF_MAX_S = env.float("NOTIFY_BACKOFF_MAX_S", default=1800.0)
# A retry due within this gets a countdown task; a later one is sent by the outbox sweep when
# due (at most NOTIFY_SWEEP_GRACE_S plus the sweep's period late). Well under the broker's
# visibility timeout, as the SLA timers' horizon.
NOTIFY_TIMER_HORIZON_S = env.float("NOTIFY_TIMER_HORIZON_S", default=300.0)
NOTIFY_WEBHOOK_TIMEOUT_S = env.float("NOTIFY_WEBHOOK_TIMEOUT_S", default=5.0)
# `make run`'s notify worker's threads (scripts/run.sh passes the variable to Celery): read
# here too, so that a bad value stops `make run` at its first command, naming it, instead of
# the notify worker failing at each of its restarts while the web served.
NOTIFY_WORKER_CONCURRENCY = env.int("NOTIFY_WORKER_CONCURRENCY", default=8)
# The sweep re-drives messages and retries overdue by this much (their task was lost).
NOTIFY_SWEEP_GRACE_S = env.float("NOTIFY_SWEEP_GRACE_S", default=30.0)
# `expires`, as the sweeps above: each run re-publishes every overdue delivery, so sweeps piled
# up while the notify worker was away would publish each of them once per missed run.
CELERY_BEAT_SCHEDULE["notifications-outbox-sweep"] = {
    "task": "notifications.outbox_sweep",
    "schedule": 30.0,
    "options": {"expires": 30.0},
}
# Announced messages and their finished deliveries (the delivery log) are kept this long.
NOTIFY_RETENTION_DAYS = env.int("NOTIFY_RETENTION_DAYS", default=30)
CELERY_BEAT_SCHEDULE["notifications-purge"] = {
    "task": "notifications.purge",
    "schedule": 3600.0,
    "options": {"expires": 3600.0},
}

# --- API ------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["leads.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["leads.api.auth.HasScope"],
    "DEFAULT_PARSER_CLASSES": ["routing_project.api.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "routing_project.api.ContentNegotiation",
    "DEFAULT_PAGINATION_CLASS": "routing_project.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": ["routing_project.filters.FilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "routing_project.exceptions.api_exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["leads.api.throttles.ClientRateThrottle"],
    "UNAUTHENTICATED_USER": None,
    "PAGE_SIZE": 50,
    "COERCE_DECIMAL_TO_STRING": False,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lead router API",
    "DESCRIPTION": "Takes sales leads in and routes each to a rep, per group, in rotation, "
    "inside one locked transaction that also writes the audit trail.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name for the strategy wherever it appears (a group, the rotation view, simulate, replay).
    "ENUM_NAME_OVERRIDES": {"StrategyEnum": "rotation.models.Strategy"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "security.schema.document_common_errors",
        "security.schema.forbid_unknown_request_fields",
        "security.schema.require_answered_fields",
    ],
}

# --- Security (SPEC 7, 10) --------------------------------------------------------------------
# Requests a minute per API client when the client sets no limit of its own (429 beyond).
# Sized above what one web tier can take (SPEC 9 targets hundreds of leads a second): the
# default guards against a runaway client, not a busy one. Set a lower limit per client.
API_RATE_LIMIT_PER_MINUTE = env.int("API_RATE_LIMIT_PER_MINUTE", default=60000)
# Without REDIS_URL, the rate-limit and login-throttle counters (security/ratelimit.py) are in
# Django's cache, which must then be one every web process of the machine shares: diskcache's
# (SQLite files; atomic increments across processes), not the per-process default.
if not REDIS_URL:
    CACHES = {"default": {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(VAR_DIR / "cache")}}
# Fernet keys that encrypt the HMAC secrets kept in the database (security/fields.py): the
# first encrypts, all decrypt. Empty: one derived from SECRET_KEY (then changing SECRET_KEY
# makes the stored secrets unreadable; production should set these).
SECRET_BOX_KEYS = env.list("SECRET_BOX_KEYS", default=[])
for _key in SECRET_BOX_KEYS:
    # Else refused only when a secret is first sealed or read: every signed web-form post,
    # webhook delivery and source saved in the admin would fail on a server that started.
    try:
        Fernet(_key.encode())
    except ValueError:
        raise ImproperlyConfigured(
            "SECRET_BOX_KEYS holds a value that is not a Fernet key (32 url-safe base64-encoded bytes): "
            "make one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`."
        ) from None
# Signed intake: bad signatures allowed per client address and minute before 429.
HOOK_SIGNATURE_FAILURES_PER_ADDRESS = env.int("HOOK_SIGNATURE_FAILURES_PER_ADDRESS", default=20)
# Failed logins allowed per (username, address) and per address in 15 minutes.
LOGIN_FAILURES_PER_USER = env.int("LOGIN_FAILURES_PER_USER", default=5)
LOGIN_FAILURES_PER_ADDRESS = env.int("LOGIN_FAILURES_PER_ADDRESS", default=50)
AUTHENTICATION_BACKENDS = ["security.login.ThrottledModelBackend"]
# The proxies in front of the web server (a load balancer, nginx), each adding the address it
# got the request from to X-Forwarded-For: the client's address, which the limits above count
# by, is read from that header then. 0: the connection's own address (nothing in front).
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)

# --- I18N, static ---------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# The admin's dates and times to the second (routing_project/formats/en/formats.py).
FORMAT_MODULE_PATH = ["routing_project.formats"]
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LOG_FORMATS = ("plain", "json")


def log_format(default: str) -> str:
    """LOG_FORMAT, refused by name when it is not a formatter below (dictConfig's own error
    names only the handler it could not configure)."""
    value = env("LOG_FORMAT", default=default)
    if value not in LOG_FORMATS:
        raise ImproperlyConfigured(f"LOG_FORMAT is {value!r}: give one of {', '.join(LOG_FORMATS)}.")
    return value


# Any case, as the Celery command line takes it; stored as logging names it.
_log_level = env("LOG_LEVEL", default="INFO")
if _log_level.upper() not in logging.getLevelNamesMapping():
    raise ImproperlyConfigured(f"LOG_LEVEL is {_log_level!r}: give DEBUG, INFO, WARNING, ERROR or CRITICAL.")

LOGGING_CONFIG = "routing_project.logging.configure"  # dictConfig, and warnings as records
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "routing_project.logging.RequestIdFilter"},
        # The safety net: redacts emails, phone numbers, tokens and signatures in every record.
        "redact": {"()": "security.redaction.RedactingFilter"},
        "refusal_without_traceback": {"()": "routing_project.logging.RefusalWithoutTracebackFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "routing_project.logging.JsonFormatter"},
    },
    "handlers": {
        # LOG_FORMAT=json: one JSON object per line, for log shippers (production's default).
        "console": {
            "class": "logging.StreamHandler",
            "formatter": log_format("plain"),
            "filters": ["request_id", "redact"],
        },
    },
    "root": {"handlers": ["console"], "level": _log_level.upper()},
    "loggers": {
        # Django's own console handler (DEBUG only) would print its records a second time.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        "django.request": {"filters": ["refusal_without_traceback"]},
    },
}

# The embedded SQLite default serializes all writers, so the deferred position constraint
# (PostgreSQL) has nothing to add there.
SILENCED_SYSTEM_CHECKS = ["models.W038"]

# The admin's login page sends a user whose `next` is not safe (another site) here, not to
# Django's default /accounts/profile/, which this product does not have (a 404).
LOGIN_REDIRECT_URL = "admin:index"

# --- Numbers that cannot work ------------------------------------------------------------------
# Each stops the start naming the setting: taken as they were, they showed only as symptoms.
_require(INTAKE_BATCH_MAX >= 1, "INTAKE_BATCH_MAX", INTAKE_BATCH_MAX, "at least 1 (1 routes each lead alone)")
_require(API_RATE_LIMIT_PER_MINUTE >= 1, "API_RATE_LIMIT_PER_MINUTE", API_RATE_LIMIT_PER_MINUTE, "at least 1")
_require(TRUSTED_PROXY_COUNT >= 0, "TRUSTED_PROXY_COUNT", TRUSTED_PROXY_COUNT, "0 or more (0: nothing in front)")
for _name in ("HOOK_SIGNATURE_FAILURES_PER_ADDRESS", "LOGIN_FAILURES_PER_USER", "LOGIN_FAILURES_PER_ADDRESS"):
    # 0 or less: every signed post, every login refused with a 429.
    _require(globals()[_name] >= 1, _name, globals()[_name], "at least 1")
for _name in (
    "ESCALATION_ARM_MAX",
    "ESCALATION_SWEEP_BATCH",
    "QUEUE_DRAIN_BATCH",
    "NOTIFY_MAX_ATTEMPTS",
    "NOTIFY_WORKER_CONCURRENCY",
):
    # 0 or less: the sweeps and drains would do nothing, a notification never be tried.
    _require(globals()[_name] >= 1, _name, globals()[_name], "at least 1")
for _name in (
    "QUEUE_DRAIN_INLINE",
    "ESCALATION_ARM_OVERLAP_S",
    "ABSENCE_END_DRAIN_DELAY_S",
    "BROKER_PUBLISH_BACKOFF_S",
):
    _require(globals()[_name] >= 0, _name, globals()[_name], "0 or more")
for _name in (
    "ESCALATION_TIMER_HORIZON_S",
    "NOTIFY_TIMER_HORIZON_S",
    "NOTIFY_BACKOFF_BASE_S",
    "NOTIFY_WEBHOOK_TIMEOUT_S",  # 0: every delivery times out at once; below: refused by the socket
    "ACCEPT_LINK_MAX_AGE_S",
    "EMAIL_TIMEOUT",
    "NOTIFY_RETENTION_DAYS",
    "BROKER_RECONNECT_EVERY_S",  # 0: a worker retrying its broker in a busy loop
):
    _require(globals()[_name] > 0, _name, globals()[_name], "a number above 0")
_require(NOTIFY_SWEEP_GRACE_S >= 0, "NOTIFY_SWEEP_GRACE_S", NOTIFY_SWEEP_GRACE_S, "0 or more (s)")
_require(
    NOTIFY_BACKOFF_MAX_S >= NOTIFY_BACKOFF_BASE_S,
    "NOTIFY_BACKOFF_MAX_S",
    NOTIFY_BACKOFF_MAX_S,
    f"at least NOTIFY_BACKOFF_BASE_S ({NOTIFY_BACKOFF_BASE_S})",
)
_require(0 < EMAIL_PORT < 65536, "EMAIL_PORT", EMAIL_PORT, "a port number (1 to 65535)")
if "visibility_timeout" in CELERY_BROKER_TRANSPORT_OPTIONS:
    # A timer is published up to a horizon ahead and acknowledged once it has run; Redis hands
    # a message not acknowledged within the visibility timeout to a worker again (SPEC 5's
    # trap). Twice the longer horizon leaves the task time to run.
    _horizon = max(ESCALATION_TIMER_HORIZON_S, NOTIFY_TIMER_HORIZON_S)
    _visibility = CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    _require(
        _visibility >= 2 * _horizon,
        "CELERY_VISIBILITY_TIMEOUT_S",
        _visibility,
        "at least twice the longer timer horizon (ESCALATION_TIMER_HORIZON_S, NOTIFY_TIMER_HORIZON_S): "
        f"{2 * _horizon:g} s",
    )
