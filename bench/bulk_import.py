"""The bulk import benchmark: `manage.py import_leads` on a file of N leads, timed, with
peak memory, on a fresh PostgreSQL database.

    python -m bench.bulk_import                  # 100,000 leads (and 10,000 for the memory check)
    python -m bench.bulk_import --rows 20000

It recreates a bench database (BULK_BENCH_DATABASE_URL, default lr_bulk_bench on the local
server; the name must contain "bench", since it is dropped), migrates it, seeds one weighted
group of 5 reps (every lead goes to it: the hot-group case, one rotation lock per batch),
writes the CSV with bench/make_leads_csv.py, runs the import (progress bar off), then runs
it again (idempotent: nothing new). Time and memory come from /usr/bin/time (wall, CPU of
the command and its reader process, peak resident memory); the load average is printed
beside them, since the machine may be shared. Then it checks the result: every row a lead,
one assignment and two audit events each, exact weighted shares.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

BASE = Path(__file__).resolve().parent.parent
PY = sys.executable


def sh(cmd: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=BASE, env=env, check=True, text=True, capture_output=True, **kwargs)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[dict[str, float], str]:
    out = subprocess.run(
        ["/usr/bin/time", "-f", "TIME %e %U %S %M", *cmd], cwd=BASE, env=env, text=True, capture_output=True
    )
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    line = next(x for x in out.stderr.splitlines() if x.startswith("TIME "))
    wall, user, system, rss_kb = (float(v) for v in line.split()[1:])
    return {"wall": wall, "cpu": user + system, "rss_mb": rss_kb / 1024}, out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description="bulk import benchmark")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--no-notify", action="store_true")
    args = parser.parse_args()
    url = os.environ.get("BULK_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lr_bulk_bench")
    name = urlparse(url).path.lstrip("/")
    if "bench" not in name:
        raise SystemExit("BULK_BENCH_DATABASE_URL must name a database whose name contains 'bench' (it is dropped)")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "routing_project.settings.production",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-secret"),
        "LOG_LEVEL": "WARNING",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/7"),
    }
    admin = urlparse(url)._replace(path="/postgres").geturl()
    sh(["psql", admin, "-qc", f'DROP DATABASE IF EXISTS "{name}"'], env)
    sh(["psql", admin, "-qc", f'CREATE DATABASE "{name}"'], env)
    sh([PY, "manage.py", "migrate", "-v0"], env)
    seed = (
        "from rotation.models import Group, Rep, RotationState\n"
        "from rotation import services\n"
        "g = Group.objects.create(slug='bulk', name='Bulk', strategy='weighted', sla_minutes=30)\n"
        "RotationState.objects.get_or_create(group=g)\n"
        "for i in range(5):\n"
        "    r = Rep.objects.create(name=f'Rep {i}', email=f'rep{i}@sales.example')\n"
        "    services.membership_add(group=g, rep=r, actor='bench', weight=i + 1)\n"
    )
    sh([PY, "manage.py", "shell", "-c", seed], env)

    runs = sorted({min(10_000, args.rows), args.rows})
    results = []
    for n in runs:
        path = BASE / "var" / f"bench-leads-{n}.csv"
        path.parent.mkdir(exist_ok=True)
        sh([PY, "bench/make_leads_csv.py", str(path), "--rows", str(n), "--group", "bulk", "--prefix", f"b{n}"], env)
        cmd = [
            PY,
            "manage.py",
            "import_leads",
            str(path),
            "--no-progress",
            *(["--no-notify"] if args.no_notify else []),
        ]
        load = os.getloadavg()[0]
        first, summary = timed(cmd, env)
        again, summary_again = timed(cmd, env)
        results.append((n, first, again, load, summary, summary_again))

    check = (
        "from leads.models import Lead, Assignment\n"
        "from audit.models import AuditEvent\n"
        "from django.db.models import Count\n"
        "leads = Lead.objects.count()\n"
        "events = AuditEvent.objects.filter(lead_id__isnull=False).count()\n"
        "print(f'check: {leads:,} leads, {Assignment.objects.count():,} assignments, {events:,} lead events')\n"
        "per_rep = sorted(Lead.objects.values_list('owner_id').annotate(n=Count('id')).values_list('n', flat=True))\n"
        "print(f'check: leads per rep, weights 1 to 5: {per_rep}')\n"
    )
    print(sh([PY, "manage.py", "shell", "-c", check], env).stdout.strip())
    print()
    print("| leads | wall | rows/s | CPU (command + reader) | peak RSS | re-run (nothing new) | load avg at start |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, first, again, load, _, _ in results:
        print(
            f"| {n:,} | {first['wall']:.1f} s | {n / first['wall']:,.0f} | {first['cpu']:.1f} s | "
            f"{first['rss_mb']:.0f} MB | {again['wall']:.1f} s | {load:.1f} |"
        )
    for n, _, _, _, summary, summary_again in results:
        print(f"{n:,}: {summary}\n{n:,} again: {summary_again}")


if __name__ == "__main__":
    main()
