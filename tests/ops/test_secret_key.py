"""`make run` and the `manage.py` commands beside it (routing_project.settings.local) sign
with one key of the checkout's own, never the settings' public development default."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from routing_project.secret_keys import kept_secret_key

BASE_DIR = Path(__file__).resolve().parents[2]


def test_the_key_is_made_once_kept_for_its_owner_alone_and_read_back(tmp_path):
    path = tmp_path / "var" / "secret_key"
    key = kept_secret_key(path)
    assert len(key) >= 50 and path.read_text().strip() == key
    assert path.stat().st_mode & 0o077 == 0
    assert kept_secret_key(path) == key
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret_key"]  # no draft left


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    path = tmp_path / "secret_key"
    keys: list[str] = []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        keys.append(kept_secret_key(path))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and keys[0] == path.read_text().strip()


def _secret_key_of(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)",
        ],
        cwd=BASE_DIR,
        env={**base, "DJANGO_SETTINGS_MODULE": "routing_project.settings.local", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_make_run_and_the_commands_beside_it_share_the_checkouts_key():
    # A webhook endpoint made from `manage.py shell` was sealed under the development key
    # while `make run`'s workers read it under another: every notification stopped.
    first, second = _secret_key_of(), _secret_key_of()
    assert first == second == (BASE_DIR / "var" / "secret_key").read_text().strip()
    assert first != "dev-insecure-key-change-me"
    assert _secret_key_of(SECRET_KEY="given-" + "k" * 50) == "given-" + "k" * 50
