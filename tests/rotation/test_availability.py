"""Caps, out-of-office windows and working hours (rep's time zone, across DST), at the API and
service level, with the skip reason in the audit explanation."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from leads.models import Assignment, Lead
from leads.routing import day_start, week_start
from rotation.eligibility import (
    DAYS,
    MemberFacts,
    eligibility,
    reasons_counted,
    within_working_hours,
    working_hours_starts,
)
from rotation.models import Absence, Membership, Rep
from tests.conftest import lead_body

pytestmark = pytest.mark.django_db


def post(api, slug, **fields):
    r = api.post("/api/v1/leads/", lead_body(group=slug, **fields), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def candidates(lead_id: int) -> dict[int, dict]:
    event = AuditEvent.objects.filter(lead_id=lead_id, type__in=["lead.assigned", "lead.queued"]).get()
    return {c["rep"]: c for c in event.explanation["candidates"]}


# --- absences API ------------------------------------------------------------------------------


def test_absences_api(api, make_group):
    _, (rep,) = make_group(1)
    url = f"/api/v1/reps/{rep.id}/absences/"
    now = timezone.now()
    body = {"starts_at": now.isoformat(), "ends_at": (now + timedelta(days=2)).isoformat(), "reason": "holiday"}
    r = api.post(url, body, format="json")
    assert r.status_code == 201, r.content
    absence = r.json()
    assert set(absence) == {"id", "starts_at", "ends_at", "reason"} and absence["reason"] == "holiday"
    assert [a["id"] for a in api.get(url).json()] == [absence["id"]]
    assert api.delete(f"{url}{absence['id']}/").status_code == 204
    assert api.get(url).json() == []
    assert api.delete(f"{url}{absence['id']}/").status_code == 404
    actions = [e.explanation["action"] for e in AuditEvent.objects.filter(type="absence.changed").order_by("id")]
    assert actions == ["created", "deleted"]


def test_a_deleted_absence_leaves_its_window_in_the_trail(api, make_group):
    """A deleted out-of-office window left only its id: the trail could no longer say which
    days the rep had been marked away, nor who had taken them back."""
    from audit.summary import event_summary

    _, (rep,) = make_group(1)
    url = f"/api/v1/reps/{rep.id}/absences/"
    body = {"starts_at": "2030-01-01T09:00:00Z", "ends_at": "2030-01-03T18:00:00Z", "reason": "holiday"}
    absence = api.post(url, body, format="json").json()
    assert api.delete(f"{url}{absence['id']}/").status_code == 204
    created, deleted = AuditEvent.objects.filter(type="absence.changed").order_by("id")
    assert deleted.explanation["before"] == created.explanation["changes"]
    texts = [
        event_summary(type=e.type, explanation=e.explanation, rep_id=e.rep_id, names={}) for e in (created, deleted)
    ]
    window = "2030-01-01 09:00:00+00:00 to 2030-01-03 18:00:00+00:00 (holiday)"
    assert texts == [f"Created: out of office from {window}.", f"Deleted: out of office from {window}."], texts


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"starts_at": "2030-01-02T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}, "ends_at"),
        ({"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}, "ends_at"),
        ({"starts_at": "tomorrow", "ends_at": "2030-01-01T00:00:00Z"}, "starts_at"),
        ({"ends_at": "2030-01-01T00:00:00Z"}, "starts_at"),
        ({"starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z", "why": "x"}, "why"),
    ],
)
def test_bad_absence_is_400(api, make_group, body, field):
    _, (rep,) = make_group(1)
    r = api.post(f"/api/v1/reps/{rep.id}/absences/", body, format="json")
    assert r.status_code == 400 and field in r.json(), r.content
    assert not Absence.objects.exists()


def test_an_absence_without_an_offset_is_in_the_reps_time_zone(api, make_group):
    """As the admin enters a rep's absences: "from 9:00" is the rep's 9:00, not UTC's. With an
    offset, the time is that instant whatever the rep's zone; answers give UTC."""
    _, (rep,) = make_group(1)
    Rep.objects.filter(pk=rep.pk).update(timezone="America/New_York")
    url = f"/api/v1/reps/{rep.id}/absences/"
    local = api.post(url, {"starts_at": "2030-07-01T09:00:00", "ends_at": "2030-07-01T17:30"}, format="json")
    assert local.status_code == 201, local.content
    assert (local.json()["starts_at"], local.json()["ends_at"]) == ("2030-07-01T13:00:00Z", "2030-07-01T21:30:00Z")
    absence = Absence.objects.get(pk=local.json()["id"])
    assert absence.starts_at == datetime(2030, 7, 1, 9, tzinfo=ZoneInfo("America/New_York"))
    winter = api.post(url, {"starts_at": "2030-12-01T09:00:00", "ends_at": "2030-12-02T09:00:00+01:00"}, format="json")
    assert (winter.json()["starts_at"], winter.json()["ends_at"]) == ("2030-12-01T14:00:00Z", "2030-12-02T08:00:00Z")
    # The same body for a rep in UTC is UTC.
    _, (other,) = make_group(1)
    utc = api.post(
        f"/api/v1/reps/{other.id}/absences/",
        {"starts_at": "2030-07-01T09:00:00", "ends_at": "2030-07-01T17:30"},
        format="json",
    )
    assert utc.json()["starts_at"] == "2030-07-01T09:00:00Z"


