"""Intake, manager actions, escalations, queue drains and configuration changes all at once,
on real PostgreSQL with real threads; invariants over everything recorded (SPEC 10)."""

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from leads import actions, bulk, routing, routing_sql
from leads.models import OPEN_STATUSES, Assignment, Lead, LeadStatus
from leads.routing import RoutingBusy
from rotation import services
from rotation.models import Absence, Account, Group, Membership, Rep, RotationState
from tests.factories import api_client_with

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("concurrency")]

EXPECTED = (actions.LeadConflict, actions.ActionRejected, RoutingBusy, Lead.DoesNotExist)


def run_all(targets: list) -> None:
    errors: list = []

    def wrap(target) -> None:
        try:
            target()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_intake_while_everything_else_happens(make_group, strategy):
    group, reps = make_group(5, slug="mix", strategy=strategy, sla_minutes=Decimal("0.01"), max_attempts=3)
    capped, uncapped = reps[:3], reps[3:]
    for rep in capped:
        member = Membership.objects.get(group=group, rep=rep)
        member.max_open, member.max_per_day = 4, 40
        services.membership_update(membership=member, actor="test", changed=["max_open", "max_per_day"])
    # Every third lead is from an account a capped rep owns: owner matches beside the rotation.
    services.account_save(account=Account(domain="dup.example", owner=capped[0]), actor="test")
    _client, token = api_client_with(["intake", "read", "manage"])
    stop = threading.Event()
    statuses: Counter = Counter()
    # Windows during which a rep was ineligible: (the change had committed by then, the id of
    # the audit event of the change that undid it).
    paused: dict[int, list[tuple]] = defaultdict(list)
    away: dict[int, list[tuple]] = defaultdict(list)
    inactive: dict[int, list[tuple]] = defaultdict(list)
    closed: list[tuple] = []  # the group deactivated
    lock = threading.Lock()

    def last_event_of(rep: Rep) -> int:
        # The change that undid the window: the rep's last configuration event. Not any event
        # of the rep: a lead given to it just after the undo, before this read, would widen
        # the window over a decision that rightly saw the rep back.
        configuration = AuditEvent.objects.filter(rep_id=rep.id).exclude(type__startswith="lead.")
        return configuration.order_by("-id").values_list("id", flat=True)[0]

    def intake(i: int):
        def run() -> None:
            api = APIClient()
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            rng = random.Random(i)
            for j in range(50):
                # A few addresses posted by every thread at once: one lead each while open.
                email = f"same{rng.randrange(6)}@dup.example" if j % 3 == 0 else f"t{i}-{j}@load.example"
                r = api.post("/api/v1/leads/", {"email": email, "group": "mix"}, format="json")
                with lock:
                    statuses[r.status_code] += 1

        return run

    def open_lead_ids() -> list[int]:
        return list(Lead.objects.filter(group=group, status__in=OPEN_STATUSES).values_list("id", flat=True)[:200])

    def manager() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            ids = open_lead_ids() or [0]
            queued = list(Lead.objects.filter(status=LeadStatus.QUEUED).values_list("id", flat=True)[:50]) or [0]
            what = rng.choice(["close", "reassign", "reroute", "accept", "close_queued", "reassign_queued"])
            try:
                if what == "close":
                    actions.lead_close(lead_id=rng.choice(ids), outcome="won", actor="test")
                elif what == "close_queued":
                    actions.lead_close(lead_id=rng.choice(queued), outcome="lost", actor="test", only_queued=True)
                elif what in ("reassign", "reassign_queued"):
                    # Only to reps without caps: a manual reassign may exceed a cap.
                    lead_id = rng.choice(ids if what == "reassign" else queued)
                    actions.lead_reassign(lead_id=lead_id, rep_id=rng.choice(uncapped).id, reason="t", actor="test")
                elif what == "reroute":
                    actions.lead_reroute(lead_id=rng.choice(ids + queued), actor="test")
                else:
                    lead = Lead.objects.filter(pk=rng.choice(ids)).first()
                    if lead is not None and lead.owner_id is not None:
                        actions.lead_accept(lead_id=lead.id, rep_id=lead.owner_id, actor="test")
            except EXPECTED:
                pass
            time.sleep(0.005)

    def escalator() -> None:
        while not stop.is_set():
            tally = actions.escalation_sweep()
            assert "failed" not in tally, tally  # the sweep logs and swallows what fails
            due = Assignment.objects.filter(ended_at__isnull=True, due_at__lte=timezone.now()).values_list(
                "id", flat=True
            )[:5]
            for assignment_id in due:
                actions.lead_escalate(assignment_id=assignment_id)
            time.sleep(0.01)

    def drainer() -> None:
        while not stop.is_set():
            actions.queue_drain(group_id=group.id)
            time.sleep(0.02)

    def configurer() -> None:
        rng = random.Random(2)
        removed: Rep | None = None
        while not stop.is_set():
            rep = rng.choice(reps)
            what = rng.choice(["pause", "absence", "deactivate", "remove", "cap", "group"])
            if what == "pause":
                member = Membership.objects.filter(group=group, rep=rep, active=True).first()
                if member is None:
                    continue
                member.active = False
                services.membership_update(membership=member, actor="test", changed=["active"])
                since = timezone.now()
                time.sleep(rng.uniform(0.01, 0.1))
                member.active = True
                services.membership_update(membership=member, actor="test", changed=["active"])
                paused[rep.id].append((since, last_event_of(rep)))
            elif what == "absence":
                now = timezone.now()
                absence = Absence(rep=rep, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1))
                services.absence_add(absence=absence, actor="test")
                since = timezone.now()
                time.sleep(rng.uniform(0.01, 0.1))
                services.absence_remove(absence=absence, actor="test")
                away[rep.id].append((since, last_event_of(rep)))
            elif what == "deactivate":
                rep = Rep.objects.get(pk=rep.pk)
                rep.active = False
                services.rep_save(rep=rep, actor="test", changed=["active"])
                since = timezone.now()
                time.sleep(rng.uniform(0.01, 0.1))
                rep.active = True
                services.rep_save(rep=rep, actor="test", changed=["active"])
                inactive[rep.id].append((since, last_event_of(rep)))
            elif what == "group":
                changed = Group.objects.get(pk=group.pk)
                changed.active = False
                services.group_save(group=changed, actor="test", changed=["active"])
                since = timezone.now()
                time.sleep(rng.uniform(0.01, 0.05))
                changed.active = True
                services.group_save(group=changed, actor="test", changed=["active"])
                last = AuditEvent.objects.filter(type="group.changed").order_by("-id").values_list("id", flat=True)[0]
                closed.append((since, last))
            elif what == "remove" and rep in uncapped:
                member = Membership.objects.filter(group=group, rep=rep).first()
                if member is not None and removed is None:
                    services.membership_remove(membership=member, actor="test")
                    removed = rep
                elif removed is not None:
                    services.membership_add(group=group, rep=removed, actor="test")
                    removed = None
            elif what == "cap" and rep in capped:
                # Raised only: a cap lowered below a rep's open leads is exceeded legitimately.
                member = Membership.objects.get(group=group, rep=rep)
                member.max_open = (member.max_open or 0) + 1
                services.membership_update(membership=member, actor="test", changed=["max_open"])
            time.sleep(0.005)

    def open_sampler() -> None:
        """In one snapshot: no capped rep over max_open (caps are only raised here)."""
        while not stop.is_set():
            rows = Membership.objects.filter(group=group, max_open__isnull=False).values_list("rep_id", "max_open")
            caps = dict(rows)
            counts = Counter(
                Lead.objects.filter(group=group, status__in=OPEN_STATUSES, owner_id__in=caps).values_list(
                    "owner_id", flat=True
                )
            )
            for rep_id, n in counts.items():
                assert n <= caps[rep_id], (rep_id, n, caps[rep_id])
            time.sleep(0.02)

    def intakes_then_stop() -> None:
        try:
            run_all([intake(i) for i in range(4)])
        finally:
            stop.set()

    run_all([intakes_then_stop, manager, escalator, drainer, configurer, open_sampler])

    # Every request answered: created or a duplicate, never a 5xx.
    assert set(statuses) <= {200, 201}, statuses
    check_invariants(group, paused=paused, away=away, inactive=inactive, closed=closed)


