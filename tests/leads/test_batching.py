"""Intake batching (leads/batching.py) on real PostgreSQL with real threads: concurrent intakes
share one routing transaction, and everything recorded is what one-by-one routing gives."""

import threading
import time
from collections import Counter

import pytest
from django.db import OperationalError, connection, connections, transaction

from audit.models import AuditEvent
from leads import batching, services
from leads.models import Assignment, Lead
from rotation import services as rotation_services
from rotation.models import Group, Membership, RotationState
from routing_project import metrics
from tests.conftest import lead_body
from tests.factories import GroupFactory, RepFactory, api_client_with
from tests.leads.test_bulk_import import rotation_row_held
from tests.leads.test_concurrency import fails_once_with, http_client, post, run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]


def batches_seen() -> tuple[float, float]:
    """(batches, leads in them) from the batch size histogram (batches of one included)."""
    samples = {s.name: s.value for metric in metrics.INTAKE_BATCH_SIZE.collect() for s in metric.samples}
    return samples["leadrouter_intake_batch_size_count"], samples["leadrouter_intake_batch_size_sum"]


def post_all(token: str, clients: int, each: int, group: str, prefix: str) -> list[tuple[int, dict]]:
    def worker(i: int) -> list[tuple[int, dict]]:
        c = http_client(token)
        out = []
        for j in range(each):
            r = post(c, {"email": f"{prefix}{i}-{j}@batch.example", "group": group})
            out.append((r.status_code, r.json()))
        return out

    return [item for chunk in run_threads(clients, worker) for item in chunk]


def test_batched_intake_into_one_group_is_exact(make_group):
    group, reps = make_group(5, slug="hot")
    _client, token = api_client_with(["intake"])
    before = batches_seen()

    results = post_all(token, clients=16, each=25, group="hot", prefix="b")

    total = 16 * 25
    batches, batched = (a - b for a, b in zip(batches_seen(), before, strict=True))
    assert batches > 0 and batched > batches  # leads did share transactions
    assert batched == total
    assert Counter(status for status, _ in results) == {201: total}
    assert len({body["id"] for _, body in results}) == total
    leads = list(Lead.objects.filter(group=group).order_by("id"))
    assert len(leads) == total and all(lead.status == "assigned" for lead in leads)
    # Each answer is the lead as stored: same owner.
    owners = {lead.id: lead.owner_id for lead in leads}
    assert all(owners[body["id"]] == body["owner"]["id"] for _, body in results)
    assignments = Counter(Assignment.objects.values_list("lead_id", flat=True))
    assert set(assignments.values()) == {1} and len(assignments) == total
    assert {a.lead_id: a.rep_id for a in Assignment.objects.all()} == owners
    # Strict rotation in id order across batches, an unbroken pointer chain, one event each.
    order = [r.id for r in reps]
    assert [lead.owner_id for lead in leads] == [order[i % 5] for i in range(total)]
    events = sorted(AuditEvent.objects.filter(type="lead.assigned"), key=lambda e: e.lead_id)
    assert [e.lead_id for e in events] == [lead.id for lead in leads]
    for before_event, after_event in zip(events, events[1:], strict=False):
        assert after_event.explanation["pointer_before"] == before_event.explanation["pointer_after"]
    received = Counter(AuditEvent.objects.filter(type="lead.received").values_list("lead_id", flat=True))
    assert received == Counter({lead.id: 1 for lead in leads})
    # Every event carries its own request's id, not its batch leader's.
    assert len(set(AuditEvent.objects.filter(type="lead.assigned").values_list("request_id", flat=True))) == total
    state = RotationState.objects.get(group=group)
    assert state.turns == total
    assert state.pointer == Membership.objects.get(group=group, rep_id=leads[-1].owner_id).position + 1


def test_batched_decisions_count_the_leads_before_them_caps_and_weights(make_group):
    capped, capped_reps = make_group(2, slug="capped")
    Membership.objects.filter(group=capped).update(max_per_day=15)
    weighted = GroupFactory(slug="weighted", strategy="weighted")
    heavy, light = RepFactory(), RepFactory()
    rotation_services.membership_add(group=weighted, rep=heavy, actor="test", weight=3)
    rotation_services.membership_add(group=weighted, rep=light, actor="test", weight=1)
    _client, token = api_client_with(["intake"])

    capped_results = post_all(token, clients=12, each=4, group="capped", prefix="c")
    weighted_results = post_all(token, clients=16, each=10, group="weighted", prefix="w")

    # Caps: exactly 15 each, then the queue, whatever the batches.
    assert Counter(body["status"] for _, body in capped_results) == {"assigned": 30, "queued": 18}
    per_rep = Counter(Lead.objects.filter(group=capped, status="assigned").values_list("owner_id", flat=True))
    assert per_rep == {capped_reps[0].id: 15, capped_reps[1].id: 15}
    # Weights 3:1 exactly over 160 leads (stride scheduling is exact over every window of 4).
    per_rep = Counter(Lead.objects.filter(group=weighted).values_list("owner_id", flat=True))
    assert per_rep == {heavy.id: 120, light.id: 40}
    in_order = list(Lead.objects.filter(group=weighted).order_by("id").values_list("owner_id", flat=True))
    for start in range(0, 160, 4):
        assert Counter(in_order[start : start + 4]) == {heavy.id: 3, light.id: 1}
    assert {status for status, _ in weighted_results} == {201}


