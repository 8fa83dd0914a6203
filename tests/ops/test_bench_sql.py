"""bench/routing.sql (the raw-SQL side of the benchmark) runs against the real schema and
routes exactly: a schema change that breaks it fails here, not in the middle of `make bench`."""

import subprocess
from collections import Counter

import pytest
from django.db import connection

from audit.models import AuditEvent
from bench.run import BASE_DIR, pgbench_binary
from leads.models import Lead
from rotation.models import RotationState


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pgbench_script_routes_exactly_on_the_current_schema(make_group):
    group, reps = make_group(3)
    db = connection.settings_dict
    cmd = [pgbench_binary(), "-n", "-c", "2", "-t", "6", "-f", str(BASE_DIR / "bench" / "routing.sql")]
    cmd += ["-D", f"gmin={group.id}", "-D", f"gmax={group.id}"]
    cmd += ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432), "-U", db["USER"] or "postgres", db["NAME"]]
    env = {"PGPASSWORD": db["PASSWORD"] or "", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr

    leads = Lead.objects.filter(source="pgbench", group=group)
    assert leads.count() == 12
    assert set(Counter(leads.values_list("owner_id", flat=True)).values()) == {4}  # 12 leads, 3 reps
    assert AuditEvent.objects.filter(type="lead.assigned", lead_id__in=leads.values("id")).count() == 12
    assert RotationState.objects.get(group=group).turns == 12


def test_sliced_runs_add_up():
    """A scenario measured in alternated slices reports the rate over all of them."""
    from bench.run import HttpRun, SqlRun, http_merge, sql_merge

    sql = sql_merge(
        "sql",
        [
            SqlRun("a", tps=800.0, latency_ms=10.0, transactions=4000),
            SqlRun("b", tps=400.0, latency_ms=20.0, transactions=2000),
        ],
    )
    assert sql.transactions == 6000 and sql.tps == 6000 / 10.0
    assert sql.latency_ms == (10.0 * 4000 + 20.0 * 2000) / 6000
    one, two = HttpRun("h", "t", 16, seconds=5.0), HttpRun("h", "t", 16, seconds=5.0)
    one.statuses[201], two.statuses[201] = 1500, 1000
    one.lead_ids, two.lead_ids = [1, 2], [3]
    merged = http_merge("h", [one, two])
    assert merged.rate == 2500 / 10.0 and merged.lead_ids == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_floor_run_counts_healthz_answers(live_server):
    """The floor run speaks keep-alive HTTP/1.1 to a real server and counts its 200s."""
    from urllib.parse import urlsplit

    from bench.run import floor_loop

    port = urlsplit(live_server.url).port
    run = floor_loop(port=port, clients=2, seconds=0.5)
    assert run.ok > 0 and run.other == 0
    assert run.rate == run.ok / run.seconds
