"""Per-client rate limits (429 + Retry-After) in Redis, shared by every process; fail open
when Redis is unreachable. Page size is capped."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from leads.models import ApiClient, Lead
from security import ratelimit
from tests.conftest import start_of_a_window
from tests.factories import api_client_with

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _redis_up():
    ratelimit._state.down_until = ratelimit._state.last_warning = 0.0
    yield
    ratelimit._state.down_until = ratelimit._state.last_warning = 0.0


def http(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def limited_client(limit: int) -> tuple[ApiClient, str]:
    client, token = api_client_with(["read"])
    ApiClient.objects.filter(pk=client.pk).update(rate_limit_per_minute=limit)
    start_of_a_window(3)
    return client, token


@pytest.mark.django_db
def test_over_the_client_limit_is_429_with_retry_after():
    _, token = limited_client(3)
    _, other = limited_client(3)
    codes = [http(token).get("/api/v1/queue/").status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = http(token).get("/api/v1/queue/")
    assert r.status_code == 429
    assert 1 <= int(r["Retry-After"]) <= 60
    assert "throttled" in r.json()["detail"].lower()
    # Another client has its own budget.
    assert http(other).get("/api/v1/queue/").status_code == 200


@pytest.mark.django_db
def test_without_a_limit_of_its_own_a_client_gets_the_default(settings):
    settings.API_RATE_LIMIT_PER_MINUTE = 2
    _, token = api_client_with(["read"])
    start_of_a_window(3)
    assert [http(token).get("/api/v1/queue/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
def test_requests_without_a_valid_token_do_not_count():
    _, token = limited_client(1)
    for _ in range(3):
        assert Client(HTTP_AUTHORIZATION="Bearer lr_wrong").get("/api/v1/queue/").status_code == 401
    assert http(token).get("/api/v1/queue/").status_code == 200


@pytest.mark.django_db
def test_redis_unreachable_fails_open_with_a_log_line(settings, caplog):
    settings.RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    _, token = limited_client(1)
    with caplog.at_level(logging.WARNING, logger="security.ratelimit"):
        codes = [http(token).get("/api/v1/queue/").status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    warnings = [r for r in caplog.records if r.name == "security.ratelimit"]
    assert len(warnings) == 1 and "not enforced" in warnings[0].getMessage()


@pytest.mark.django_db
def test_a_limit_against_guessing_is_held_in_the_process_while_redis_is_down(settings):
    """The bad-signature limit of web-form intake (and the login throttle) count in the
    process's memory while Redis is unreachable, where the intake limits fail open."""
    settings.RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    start_of_a_window(5)
    try:
        held = [ratelimit.rate_limit_hit(key="guess:1", limit=2, held_when_down=True).allowed for _ in range(3)]
        assert held == [True, True, False]
        assert ratelimit.rate_limit_count(key="guess:1", held_when_down=True) == 3
        ratelimit.rate_limit_undo(key="guess:1")
        assert ratelimit.rate_limit_count(key="guess:1", held_when_down=True) == 2
        assert ratelimit.rate_limit_count(key="guess:1") == 0  # not asked held: fails open
        assert all(ratelimit.rate_limit_hit(key="intake:1", limit=1).allowed for _ in range(3))
    finally:
        ratelimit._local.clear()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_limit_holds_across_processes():
    """Another OS process spends part of the budget; this one sees it spent."""
    client, token = limited_client(5)
    start_of_a_window(20)  # the other process's start-up and every hit in one window
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    script = textwrap.dedent(
        f"""
        import django
        django.setup()
        from django.test import Client
        c = Client(HTTP_AUTHORIZATION="Bearer {token}")
        print(",".join(str(c.get("/api/v1/queue/").status_code) for _ in range(4)))
        """
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.test",
        "DATABASE_URL": url,
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "200,200,200,200"
    assert http(token).get("/api/v1/queue/").status_code == 200
    assert http(token).get("/api/v1/queue/").status_code == 429


def test_without_redis_the_limit_holds_across_the_web_processes_of_the_machine(settings, monkeypatch, tmp_path):
    """The embedded default (no REDIS_URL) runs one web process per core: a hit counted in
    another process is counted here too (the cache the settings choose without Redis)."""
    script = textwrap.dedent(
        f"""
        import os
        os.environ["REDIS_URL"] = ""
        import django
        from django.conf import settings
        django.setup()
        from security import ratelimit
        assert settings.CACHES["default"]["BACKEND"] == "diskcache.DjangoCache", settings.CACHES
        settings.CACHES["default"]["LOCATION"] = {str(tmp_path / "cache")!r}
        ratelimit._prefix = lambda: "rl:embedded"
        print(",".join(str(ratelimit.rate_limit_hit(key="client:1", limit=5).allowed) for _ in range(4)))
        """
    )
    settings.RATE_LIMIT_REDIS_URL = settings.REDIS_URL = ""
    settings.CACHES = {"default": {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(tmp_path / "cache")}}
    monkeypatch.setattr(ratelimit, "_prefix", lambda: "rl:embedded")
    start_of_a_window(20)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "routing_project.settings.local", "REDIS_URL": ""}
    env.pop("DATABASE_URL", None)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True,True,True,True"
    fifth, sixth = (ratelimit.rate_limit_hit(key="client:1", limit=5) for _ in range(2))
    assert (fifth.allowed, fifth.count) == (True, 5)
    assert (sixth.allowed, sixth.count) == (False, 6) and sixth.retry_after >= 1
    assert ratelimit.rate_limit_count(key="client:1") == 6
    ratelimit.rate_limit_reset(key="client:1")
    assert ratelimit.rate_limit_hit(key="client:1", limit=5).count == 1


