"""The benchmark: intake over HTTP against gunicorn on PostgreSQL, next to the same routing
transaction in raw SQL (pgbench), measured in the same run, with an exactness check of every
run against the database.

    python -m bench.run            # about two and a half minutes
    python -m bench.run --quick    # about forty seconds

It recreates a bench database (BENCH_DATABASE_URL, default lr_bench on the local server; the
name must contain "bench", since it is dropped), migrates it, seeds one hot group of 5 reps
and 100 groups of 5 reps (and the same again for pgbench), starts gunicorn with
gunicorn.conf.py on 127.0.0.1 and drives it with keep-alive HTTP clients (threads and
http.client). Scenarios, in this order, so that each HTTP figure sits beside its raw SQL one:

    sql hot       pgbench, 8 clients, one group            (bench/routing.sql)
    http hot      16 clients, one group
    sql spread    pgbench, 8 clients, 100 groups
    http spread   16 clients, 100 groups
    paced 50/s    open loop at 50 leads/s (latency from the scheduled send time)
    overload      32 clients, one group
    floor         GET /healthz, 16 clients: a request that validates, routes and asks
                  PostgreSQL nothing, the ceiling of any intake on this stack and host

Each raw SQL run and its HTTP run are taken in alternated slices (pgbench, HTTP, pgbench,
HTTP, ...; --slices), so that a ratio compares the two on the same host: a shared virtual
machine's speed can change by half within a minute, and the report prints a probe of it.

After each run the database is checked: every 201 is a lead in the database and nothing
else was written (no lost lead), each lead has one assignment and its owner is that rep (no
lead with two owners), one lead.assigned audit event per lead, each group's per-rep counts
differ by at most 1 (equal weights), and the rotation advanced once per lead.
Only 127.0.0.1 is ever targeted; every loop is bounded in time and in count.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
REPS_PER_GROUP = 5
SPREAD_GROUPS = 100
MAX_REQUESTS_PER_CLIENT = 100_000
OPTIONS = {"idempotency_keys": False}
TARGETS = {
    "hot_ratio": 0.5,
    "spread_ratio": 0.5,
    "paced_p50_ms": 15.0,
    "paced_p99_ms": 60.0,
    "overload_p99_ms": 250.0,
}


# --- results -----------------------------------------------------------------------------------


@dataclass
class HttpRun:
    name: str
    tag: str
    clients: int
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    lead_ids: list[int] = field(default_factory=list)
    lead_groups: dict[int, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    exact: bool | None = None
    problems: list[str] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return self.statuses.get(201, 0)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class SqlRun:
    name: str
    tps: float = 0.0
    latency_ms: float = 0.0
    transactions: int = 0
    failed: int = 0
    exact: bool | None = None
    problems: list[str] = field(default_factory=list)


def http_merge(name: str, parts: list[HttpRun]) -> HttpRun:
    """One run from its slices (interleaved with pgbench's, see `paired`)."""
    run = HttpRun(name, parts[0].tag, parts[0].clients)
    for part in parts:
        run.seconds += part.seconds
        run.latencies_ms += part.latencies_ms
        run.statuses.update(part.statuses)
        run.lead_ids += part.lead_ids
        run.lead_groups.update(part.lead_groups)
        run.failures += part.failures
    return run


def sql_merge(name: str, parts: list[SqlRun]) -> SqlRun:
    run = SqlRun(name)
    seconds = sum(p.transactions / p.tps for p in parts if p.tps)
    run.transactions = sum(p.transactions for p in parts)
    run.failed = sum(p.failed for p in parts)
    run.tps = run.transactions / seconds if seconds else 0.0
    run.latency_ms = sum(p.latency_ms * p.transactions for p in parts) / run.transactions if run.transactions else 0.0
    run.problems = [problem for p in parts for problem in p.problems]
    return run


def host_probe_ms() -> float:
    """Milliseconds for a fixed piece of pure Python: the host's speed at this moment. On a
    shared virtual machine it can change by half within a minute, which is why each HTTP
    figure is measured in slices alternated with its raw SQL one."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return (time.perf_counter() - started) * 1000


# --- database set-up ---------------------------------------------------------------------------


def bench_env(database_url: str, redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="routing_project.settings.production",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-secret-key-not-for-production"),
        ALLOWED_HOSTS=HOST,
        LOG_FORMAT=os.environ.get("LOG_FORMAT", "json"),
    )
    return env


def recreate_database(database_url: str) -> None:
    import psycopg

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    if "bench" not in name or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        sys.exit(f"refusing to drop database {name!r}: a bench database's name must contain 'bench'")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")


def migrate(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, env=env, check=True)


def django_setup(env: dict[str, str]) -> None:
    for key in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY", "ALLOWED_HOSTS"):
        os.environ[key] = env[key]
    sys.path.insert(0, str(BASE_DIR))
    import django

    django.setup()


@dataclass
class Seed:
    token: str
    hot: str
    overload: str
    paced: str
    spread: list[str]
    sql_hot_id: int
    sql_spread_ids: tuple[int, int]


def seed() -> Seed:
    """Groups of 5 reps each, created in bulk (ids of the pgbench groups are contiguous)."""
    from django.db import transaction

    from leads.tokens import api_client_create
    from rotation.models import Group, Membership, Rep, RotationState

    slugs = ["hot", "overload", "paced"] + [f"spread-{i:03d}" for i in range(SPREAD_GROUPS)]
    sql_slugs = ["sql-hot"] + [f"sql-spread-{i:03d}" for i in range(SPREAD_GROUPS)]
    with transaction.atomic():
        groups = Group.objects.bulk_create(
            [Group(slug=s, name=s, strategy="round_robin", sla_minutes=30) for s in slugs + sql_slugs]
        )
        reps = Rep.objects.bulk_create(
            [
                Rep(name=f"Rep {g.slug} {i}", email=f"rep{i}.{g.slug}@bench.example")
                for g in groups
                for i in range(REPS_PER_GROUP)
            ]
        )
        Membership.objects.bulk_create(
            [
                Membership(group=g, rep=reps[gi * REPS_PER_GROUP + i], position=i, weight=1)
                for gi, g in enumerate(groups)
                for i in range(REPS_PER_GROUP)
            ]
        )
        RotationState.objects.bulk_create([RotationState(group=g) for g in groups])
    # A load generator, not a web form: far above the default per-client rate limit (429s).
    _client, token = api_client_create(name="bench", scopes=["intake", "read"], rate_limit_per_minute=100_000_000)
    by_slug = {g.slug: g.id for g in groups}
    spread_ids = sorted(by_slug[s] for s in sql_slugs[1:])
    assert spread_ids[-1] - spread_ids[0] == SPREAD_GROUPS - 1, "pgbench groups must have contiguous ids"
    return Seed(
        token=token,
        hot="hot",
        overload="overload",
        paced="paced",
        spread=slugs[3:],
        sql_hot_id=by_slug["sql-hot"],
        sql_spread_ids=(spread_ids[0], spread_ids[-1]),
    )


# --- the web server ----------------------------------------------------------------------------


def start_server(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    gunicorn = Path(sys.executable).parent / "gunicorn"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(gunicorn), "routing_project.wsgi:application", "--config", "gunicorn.conf.py", "--bind", f"{HOST}:{port}"],
        cwd=BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gunicorn exited with {proc.returncode}; see {log_path}")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.terminate()
    sys.exit(f"gunicorn did not answer on {HOST}:{port} within 60 s; see {log_path}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def web_cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """CPU time (user + system) of gunicorn's master and workers so far, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [proc.pid]
    try:
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        return float("nan")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a worker that just exited
        total += (int(fields[11]) + int(fields[12])) / tick
        if pid == proc.pid:
            # Workers recycled (max_requests) and reaped: their CPU moved to the master's
            # children counters, so the total never goes down.
            total += (int(fields[13]) + int(fields[14])) / tick
    return total


def scrape(port: int) -> dict[str, float]:
    """Sums of the server's routing and lock-wait histograms (to report means per run)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = defaultdict(float)
    wanted = (
        "leadrouter_rotation_lock_wait_seconds_sum",
        "leadrouter_rotation_lock_wait_seconds_count",
        "leadrouter_rotation_lock_held_seconds_sum",
        "leadrouter_rotation_lock_held_seconds_count",
        "leadrouter_routing_duration_seconds_sum",
        "leadrouter_routing_duration_seconds_count",
        "leadrouter_intake_batch_size_sum",
        "leadrouter_intake_batch_size_count",
    )
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


# --- load --------------------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection posting leads, on a bare socket.

    The load generator shares the machine's two cores with the server it measures, while
    pgbench, on the other side of the comparison, is C: http.client parses every answer's
    headers with the email package, several times the CPU of reading a status line and a
    Content-Length, which is all this needs (Django's answers always carry one)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.head = (
            f"POST /api/v1/leads/ HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        self.sock: socket.socket | None = None
        self.pending = b""

    def post(self, body: bytes) -> tuple[int, bytes]:
        extra = b""
        if OPTIONS["idempotency_keys"]:
            # One key per lead, kept across the reconnect below: a retry is replayed, never doubled.
            extra = f"Idempotency-Key: {uuid.uuid4().hex}\r\n".encode()
        request = self.head + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body
        for attempt in (1, 2):
            try:
                if self.sock is None:
                    self.sock = socket.create_connection((HOST, self.port), timeout=30)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.pending = b""
                self.sock.sendall(request)
                status, answer, close = self._read_response(self.sock)
                if close:
                    self.close()
                return status, answer
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                # The server closed an idle keep-alive connection (max_requests restart): reconnect once.
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> int:
        """A GET on the same keep-alive socket (the floor run: `GET /healthz`); its status."""
        if self.sock is None:
            self.sock = socket.create_connection((HOST, self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.pending = b""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n\r\n".encode())
        status, _, close = self._read_response(self.sock)
        if close:
            self.close()
        return status

    def _read_response(self, sock: socket.socket) -> tuple[int, bytes, bool]:
        data = self.pending
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv(sock)
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = None, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection":
                close = value.strip().lower() == "close"
            elif name == "transfer-encoding":
                raise ValueError("chunked answers are not expected from the intake endpoint")
        if length is None:
            raise ValueError("an answer without Content-Length")
        start = end + 4
        while len(data) < start + length:
            data += self._recv(sock)
        self.pending = data[start + length :]
        return status, data[start : start + length], close

    @staticmethod
    def _recv(sock: socket.socket) -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def lead_body(tag: str, client: int, n: int, group: str, part: int = 0) -> bytes:
    return json.dumps(
        {
            "email": f"{tag}.{part}.{client}.{n}@customer.example",
            "first_name": "Bench",
            "last_name": "Lead",
            "company": "Bench Co",
            "country": "FR",
            "source": tag,
            "group": group,
            "score": 50,
        }
    ).encode()


def record(run: HttpRun, lock: threading.Lock, status: int, body: bytes, latency_ms: float, group: str) -> None:
    lead_id = None
    if status == 201:
        lead_id = json.loads(body)["id"]
    with lock:
        run.statuses[status] += 1
        run.latencies_ms.append(latency_ms)
        if lead_id is not None:
            run.lead_ids.append(lead_id)
            run.lead_groups[lead_id] = group
        elif len(run.failures) < 5:
            run.failures.append(f"{status}: {body[:200]!r}")


def in_threads(clients: int, seconds: float, work: Callable[[int, float], None]) -> float:
    """Runs `work(index, deadline)` in `clients` threads released together; the seconds from
    their release to the last one's end."""
    start = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        start.wait()
        work(index, time.perf_counter() + seconds)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(seconds + 60)
    return time.perf_counter() - t0


def closed_loop(
    name: str, tag: str, *, port: int, token: str, clients: int, seconds: float, groups: list[str], part: int = 0
) -> HttpRun:
    """`clients` connections, each posting as soon as its previous answer arrived (`part`: the
    slice, so that every slice posts other addresses)."""
    run = HttpRun(name, tag, clients)
    lock = threading.Lock()

    def worker(index: int, deadline: float) -> None:
        rng = random.Random(index)
        client = Client(port, token)
        try:
            for n in range(MAX_REQUESTS_PER_CLIENT):
                if time.perf_counter() >= deadline:
                    break
                group = groups[0] if len(groups) == 1 else rng.choice(groups)
                body = lead_body(tag, index, n, group, part)
                t0 = time.perf_counter()
                status, answer = client.post(body)
                record(run, lock, status, answer, (time.perf_counter() - t0) * 1000, group)
        except Exception as exc:  # reported, never hidden
            with lock:
                run.failures.append(f"client {index}: {exc!r}")
        finally:
            client.close()

    run.seconds = in_threads(clients, seconds, worker)
    return run


@dataclass
class FloorRun:
    """`GET /healthz` in a closed loop: a Django request through the whole middleware that
    validates nothing, routes nothing and asks PostgreSQL nothing. Its rate on the same
    gunicorn is the ceiling any intake on this stack could reach on this host."""

    clients: int
    seconds: float = 0.0
    ok: int = 0
    other: int = 0
    web_cpu_ms: float = float("nan")

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def floor_loop(*, port: int, clients: int, seconds: float) -> FloorRun:
    run = FloorRun(clients)
    lock = threading.Lock()

    def worker(index: int, deadline: float) -> None:
        client = Client(port, "")
        ok = other = 0
        try:
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                if time.perf_counter() >= deadline:
                    break
                if client.get("/healthz") == 200:
                    ok += 1
                else:
                    other += 1
        except OSError:
            other += 1
        finally:
            client.close()
            with lock:
                run.ok += ok
                run.other += other

    run.seconds = in_threads(clients, seconds, worker)
    return run


def paced(name: str, tag: str, *, port: int, token: str, rate: float, seconds: float, group: str) -> HttpRun:
    """Open loop: lead k is due at start + k/rate; its latency counts from that instant, so a
    slow answer that delays the next send is measured too (no coordinated omission)."""
    total = int(rate * seconds)
    clients = 8
    run = HttpRun(name, tag, clients)
    lock = threading.Lock()
    next_index = iter(range(total))
    start_at = time.perf_counter() + 0.5

    def worker(index: int) -> None:
        client = Client(port, token)
        try:
            while True:
                with lock:
                    k = next(next_index, None)
                if k is None:
                    return
                due = start_at + k / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                status, answer = client.post(lead_body(tag, index, k, group))
                record(run, lock, status, answer, (time.perf_counter() - due) * 1000, group)
        except Exception as exc:
            with lock:
                run.failures.append(f"client {index}: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    run.seconds = max(time.perf_counter() - start_at, 0.001)
    return run


# --- raw SQL -------------------------------------------------------------------------------------


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    if not candidates:
        sys.exit("pgbench not found (it comes with the PostgreSQL packages)")
    return str(candidates[-1])


def run_pgbench(name: str, database_url: str, *, clients: int, seconds: float, gmin: int, gmax: int) -> SqlRun:
    parts = urlsplit(database_url)
    cmd = [
        pgbench_binary(),
        "-n",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(BASE_DIR / "bench" / "routing.sql"),
        "-D",
        f"gmin={gmin}",
        "-D",
        f"gmax={gmax}",
        "-h",
        parts.hostname or HOST,
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
        parts.path.lstrip("/"),
    ]
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = parts.password
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 120)
    run = SqlRun(name)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        run.problems.append(f"pgbench exited {proc.returncode}: {out.strip()[-500:]}")
    if m := re.search(r"tps = ([\d.]+) \(without initial connection time\)", out):
        run.tps = float(m.group(1))
    if m := re.search(r"latency average = ([\d.]+) ms", out):
        run.latency_ms = float(m.group(1))
    if m := re.search(r"number of transactions actually processed: (\d+)", out):
        run.transactions = int(m.group(1))
    if m := re.search(r"number of failed transactions: (\d+)", out):
        run.failed = int(m.group(1))
    return run


# --- exactness ---------------------------------------------------------------------------------


def check_http(run: HttpRun, turns_before: dict[str, int]) -> None:
    """Checks one run over everything the database recorded for it."""
    from django.db.models import Count

    from audit.models import AuditEvent
    from leads.models import Assignment, Lead
    from rotation.models import Membership, RotationState

    problems: list[str] = []
    leads = dict(Lead.objects.filter(source=run.tag).values_list("id", "owner_id"))
    answered = set(run.lead_ids)
    if len(answered) != len(run.lead_ids):
        problems.append("one lead id was answered twice")
    if set(leads) != answered:
        problems.append(
            f"lost or extra leads: {len(answered - set(leads))} answered but absent, "
            f"{len(set(leads) - answered)} written but not answered"
        )
    not_assigned = Lead.objects.filter(source=run.tag).exclude(status="assigned").count()
    if not_assigned:
        problems.append(f"{not_assigned} leads not assigned")
    per_lead = Counter(
        dict(
            Assignment.objects.filter(lead__source=run.tag)
            .values_list("lead_id")
            .annotate(n=Count("id"))
            .values_list("lead_id", "n")
        )
    )
    if any(n != 1 for n in per_lead.values()) or len(per_lead) != len(leads):
        problems.append("a lead without exactly one assignment")
    mismatched = sum(
        1
        for lead_id, rep_id in Assignment.objects.filter(lead__source=run.tag).values_list("lead_id", "rep_id")
        if leads.get(lead_id) != rep_id
    )
    if mismatched:
        problems.append(f"{mismatched} leads whose owner is not their assignment's rep (two owners)")
    events = Counter(
        dict(
            AuditEvent.objects.filter(type="lead.assigned", lead_id__in=list(leads))
            .values_list("lead_id")
            .annotate(n=Count("id"))
            .values_list("lead_id", "n")
        )
    )
    if len(events) != len(leads) or any(n != 1 for n in events.values()):
        problems.append("not exactly one lead.assigned event per lead")
    by_group: dict[str, Counter[int]] = defaultdict(Counter)
    for lead_id, owner in leads.items():
        by_group[run.lead_groups.get(lead_id, "?")][owner] += 1
    members: dict[str, list[int]] = defaultdict(list)
    for slug, rep_id in Membership.objects.filter(group__slug__in=list(by_group)).values_list("group__slug", "rep_id"):
        members[slug].append(rep_id)
    spread = 0
    for slug, counts in by_group.items():
        values = [counts.get(rep, 0) for rep in members[slug]]
        spread = max(spread, max(values) - min(values))
    if spread > 1:
        problems.append(f"per-rep counts in a group differ by {spread}")
    turns_after = dict(RotationState.objects.filter(group__slug__in=list(by_group)).values_list("group__slug", "turns"))
    for slug, counts in by_group.items():
        if turns_after.get(slug, 0) - turns_before.get(slug, 0) != sum(counts.values()):
            problems.append(f"rotation of {slug} did not advance once per lead")
            break
    run.problems = problems
    run.exact = not problems and run.ok > 0


def check_sql(run: SqlRun, group_ids: list[int]) -> None:
    from django.db.models import Count

    from leads.models import Lead
    from rotation.models import Membership

    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for group_id, owner, n in (
        Lead.objects.filter(source="pgbench", group_id__in=group_ids)
        .values_list("group_id", "owner_id")
        .annotate(n=Count("id"))
        .values_list("group_id", "owner_id", "n")
    ):
        counts[group_id][owner] = n
    members: dict[int, list[int]] = defaultdict(list)
    for group_id, rep_id in Membership.objects.filter(group_id__in=group_ids).values_list("group_id", "rep_id"):
        members[group_id].append(rep_id)
    spread = max(
        (max(c.get(r, 0) for r in members[g]) - min(c.get(r, 0) for r in members[g]) for g, c in counts.items()),
        default=0,
    )
    total = sum(sum(c.values()) for c in counts.values())
    if spread > 1:
        run.problems.append(f"per-rep counts differ by {spread}")
    if total != run.transactions:
        run.problems.append(f"{run.transactions} transactions but {total} leads")
    run.exact = not run.problems and total > 0


def rotation_turns(slugs: list[str]) -> dict[str, int]:
    from rotation.models import RotationState

    return dict(RotationState.objects.filter(group__slug__in=slugs).values_list("group__slug", "turns"))


# --- report ------------------------------------------------------------------------------------


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"  # NaN -> "-"


def report(rows: list[tuple[HttpRun, SqlRun | None]], sql_runs: list[SqlRun]) -> list[str]:
    lines = []
    head = (
        f"{'scenario':<24}{'HTTP leads/s':>13}{'raw SQL/s':>11}{'ratio':>7}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'max ms':>8}{'errors':>8}{'lock ms':>9}{'held ms':>8}{'batch':>7}{'cpu ms':>8}{'exact':>7}"
    )
    lines.append(head)
    lines.append("-" * len(head))
    for run, sql in rows:
        ratio = run.rate / sql.tps if sql and sql.tps else float("nan")
        errors = sum(n for status, n in run.statuses.items() if status != 201) + len(
            [f for f in run.failures if f.startswith("client")]
        )
        lock = run.server.get("lock_ms", float("nan"))
        lines.append(
            f"{run.name:<24}{fmt(run.rate):>13}{fmt(sql.tps) if sql else '-':>11}{fmt(ratio, 2):>7}"
            f"{fmt(run.pct(0.50)):>8}{fmt(run.pct(0.99)):>8}{fmt(max(run.latencies_ms, default=float('nan'))):>8}"
            f"{errors:>8}{fmt(lock, 2):>9}{fmt(run.server.get('held_ms', float('nan')), 2):>8}"
            f"{fmt(run.server.get('batch', float('nan'))):>7}{fmt(run.server.get('web_cpu_ms', float('nan'))):>8}"
            f"{('yes' if run.exact else 'NO'):>7}"
        )
    for sql in sql_runs:
        lines.append(
            f"{sql.name:<24}{'':>13}{fmt(sql.tps):>11}{'':>7}{'':>8}{'':>8}{'':>8}{sql.failed:>8}{'':>9}{'':>8}{'':>7}{'':>8}"
            f"{('yes' if sql.exact else 'NO'):>7}   (pgbench avg latency {fmt(sql.latency_ms, 2)} ms)"
        )
    return lines


def verdicts(
    hot: HttpRun, sql_hot: SqlRun, spread: HttpRun, sql_spread: SqlRun, pace: HttpRun, over: HttpRun
) -> list[str]:
    def mark(ok: bool) -> str:
        return "met " if ok else "MISS"

    hot_ratio = hot.rate / sql_hot.tps if sql_hot.tps else 0.0
    spread_ratio = spread.rate / sql_spread.tps if sql_spread.tps else 0.0
    return [
        f"[{mark(hot_ratio >= TARGETS['hot_ratio'])}] hot group, 16 clients: HTTP >= 0.5 x raw SQL "
        f"(SPEC 9: raw ~600-800/s on 2 cores): {hot.rate:,.0f}/s vs {sql_hot.tps:,.0f}/s = {hot_ratio:.2f}",
        f"[{mark(spread_ratio >= TARGETS['spread_ratio'])}] 100 groups, 16 clients: HTTP >= 0.5 x raw SQL "
        f"(SPEC 9: raw ~1,500-2,000/s): {spread.rate:,.0f}/s vs {sql_spread.tps:,.0f}/s = {spread_ratio:.2f}",
        f"[{mark(pace.pct(0.5) < TARGETS['paced_p50_ms'])}] 50 leads/s: p50 < 15 ms: {pace.pct(0.5):.1f} ms",
        f"[{mark(pace.pct(0.99) < TARGETS['paced_p99_ms'])}] 50 leads/s: p99 < 60 ms: {pace.pct(0.99):.1f} ms",
        f"[{mark(over.pct(0.99) < TARGETS['overload_p99_ms'])}] 32 clients, one group: p99 < 250 ms: "
        f"{over.pct(0.99):.1f} ms",
        f"[{mark(all(r.exact for r in (hot, spread, pace, over)))}] exact: 0 duplicates, 0 lost leads, "
        "per-rep counts within 1, one lead.assigned event per lead",
    ]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 40 s in all)")
    parser.add_argument("--seconds", type=float, help="length of each closed-loop and pgbench run")
    parser.add_argument("--paced-seconds", type=float, help="length of the 50 leads/s run")
    parser.add_argument(
        "--slices", type=int, help="alternated pgbench/HTTP slices per scenario (default 3; 2 with --quick)"
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT", 18600)))
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: gunicorn.conf.py's)")
    parser.add_argument("--threads", type=int, help="gunicorn threads per worker (default: gunicorn.conf.py's)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--idempotency-keys", action="store_true", help="send an Idempotency-Key with every lead (as web forms do)"
    )
    args = parser.parse_args(argv)
    OPTIONS["idempotency_keys"] = args.idempotency_keys
    seconds = args.seconds or (4.0 if args.quick else 15.0)
    paced_seconds = args.paced_seconds or (6.0 if args.quick else 20.0)
    slices = max(1, args.slices or (2 if args.quick else 3))

    database_url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lr_bench")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
    env = bench_env(database_url, redis_url)
    if args.workers:
        env["WEB_WORKERS"] = str(args.workers)
    if args.threads:
        env["WEB_THREADS"] = str(args.threads)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # gunicorn.conf.py makes a private one
    print(f"load before: {uptime()}")
    probe_before = host_probe_ms()
    print(f"database {urlsplit(database_url).path.lstrip('/')} (recreated), server on {HOST}:{args.port}")
    recreate_database(database_url)
    migrate(env)
    django_setup(env)
    s = seed()
    log_dir = BASE_DIR / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "bench-web.log"
    server = start_server(env, args.port, log_path)
    try:
        # Warm-up: every worker imports, connects and fills its caches (not measured).
        closed_loop("warm-up", "bench-warmup", port=args.port, token=s.token, clients=8, seconds=2.0, groups=s.spread)

        def http_run(name: str, tag: str, groups: list[str], clients: int) -> HttpRun:
            before_turns, before, cpu = rotation_turns(groups), scrape(args.port), web_cpu_seconds(server)
            run = closed_loop(name, tag, port=args.port, token=s.token, clients=clients, seconds=seconds, groups=groups)
            server_means(run, before, scrape(args.port), web_cpu_seconds(server) - cpu)
            check_http(run, before_turns)
            return run

        def paired(
            http_name: str, tag: str, groups: list[str], sql_name: str, gmin: int, gmax: int
        ) -> tuple[HttpRun, SqlRun]:
            """The raw SQL and the HTTP run of one scenario, in alternated slices, so that both
            see the same host: a slice of pgbench, then one of HTTP, `slices` times."""
            before_turns, before, cpu = rotation_turns(groups), scrape(args.port), web_cpu_seconds(server)
            sql_parts, http_parts = [], []
            for part in range(slices):
                sql_parts.append(
                    run_pgbench(sql_name, database_url, clients=8, seconds=seconds / slices, gmin=gmin, gmax=gmax)
                )
                http_parts.append(
                    closed_loop(
                        http_name,
                        tag,
                        port=args.port,
                        token=s.token,
                        clients=16,
                        seconds=seconds / slices,
                        groups=groups,
                        part=part,
                    )
                )
            sql, run = sql_merge(sql_name, sql_parts), http_merge(http_name, http_parts)
            server_means(run, before, scrape(args.port), web_cpu_seconds(server) - cpu)
            check_http(run, before_turns)
            check_sql(sql, list(range(gmin, gmax + 1)))
            return run, sql

        print(
            f"running: pgbench and HTTP, {seconds:.0f} s each in {slices} alternated slices; "
            f"paced run {paced_seconds:.0f} s"
        )
        hot, sql_hot = paired(
            "http hot (16 clients)", "bench-hot", [s.hot], "sql hot (8 clients)", s.sql_hot_id, s.sql_hot_id
        )
        spread, sql_spread = paired(
            "http spread (16 clients)",
            "bench-spread",
            s.spread,
            "sql spread (8 clients)",
            s.sql_spread_ids[0],
            s.sql_spread_ids[1],
        )
        before_turns, before, cpu = rotation_turns([s.paced]), scrape(args.port), web_cpu_seconds(server)
        pace = paced(
            "paced 50/s (1 group)",
            "bench-paced",
            port=args.port,
            token=s.token,
            rate=50.0,
            seconds=paced_seconds,
            group=s.paced,
        )
        server_means(pace, before, scrape(args.port), web_cpu_seconds(server) - cpu)
        check_http(pace, before_turns)
        over = http_run("overload (32 clients)", "bench-overload", [s.overload], 32)
        cpu = web_cpu_seconds(server)
        floor = floor_loop(port=args.port, clients=16, seconds=max(2.0, seconds / slices))
        floor.web_cpu_ms = (web_cpu_seconds(server) - cpu) / max(floor.ok + floor.other, 1) * 1000
    finally:
        stop_server(server)

    lines = report([(hot, sql_hot), (spread, sql_spread), (pace, None), (over, None)], [sql_hot, sql_spread])
    lines.append("")
    lines.extend(verdicts(hot, sql_hot, spread, sql_spread, pace, over))
    for run in (hot, spread, pace, over):
        for problem in run.problems + run.failures:
            lines.append(f"  {run.name}: {problem}")
    for sql in (sql_hot, sql_spread):
        for problem in sql.problems:
            lines.append(f"  {sql.name}: {problem}")
    lines.append("")
    lines.append(
        f"floor: GET /healthz (the whole middleware; no validation, no routing, no SQL), 16 clients, "
        f"same gunicorn: {floor.rate:,.0f}/s, {fmt(floor.web_cpu_ms, 2)} ms of web CPU each"
        + (f", {floor.other} not 200" if floor.other else "")
        + f"; half the raw SQL rate over 100 groups is {sql_spread.tps / 2:,.0f}/s"
    )
    lines.append(
        f"gunicorn: {env.get('WEB_WORKERS', 'default')} workers x {env.get('WEB_THREADS', 'default')} threads "
        f"(gunicorn.conf.py); Idempotency-Key: {'yes' if args.idempotency_keys else 'no'}; "
        "lock ms / held ms = mean time to take / hold the rotation row lock, from /metrics; "
        "batch = mean leads per routing transaction; "
        "cpu ms = CPU time of the web processes per request"
    )
    lines.append(f"load after: {uptime()}")
    lines.append(
        f"host speed: a fixed piece of Python took {probe_before:.0f} ms before the runs and "
        f"{host_probe_ms():.0f} ms after (a shared host's speed drifts; see host_probe_ms)"
    )
    print()
    print("\n".join(lines))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "http": [
                        {
                            "name": r.name,
                            "rate": r.rate,
                            "p50_ms": r.pct(0.5),
                            "p99_ms": r.pct(0.99),
                            "statuses": dict(r.statuses),
                            "exact": r.exact,
                            "problems": r.problems,
                            **r.server,
                        }
                        for r in (hot, spread, pace, over)
                    ],
                    "sql": [{"name": r.name, "tps": r.tps, "exact": r.exact} for r in (sql_hot, sql_spread)],
                    "floor": {"rate": floor.rate, "web_cpu_ms": floor.web_cpu_ms, "not_200": floor.other},
                    "uptime": uptime(),
                },
                indent=2,
            )
        )
    exact = all(r.exact for r in (hot, spread, pace, over, sql_hot, sql_spread))
    return 0 if exact else 1


def server_means(run: HttpRun, before: dict[str, float], after: dict[str, float], cpu_seconds: float) -> None:
    def mean(prefix: str) -> float:
        n = after.get(f"{prefix}_count", 0) - before.get(f"{prefix}_count", 0)
        return (after.get(f"{prefix}_sum", 0) - before.get(f"{prefix}_sum", 0)) / n * 1000 if n else float("nan")

    run.server = {
        "lock_ms": mean("leadrouter_rotation_lock_wait_seconds"),
        "held_ms": mean("leadrouter_rotation_lock_held_seconds"),
        # Leads per routing transaction (intake batching; 1 = every lead on its own).
        "batch": mean("leadrouter_intake_batch_size") / 1000,
        "routing_ms": mean("leadrouter_routing_duration_seconds"),
        # CPU of the web processes per request (the scrapes included, a rounding error).
        "web_cpu_ms": cpu_seconds / sum(run.statuses.values()) * 1000 if run.statuses else float("nan"),
    }


if __name__ == "__main__":
    raise SystemExit(main())
