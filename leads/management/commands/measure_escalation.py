"""Measures the escalation design on this machine, with a real worker on the configured broker.

    python manage.py measure_escalation --pending 100000

1. Memory: `--pending` open assignments due over the next `--spread-minutes` (SLA-like), then
   the worker's resident memory (a) idle, (b) after the `escalation_arm` run of this design
   (only timers within the horizon are published), and (c) for contrast, after publishing
   every timer as an ETA task (the naive design the horizon avoids).
2. Delay from due time to escalation: `--samples` assignments due in a few seconds, (a) on the
   timer path, (b) with no timer (the beat sweep alone).

Writes rows into the configured database (a group named `measure-escalation`) and empties the
Redis database of `REDIS_URL` before and after (the broker's queues, timers and counters): run
it on a scratch database, never on production. It refuses a Redis database that holds keys
unless `--flush-redis` says to empty it.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions, scheduling
from leads.models import Assignment, Lead, LeadStatus
from rotation.models import Group, Membership, Rep, RotationState

SLUG = "measure-escalation"


def rss_kib(pid: int, *, children: bool = True) -> int:
    """Resident memory of a process (and its children) in KiB, from /proc."""
    total = 0
    pids = [pid]
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    if children and kids.exists():
        pids += [int(p) for p in kids.read_text().split()]
    for p in pids:
        status = Path(f"/proc/{p}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


class Command(BaseCommand):
    help = "Measures worker memory with many pending timers and the due-to-escalation delay."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pending", type=int, default=100_000)
        parser.add_argument("--spread-minutes", type=float, default=30.0)
        parser.add_argument("--samples", type=int, default=30)
        parser.add_argument(
            "--spacing", type=float, default=0.2, help="Seconds between the samples' due times (0.01: a burst)."
        )
        parser.add_argument("--skip-naive", action="store_true", help="Do not publish every timer for contrast.")
        parser.add_argument("--skip-delay", action="store_true", help="Memory only.")
        parser.add_argument(
            "--flush-redis",
            action="store_true",
            help="Empty REDIS_URL's database even when it holds keys (another run's, or a live broker's).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not settings.CELERY_BROKER_URL.startswith("redis"):
            raise CommandError("Set REDIS_URL: this measures Celery on Redis.")
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        held = self.redis.dbsize()
        if held and not opts["flush_redis"]:
            raise CommandError(
                f"The Redis database of REDIS_URL holds {held} keys, which this command would delete (a live "
                "broker's queued timers and deliveries, its counters): point REDIS_URL at an empty database, "
                "or pass --flush-redis if these keys are a scratch run's."
            )
        self.redis.flushdb()
        group, reps = self.setup_group()
        worker = self.start_worker(beat=False)
        try:
            self.measure_memory(worker, group, reps, opts["pending"], opts["spread_minutes"], opts["skip_naive"])
        finally:
            self.stop(worker)
        self.redis.flushdb()
        self.clear(group)
        if opts["skip_delay"]:
            return
        worker = self.start_worker(beat=True)
        try:
            self.measure_delay(group, reps, opts["samples"], opts["spacing"])
        finally:
            self.stop(worker)
            self.redis.flushdb()

    # --- set-up ---------------------------------------------------------------------------

    def setup_group(self) -> tuple[Group, list[Rep]]:
        group, _ = Group.objects.get_or_create(slug=SLUG, defaults={"name": "Measure escalation"})
        group.sla_minutes, group.max_attempts = 30, 1000
        group.save()
        RotationState.objects.get_or_create(group=group)
        self.clear(group)
        reps = []
        for i in range(5):
            rep, _ = Rep.objects.get_or_create(email=f"measure{i}@sales.example", defaults={"name": f"Measure {i}"})
            Membership.objects.get_or_create(group=group, rep=rep, defaults={"position": i})
            reps.append(rep)
        return group, reps

    def clear(self, group: Group) -> None:
        Assignment.objects.filter(group=group).delete()
        Lead.objects.filter(group=group).delete()

    def make_assignments(self, group: Group, reps: list[Rep], dues: list[Any]) -> list[int]:
        now = timezone.now()
        ids: list[int] = []
        batch = 5000
        for start in range(0, len(dues), batch):
            chunk = dues[start : start + batch]
            leads = Lead.objects.bulk_create(
                [
                    Lead(
                        email=f"m{start + i}@measure.example",
                        email_normalized=f"m{start + i}@measure.example",
                        group=group,
                        status=LeadStatus.ASSIGNED,
                        owner_id=reps[(start + i) % len(reps)].id,
                        created_at=now,
                        assigned_at=now,
                        sla_due_at=due,
                    )
                    for i, due in enumerate(chunk)
                ]
            )
            rows = Assignment.objects.bulk_create(
                [
                    Assignment(
                        lead=lead,
                        rep_id=lead.owner_id or reps[0].id,
                        group=group,
                        attempt=1,
                        reason=Assignment.Reason.ROTATION,
                        started_at=now,
                        due_at=lead.sla_due_at,
                    )
                    for lead in leads
                ]
            )
            ids += [a.id for a in rows]
        return ids

    def start_worker(self, *, beat: bool) -> subprocess.Popen[bytes]:
        Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)
        log = open(Path(settings.VAR_DIR) / f"measure-worker-{'beat' if beat else 'plain'}.log", "wb")  # noqa: SIM115
        cmd = [str(Path(sys.executable).parent / "celery"), "-A", "routing_project", "worker", "--concurrency", "2"]
        cmd += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]
        if beat:
            cmd += ["--beat", "--schedule", str(Path(settings.VAR_DIR) / "measure-beat")]
        # The command line is built here from fixed parts (no outside input).
        proc = subprocess.Popen(  # noqa: S603
            cmd, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        time.sleep(6)
        if proc.poll() is not None:
            raise CommandError("the worker did not start; see var/measure-worker-*.log")
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def queued(self) -> int:
        return int(self.redis.llen("celery"))  # type: ignore[arg-type]

    def wait_drained(self, timeout: float = 300) -> None:
        """Until the worker has taken every message off the queue (ETA tasks into memory)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.queued() > 0:
            time.sleep(0.5)
        time.sleep(5)

    # --- memory ---------------------------------------------------------------------------

    def measure_memory(
        self, worker: subprocess.Popen[bytes], group: Group, reps: list[Rep], n: int, minutes: float, skip_naive: bool
    ) -> None:
        now = timezone.now()
        start = now + timedelta(seconds=30)
        step = timedelta(minutes=minutes) / max(n, 1)
        dues = [start + step * i for i in range(n)]
        t0 = time.monotonic()
        ids = self.make_assignments(group, reps, dues)
        self.stdout.write(f"{len(ids)} pending assignments written in {time.monotonic() - t0:.1f} s")
        # Warm up: the pool children import and connect on their first tasks.
        for _ in range(20):
            scheduling.publish(scheduling.ESCALATE_TASK, args=[0])
        self.wait_drained()
        idle, idle_main = rss_kib(worker.pid), rss_kib(worker.pid, children=False)
        self.stdout.write(f"worker RSS warm, no timers: {idle / 1024:.1f} MiB (main process {idle_main / 1024:.1f})")
        published = actions.escalation_arm()
        self.wait_drained()
        horizon, horizon_main = rss_kib(worker.pid), rss_kib(worker.pid, children=False)
        self.stdout.write(
            f"this design (horizon {settings.ESCALATION_TIMER_HORIZON_S:.0f} s, slices of "
            f"{settings.ESCALATION_TIMER_SLICE_S:g} s): escalation_arm armed the timers of {published} "
            f"assignments; worker RSS {horizon / 1024:.1f} MiB (+{(horizon - idle) / 1024:.1f} MiB; "
            f"main process +{(horizon_main - idle_main) / 1024:.1f} MiB)"
        )
        if skip_naive:
            return
        rows = Assignment.objects.filter(pk__in=ids).values_list("id", "due_at")
        t0 = time.monotonic()
        sent = 0
        from routing_project.celery import app

        with app.producer_or_acquire() as producer:
            for assignment_id, due in rows.iterator(chunk_size=5000):
                app.send_task(scheduling.ESCALATE_TASK, args=[assignment_id], eta=due, producer=producer)
                sent += 1
        self.stdout.write(f"naive: {sent} ETA timers published in {time.monotonic() - t0:.1f} s")
        self.wait_drained()
        naive, naive_main = rss_kib(worker.pid), rss_kib(worker.pid, children=False)
        self.stdout.write(
            f"naive (every timer as an ETA task): worker RSS {naive / 1024:.1f} MiB "
            f"(+{(naive - idle) / 1024:.1f} MiB; main process +{(naive_main - idle_main) / 1024:.1f} MiB)"
        )

    # --- delay ----------------------------------------------------------------------------

    def measure_delay(self, group: Group, reps: list[Rep], samples: int, spacing: float) -> None:
        for path in ("timer", "sweep"):
            now = timezone.now()
            dues = [now + timedelta(seconds=5 + spacing * i) for i in range(samples)]
            ids = self.make_assignments(group, reps, dues)
            if path == "timer":
                for assignment_id, due in zip(ids, dues, strict=True):
                    scheduling.timer_publish(assignment_id=assignment_id, due_at=due, group_id=group.id)
            deadline = time.monotonic() + 60
            lead_ids = list(Assignment.objects.filter(pk__in=ids).values_list("lead_id", flat=True))
            events: list[AuditEvent] = []
            while time.monotonic() < deadline:
                events = list(AuditEvent.objects.filter(type="lead.escalated", lead_id__in=lead_ids))
                if len(events) >= samples:
                    break
                time.sleep(0.5)
            delays = sorted(e.explanation["late_by_s"] for e in events if e.explanation["missed_attempt"] == 1)
            if not delays:
                self.stdout.write(f"{path} path: no escalation seen")
                continue
            p95 = delays[min(len(delays) - 1, int(len(delays) * 0.95))]
            self.stdout.write(
                f"{path} path: {len(delays)}/{samples} escalated; due -> escalation p50 "
                f"{statistics.median(delays):.3f} s, p95 {p95:.3f} s, max {delays[-1]:.3f} s"
                + (f" (sweep every {settings.ESCALATION_SWEEP_EVERY_S:.0f} s)" if path == "sweep" else "")
            )
            self.clear(group)
