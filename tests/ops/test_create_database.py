"""`manage.py create_database` (run by `make run` before migrating): a PostgreSQL database named
by DATABASE_URL that does not exist yet is created; one that exists is left alone."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

BASE_DIR = Path(__file__).resolve().parent.parent.parent


@pytest.mark.postgres
def test_make_runs_database_is_created_when_missing_and_left_alone_when_there():
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    server = f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    name = f"lr_create_{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "DATABASE_URL": f"{server}/{name}", "DJANGO_SETTINGS_MODULE": "routing_project.settings.local"}

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", "create_database"], cwd=BASE_DIR, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    try:
        assert f"Created database '{name}'" in run()
        with psycopg.connect(f"{server}/{name}") as conn:
            conn.execute("CREATE TABLE kept (id int)")
        assert run() == ""  # there already: nothing done, nothing lost
        with psycopg.connect(f"{server}/{name}") as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