@pytest.mark.parametrize(
    "starts_at",
    [
        "2030-03-10T02:30:00",  # New York's clocks skip from 2:00 to 3:00
        "2030-11-03T01:30:00",  # and go through 1:00 to 2:00 twice
    ],
)
def test_a_local_time_that_names_no_single_instant_is_refused(api, make_group, starts_at):
    _, (rep,) = make_group(1)
    Rep.objects.filter(pk=rep.pk).update(timezone="America/New_York")
    r = api.post(
        f"/api/v1/reps/{rep.id}/absences/", {"starts_at": starts_at, "ends_at": "2031-01-01T00:00:00Z"}, format="json"
    )
    assert r.status_code == 400, r.content
    assert r.json() == {
        "starts_at": [f"{starts_at} is not one time in America/New_York: its clocks change then. Give an offset."]
    }
    assert not Absence.objects.exists()
    fine = api.post(
        f"/api/v1/reps/{rep.id}/absences/",
        {"starts_at": f"{starts_at}-05:00", "ends_at": "2031-01-01T00:00:00Z"},
        format="json",
    )
    assert fine.status_code == 201, fine.content


def test_a_local_time_past_the_calendar_in_utc_is_a_400(api, make_group):
    _, (rep,) = make_group(1)
    Rep.objects.filter(pk=rep.pk).update(timezone="Asia/Tokyo")
    r = api.post(
        f"/api/v1/reps/{rep.id}/absences/", {"starts_at": "0001-01-01T00:00:00", "ends_at": "0001-01-02"}, format="json"
    )
    assert r.status_code == 400 and "starts_at" in r.json(), r.content
    assert not Absence.objects.exists()


def test_absences_of_unknown_rep_and_scope(api, api_with):
    assert api.get("/api/v1/reps/999999/absences/").status_code == 404
    assert api_with(["read"]).get("/api/v1/reps/1/absences/").status_code == 403


def test_rep_out_of_office_is_skipped_and_keeps_its_place(api, make_group):
    group, (a, b, c) = make_group(3, slug="pool")
    now = timezone.now()
    r = api.post(
        f"/api/v1/reps/{b.id}/absences/",
        {"starts_at": (now - timedelta(hours=1)).isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat()},
        format="json",
    )
    absence_id = r.json()["id"]
    owners = [post(api, "pool")["owner"]["id"] for _ in range(2)]
    assert owners == [a.id, c.id]
    lead = Lead.objects.order_by("id").first()
    assert candidates(lead.id)[b.id]["reason"].startswith("out of office until")
    api.delete(f"/api/v1/reps/{b.id}/absences/{absence_id}/")
    assert [post(api, "pool")["owner"]["id"] for _ in range(3)] == [a.id, b.id, c.id]