def test_a_batch_never_holds_two_leads_of_one_email(make_group):
    make_group(3, slug="g")
    _client, token = api_client_with(["intake"])
    barrier = threading.Barrier(12)

    def worker(i: int):
        c = http_client(token)
        barrier.wait()
        r = post(c, {"email": f"same{i % 3}@batch.example", "group": "g"})
        return r.status_code, r.json()

    results = run_threads(12, worker)
    assert Counter(status for status, _ in results) == {201: 3, 200: 9}
    assert Lead.objects.count() == 3
    first = {body["email"].lower(): body["id"] for status, body in results if status == 201}
    assert all(body["duplicate_of"] == first[body["email"].lower()] for status, body in results if status == 200)


def first_batch_held(monkeypatch) -> tuple[threading.Event, threading.Event, list[int]]:
    """Holds the process's first intake batch until `gate` is set (`entered` says it is held),
    so that the requests sent meanwhile queue up and form the next batch; `sizes` collects
    each batch's size."""
    gate, entered = threading.Event(), threading.Event()
    real_batch = services._intake_batch
    sizes: list[int] = []

    def slow_batch(jobs):
        sizes.append(len(jobs))
        if not entered.is_set():
            entered.set()
            gate.wait(10)
        real_batch(jobs)

    monkeypatch.setattr(
        services, "_combiner_instance", batching.Combiner(slow_batch, max_batch=32, key=lambda j: j.email_normalized)
    )
    return gate, entered, sizes


def seven_posted_in_one_held_batch(monkeypatch, token: str, prefix: str) -> list[int]:
    """Seven leads posted to group "g" while the first routing transaction is held: the
    first goes alone, the six others queue behind it and are routed as one batch."""
    gate, entered, _sizes = first_batch_held(monkeypatch)

    def worker(i: int):
        if i > 0:
            entered.wait(10)
        if i == 6:
            threading.Timer(0.5, gate.set).start()
        r = post(http_client(token), {"email": f"{prefix}{i}@batch.example", "group": "g"})
        return r.status_code

    try:
        return run_threads(7, worker)
    finally:
        gate.set()
        connections.close_all()


def test_a_failing_batch_routes_its_leads_one_by_one(make_group, monkeypatch):
    """A batch whose shared transaction fails for another reason than a busy rotation is
    routed again lead by lead, each in its own transaction: nothing half-written, no lead
    lost or doubled."""
    make_group(2, slug="g")
    _client, token = api_client_with(["intake"])
    calls = Counter()
    real = services._intake_locked_many

    def fail_first(jobs):
        calls["batch"] += 1
        if calls["batch"] == 1:
            real(jobs)  # all its writes happen, then the transaction fails and rolls back
            raise RuntimeError("injected after the writes")
        return real(jobs)

    monkeypatch.setattr(services, "_intake_locked_many", fail_first)
    assert seven_posted_in_one_held_batch(monkeypatch, token, "f") == [201] * 7
    assert calls["batch"] >= 1
    assert Lead.objects.count() == 7 and Assignment.objects.count() == 7
    assert AuditEvent.objects.filter(type="lead.assigned").count() == 7
    assert RotationState.objects.get(group__slug="g").turns == 7


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])  # deadlock detected, serialization failure
def test_a_batch_after_a_deadlock_or_serialization_failure_is_retried_whole(make_group, monkeypatch, sqlstate, caplog):
    """The batch's shared transaction, failing after its writes with an error PostgreSQL says
    to retry, is run again as a batch: every lead routed once, in strict rotation."""
    group, reps = make_group(3, slug="g")
    _client, token = api_client_with(["intake"])
    failing = fails_once_with(sqlstate, services._intake_locked_many)
    monkeypatch.setattr(services, "_intake_locked_many", failing)
    assert seven_posted_in_one_held_batch(monkeypatch, token, "d") == [201] * 7
    assert len(failing.calls) >= 2 and f"routing batch retried after {sqlstate}" in caplog.text
    leads = list(Lead.objects.order_by("id"))
    assert len(leads) == 7 and Assignment.objects.count() == 7
    order = [r.id for r in reps]
    assert [lead.owner_id for lead in leads] == [order[i % 3] for i in range(7)]
    trail = Counter(AuditEvent.objects.filter(lead_id__isnull=False).values_list("lead_id", "type"))
    assert trail == Counter({(lead.id, t): 1 for lead in leads for t in ("lead.received", "lead.assigned")})
    assert RotationState.objects.get(group=group).turns == 7


