"""The Makefile: `make` alone says how to run the product and its tests (the README's two
commands) and does nothing else."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    # As a user types it: not as a sub-make of `make test` (whose MAKEFLAGS and MAKELEVEL
    # would add "Entering directory" lines).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    env.pop("LOG_FORMAT", None)
    env.update(extra_env)
    return subprocess.run(["make", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, env=env)


def test_make_alone_lists_the_targets_and_builds_nothing():
    # The first rule used to be the virtual environment's: `make` alone created .venv and
    # upgraded pip in it, rather than telling a newcomer about `make run` and `make test`.
    database = _make("-n", "-p").stdout  # -n: nothing is run
    assert ".DEFAULT_GOAL := help" in database.splitlines()


def test_make_help_names_run_then_test_first():
    done = _make("-s", "help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines[:2]] == ["run", "test"], lines
    assert all(line.startswith("make ") and len(line.split()) > 2 for line in lines), lines  # each says what it does


def test_make_echoes_no_command_under_log_format_json():
    # `LOG_FORMAT=json make run` wrote "scripts/run.sh" and the install commands as text
    # lines among the JSON ones.
    assert ".SILENT:" in _make("-n", "-p", LOG_FORMAT="json").stdout.splitlines()
    assert ".SILENT:" not in _make("-n", "-p").stdout.splitlines()