def test_the_rotation_view_says_when_a_rep_is_back_through_absences_that_follow_on(api, make_group):
    """A day off, then a week's holiday starting as it ends: the rep is back after the week,
    not at the end of the day off. A later absence after a gap is not counted."""
    group, (a, b) = make_group(2, slug="pool")
    now = timezone.now().replace(microsecond=0)
    for starts, ends in ((-1, 8), (8, 8 + 24 * 7), (8 + 24 * 7 + 1, 8 + 24 * 8)):
        Absence.objects.create(rep=b, starts_at=now + timedelta(hours=starts), ends_at=now + timedelta(hours=ends))
    Absence.objects.create(rep=a, starts_at=now + timedelta(hours=2), ends_at=now + timedelta(hours=3))
    members = {m["rep"]["id"]: m for m in api.get("/api/v1/groups/pool/rotation/").json()["members"]}
    back = now + timedelta(hours=8 + 24 * 7)
    reason = f"out of office until {back.isoformat()}"
    assert members[b.id]["reason"] == reason
    assert members[a.id]["eligible"] is True  # an absence ahead is not an absence now
    # What-if and intake (its audit event) say the same: they read the time away under the
    # rotation lock, in one statement, and said the end of the day off.
    simulated = api.post("/api/v1/routing/simulate/", lead_body(group="pool"), format="json").json()
    assert {c["rep"]["id"]: c["reason"] for c in simulated["candidates"]}[b.id] == reason
    lead = post(api, "pool")
    assert lead["owner"]["id"] == a.id
    assert candidates(lead["id"])[b.id]["reason"] == reason


def test_overlapping_absences_read_as_one_time_away(api, make_group):
    """Two absences covering now and one that starts inside the second: away from the earliest
    start to the last end, in every reading."""
    group, (a, b) = make_group(2, slug="pool")
    now = timezone.now().replace(microsecond=0)
    for starts, ends in ((-5, 2), (-1, 4), (3, 9)):
        Absence.objects.create(rep=b, starts_at=now + timedelta(hours=starts), ends_at=now + timedelta(hours=ends))
    reason = f"out of office until {(now + timedelta(hours=9)).isoformat()}"
    members = {m["rep"]["id"]: m for m in api.get("/api/v1/groups/pool/rotation/").json()["members"]}
    assert members[b.id]["reason"] == reason
    lead = post(api, "pool")
    assert candidates(lead["id"])[b.id]["reason"] == reason


# --- caps --------------------------------------------------------------------------------------


def test_max_open_cap_skips_and_frees_on_close(api, make_group):
    group, (a, b) = make_group(2, slug="pool")
    Membership.objects.filter(rep=a).update(max_open=1)
    owners = [post(api, "pool")["owner"]["id"] for _ in range(3)]
    assert owners == [a.id, b.id, b.id]
    third = Lead.objects.order_by("-id").first()
    assert candidates(third.id)[a.id]["reason"] == "at max_open cap (1/1)"
    Lead.objects.filter(owner=a).update(status="closed", owner=None, outcome="won")
    assert post(api, "pool")["owner"]["id"] == a.id


def test_cap_of_zero_takes_nothing(api, make_group):
    group, (a, b) = make_group(2, slug="pool")
    Membership.objects.filter(rep=a).update(max_per_day=0)
    Membership.objects.filter(rep=b).update(max_open=0)
    body = post(api, "pool")
    assert body["status"] == "queued" and "no eligible rep" in body["queue_reason"]
    reasons = candidates(body["id"])
    assert reasons[a.id]["reason"] == "at max_per_day cap (0/0)"
    assert reasons[b.id]["reason"] == "at max_open cap (0/0)"


@pytest.mark.parametrize("tz", ["Pacific/Kiritimati", "Pacific/Pago_Pago", "Europe/Paris", "UTC"])
def test_max_per_day_counts_the_groups_day(api, make_group, tz):
    group, (a, b) = make_group(2, slug="pool", timezone=tz)
    Membership.objects.filter(rep=a).update(max_per_day=1)
    first = post(api, "pool")
    assert first["owner"]["id"] == a.id
    start = day_start(timezone.now(), tz)
    # Yesterday in the group's time zone: does not count, whatever the UTC date says.
    Assignment.objects.filter(lead_id=first["id"]).update(started_at=start - timedelta(seconds=1))
    Membership.objects.filter(rep=b).update(active=False)
    assert post(api, "pool")["owner"]["id"] == a.id  # first of the group's day
    blocked = post(api, "pool")
    assert blocked["status"] == "queued"
    assert candidates(blocked["id"])[a.id]["reason"] == "at max_per_day cap (1/1)"


