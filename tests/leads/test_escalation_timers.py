"""Which timers get published, and when: the horizon that keeps a worker's memory bounded."""

import math
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent
from leads import actions, scheduling
from leads.models import Assignment, Lead
from tests.celery_worker import broker_purge
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def queued_messages() -> int:
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    return redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(f"{prefix}celery")


@pytest.fixture
def empty_broker():
    broker_purge()
    scheduling.publish_reset()
    yield
    broker_purge()


def test_arm_publishes_only_the_window_within_the_horizon(api, make_group, empty_broker):
    make_group(1, slug="emea", sla_minutes="60")
    now = timezone.now()
    offsets = [10, 50, 100, 119, 121, 600]  # seconds from now
    for offset in offsets:
        lead = api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json()
        Assignment.objects.filter(lead_id=lead["id"]).update(due_at=now + timedelta(seconds=offset))
    # horizon 120 s, every 60 s, overlap 15 s: this run covers (45 s, 120 s]; the 10 s one was
    # published at commit (or by the previous run), the 121 s and 600 s ones by later runs.
    assert actions.escalation_arm(now=now) == 3
    assert queued_messages() == 3
    assert actions.escalation_arm(now=now + timedelta(seconds=60)) == 2  # (105 s, 180 s]: 119 s and 121 s


def test_a_timer_beyond_the_horizon_is_not_published_at_commit(empty_broker):
    now = timezone.now()
    assert scheduling.timer_publish(assignment_id=1, due_at=now + timedelta(minutes=30)) is False
    assert scheduling.timer_publish(assignment_id=1, due_at=now + timedelta(seconds=30)) is True
    assert queued_messages() == 1


def test_arm_publishes_a_drain_for_when_an_absence_runs_out(api, make_group, empty_broker, monkeypatch):
    from rotation.models import Absence

    group, (away, back_later) = make_group(2, slug="emea")
    _other, (other_rep,) = make_group(1, slug="apac")
    now = timezone.now()
    ends = now + timedelta(seconds=100)
    Absence.objects.create(rep=away, starts_at=now - timedelta(hours=1), ends_at=ends)
    # Ends in the window, but another absence goes on past it: not back, no drain.
    Absence.objects.create(rep=back_later, starts_at=now - timedelta(hours=1), ends_at=ends)
    Absence.objects.create(rep=back_later, starts_at=ends - timedelta(minutes=1), ends_at=ends + timedelta(days=1))
    Absence.objects.create(rep=other_rep, starts_at=now, ends_at=now + timedelta(hours=3))  # beyond the horizon
    sent = []
    monkeypatch.setattr(scheduling, "publish", lambda name, **options: sent.append((name, options)) or True)
    assert actions.escalation_arm(now=now) == 1
    ((name, options),) = sent
    assert name == scheduling.DRAIN_TASK and options["args"] == [
        group.id,
        f"back from out of office: the absence of rep {away.id} ended at {ends.isoformat()}",
    ]
    assert options["eta"] == ends + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)


def test_an_absence_ending_within_the_horizon_publishes_its_drains_at_once(
    make_group, monkeypatch, django_capture_on_commit_callbacks
):
    from rotation import services
    from rotation.models import Absence

    group, (rep,) = make_group(1, slug="emea")
    other, _ = make_group(1, slug="apac")
    services.membership_add(group=other, rep=rep, actor="t")
    sent = []
    monkeypatch.setattr(scheduling, "publish", lambda name, **options: sent.append((name, options)) or True)
    now = timezone.now()
    soon = Absence(rep=rep, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(seconds=20))
    with django_capture_on_commit_callbacks(execute=True):
        services.absence_add(absence=soon, actor="t")
    drains = sorted((options["args"][0], options["eta"]) for name, options in sent if name == scheduling.DRAIN_TASK)
    eta = soon.ends_at + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)
    assert drains == sorted([(group.id, eta), (other.id, eta)])
    sent.clear()
    later = Absence(rep=rep, starts_at=now, ends_at=now + timedelta(days=1))  # armed later by escalation-arm
    with django_capture_on_commit_callbacks(execute=True):
        services.absence_add(absence=later, actor="t")
    assert [name for name, _ in sent if name == scheduling.DRAIN_TASK] == []