def test_batches_spanning_groups_keep_each_rotation_strict(make_group):
    groups = {f"s{i}": make_group(3, slug=f"s{i}") for i in range(6)}
    _client, token = api_client_with(["intake"])
    before = batches_seen()

    def worker(i: int) -> list[int]:
        c = http_client(token)
        return [
            post(c, {"email": f"s{i}-{j}@batch.example", "group": f"s{(i + j) % 6}"}).status_code for j in range(24)
        ]

    assert {s for chunk in run_threads(16, worker) for s in chunk} == {201}
    assert batches_seen()[0] > before[0]
    for group, reps in groups.values():
        leads = list(Lead.objects.filter(group=group).order_by("id"))
        assert len(leads) == 64
        order = [r.id for r in reps]
        assert [lead.owner_id for lead in leads] == [order[i % 3] for i in range(64)]
        assert RotationState.objects.get(group=group).turns == 64


def test_requests_with_an_idempotency_key_are_batched_and_replay_their_answer(make_group):
    make_group(3, slug="keyed")
    _client, token = api_client_with(["intake"])
    before = batches_seen()

    def worker(i: int) -> list[tuple[str, int, bytes]]:
        c = http_client(token)
        out = []
        for j in range(10):
            key = f"k{i}-{j}"
            r = post(c, {"email": f"k{i}-{j}@batch.example", "group": "keyed"}, **{"Idempotency-Key": key})
            out.append((key, r.status_code, r.content))
        return out

    first = [item for chunk in run_threads(16, worker) for item in chunk]
    batches, batched = (a - b for a, b in zip(batches_seen(), before, strict=True))
    assert batched == 160 and batches < 160  # some keyed requests shared a transaction
    assert {status for _, status, _ in first} == {201}
    c = http_client(token)
    for key, _status, body in first:
        i, j = key[1:].split("-")
        replay = post(c, {"email": f"k{i}-{j}@batch.example", "group": "keyed"}, **{"Idempotency-Key": key})
        assert (replay.status_code, replay["Idempotent-Replayed"], replay.content) == (200, "true", body)
    assert Lead.objects.count() == 160


def test_an_intake_inside_the_callers_transaction_is_never_batched(make_group, monkeypatch):
    from django.db import transaction

    from tests.conftest import lead_body

    group, _reps = make_group(2, slug="inner")
    monkeypatch.setattr(services, "_combiner", lambda: pytest.fail("batched inside a transaction"))
    with transaction.atomic():
        result = services.lead_intake(
            data=lead_body(), requested=group, client=None, actor="test", render=lambda lead, dup: b"{}"
        )
        transaction.set_rollback(True)
    assert result.status_code == 201
    assert not Lead.objects.exists()  # it rolled back with the caller's transaction


def test_a_group_without_a_rotation_row_gets_one_under_the_lock_alone_or_in_a_batch(make_group):
    """The rotation row is made when missing (then locked, and its members read after that),
    both on the single path and in a batch beside a group that has one."""
    lone, lone_reps = make_group(2)
    fresh, fresh_reps = make_group(2)
    other, other_reps = make_group(2)
    RotationState.objects.filter(group__in=[lone, fresh]).delete()

    _client, token = api_client_with(["intake"])
    r = post(http_client(token), {"email": "lone@batch.example", "group": lone.slug})
    assert r.status_code == 201 and r.json()["owner"]["id"] == lone_reps[0].id

    jobs = []
    for target in (fresh, other, fresh):
        data = lead_body()
        resolution = services.lead_resolve_group(data=data, requested=target)
        jobs.append(services.IntakeJob(data, data, target, resolution, None, "test", "", data["email"]))
    with transaction.atomic():
        results = services._intake_locked_many(jobs)
    assert [r.status_code for r in results] == [201] * 3
    assert [r.lead.owner_id for r in results] == [fresh_reps[0].id, other_reps[0].id, fresh_reps[1].id]
    turns = dict(RotationState.objects.values_list("group_id", "turns"))
    assert (turns[lone.id], turns[fresh.id], turns[other.id]) == (1, 2, 1)