def check_invariants(group, *, paused, away, inactive, closed) -> None:
    leads = {lead.id: lead for lead in Lead.objects.all()}
    assignments = list(Assignment.objects.order_by("id"))
    open_by_lead: dict[int, list[Assignment]] = defaultdict(list)
    for a in assignments:
        if a.ended_at is None:
            open_by_lead[a.lead_id].append(a)
    for lead in leads.values():
        opened = open_by_lead.get(lead.id, [])
        assert len(opened) <= 1, (lead.id, opened)
        if lead.status in OPEN_STATUSES:
            assert opened and lead.owner_id == opened[0].rep_id, lead.id
        else:
            assert not opened, lead.id
        if lead.status == LeadStatus.QUEUED:
            assert lead.queue_reason, lead.id
        assert lead.status in LeadStatus.values

    # One address, one lead waiting or open at a time.
    waiting = Counter(
        Lead.objects.filter(status__in=[*OPEN_STATUSES, LeadStatus.QUEUED]).values_list("email_normalized", flat=True)
    )
    assert max(waiting.values()) == 1, waiting.most_common(3)

    events = list(AuditEvent.objects.order_by("id"))
    received = Counter(e.lead_id for e in events if e.type == "lead.received")
    assert received == Counter(dict.fromkeys(leads, 1))
    decided = Counter(
        e.lead_id for e in events if e.type in ("lead.assigned", "lead.queued") and e.actor != "system:queue"
    )
    assert decided == Counter(dict.fromkeys(leads, 1))

    # Every assignment is one audited decision, and the other way round (a reroute that found
    # the lead with the rep it would go to kept that assignment: no new one).
    def gave(e: AuditEvent) -> bool:
        return e.type == "lead.assigned" or (
            e.type in ("lead.escalated", "lead.rerouted", "lead.reassigned")
            and e.rep_id is not None
            and not e.explanation.get("unchanged")
        )

    audited = Counter()
    for e in events:
        if gave(e):
            audited[(e.lead_id, e.rep_id)] += 1
    assert Counter((a.lead_id, a.rep_id) for a in assignments) == audited

    # Never to a rep known ineligible when deciding (manual assignments aside): a decision
    # whose transaction began after the change committed, and whose audit event was written
    # before the change that undid it was, read the rep ineligible.
    decisions: dict[int, list[AuditEvent]] = defaultdict(list)
    for e in events:
        if gave(e):
            decisions[e.lead_id].append(e)
    by_lead: dict[int, list[Assignment]] = defaultdict(list)
    for a in assignments:
        by_lead[a.lead_id].append(a)
    turned: set[int] = set()  # the decisions that took a rotation turn
    for lead_id, made in by_lead.items():
        for a, e in zip(sorted(made, key=lambda a: a.attempt), decisions[lead_id], strict=True):
            assert a.rep_id == e.rep_id, (a.id, e.id)
            if a.reason == Assignment.Reason.MANUAL:
                continue
            for why, windows in (("paused", paused), ("away", away), ("inactive", inactive)):
                assert not any(since < a.started_at and e.id < undone for since, undone in windows[a.rep_id]), (
                    why,
                    a.id,
                    e.id,
                )
            assert not any(since < a.started_at and e.id < undone for since, undone in closed), ("group", a.id)
            if a.reason != Assignment.Reason.OWNER_MATCH:
                turned.add(e.id)

    # max_per_day never exceeded (only rotation-side assignments go to capped reps).
    caps = dict(Membership.objects.filter(group=group, max_per_day__isnull=False).values_list("rep_id", "max_per_day"))
    today = Counter(a.rep_id for a in assignments if a.group_id == group.id and a.rep_id in caps)
    for rep_id, n in today.items():
        assert n <= caps[rep_id], (rep_id, n)
    assert not any(a.over_cap for a in assignments if a.rep_id in caps)

    # The rotation: one turn per assignment the rotation made, and an unbroken pointer chain
    # in lock order (the audit ids of one group are taken under its rotation lock).
    moved = [e for e in events if e.id in turned]
    rotation_made = Assignment.objects.filter(
        group=group, reason__in=[Assignment.Reason.ROTATION, Assignment.Reason.ESCALATION, Assignment.Reason.REROUTE]
    ).count()
    state = RotationState.objects.get(group=group)
    assert state.turns == rotation_made == len(moved)
    for before, after in zip(moved, moved[1:], strict=False):
        assert after.explanation["pointer_before"] == before.explanation["pointer_after"], (before.id, after.id)
    assert state.pointer == moved[-1].explanation["pointer_after"]
    assert not Lead.objects.filter(Q(status=LeadStatus.QUEUED) & Q(queue_reason="")).exists()