@pytest.mark.django_db
def test_page_size_is_at_most_500(api):
    now = timezone.now()
    Lead.objects.bulk_create(
        Lead(email=f"p{i}@x.example", email_normalized=f"p{i}@x.example", status="queued", created_at=now)
        for i in range(501)
    )
    body = api.get("/api/v1/leads/?page_size=500").json()
    assert len(body["results"]) == 500 and body["count"] == 501
    for bad in ("501", "100000", "0", "-1", "ten", "1.5"):
        r = api.get(f"/api/v1/queue/?page_size={bad}")
        assert r.status_code == 400 and "page_size" in r.json(), bad


@pytest.mark.django_db
def test_create_api_token_sets_a_rate_limit():
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("create_api_token", "bench-like", "--scopes", "intake", "--rate-limit", "100000", stdout=out)
    client = ApiClient.objects.get(name="bench-like")
    assert client.rate_limit_per_minute == 100000
    assert client.token_hash == ApiClient.hash_token(out.getvalue().strip())


@pytest.mark.django_db
def test_each_window_counts_in_a_key_that_expires_after_it():
    import time

    start_of_a_window(3)
    key = f"expiry-{time.time_ns()}"
    verdicts = [ratelimit.rate_limit_hit(key=key, limit=2) for _ in range(3)]
    assert [(v.allowed, v.count) for v in verdicts] == [(True, 1), (True, 2), (False, 3)]
    client = ratelimit._redis()
    full_key = f"{ratelimit._prefix()}:{key}:{int(time.time() // 60)}"
    assert 0 < client.ttl(full_key) <= 61
    assert ratelimit.rate_limit_count(key=key) == 3


class _HungRedis:
    """A Redis client whose every call fails as a hung server's would, after its timeout."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, *args: object, **kwargs: object) -> None:
        import redis

        self.calls += 1
        raise redis.TimeoutError("Timeout connecting to server")

    get = incr = expire = delete = _fail


def test_counts_skip_redis_while_it_is_down_as_hits_do(settings, monkeypatch):
    """Signed intake reads the bad-signature count of the address before each request: with
    Redis hung, every such read waited for the socket timeout (0.25 s a request) while the hits
    skipped Redis for the back-off. Reads and hits share the back-off."""
    settings.RATE_LIMIT_REDIS_URL = "redis://hung.example:6379/0"
    hung = _HungRedis()
    monkeypatch.setattr(ratelimit._state, "client", hung)
    monkeypatch.setattr(ratelimit._state, "url", settings.RATE_LIMIT_REDIS_URL)
    assert ratelimit.rate_limit_count(key="hookfail:10.0.0.1") == 0  # fails open
    assert hung.calls == 1
    for _ in range(5):
        assert ratelimit.rate_limit_count(key="hookfail:10.0.0.1") == 0
        assert ratelimit.rate_limit_hit(key="hookfail:10.0.0.1", limit=20).allowed
    assert hung.calls == 1, "Redis was asked again during the back-off"
