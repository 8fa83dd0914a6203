"""The command-line import killed (not Ctrl-C, which reaches its reader process too): nothing
it started may outlive it holding a rotation lock. Real processes on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection, transaction

from leads.models import Lead
from rotation.models import RotationState
from tests.celery_worker import database_url, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parents[2]


def _start_import(path: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.test",
        "DATABASE_URL": database_url(),
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "import_leads", str(path), "--no-progress", "--no-notify", "--batch-size", "200"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _a_big_file(tmp_path: Path) -> Path:
    path = tmp_path / "leads.csv"
    rows = "".join(f"k{i},k{i}@customer.example,emea\n" for i in range(40_000))
    path.write_text("external_id,email,group\n" + rows)
    return path


def _processes_reading(path: Path) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if str(path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


def _rotation_free(group_id: int) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '300ms'")
            list(RotationState.objects.select_for_update().filter(group_id=group_id))
        return True
    except Exception:  # noqa: BLE001 - a lock timeout: still held
        return False


def test_an_import_killed_leaves_no_process_and_no_lock_behind(make_group, tmp_path):
    """SIGKILL to the command alone (an operator's `kill -9`, the OOM killer): its forked
    reader kept the pipe's read end and the command's database socket, so the batch's
    transaction stayed open on the server with the group's rotation lock, and intake into the
    group answered 503 until the reader was found and killed by hand."""
    group, _reps = make_group(2, slug="emea")
    path = _a_big_file(tmp_path)
    proc = _start_import(path)
    try:
        assert wait_for(lambda: Lead.objects.exists(), timeout=60), proc.stderr.read() if proc.poll() else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_for(lambda: not _processes_reading(path), timeout=15), _processes_reading(path)
        assert wait_for(lambda: _rotation_free(group.id), timeout=15)
    finally:
        for pid in _processes_reading(path):
            os.kill(pid, signal.SIGKILL)
    imported = Lead.objects.count()
    assert 0 < imported < 40_000 and imported % 200 == 0  # whole batches, the one in progress rolled back


def test_an_import_stopped_by_a_term_says_what_is_in_and_exits_143(make_group, tmp_path):
    make_group(2, slug="emea")
    path = _a_big_file(tmp_path)
    proc = _start_import(path)
    try:
        assert wait_for(lambda: Lead.objects.exists(), timeout=60)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    imported = Lead.objects.count()
    assert f"Interrupted: the first {imported} rows are imported" in err, err
    assert time.monotonic() - started < 20
    assert wait_for(lambda: not _processes_reading(path), timeout=15)