def test_a_busy_rotation_refuses_only_its_own_leads_in_a_batch(make_group, settings, monkeypatch):
    """A batch holding leads of a group whose rotation row stays locked and of a free group:
    the busy group's leads get 503 and nothing of them is written; the free group's leads are
    routed, not refused for another group's lock."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    busy, _ = make_group(2, slug="busy")
    make_group(2, slug="free")
    _client, token = api_client_with(["intake"])
    gate, entered, sizes = first_batch_held(monkeypatch)

    def worker(i: int):
        if i > 0:
            entered.wait(10)
        if i == 6:
            threading.Timer(0.5, gate.set).start()
        group = "free" if i == 0 or i % 2 else "busy"
        r = post(http_client(token), {"email": f"b{i}@batch.example", "group": group})
        return group, r.status_code, r.get("Retry-After")

    with rotation_row_held(busy):
        try:
            outcomes = run_threads(7, worker)
        finally:
            gate.set()
    connections.close_all()
    assert max(sizes) > 1  # the busy and the free group's leads did share a batch
    assert sorted(o for o in outcomes if o[0] == "busy") == [("busy", 503, "1")] * 3
    assert [o[1] for o in outcomes if o[0] == "free"] == [201] * 4
    assert not Lead.objects.filter(group=busy).exists()
    assert Lead.objects.filter(group__slug="free").count() == 4
    assert AuditEvent.objects.filter(type="lead.assigned").count() == 4
    assert RotationState.objects.get(group=busy).turns == 0


def test_a_request_waiting_behind_a_busy_batch_is_answered_within_its_lock_timeout(make_group, settings):
    """Requests queued in the process behind a batch that waits for a locked rotation row
    have been waiting all along: their own batch waits only what is left of their lock
    timeout, so each gets its 503 about one lock timeout after it came, not one more whole
    timeout per batch ahead of it."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 1000
    busy, _ = make_group(2, slug="busy")
    _client, token = api_client_with(["intake"])

    def worker(i: int):
        if i > 0:
            time.sleep(0.2)  # while the first request's batch waits for the row
        started = time.monotonic()
        r = post(http_client(token), {"email": f"w{i}@batch.example", "group": "busy"})
        return r.status_code, time.monotonic() - started

    with rotation_row_held(busy):
        outcomes = run_threads(4, worker)
    connections.close_all()
    assert [status for status, _ in outcomes] == [503] * 4
    assert max(elapsed for _, elapsed in outcomes) < 1.5, outcomes  # not 1.8 s: 0.2 s early + 1 s + 1 s
    assert not Lead.objects.exists()


def test_a_request_behind_another_waiter_gets_its_503_after_one_lock_timeout(make_group, settings):
    """PostgreSQL counts lock_timeout per lock it waits for: a request queued behind another
    waiter for the rotation row waits first for that waiter's place, then for the holder. The
    whole wait stays within the lock timeout."""
    settings.ROUTING_LOCK_TIMEOUT_MS = 1000
    busy, _ = make_group(2, slug="busy")
    _client, token = api_client_with(["intake"])
    queued = threading.Event()

    def wait_a_while() -> None:  # another waiter for the row, ahead of the request, gives up at 0.6 s
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '600ms'")
                queued.set()
                cursor.execute("SELECT 1 FROM rotation_rotationstate WHERE group_id = %s FOR UPDATE", [busy.id])
        except OperationalError:
            pass
        finally:
            connections.close_all()

    other = threading.Thread(target=wait_a_while)
    with rotation_row_held(busy):
        other.start()
        assert queued.wait(10)
        time.sleep(0.1)
        started = time.monotonic()
        r = post(http_client(token), {"email": "late@batch.example", "group": "busy"})
        elapsed = time.monotonic() - started
    other.join(10)
    assert (r.status_code, r["Retry-After"]) == (503, "1")
    assert elapsed < 1.3, elapsed  # not 1.5 s: 0.5 s behind the other waiter, then 1 s again
    assert not Lead.objects.exists()


def test_a_group_made_outside_the_services_has_its_rotation_row_from_the_start():
    """A group made in a shell or a data migration had no rotation row until its first lead
    made one, after a batch had locked the rotation rows of higher groups: out of the lock
    order, a deadlock with another batch. The group's save makes the row with the group."""
    group = Group.objects.create(slug="shell-made", name="Shell made")
    assert RotationState.objects.filter(group=group, pointer=0, turns=0).exists()
    group.name = "Renamed"
    group.save()  # an edit leaves the row as it is
    assert RotationState.objects.filter(group=group).count() == 1
