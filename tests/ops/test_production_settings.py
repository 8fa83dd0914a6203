"""routing_project.settings.production refuses to start without a real SECRET_KEY."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