def test_moved_leads_still_count_toward_the_day(api, make_group):
    group, (a, b) = make_group(2, slug="pool")
    Membership.objects.filter(rep=a).update(max_per_day=1)
    first = post(api, "pool")
    # The lead was moved away later (ended assignment): it still counts for the day.
    Assignment.objects.filter(lead_id=first["id"]).update(ended_at=timezone.now(), end_reason="manual")
    Membership.objects.filter(rep=b).update(active=False)
    assert post(api, "pool")["status"] == "queued"


# --- working hours and DST ---------------------------------------------------------------------


def test_rep_outside_working_hours_is_skipped(api, make_group):
    group, (a, b) = make_group(2, slug="pool")
    tz = "Asia/Kolkata"
    local = timezone.now().astimezone(ZoneInfo(tz))
    today = DAYS[local.weekday()]
    # Hours that ended an hour ago (or, just after midnight, that start in an hour).
    if local.hour >= 2:
        span = ["00:00", f"{local.hour - 1:02d}:00"]
    else:
        span = [f"{local.hour + 1:02d}:00", "23:00"]
    r = api.patch(f"/api/v1/reps/{a.id}/", {"timezone": tz, "working_hours": {today: [span]}}, format="json")
    assert r.status_code == 200, r.content
    body = post(api, "pool")
    assert body["owner"]["id"] == b.id
    assert candidates(body["id"])[a.id]["reason"] == "outside working hours"
    api.patch(f"/api/v1/reps/{a.id}/", {"working_hours": None}, format="json")
    assert post(api, "pool")["owner"]["id"] == a.id


@pytest.mark.parametrize(
    "hours",
    [
        {"mon": [["17:00", "09:00"]]},
        {"monday": [["09:00", "17:00"]]},
        {"mon": [["9am", "5pm"]]},
        ["09:00"],
        {"mon": [["\u0669:00", "17:00"]]},  # Arabic-Indic 9: int() reads it, HH:MM does not
        {"mon": [[" 9:00", "17:00"]]},
        {"mon": [["09:00", "24:01"]]},
    ],
)
def test_bad_working_hours_are_400(api, make_group, hours):
    _, (rep,) = make_group(1)
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": hours}, format="json")
    assert r.status_code == 400 and "working_hours" in r.json()


@pytest.mark.parametrize(
    ("span", "hint"),
    [
        (["22:00", "6:00"], 'A span past midnight is two: ["22:00", "24:00"], and ["00:00", "06:00"] on the next day.'),
        (["09:00", "00:00"], 'Midnight at the end of the day is "24:00".'),
    ],
)
def test_a_span_past_midnight_is_refused_with_how_to_enter_it(api, make_group, span, hint):
    _, (rep,) = make_group(1)
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": {"fri": [span]}}, format="json")
    assert r.status_code == 400
    assert r.json()["working_hours"] == [f"fri: a span must end after it starts ({span[0]}-{span[1]}). {hint}"]


def test_working_hours_with_no_day_listed_are_a_400_not_always(api, make_group):
    # Built from a form with no day ticked, {} meant "no hours"; it was read as "always".
    group, (rep,) = make_group(1, slug="pool")
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": {}}, format="json")
    assert r.status_code == 400
    assert r.json() == {"working_hours": ['No day is listed: use null for "always", or give the days\' hours.']}
    assert Rep.objects.get(pk=rep.pk).working_hours is None


@pytest.mark.parametrize("hours", [{"mon": []}, {"mon": [], "sat": []}])
def test_working_hours_listing_days_without_any_hours_are_a_400(api, make_group, hours):
    """A rep who never takes a lead: deactivating says that plainly. A day off beside days
    with hours is fine."""
    _, (rep,) = make_group(1, slug="pool")
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": hours}, format="json")
    assert r.status_code == 400
    assert r.json() == {"working_hours": ['No day has hours: use null for "always", or give the days\' hours.']}
    ok = {"mon": [["09:00", "17:00"]], "sat": []}
    assert api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": ok}, format="json").status_code == 200


