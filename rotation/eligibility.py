"""Is a member eligible right now, and if not, why: a pure function over plain data."""

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class MemberFacts:
    rep_id: int
    rep_name: str
    rep_email: str
    position: int
    weight: int
    rep_active: bool
    member_active: bool
    rep_timezone: str = "UTC"
    working_hours: Mapping[str, Any] | None = None
    absences: Sequence[tuple[datetime, datetime]] = field(default_factory=tuple)
    max_open: int | None = None
    max_per_day: int | None = None
    open: int = 0
    assigned_today: int = 0
    paused_reason: str = ""


def parse_hhmm(value: str) -> time:
    hours, minutes = value.split(":")
    h, m = int(hours), int(minutes)
    if h == 24 and m == 0:
        return time.max
    return time(h, m)


_HHMM = re.compile(r"[0-9]{1,2}:[0-9]{2}")  # ASCII digits only (int() also reads "٩")


def _padded(value: str) -> str:
    hours, minutes = value.split(":")
    return f"{int(hours):02d}:{minutes}"


def validate_working_hours(value: Any) -> dict[str, list[list[str]]] | None:
    """Normalises working hours or raises ValueError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('Working hours must be an object like {"mon": [["09:00", "17:30"]]} or null.')
    if not value:
        # Read as "only the days listed", it would be a rep who never takes a lead; "always" is null.
        raise ValueError('No day is listed: use null for "always", or give the days\' hours.')
    cleaned: dict[str, list[list[str]]] = {}
    for day, spans in value.items():
        if day not in DAYS:
            raise ValueError(f"Unknown day '{day}'; use {', '.join(DAYS)}.")
        if not isinstance(spans, list):
            raise ValueError(f"{day}: a list of [start, end] pairs.")
        out = []
        for span in spans:
            if not (isinstance(span, list | tuple) and len(span) == 2 and all(isinstance(s, str) for s in span)):
                raise ValueError(f'{day}: each span is ["HH:MM", "HH:MM"].')
            try:
                if not all(_HHMM.fullmatch(s) for s in span):
                    raise ValueError
                start, end = parse_hhmm(span[0]), parse_hhmm(span[1])
            except ValueError:
                raise ValueError(f"{day}: times must be HH:MM (00:00 to 24:00).") from None
            if end <= start:
                hint = ""
                if end == time.min:
                    hint = ' Midnight at the end of the day is "24:00".'
                elif end < start:  # an overnight shift: each day holds its own part
                    first, then = _padded(span[0]), _padded(span[1])
                    hint = (
                        f' A span past midnight is two: ["{first}", "24:00"], and ["00:00", "{then}"] on the next day.'
                    )
                raise ValueError(f"{day}: a span must end after it starts ({span[0]}-{span[1]}).{hint}")
            out.append([_padded(span[0]), _padded(span[1])])  # "9:00" is stored as "09:00"
        cleaned[day] = out
    if not any(cleaned.values()):
        # As an empty object: a rep who never takes a lead, which deactivating says plainly.
        raise ValueError('No day has hours: use null for "always", or give the days\' hours.')
    return cleaned


def within_working_hours(working_hours: Mapping[str, Any] | None, tz: str, now: datetime) -> bool:
    if not working_hours:
        return True
    local = now.astimezone(ZoneInfo(tz))
    spans = working_hours.get(DAYS[local.weekday()]) or []
    clock = local.time().replace(tzinfo=None)
    return any(parse_hhmm(s) <= clock < parse_hhmm(e) for s, e in spans)


def working_hours_starts(
    working_hours: Mapping[str, Any] | None, tz: str, low: datetime, high: datetime
) -> list[datetime]:
    """The moments in (low, high] at which a rep comes back within its working hours: each
    span's start, unless another span runs up to it (a shift split at midnight, or two spans
    that meet), where the rep was never away."""
    if not working_hours:
        return []
    zone = ZoneInfo(tz)
    starts = []
    day = low.astimezone(zone).date()
    while day <= high.astimezone(zone).date():
        for begin, _end in working_hours.get(DAYS[day.weekday()]) or []:
            at = datetime.combine(day, parse_hhmm(begin), tzinfo=zone)
            before = at - timedelta(seconds=1)
            if low < at <= high and not within_working_hours(working_hours, tz, before):
                starts.append(at.astimezone(UTC))
        day += timedelta(days=1)
    return sorted(set(starts))


AWAY_UNTIL = "out of office until "


def reason_in_words(reason: str, tz: str) -> str:
    """A reason as a manager reads it on a page: the time an absent rep is back in the rep's
    time zone, to the minute ("out of office until 2027-01-05 09:30 (Europe/Paris)"), where the
    API and the audit trail carry it as an ISO timestamp."""
    if not reason.startswith(AWAY_UNTIL):
        return reason
    try:
        back = datetime.fromisoformat(reason.removeprefix(AWAY_UNTIL))
    except ValueError:
        return reason
    try:
        back = back.astimezone(ZoneInfo(tz))
    except (ValueError, KeyError, OverflowError):
        # Back at a time that has no date in the rep's zone (an absence "until further notice",
        # up to 9999-12-31, in a zone east of UTC): said in UTC, as the API holds it.
        back, tz = back.astimezone(UTC), "UTC"
    return f"{AWAY_UNTIL}{back:%Y-%m-%d %H:%M} ({tz})"


def reasons_counted(reasons: Iterable[str]) -> str:
    """What keeps members out, each kind once with how many members it keeps out, the most
    first: "2 outside working hours, 1 out of office". What a manager can act on, in one line;
    the particulars (whose cap, back when) are in the decision's candidates."""
    kinds = Counter("out of office" if r.startswith(AWAY_UNTIL) else r.split(" (", 1)[0] for r in reasons)
    if kinds.get("rep inactive", 0) > 1:
        kinds["reps inactive"] = kinds.pop("rep inactive")
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def eligibility(m: MemberFacts, now: datetime) -> tuple[bool, str]:
    """(eligible, reason). The reason names the first thing that keeps the member out."""
    if not m.rep_active:
        return False, "rep inactive"
    if not m.member_active:
        return False, "paused in this group" + (f" ({m.paused_reason})" if m.paused_reason else "")
    for starts, ends in m.absences:
        if starts <= now < ends:
            return False, f"{AWAY_UNTIL}{ends.isoformat()}"
    try:
        within = within_working_hours(m.working_hours, m.rep_timezone, now)
    except (ValueError, TypeError, AttributeError, KeyError):
        # Validated wherever it is written; this only guards rows written around that.
        return False, "working hours unreadable (fix them on the rep)"
    if not within:
        return False, "outside working hours"
    if m.max_open is not None and m.open >= m.max_open:
        return False, f"at max_open cap ({m.open}/{m.max_open})"
    if m.max_per_day is not None and m.assigned_today >= m.max_per_day:
        return False, f"at max_per_day cap ({m.assigned_today}/{m.max_per_day})"
    return True, ""
