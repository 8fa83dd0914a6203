"""Concurrency on real PostgreSQL with real threads and processes; invariants over everything recorded."""

import http.client
import json
import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections, transaction
from django.test import Client

from audit.models import AuditEvent
from leads.models import Assignment, IdempotencyRecord, Lead
from rotation.models import Membership, RotationState
from tests.factories import api_client_with
from tests.ops.webserver import gunicorn, live_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


def run_threads(n: int, target) -> list:
    results: list = [None] * n
    errors: list = []

    def wrap(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def http_client(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client: Client, body: dict, **headers):
    return client.post("/api/v1/leads/", body, content_type="application/json", headers=headers)


def waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def test_concurrent_intake_into_one_group_is_exact(make_group):
    clients, leads_each = 8, 50
    group, reps = make_group(5, slug="hot")
    _client, token = api_client_with(["intake", "read"])

    def worker(i: int) -> list[tuple[int, dict]]:
        c = http_client(token)
        out = []
        for j in range(leads_each):
            # A well-behaved client: on 503 it waits Retry-After and retries with the same key.
            for _attempt in range(20):
                r = post(c, {"email": f"t{i}-{j}@load.example", "group": "hot"}, **{"Idempotency-Key": f"{i}-{j}"})
                if r.status_code != 503:
                    break
                time.sleep(float(r["Retry-After"]) / 10)
            out.append((r.status_code, r.json()))
        return out

    results = [item for chunk in run_threads(clients, worker) for item in chunk]
    total = clients * leads_each
    assert Counter(status for status, _ in results) == {201: total}
    ids = {body["id"] for _, body in results}
    assert len(ids) == total  # no lost lead, no double-created lead

    check_exact_rotation(group, reps, total)


def check_exact_rotation(group, reps, total: int) -> None:
    """Invariants over everything recorded for `total` leads posted into a round-robin group."""
    leads = list(Lead.objects.filter(group=group).order_by("id"))
    ids = [lead.id for lead in leads]
    assert len(leads) == total and all(lead.status == "assigned" for lead in leads)
    # No lead with two owners: exactly one assignment each, open, matching the owner.
    assignments = Counter(Assignment.objects.filter(group=group).values_list("lead_id", flat=True))
    assert assignments == Counter(ids)
    assert not Assignment.objects.filter(lead_id__in=ids).exclude(rep_id=models_owner()).exists()
    # Exact rotation: equal weights, counts differ by at most 1 (here exactly equal).
    per_rep = Counter(lead.owner_id for lead in leads)
    assert set(per_rep) == {r.id for r in reps}
    assert max(per_rep.values()) - min(per_rep.values()) <= 1
    # Leads were numbered inside the lock, so in id order the rotation is strict.
    order = [r.id for r in reps]
    assert [lead.owner_id for lead in leads] == [order[i % len(order)] for i in range(total)]
    # One decision, one trail per lead: received then assigned, nothing else, nothing twice.
    trail: dict[int, list[str]] = {}
    for lead_id, type_ in AuditEvent.objects.filter(lead_id__in=ids).order_by("id").values_list("lead_id", "type"):
        trail.setdefault(lead_id, []).append(type_)
    assert trail == {lead.id: ["lead.received", "lead.assigned"] for lead in leads}
    # The pointer chain is unbroken.
    events = list(AuditEvent.objects.filter(type="lead.assigned", lead_id__in=ids).order_by("id"))
    by_lead = sorted(events, key=lambda e: e.lead_id)
    for before, after in zip(by_lead, by_lead[1:], strict=False):
        assert after.explanation["pointer_before"] == before.explanation["pointer_after"]
    state = RotationState.objects.get(group=group)
    assert state.turns == total
    assert state.pointer == Membership.objects.get(group=group, rep_id=leads[-1].owner_id).position + 1


def test_concurrent_intake_into_one_group_from_many_processes_is_exact(make_group, tmp_path):
    """Several gunicorn processes: the threads of one process share a routing transaction
    (leads/batching.py), so only separate processes contend for the group's rotation row, and
    only the row lock keeps them from deciding from the same pointer."""
    clients, leads_each = 9, 30
    group, reps = make_group(4, slug="hot")
    _client, token = api_client_with(["intake"])
    env = {"DATABASE_URL": live_database_url(), "WEB_WORKERS": "3", "WEB_THREADS": "3", "DB_POOL_MAX_SIZE": "2"}

    with gunicorn(tmp_path, **env) as server:

        def worker(i: int) -> list[tuple[int, dict]]:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            out = []
            try:
                for j in range(leads_each):
                    body = json.dumps({"email": f"p{i}-{j}@load.example", "group": "hot"})
                    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                    headers["Idempotency-Key"] = f"{i}-{j}"
                    for _attempt in range(20):  # on 503: wait Retry-After, retry with the same key
                        conn.request("POST", "/api/v1/leads/", body, headers)
                        response = conn.getresponse()
                        status, content = response.status, response.read()
                        if status != 503:
                            break
                        time.sleep(float(response.getheader("Retry-After")) / 10)
                    out.append((status, json.loads(content)))
            finally:
                conn.close()
            return out

        results = [item for chunk in run_threads(clients, worker) for item in chunk]
        log = server.log_tail()

    total = clients * leads_each
    assert Counter(status for status, _ in results) == {201: total}, log
    assert len({body["id"] for _, body in results}) == total
    check_exact_rotation(group, reps, total)


def models_owner():
    from django.db.models import OuterRef, Subquery

    return Subquery(Lead.objects.filter(pk=OuterRef("lead_id")).values("owner_id")[:1])


def test_concurrent_intake_over_many_groups(make_group):
    groups = [make_group(3, slug=f"g{i}") for i in range(6)]
    _client, token = api_client_with(["intake"])

    def worker(i: int) -> list[int]:
        c = http_client(token)
        return [post(c, {"email": f"m{i}-{j}@load.example", "group": f"g{j % 6}"}).status_code for j in range(30)]

    statuses = [s for chunk in run_threads(8, worker) for s in chunk]
    assert set(statuses) == {201}
    for group, reps in groups:
        check_exact_rotation(group, reps, 40)


def hold_rotation_lock(group_id: int, locked: threading.Event, release: threading.Event) -> None:
    with transaction.atomic():
        RotationState.objects.select_for_update().get(group_id=group_id)
        locked.set()
        release.wait(30)


def request_waits_for_the_lock() -> None:
    """Returns once a request waits on a lock; fails if none does within 10 s (the change
    made next would otherwise come before the request, and the test would prove nothing)."""
    deadline = time.monotonic() + 10
    while waiting_on_locks() < 1:
        assert time.monotonic() < deadline, "the request never waited for the rotation row"
        time.sleep(0.02)


def test_eligibility_is_read_after_the_lock(make_group):
    """A rep paused while a request waits for the lock does not get the lead."""
    group, (a, b, c) = make_group(3, slug="g")
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        hold_rotation_lock(group.id, locked, release)

    def requester(_: int) -> None:
        locked.wait(10)
        r = post(http_client(token), {"email": "waiting@x.example", "group": "g"})
        outcome["status"], outcome["body"] = r.status_code, r.json()

    def controller(_: int) -> None:
        locked.wait(10)
        try:
            request_waits_for_the_lock()
            # The request is now queued on the rotation row: pause the rep who is next.
            Membership.objects.filter(group=group, rep=a).update(active=False)
        finally:
            release.set()

    def dispatch(i: int) -> None:
        (holder, requester, controller)[i](i)

    run_threads(3, dispatch)
    assert outcome["status"] == 201
    assert outcome["body"]["owner"]["id"] == b.id


def test_lock_timeout_gives_503_and_writes_nothing(make_group, settings):
    from tests.ops.test_metrics import scrape, value

    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group, reps = make_group(2, slug="g")
    before = scrape()
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        hold_rotation_lock(group.id, locked, release)

    def requester(_: int) -> None:
        locked.wait(10)
        started = time.monotonic()
        r = post(http_client(token), {"email": "late@x.example", "group": "g"}, **{"Idempotency-Key": "k-503"})
        outcome["elapsed"] = time.monotonic() - started
        outcome["response"] = r
        release.set()

    run_threads(2, lambda i: (holder, requester)[i](i))
    r = outcome["response"]
    assert r.status_code == 503
    assert r["Retry-After"] == "1"
    assert outcome["elapsed"] < 5
    assert Lead.objects.count() == 0 and Assignment.objects.count() == 0
    assert not AuditEvent.objects.filter(lead_id__isnull=False).exists()
    assert not IdempotencyRecord.objects.exists()  # released: the client may retry with the key
    assert RotationState.objects.get(group=group).turns == 0
    # The operator sees it: the refusal is counted, and so is the wait that ended in it.
    after = scrape()
    assert (
        value(after, "leadrouter_routing_busy_total", group="g")
        - value(before, "leadrouter_routing_busy_total", group="g")
        == 1
    )
    waits = "leadrouter_rotation_lock_wait_seconds"
    assert value(after, f"{waits}_count") - value(before, f"{waits}_count") == 1
    assert value(after, f"{waits}_sum") - value(before, f"{waits}_sum") >= 0.2  # most of its 300 ms
    # The routing time counts the refused intake too, with its wait: its p99 must not improve
    # as a group overloads.
    routing = "leadrouter_routing_duration_seconds"
    assert value(after, f"{routing}_count") - value(before, f"{routing}_count") == 1
    assert value(after, f"{routing}_sum") - value(before, f"{routing}_sum") >= 0.2
    r = post(http_client(token), {"email": "late@x.example", "group": "g"}, **{"Idempotency-Key": "k-503"})
    assert r.status_code == 201


def test_a_held_email_lock_past_the_timeout_gives_503_and_writes_nothing(make_group, settings):
    """The email's lock (taken with the dedup check in one round trip) obeys the lock timeout
    too: 503 with Retry-After, nothing written, and the same post succeeds afterwards."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    make_group(2, slug="g")
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["held@x.example"])
            locked.set()
            release.wait(30)

    def requester(_: int) -> None:
        locked.wait(10)
        outcome["response"] = post(http_client(token), {"email": "Held@x.example", "group": "g"})
        release.set()

    run_threads(2, lambda i: (holder, requester)[i](i))
    r = outcome["response"]
    assert r.status_code == 503 and r["Retry-After"] == "1"
    assert Lead.objects.count() == 0 and Assignment.objects.count() == 0
    assert RotationState.objects.get(group__slug="g").turns == 0
    assert post(http_client(token), {"email": "held@x.example", "group": "g"}).status_code == 201


def test_concurrent_requests_with_one_key_create_one_lead(make_group):
    make_group(3, slug="g")
    _client, token = api_client_with(["intake"])
    body = {"email": "same-key@x.example", "group": "g"}
    barrier = threading.Barrier(8)

    def worker(_: int) -> tuple[int, bytes, str | None]:
        c = http_client(token)
        barrier.wait()
        r = post(c, body, **{"Idempotency-Key": "one-key"})
        return r.status_code, r.content, r.headers.get("Idempotent-Replayed")

    results = run_threads(8, worker)
    statuses = Counter(s for s, _, _ in results)
    assert statuses[201] == 1
    assert set(statuses) <= {201, 200, 409}
    created = next(content for s, content, _ in results if s == 201)
    assert all(content == created and replayed == "true" for s, content, replayed in results if s == 200)
    assert Lead.objects.count() == 1 and Assignment.objects.count() == 1
    # One decision: one trail, one turn of the rotation.
    assert list(AuditEvent.objects.filter(lead_id__isnull=False).order_by("id").values_list("type", flat=True)) == [
        "lead.received",
        "lead.assigned",
    ]
    assert RotationState.objects.get(group__slug="g").turns == 1


def test_concurrent_posts_of_one_email_make_one_lead(make_group):
    make_group(3, slug="g")
    _client, token = api_client_with(["intake"])
    barrier = threading.Barrier(8)

    def worker(i: int) -> tuple[int, dict]:
        c = http_client(token)
        barrier.wait()
        r = post(c, {"email": "Dup@X.example", "group": "g", "external_id": str(i)})
        return r.status_code, r.json()

    results = run_threads(8, worker)
    assert Counter(s for s, _ in results) == {201: 1, 200: 7}
    lead_id = next(body["id"] for s, body in results if s == 201)
    assert all(body["duplicate_of"] == lead_id for s, body in results if s == 200)
    assert Lead.objects.count() == 1
    assert AuditEvent.objects.filter(type="lead.duplicate", lead_id=lead_id).count() == 7
    assert RotationState.objects.get(group__slug="g").turns == 1


def test_group_deactivated_while_waiting_for_the_lock_queues_the_lead(make_group):
    group, reps = make_group(2, slug="g")
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        hold_rotation_lock(group.id, locked, release)

    def requester(_: int) -> None:
        locked.wait(10)
        r = post(http_client(token), {"email": "waiting@x.example", "group": "g"})
        outcome["body"] = r.json()

    def controller(_: int) -> None:
        locked.wait(10)
        try:
            request_waits_for_the_lock()
            type(group).objects.filter(pk=group.pk).update(active=False)
        finally:
            release.set()

    run_threads(3, lambda i: (holder, requester, controller)[i](i))
    assert outcome["body"]["status"] == "queued" and "inactive" in outcome["body"]["queue_reason"]


def test_a_connection_dropped_during_intake_leaves_the_key_free_for_the_retry(make_group, monkeypatch, settings):
    """PostgreSQL restarted (here: the request's connection terminated) after the key was
    claimed, before the lead was written: the 503 says retry in 2 s, and the retry must not
    find the key 'still in flight' (409) for the minute it takes to go stale."""
    from routing_project import configcache
    from tests.ops.test_pool_check import drop_connection_before_intake

    settings.INTAKE_BATCH_MAX = 1  # routed on this request's connection, the one dropped
    configcache.clear()  # not answered again under a newer configuration: the 503 stands
    make_group(2, slug="g")
    _client, token = api_client_with(["intake"])
    dropped = drop_connection_before_intake(monkeypatch)
    body = {"email": "restart@x.example", "group": "g"}
    first = post(http_client(token), body, **{"Idempotency-Key": "k-restart"})
    assert first.status_code == 503 and first["Retry-After"], first.content
    connection.close()  # this thread's connection is the request's: the dead one
    assert dropped and not IdempotencyRecord.objects.exists()
    retry = post(http_client(token), body, **{"Idempotency-Key": "k-restart"})
    assert retry.status_code == 201, retry.content
    assert Lead.objects.count() == 1


def fails_once_with(sqlstate: str, original):
    """`original`, whose transaction then fails once with PostgreSQL's `sqlstate` (after its
    writes, as a deadlock or a serialization failure found at the next statement would)."""
    calls = []

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(sqlstate)
        if len(calls) == 1:
            with connection.cursor() as cursor:
                cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$")
        return result

    wrapped.calls = calls  # type: ignore[attr-defined]
    return wrapped


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])  # deadlock detected, serialization failure
def test_intake_after_a_deadlock_or_serialization_failure_is_retried_whole(make_group, monkeypatch, sqlstate, caplog):
    from leads import services

    group, reps = make_group(2, slug="g")
    _client, token = api_client_with(["intake", "read"])
    failing = fails_once_with(sqlstate, services._routed_announce)
    monkeypatch.setattr(services, "_routed_announce", failing)
    r = post(http_client(token), {"email": "retried@x.example", "group": "g"}, **{"Idempotency-Key": "k-retry"})
    assert r.status_code == 201, r.content
    assert len(failing.calls) == 2 and f"retried after {sqlstate}" in caplog.text
    # The failed attempt left nothing behind: one lead, one assignment, one trail, one turn.
    (lead,) = Lead.objects.all()
    assert r.json()["id"] == lead.id and lead.owner_id == reps[0].id
    assert list(Assignment.objects.values_list("lead_id", "rep_id")) == [(lead.id, reps[0].id)]
    trail = list(AuditEvent.objects.filter(lead_id__isnull=False).order_by("id").values_list("lead_id", "type"))
    assert trail == [(lead.id, "lead.received"), (lead.id, "lead.assigned")]
    assert RotationState.objects.get(group=group).turns == 1
    replay = post(http_client(token), {"email": "retried@x.example", "group": "g"}, **{"Idempotency-Key": "k-retry"})
    assert replay.status_code == 200 and replay.content == r.content


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_managers_action_after_a_deadlock_or_serialization_failure_is_retried_whole(
    make_group, monkeypatch, sqlstate, caplog
):
    from leads import actions

    group, reps = make_group(3, slug="g")
    _client, token = api_client_with(["intake", "manage"])
    lead_id = post(http_client(token), {"email": "moved@x.example", "group": "g"}).json()["id"]
    failing = fails_once_with(sqlstate, actions.audit_record_many)
    monkeypatch.setattr(actions, "audit_record_many", failing)
    r = http_client(token).post(
        f"/api/v1/leads/{lead_id}/reassign/", {"rep": reps[2].id, "reason": "by hand"}, content_type="application/json"
    )
    assert r.status_code == 200, r.content
    assert len(failing.calls) == 2 and f"retried after {sqlstate}" in caplog.text
    assert Lead.objects.get(pk=lead_id).owner_id == reps[2].id
    rows = list(Assignment.objects.filter(lead_id=lead_id).order_by("attempt").values_list("rep_id", "ended_at"))
    assert [rep for rep, _ in rows] == [reps[0].id, reps[2].id] and rows[0][1] is not None and rows[1][1] is None
    assert AuditEvent.objects.filter(lead_id=lead_id, type="lead.reassigned").count() == 1
    assert RotationState.objects.get(group=group).turns == 1  # a reassign never moves the pointer


@pytest.mark.parametrize(
    "action, body",
    [("reassign", lambda reps: {"rep": reps[1].id, "reason": "by hand"}), ("reroute", lambda reps: {})],
    ids=["reassign", "reroute"],
)
def test_a_managers_action_on_a_held_rotation_row_is_a_503_and_changes_nothing(make_group, settings, action, body):
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group, reps = make_group(2, slug="g")
    _client, token = api_client_with(["intake", "manage"])
    lead_id = post(http_client(token), {"email": "held@x.example", "group": "g"}).json()["id"]
    before = (list(Assignment.objects.values_list("id", "rep_id", "ended_at")), AuditEvent.objects.count())
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        hold_rotation_lock(group.id, locked, release)

    def manager(_: int) -> None:
        locked.wait(10)
        try:
            started = time.monotonic()
            outcome["response"] = http_client(token).post(
                f"/api/v1/leads/{lead_id}/{action}/", body(reps), content_type="application/json"
            )
            outcome["elapsed"] = time.monotonic() - started
        finally:
            release.set()

    run_threads(2, lambda i: (holder, manager)[i](i))
    r = outcome["response"]
    assert (r.status_code, r["Retry-After"]) == (503, "1"), r.content
    assert "busy" in r.json()["detail"] and outcome["elapsed"] < 5
    assert Lead.objects.get(pk=lead_id).owner_id == reps[0].id
    assert (list(Assignment.objects.values_list("id", "rep_id", "ended_at")), AuditEvent.objects.count()) == before
    again = http_client(token).post(f"/api/v1/leads/{lead_id}/{action}/", body(reps), content_type="application/json")
    assert again.status_code == 200, again.content


def test_a_wait_given_up_at_the_lock_timeout_falls_in_a_bucket_of_its_own(make_group, settings):
    """The lock wait histogram ended at 2 s, the default lock timeout: a wait that ends in a
    503 takes about the timeout (counted from the request's arrival: a little under it, or over
    it by PostgreSQL's lateness), and one over it fell in +Inf with any longer one. It has
    buckets of its own now, and is counted once."""
    from tests.ops.test_metrics import scrape, value

    settings.ROUTING_LOCK_TIMEOUT_MS = 2000  # the default (the test settings' is 5000)
    group, _reps = make_group(1, slug="g")
    before = scrape()
    _client, token = api_client_with(["intake"])
    locked, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder(_: int) -> None:
        hold_rotation_lock(group.id, locked, release)

    def requester(_: int) -> None:
        locked.wait(10)
        outcome["response"] = post(http_client(token), {"email": "late@x.example", "group": "g"})
        release.set()

    run_threads(2, lambda i: (holder, requester)[i](i))
    assert outcome["response"].status_code == 503
    after = scrape()
    waits = "leadrouter_rotation_lock_wait_seconds"

    def given_up_below(le: str) -> float:
        return value(after, f"{waits}_bucket", le=le) - value(before, f"{waits}_bucket", le=le)

    assert given_up_below("+Inf") == 1
    assert given_up_below("1.0") == 0 and given_up_below("2.5") == 1