def test_working_hours_stored_as_an_empty_object_become_null_and_the_rep_stays_editable(api, make_group):
    from importlib import import_module

    from django.apps import apps

    _, (rep,) = make_group(1)
    Rep.objects.filter(pk=rep.pk).update(working_hours={})
    import_module("rotation.migrations.0006_working_hours_empty_object_is_null").forward(apps, None)
    assert Rep.objects.get(pk=rep.pk).working_hours is None
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"name": "Renamed"}, format="json")
    assert r.status_code == 200, r.content


def test_working_hours_are_stored_as_hh_mm(api, make_group):
    _, (rep,) = make_group(1)
    r = api.patch(f"/api/v1/reps/{rep.id}/", {"working_hours": {"mon": [["9:00", "24:00"]]}}, format="json")
    assert r.status_code == 200 and r.json()["working_hours"] == {"mon": [["09:00", "24:00"]]}


NINE_TO_FIVE = {day: [["09:00", "17:00"]] for day in DAYS[:5]}


@pytest.mark.parametrize(
    ("tz", "utc", "inside"),
    [
        # New York: EST (UTC-5) until 2026-03-08, then EDT (UTC-4).
        ("America/New_York", datetime(2026, 3, 6, 13, 30, tzinfo=UTC), False),  # 08:30 EST
        ("America/New_York", datetime(2026, 3, 6, 14, 30, tzinfo=UTC), True),  # 09:30 EST
        ("America/New_York", datetime(2026, 3, 9, 13, 30, tzinfo=UTC), True),  # 09:30 EDT
        ("America/New_York", datetime(2026, 3, 9, 21, 30, tzinfo=UTC), False),  # 17:30 EDT
        ("America/New_York", datetime(2026, 3, 6, 21, 30, tzinfo=UTC), True),  # 16:30 EST
        # London: BST (UTC+1) until 2026-10-25, then GMT.
        ("Europe/London", datetime(2026, 10, 23, 8, 30, tzinfo=UTC), True),  # 09:30 BST
        ("Europe/London", datetime(2026, 10, 26, 8, 30, tzinfo=UTC), False),  # 08:30 GMT
        ("Europe/London", datetime(2026, 10, 26, 16, 30, tzinfo=UTC), True),  # 16:30 GMT
        ("Europe/London", datetime(2026, 10, 23, 16, 30, tzinfo=UTC), False),  # 17:30 BST
        # Sydney: AEDT (UTC+11) until 2026-04-05, then AEST (UTC+10).
        ("Australia/Sydney", datetime(2026, 4, 2, 22, 30, tzinfo=UTC), True),  # Fri 09:30 AEDT
        ("Australia/Sydney", datetime(2026, 4, 5, 22, 30, tzinfo=UTC), False),  # Mon 08:30 AEST
        # Weekend, whatever the hour.
        ("America/New_York", datetime(2026, 3, 7, 15, 0, tzinfo=UTC), False),
    ],
)
def test_working_hours_follow_the_reps_clock_across_dst(tz, utc, inside):
    assert within_working_hours(NINE_TO_FIVE, tz, utc) is inside
    facts = MemberFacts(1, "r", "r@x", 0, 1, True, True, rep_timezone=tz, working_hours=NINE_TO_FIVE)
    assert eligibility(facts, utc) == ((True, "") if inside else (False, "outside working hours"))


def test_dst_gap_and_overlap_hours():
    # 02:30 does not exist in New York on 2026-03-08; 01:30 happens twice on 2026-11-01.
    hours = {"sun": [["01:00", "03:00"]]}
    assert within_working_hours(hours, "America/New_York", datetime(2026, 3, 8, 6, 59, tzinfo=UTC))  # 01:59 EST
    assert not within_working_hours(hours, "America/New_York", datetime(2026, 3, 8, 7, 0, tzinfo=UTC))  # 03:00 EDT
    assert within_working_hours(hours, "America/New_York", datetime(2026, 11, 1, 5, 30, tzinfo=UTC))  # 01:30 EDT
    assert within_working_hours(hours, "America/New_York", datetime(2026, 11, 1, 6, 30, tzinfo=UTC))  # 01:30 EST
    assert not within_working_hours(hours, "America/New_York", datetime(2026, 11, 1, 8, 0, tzinfo=UTC))  # 03:00