def three_emails_locked_in_another_order_by_hash() -> tuple[str, str, str]:
    """a < b < c as text, and c's advisory lock key below a's and b's."""
    candidates = [f"order{i}@lock.example" for i in range(40)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT e, hashtextextended(e, 0) FROM unnest(%s::text[]) AS e", [candidates])
        key = dict(cursor.fetchall())
    for a, b, c in itertools.combinations(sorted(candidates), 3):
        if key[c] < min(key[a], key[b]):
            return a, b, c
    raise AssertionError("no such emails")


def test_an_intake_batch_and_an_import_take_the_email_locks_in_one_order():
    """An intake batch and a CSV import of the same addresses wait on each other's email locks
    without a deadlock."""
    a, b, c = three_emails_locked_in_another_order_by_hash()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            routing.lock_email(b)
            held.set()
            release.wait(20)

    def batch() -> None:
        assert held.wait(10)
        with transaction.atomic():
            routing_sql.intake_begin_many(emails=sorted([a, b, c]), lock_timeout_ms=20_000)

    def importer() -> None:
        assert held.wait(10)
        wait_for_lock_waiters(1)  # the batch waits for b's lock, holding those it took before
        with transaction.atomic():
            bulk._lock_import_and_emails([a, b, c])

    def controller() -> None:
        assert held.wait(10)
        wait_for_lock_waiters(2)  # and the import too
        release.set()

    # A deadlock fails one of them (40P01), which run_all reports.
    run_all([holder, batch, importer, controller])


def wait_for_lock_waiters(n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0] >= n:
                return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {n} transactions waiting on a lock")


def test_the_default_flag_moves_while_a_batch_routes_both_groups(make_group):
    """Moving the default flag locks both groups' rows in the order routing locks them: a
    batch routing into both groups at that moment waits, without a deadlock."""
    new, _ = make_group(1, slug="new-default")
    old, _ = make_group(1, slug="old-default", is_default=True)
    assert new.id < old.id
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            RotationState.objects.select_for_update(no_key=True).get(group=old)
            held.set()
            release.wait(20)

    def batch() -> None:
        assert held.wait(10)
        with transaction.atomic():
            routing.lock_rotations_read([new.id, old.id], timezone.now())

    def saver() -> None:
        assert held.wait(10)
        wait_for_lock_waiters(1)  # the batch holds the new default's rows, waits for the old one's
        group = Group.objects.get(pk=new.pk)
        group.is_default = True
        services.group_save(group=group, actor="test", changed=["is_default"])

    def controller() -> None:
        assert held.wait(10)
        wait_for_lock_waiters(2)  # and the move too
        release.set()

    run_all([holder, batch, saver, controller])
    assert list(Group.objects.filter(is_default=True).values_list("slug", flat=True)) == ["new-default"]