def test_an_absence_with_no_end_in_sight_is_taken_without_an_error(
    api, make_group, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    """An absence may end on the last day there is (an open-ended leave): its drain is armed
    later, if ever, and working out when used to overflow past the year 9999 in the log."""
    _group, (rep,) = make_group(1, slug="emea")
    sent = []
    monkeypatch.setattr(scheduling, "publish", lambda name, **options: sent.append((name, options)) or True)
    body = {"starts_at": "2026-01-01T00:00:00Z", "ends_at": "9999-12-31T23:59:59.999999Z", "reason": "leave"}
    with caplog.at_level("ERROR"), django_capture_on_commit_callbacks(execute=True):
        r = api.post(f"/api/v1/reps/{rep.id}/absences/", body, format="json")
    assert r.status_code == 201, r.content
    assert [record.getMessage() for record in caplog.records if record.levelname == "ERROR"] == []
    assert [name for name, _ in sent if name == scheduling.DRAIN_TASK] == []


def test_arm_publishes_a_drain_for_when_working_hours_begin(api, make_group, monkeypatch):
    """Working hours that begin free the rep by time alone, as an absence that runs out does:
    the queued leads get the rep at once, before a lead that arrives after the start takes the
    place they waited for (the periodic sweep comes only later)."""
    from datetime import UTC, datetime

    from audit.models import AuditEvent
    from leads import tasks
    from leads.models import Lead
    from rotation.eligibility import DAYS
    from rotation.models import Membership

    group, (rep,) = make_group(1, slug="emea")
    Membership.objects.filter(group=group).update(max_open=1, active=False)
    waiting = [api.post("/api/v1/leads/", lead_body(group="emea"), format="json").json() for _ in range(2)]
    assert [lead["status"] for lead in waiting] == ["queued", "queued"]  # away (on the test's real clock)
    Membership.objects.filter(group=group).update(active=True)  # back, but off hours (on the clock below)
    now = datetime(2026, 3, 4, 8, 58, 20, tzinfo=UTC)  # a Wednesday; 09:00 Paris is 08:00 UTC
    rep.working_hours = {"wed": [["09:00", "12:00"], ["12:00", "17:30"]], "thu": [["09:00", "17:30"]]}
    rep.timezone = "Europe/Paris"
    rep.save()

    sent = []
    monkeypatch.setattr(scheduling, "publish", lambda name, **options: sent.append((name, options)) or True)
    assert actions.escalation_arm(now=now) == 0  # (08:59:05, 09:00:20] UTC: no start in Paris
    start = datetime(2026, 3, 5, 8, 0, tzinfo=UTC)  # Thursday 09:00 in Paris
    assert DAYS[start.weekday()] == "thu"
    assert actions.escalation_arm(now=start - timedelta(seconds=100)) == 1
    ((name, options),) = sent
    because = f"rep {rep.id}'s working hours began (Europe/Paris)"
    assert name == scheduling.DRAIN_TASK and options["args"] == [group.id, because]
    assert options["eta"] == start + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)
    sent.clear()
    noon = datetime(2026, 3, 5, 11, 0, tzinfo=UTC)  # 12:00 in Paris: one span ends as the next begins
    assert actions.escalation_arm(now=noon - timedelta(seconds=100)) == 0

    # The worker's drain, once the hours have begun: the lead that waited longest gets the rep.
    rep.working_hours = None  # (the drain reads the real clock: within hours now)
    rep.save()
    assert tasks.drain_group.run(group.id, because) == 1
    first = Lead.objects.get(pk=waiting[0]["id"])
    assert first.status == "assigned" and first.owner_id == rep.id
    event = AuditEvent.objects.get(lead_id=first.id, type="lead.assigned")
    assert event.explanation["drained_because"] == because


def test_arm_publishes_a_drain_for_a_new_day_under_daily_caps(make_group, monkeypatch):
    from datetime import UTC, datetime

    from rotation.models import Membership

    capped, _ = make_group(1, slug="emea", timezone="Asia/Tokyo")
    make_group(1, slug="amer", timezone="Asia/Tokyo")  # no daily cap: its day changes nothing
    Membership.objects.filter(group=capped).update(max_per_day=5)
    midnight = datetime(2026, 3, 4, 15, 0, tzinfo=UTC)  # 00:00 in Tokyo
    sent = []
    monkeypatch.setattr(scheduling, "publish", lambda name, **options: sent.append((name, options)) or True)
    assert actions.escalation_arm(now=midnight - timedelta(seconds=100)) == 1
    ((name, options),) = sent
    assert options["args"] == [
        capped.id,
        "a new day began in group 'emea' (Asia/Tokyo): max_per_day caps count afresh",
    ]
    assert options["eta"] == midnight + timedelta(seconds=settings.ABSENCE_END_DRAIN_DELAY_S)
    sent.clear()
    assert actions.escalation_arm(now=midnight + timedelta(seconds=60)) == 0


