"""routing_project.settings.production refuses to start without a real SECRET_KEY."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

BASE_DIR = Path(__file__).resolve().parents[2]


def _check(secret_key: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env["DJANGO_SETTINGS_MODULE"] = "routing_project.settings.production"
    if secret_key is not None:
        env["SECRET_KEY"] = secret_key
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("secret_key", [None, "", "  "])
def test_production_refuses_to_start_without_a_secret_key(secret_key):
    # docker-compose.yml passes SECRET_KEY=${SECRET_KEY:-}: `docker compose up` without one
    # sets it empty. That must stop the start-up, not give a 500 on every request.
    done = _check(secret_key)
    assert done.returncode != 0
    assert "SECRET_KEY" in done.stderr


def test_production_starts_with_a_secret_key():
    done = _check("a-long-random-production-secret-0123456789")
    assert done.returncode == 0, done.stderr[-2000:]


def _check_with(**settings: str) -> subprocess.CompletedProcess[str]:
    # On PostgreSQL, as production runs: the pool and connection settings are read only there
    # (`check` opens no connection). The embedded run of the suite has a SQLite DATABASE_URL.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.local",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/leadrouter",
        **settings,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ROUTING_LOCK_TIMEOUT_MS", "2s"),
        ("CONN_MAX_AGE", "sixty"),
        ("INTAKE_BATCH_MAX", "3.5"),
        ("NOTIFY_WEBHOOK_TIMEOUT_S", "five"),
        ("NOTIFY_WORKER_CONCURRENCY", "abc"),  # make run's notify worker failed at each restart
    ],
)
def test_a_setting_that_is_not_a_number_is_refused_by_name(name, value):
    # django-environ's own error is a bare "invalid literal for int() with base 10: '2s'",
    # which leaves the operator to guess which of some forty settings it was.
    done = _check_with(**{name: value})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert name in last
    assert repr(value) in last


@pytest.mark.parametrize(
    ("settings_module", "name", "value"),
    [
        ("routing_project.settings.local", "LOG_FORMAT", "xml"),
        ("routing_project.settings.production", "LOG_FORMAT", "text"),
        ("routing_project.settings.local", "LOG_LEVEL", "LOUD"),
    ],
)
def test_a_log_setting_out_of_its_choices_is_refused_by_name(settings_module, name, value):
    # Left to logging's dictConfig, it was "Unable to configure handler 'console'" (or "root
    # logger") at the end of three chained tracebacks, naming no setting.
    done = _check_with(
        DJANGO_SETTINGS_MODULE=settings_module, SECRET_KEY="a-long-random-production-secret-0123456789", **{name: value}
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert name in last
    assert repr(value) in last


def test_the_log_level_may_be_written_in_lower_case():
    done = _check_with(LOG_LEVEL="warning")
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sizes",
    [{"DB_POOL_MIN_SIZE": "10", "DB_POOL_MAX_SIZE": "4"}, {"DB_POOL_MAX_SIZE": "0"}, {"DB_POOL_MIN_SIZE": "-1"}],
)
def test_a_pool_that_cannot_be_made_is_refused_at_start_up(sizes):
    # psycopg refuses such a pool only when the first request opens it: the server started,
    # /readyz (on a connection of its own) said ok, and every other request was a 500.
    done = _check_with(DB_POOL="true", **sizes)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert any(name in last for name in sizes)


def test_a_secret_box_key_that_is_no_fernet_key_is_refused_at_start_up():
    # It was refused only when a stored secret was first sealed or read: the server started
    # and every signed web-form post, and every source saved in the admin, failed.
    good = Fernet.generate_key().decode()
    done = _check_with(SECRET_BOX_KEYS=f"{good},not-a-key")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert "SECRET_BOX_KEYS" in last
    assert _check_with(SECRET_BOX_KEYS=good).returncode == 0


@pytest.mark.parametrize(("name", "value"), [("SESSION_COOKIE_SECURE", "ture"), ("DB_POOL", "enabled")])
def test_a_switch_that_is_neither_true_nor_false_is_refused_by_name(name, value):
    # django-environ reads any word it does not know as false: a typo turned secure cookies
    # (or the pool) off without a word.
    done = _check_with(
        DJANGO_SETTINGS_MODULE="routing_project.settings.production",
        SECRET_KEY="a-long-random-production-secret-0123456789",
        **{name: value},
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert name in last
    assert repr(value) in last


@pytest.mark.parametrize("value", ["false", "False", "off", "no", "0", "true", "On", "yes", "1"])
def test_a_switch_takes_the_usual_words(value):
    done = _check_with(NOTIFY_REP_EMAIL=value)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "value"),
    [("ESCALATION_SWEEP_EVERY_S", "0"), ("ESCALATION_ARM_EVERY_S", "-5"), ("QUEUE_DRAIN_SWEEP_EVERY_S", "0")],
)
def test_a_beat_period_of_zero_or_less_is_refused_by_name(name, value):
    # Each period is also its task's `expires`: at 0 every sweep had expired when a worker
    # got it (the safety net silently off) while beat published them without pause.
    done = _check_with(**{name: value})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert name in last


@pytest.mark.parametrize("url", ["localhost:6379", "http://127.0.0.1:6379/0", "redis:/127.0.0.1:6379/0"])
def test_a_redis_url_redis_cannot_read_is_refused_at_start_up(url):
    # It started: every publish failed (no SLA timer, no queue drain from the web), the rate
    # limits failed open and /readyz said "degraded", for a typo.
    done = _check_with(REDIS_URL=url)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: ") and "Traceback" not in done.stderr
    assert "REDIS_URL" in last


@pytest.mark.parametrize("url", ["http://x", "amqp://guest@localhost//", "sqs://"])
def test_a_broker_url_that_is_not_redis_is_refused_at_start_up(url):
    # Passed, the web and the workers would publish the SLA timers and the drains where
    # nothing listens: escalation stops, silently.
    done = _check_with(REDIS_URL="redis://127.0.0.1:6379/0", CELERY_BROKER_URL=url)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: CELERY_BROKER_URL") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:6379/abc",
        "redis://127.0.0.1:99999/0",
        "unix:///run/r.sock?db=x",
    ],
)
def test_a_redis_url_with_a_port_or_database_that_is_no_number_is_refused_at_start_up(url):
    # A check of the scheme alone let these start: redis-py then refused the port on the first
    # rate-limited request (every API call a 500) or read the database as 0 where the worker,
    # through kombu, refused to start; /readyz said ok meanwhile.
    done = _check_with(REDIS_URL=url)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: REDIS_URL") and "Traceback" not in done.stderr
    assert "notaport" not in last and "abc" not in last  # the value may hold a password: not echoed


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/3", "redis://:secret@127.0.0.1:6379", "unix:///run/r.sock?db=2"]
)
def test_a_redis_url_redis_can_read_is_taken(url):
    done = _check_with(REDIS_URL=url)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("url", ["garbage", "redis://127.0.0.1:6379/0", "mysql://root@127.0.0.1/leads"])
def test_a_database_url_of_no_database_the_product_runs_on_is_refused_by_name(url):
    # django-environ's own error was a KeyError 'ENGINE' (no scheme) or Django's "isn't an
    # available database backend", at the end of a traceback naming no setting.
    done = _check_with(DATABASE_URL=url)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "Configuration error: DATABASE_URL is not a postgres:// or sqlite:// URL: "
        "give one (postgres://user@host:5432/name)."
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("API_RATE_LIMIT_PER_MINUTE", "-1"),  # every API request a 429
        ("INTAKE_BATCH_MAX", "0"),
        ("NOTIFY_MAX_ATTEMPTS", "0"),  # a notification never tried
        ("NOTIFY_BACKOFF_BASE_S", "-5"),
        ("NOTIFY_WEBHOOK_TIMEOUT_S", "0"),  # every delivery timed out
        ("NOTIFY_BACKOFF_MAX_S", "1"),  # below the base
        ("CELERY_VISIBILITY_TIMEOUT_S", "10"),  # timers delivered twice (SPEC 5's trap)
        ("ESCALATION_TIMER_HORIZON_S", "0"),
        ("QUEUE_DRAIN_BATCH", "0"),
        ("LOGIN_FAILURES_PER_USER", "0"),  # every login refused
        ("TRUSTED_PROXY_COUNT", "-1"),
        ("EMAIL_PORT", "70000"),
        ("DB_POOL_TIMEOUT", "0"),
        ("BROKER_RECONNECT_EVERY_S", "0"),  # a worker retrying its broker in a busy loop
    ],
)
def test_a_number_that_cannot_work_is_refused_by_name(name, value):
    # Each was taken without a word and showed only as a symptom.
    done = _check_with(REDIS_URL="redis://127.0.0.1:6379/0", DB_POOL="true", **{name: value})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Configuration error: {name} is ") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("name", "value"), [("DB_POOL_TIMEOUT", "abc"), ("DB_POOL_MIN_SIZE", "-1"), ("SQLITE_BUSY_TIMEOUT", "abc")]
)
def test_a_database_setting_is_checked_while_it_does_not_apply_yet(name, value):
    """The pool off (and PostgreSQL, not SQLite): a typo there would wait, unseen, for the
    day someone turns the pool on."""
    done = _check_with(REDIS_URL="redis://127.0.0.1:6379/0", DB_POOL="false", **{name: value})
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith(f"Configuration error: {name} is ")


def test_the_web_server_refuses_a_setting_that_cannot_work_in_one_line():
    # gunicorn reads the settings in its configuration file (its logging): a traceback there
    # came under "Failed to read config file".
    env = {
        **os.environ,
        "REDIS_URL": "redis://127.0.0.1:notaport/0",
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.local",
    }
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    done = subprocess.run(
        [
            gunicorn,
            "-c",
            "gunicorn.conf.py",
            "routing_project.wsgi:application",
            "--bind",
            "127.0.0.1:0",
            "--check-config",
        ],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("Configuration error: REDIS_URL")
    assert "Traceback" not in done.stderr


def test_production_sends_rep_e_mails_over_smtp():
    # The development default writes each e-mail to a file on the machine: in a container,
    # every e-mail was marked sent and stayed there.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": "a-long-random-production-secret-0123456789",
    }
    env.pop("EMAIL_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.EMAIL_BACKEND)"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "django.core.mail.backends.smtp.EmailBackend", done.stderr[-2000:]


def test_a_metrics_directory_that_cannot_be_made_is_refused_by_name():
    # gunicorn.conf.py checked it for the web; manage.py, the worker and beat stopped on their
    # first sample in a fifty-line FileNotFoundError.
    done = _check_with(PROMETHEUS_MULTIPROC_DIR="/proc/no-such-place/metrics")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Configuration error: PROMETHEUS_MULTIPROC_DIR") and "Traceback" not in done.stderr


def test_production_sends_hsts_only_when_told_to_and_refuses_a_negative_time():
    code = "from django.conf import settings; print(settings.SECURE_HSTS_SECONDS)"
    production = {"DJANGO_SETTINGS_MODULE": "routing_project.settings.production", "SECRET_KEY": "a" * 50}
    base = {k: v for k, v in os.environ.items() if k != "SECURE_HSTS_SECONDS"}
    for given, shown in (({}, "0"), ({"SECURE_HSTS_SECONDS": "31536000"}, "31536000")):
        env = {**base, **production, **given}
        done = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == shown, done.stderr[-2000:]
    done = _check_with(
        DJANGO_SETTINGS_MODULE="routing_project.settings.production", SECRET_KEY="a" * 50, SECURE_HSTS_SECONDS="-1"
    )
    assert done.stderr.strip().splitlines()[-1].startswith("Configuration error: SECURE_HSTS_SECONDS")