def test_group_day_across_dst():
    # The group's day starts at local midnight, also on the day the clocks change.
    start = day_start(datetime(2026, 3, 8, 12, 0, tzinfo=UTC), "America/New_York")
    assert start.astimezone(UTC) == datetime(2026, 3, 8, 5, 0, tzinfo=UTC)
    start = day_start(datetime(2026, 3, 9, 12, 0, tzinfo=UTC), "America/New_York")
    assert start.astimezone(UTC) == datetime(2026, 3, 9, 4, 0, tzinfo=UTC)


def test_group_day_starts_at_the_first_midnight_when_the_hour_after_it_repeats():
    # Havana goes back from 01:00 CDT to 00:00 CST on 2026-11-01: 00:30 happens twice, and the
    # day began at the first midnight (04:00 UTC), also when asked during the second 00:30.
    first = datetime(2026, 11, 1, 4, 0, tzinfo=UTC)
    for now in (datetime(2026, 11, 1, 4, 30, tzinfo=UTC), datetime(2026, 11, 1, 5, 30, tzinfo=UTC)):
        assert day_start(now, "America/Havana").astimezone(UTC) == first
    assert week_start(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "America/Havana").astimezone(UTC) == datetime(
        2026, 10, 26, 4, 0, tzinfo=UTC
    )


def test_working_hours_starts_are_the_moments_a_rep_comes_back():
    # A night shift split at midnight, and two spans that meet: neither is a coming back.
    hours = {"mon": [["22:00", "24:00"]], "tue": [["00:00", "06:00"], ["09:00", "12:00"], ["12:00", "13:00"]]}
    monday = datetime(2026, 3, 2, tzinfo=UTC)
    starts = working_hours_starts(hours, "UTC", monday, monday + timedelta(days=2))
    assert starts == [monday.replace(hour=22), monday.replace(day=3, hour=9)]
    # In the rep's zone, returned in UTC; the window is (low, high].
    starts = working_hours_starts(hours, "Asia/Tokyo", monday + timedelta(hours=12), monday + timedelta(hours=24))
    assert starts == [monday.replace(hour=13), monday.replace(day=3, hour=0)]
    assert working_hours_starts(hours, "UTC", monday.replace(hour=22), monday.replace(hour=23)) == []
    assert working_hours_starts(None, "UTC", monday, monday + timedelta(days=7)) == []


def test_an_absence_ending_before_it_starts_is_named_with_the_other_bad_fields(api, make_group):
    """The order of the window was checked in validate(), which DRF runs only once every field
    is valid: with a reason too long as well, the 400 named the reason alone."""
    _, (rep,) = make_group(1)
    body = {"starts_at": "2030-01-02T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z", "reason": "x" * 201}
    r = api.post(f"/api/v1/reps/{rep.id}/absences/", body, format="json")
    assert r.status_code == 400 and set(r.json()) == {"ends_at", "reason"}, r.content
    assert "after the start" in r.json()["ends_at"][0]
    # A start that is not valid is named by itself, without a second word on the end.
    r = api.post(f"/api/v1/reps/{rep.id}/absences/", {**body, "starts_at": "soon", "reason": ""}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"starts_at"}
    assert not Absence.objects.exists()


def test_what_keeps_members_out_is_counted_by_kind_the_most_first():
    reasons = [
        "outside working hours",
        "rep inactive",
        "at max_open cap (3/3)",
        "out of office until 2027-01-05T09:30:00+00:00",
        "outside working hours",
        "rep inactive",
        "paused in this group (training)",
        "out of office until 2027-02-01T00:00:00+00:00",
        "outside working hours",
    ]
    assert reasons_counted(reasons) == (
        "3 outside working hours, 2 out of office, 2 reps inactive, 1 at max_open cap, 1 paused in this group"
    )
    assert reasons_counted(["rep inactive"]) == "1 rep inactive"