def slice_ends(dues) -> set[float]:
    width = settings.ESCALATION_TIMER_SLICE_S
    return {math.ceil(due.timestamp() / width) * width for due in dues}


def test_a_burst_into_one_group_publishes_one_timer_per_slice(
    api, make_group, empty_broker, django_capture_on_commit_callbacks
):
    make_group(2, slug="emea", sla_minutes="0.5")  # due in 30 s: within the horizon, published at commit
    for _ in range(12):
        with django_capture_on_commit_callbacks(execute=True):
            api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    dues = list(Assignment.objects.values_list("due_at", flat=True))
    assert len(dues) == 12
    # One task per slice of the group's due times (a slice is 0.25 s), not one per lead.
    assert queued_messages() == len(slice_ends(dues)) < 12


def test_groups_do_not_share_a_slice(api, make_group, empty_broker, django_capture_on_commit_callbacks):
    make_group(1, slug="emea", sla_minutes="0.5")
    make_group(1, slug="apac", sla_minutes="0.5")
    for slug in ("emea", "apac", "emea", "apac"):
        with django_capture_on_commit_callbacks(execute=True):
            api.post("/api/v1/leads/", lead_body(group=slug), format="json")
    per_group = {
        slug: slice_ends(Assignment.objects.filter(group__slug=slug).values_list("due_at", flat=True))
        for slug in ("emea", "apac")
    }
    assert queued_messages() == len(per_group["emea"]) + len(per_group["apac"])


def test_without_slices_each_assignment_has_its_own_timer(
    api, make_group, empty_broker, settings, django_capture_on_commit_callbacks
):
    settings.ESCALATION_TIMER_SLICE_S = 0
    make_group(1, slug="emea", sla_minutes="0.5")
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            api.post("/api/v1/leads/", lead_body(group="emea"), format="json")
    assert queued_messages() == 3


def test_an_assignment_due_within_a_second_has_its_own_timer(empty_broker):
    # Its slice's task may already have run when it commits: it does not share one.
    soon = timezone.now() + timedelta(seconds=0.5)
    assert scheduling.slice_publish(group_id=1, due_at=soon) is False
    assert scheduling.timer_publish(assignment_id=1, due_at=soon, group_id=1) is True
    assert queued_messages() == 1


def test_a_slice_is_published_again_after_the_broker_was_emptied(empty_broker):
    due = timezone.now() + timedelta(seconds=30)
    assert scheduling.slice_publish(group_id=1, due_at=due) is True
    assert scheduling.slice_publish(group_id=1, due_at=due) is True
    assert queued_messages() == 1  # once per process and slice
    broker_purge()
    scheduling.publish_reset()
    assert scheduling.slice_publish(group_id=1, due_at=due) is True
    assert queued_messages() == 1


def test_a_slice_timer_escalates_its_group_due_by_its_end_only(api, make_group, empty_broker):
    emea, _ = make_group(3, slug="emea", sla_minutes="60")
    make_group(2, slug="apac", sla_minutes="60")
    now = timezone.now()
    ids = {}
    for name, slug, offset in [
        ("late_a", "emea", -5),
        ("late_b", "emea", -1),
        ("in_slice_later", "emea", 20),  # due after now, before the slice's end (a clock behind)
        ("next_slice", "emea", 40),
        ("other_group", "apac", -5),
    ]:
        lead = api.post("/api/v1/leads/", lead_body(group=slug), format="json").json()
        Assignment.objects.filter(lead_id=lead["id"]).update(due_at=now + timedelta(seconds=offset))
        Lead.objects.filter(pk=lead["id"]).update(sla_due_at=now + timedelta(seconds=offset))
        ids[name] = lead["id"]
    tally = actions.escalate_group_due(group_id=emea.id, until=now + timedelta(seconds=30))
    assert tally == {"escalated": 2}, tally
    escalated = set(AuditEvent.objects.filter(type="lead.escalated").values_list("lead_id", flat=True))
    assert escalated == {ids["late_a"], ids["late_b"]}
    event = AuditEvent.objects.filter(type="lead.escalated").first()
    assert event is not None and event.actor == "system:sla" and event.explanation["trigger"] == "timer"
    # Woken early for one of its slice: it is published again for that one's due time.
    assert queued_messages() == 1
