"""The managers' dashboard: fairness, speed and the queue per group, over a time window.

A fixed number of queries whatever the number of groups and reps (no N+1): one for the
groups, one for the memberships, one aggregate over assignments (counts, acceptances, SLA
breaches), one or two for the median time to accept, one for the queue episodes, and two more
when reps not members now were given leads in the period (their names, and the weights they
had when removed).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, F, OuterRef, Q, Subquery
from django.utils import timezone

from audit.models import QUEUE_ENTRY, AuditEvent
from rotation.models import Group, Membership, Rep, Strategy
from rotation.strategies import turn_weight

from .models import Assignment, Lead, LeadStatus

QUEUE_POINTS = 48
# Queue episodes older than this before the window are not looked for (bounds the query),
# except those of the leads queued now.
QUEUE_LOOKBACK = timedelta(days=30)


def duration_text(seconds: float | None) -> str:
    """A time to accept as a manager reads it: "45 s", "25 min", "2 h 05 min", "3 d 4 h"."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    hours = round(seconds / 3600)
    return f"{hours // 24} d {hours % 24} h"


@dataclass
class RepRow:
    rep_id: int
    name: str
    weight: int
    active: bool
    assigned: int = 0
    turns: int = 0  # of those, rotation turns (not escalations, owner matches, reroutes, by hand)
    accepted: int = 0
    breaches: int = 0
    median_accept_s: float | None = None
    share: float = 0.0  # of the group's rotation turns in the window
    target_share: float = 0.0  # fair share of turns among the members taking part (active, or given turns)
    rep_active: bool = True  # else the rep takes no leads anywhere (`active` False: paused here, or this)
    paused_reason: str = ""  # why paused in this group ("auto-paused after 3 SLA misses"...)
    member: bool = True  # False: given leads in the period, not a member now (removed, or by hand)
    removed: bool = False  # not a member now, and was one (its removal is in the audit trail)

    @property
    def median_accept(self) -> str:
        return duration_text(self.median_accept_s)

    # As percentages, to one decimal: the table and the chart's labels show the same figures.
    @property
    def share_pct(self) -> float:
        return round(100 * self.share, 1)

    @property
    def target_share_pct(self) -> float:
        return round(100 * self.target_share, 1)


@dataclass
class GroupPanel:
    id: int
    slug: str
    name: str
    strategy: str
    sla_minutes: Any
    active: bool
    reps: list[RepRow] = field(default_factory=list)
    assigned: int = 0
    turns: int = 0
    accepted: int = 0
    breaches: int = 0
    median_accept_s: float | None = None
    queue_now: int = 0
    queue_max: int = 0
    queue_points: list[tuple[datetime, int]] = field(default_factory=list)  # (end of each step, depth)
    # The most waiting at any instant of each step: what the chart draws, so that a queue
    # that filled and emptied between two points still shows.
    queue_highs: list[int] = field(default_factory=list)
    queue_since: datetime | None = None  # where the first step begins

    @property
    def median_accept(self) -> str:
        return duration_text(self.median_accept_s)

    @property
    def strategy_label(self) -> str:
        """As the group's page names it ("Round robin"), not its code ("round_robin")."""
        return str(Strategy(self.strategy).label) if self.strategy in Strategy.values else self.strategy


def natural_key(text: str) -> list[Any]:
    """Sorts "group 2" before "group 10": the runs of digits as numbers (re.split alternates
    text and digits, so like is compared with like)."""
    return [int(part) if n % 2 else part.casefold() for n, part in enumerate(re.split(r"(\d+)", text))]


def breach_q(now: datetime) -> Q:
    """An assignment missed its SLA: not accepted by its due time (accepted late, moved on
    after it, or still open past it)."""
    return Q(due_at__isnull=False) & (
        Q(accepted_at__isnull=False, accepted_at__gt=F("due_at"))
        | Q(accepted_at__isnull=True, ended_at__isnull=False, ended_at__gt=F("due_at"))
        | Q(accepted_at__isnull=True, ended_at__isnull=True, due_at__lt=now)
    )


def dashboard_view(*, since: datetime, until: datetime, group_slug: str | None = None) -> list[GroupPanel]:
    now = timezone.now()
    # As the picker lists them: by name, numbers in order ("Group 2" before "Group 10").
    groups = sorted(Group.objects.all(), key=lambda g: (natural_key(g.name), natural_key(g.slug)))
    if group_slug:
        groups = [g for g in groups if g.slug == group_slug]
    panels = {g.id: GroupPanel(g.id, g.slug, g.name, g.strategy, g.sla_minutes, g.active) for g in groups}
    by_slug = {g.slug: panels[g.id] for g in groups}
    rows: dict[tuple[int, int], RepRow] = {}
    for m in Membership.objects.filter(group_id__in=panels).select_related("rep").order_by("group_id", "position"):
        row = RepRow(
            m.rep_id,
            m.rep.name,
            m.weight,
            m.active and m.rep.active,
            rep_active=m.rep.active,
            paused_reason=m.paused_reason if not m.active else "",
        )
        rows[(m.group_id, m.rep_id)] = row
        panels[m.group_id].reps.append(row)

    window = Q(started_at__gte=since, started_at__lt=until, group_id__in=list(panels))
    # The share is of rotation turns: an escalation goes to whoever has not had the lead, so a
    # group with SLA misses would show its rotation as unfair when it is even.
    turn = Q(reason=Assignment.Reason.ROTATION)
    for group_id, rep_id, n, turns, accepted, breaches in (
        Assignment.objects.filter(window)
        .values_list("group_id", "rep_id")
        .annotate(
            n=Count("id"),
            turns=Count("id", filter=turn),
            acc=Count("accepted_at"),
            br=Count("id", filter=breach_q(now)),
        )
        .values_list("group_id", "rep_id", "n", "turns", "acc", "br")
    ):
        panel = panels[group_id]
        panel.assigned += n
        panel.turns += turns
        panel.accepted += accepted
        panel.breaches += breaches
        found = rows.get((group_id, rep_id))
        if found is None:  # not a member now: removed since, or given leads by hand
            found = rows[(group_id, rep_id)] = RepRow(rep_id, "", 0, False, member=False)
            panel.reps.append(found)
        found.assigned, found.turns, found.accepted, found.breaches = n, turns, accepted, breaches
    _former_members([(panels[g], row) for (g, _), row in rows.items() if not row.member])

    per_rep, per_group = _medians(since, until, list(panels))
    for (group_id, rep_id), value in per_rep.items():
        if (group_id, rep_id) in rows:
            rows[(group_id, rep_id)].median_accept_s = value
    for group_id, value in per_group.items():
        panels[group_id].median_accept_s = value

    for panel in panels.values():
        # The members that took part in the rotation in the period: active now, or given
        # rotation turns in it (a rep paused or removed since keeps its fair share; one away
        # all along has none, even if a manager gave it a lead by hand). The fair share is the
        # weight's share in a weighted group, an equal one in the others: a round robin gives a
        # rep of weight 2 no more turns, and the chart must not show it short-changed.
        taking_part = [r for r in panel.reps if r.active or r.turns]
        weights = sum(turn_weight(panel.strategy, r.weight) for r in taking_part)
        for r in panel.reps:
            r.share = r.turns / panel.turns if panel.turns else 0.0
            taking = weights and (r.active or r.turns)
            r.target_share = turn_weight(panel.strategy, r.weight) / weights if taking else 0.0

    _queue_depth(by_slug, since, until, now)
    return list(panels.values())


def _former_members(rows: list[tuple[GroupPanel, RepRow]]) -> None:
    """Names the reps given leads in a group they are not members of now, and, for those
    removed since, the weight they had (from their removal's audit snapshot; 1 if none)."""
    if not rows:
        return
    rep_ids = {r.rep_id for _, r in rows}
    names = dict(Rep.objects.filter(pk__in=rep_ids).values_list("id", "name"))
    weights: dict[tuple[str, int], int] = {}
    removals = AuditEvent.objects.filter(
        type=AuditEvent.Type.MEMBERSHIP_CHANGED,
        rep_id__in=rep_ids,
        group__in={p.slug for p, _ in rows},
        explanation__action="removed",
    ).order_by("id")
    for slug, rep_id, weight in removals.values_list("group", "rep_id", "explanation__before__weight"):
        if isinstance(weight, int) and rep_id is not None:
            weights[(slug, rep_id)] = weight  # the latest removal last
    for panel, row in rows:
        row.name = names.get(row.rep_id, f"rep {row.rep_id} (deleted)")
        row.removed = (panel.slug, row.rep_id) in weights
        row.weight = weights.get((panel.slug, row.rep_id), 1)


def queued_without_group() -> int:
    """Leads in the fallback queue that no group holds (no rule matched and there is no
    default group): in no group's panel, and waiting for a manager all the same."""
    return Lead.objects.filter(status=LeadStatus.QUEUED, group__isnull=True).count()


def _medians(
    since: datetime, until: datetime, group_ids: list[int]
) -> tuple[dict[tuple[int, int], float], dict[int, float]]:
    """Median seconds from assignment to acceptance, per (group, rep) and per group."""
    if not group_ids:
        return {}, {}
    if connection.vendor == "postgresql":
        sql = (
            "SELECT group_id, rep_id, percentile_cont(0.5) WITHIN GROUP "
            "(ORDER BY EXTRACT(EPOCH FROM accepted_at - started_at)) "
            "FROM leads_assignment WHERE accepted_at IS NOT NULL AND started_at >= %s AND started_at < %s "
            "AND group_id = ANY(%s) GROUP BY GROUPING SETS ((group_id, rep_id), (group_id))"
        )
        per_rep: dict[tuple[int, int], float] = {}
        per_group: dict[int, float] = {}
        with connection.cursor() as cursor:
            cursor.execute(sql, [since, until, group_ids])
            for group_id, rep_id, median in cursor.fetchall():
                if rep_id is None:
                    per_group[group_id] = float(median)
                else:
                    per_rep[(group_id, rep_id)] = float(median)
        return per_rep, per_group
    # The embedded default (SQLite) has no percentile: compute it here.
    durations: dict[tuple[int, int], list[float]] = {}
    for group_id, rep_id, started, accepted in Assignment.objects.filter(
        accepted_at__isnull=False, started_at__gte=since, started_at__lt=until, group_id__in=group_ids
    ).values_list("group_id", "rep_id", "started_at", "accepted_at"):
        if accepted is not None and group_id is not None:
            durations.setdefault((group_id, rep_id), []).append((accepted - started).total_seconds())
    grouped: dict[int, list[float]] = {}
    for (group_id, _), values in durations.items():
        grouped.setdefault(group_id, []).extend(values)
    return (
        {k: statistics.median(v) for k, v in durations.items()},
        {k: statistics.median(v) for k, v in grouped.items()},
    )


def _queue_depth(panels: dict[str, GroupPanel], since: datetime, until: datetime, now: datetime) -> None:
    """Queue depth over time, from the audit trail: a lead enters the queue with an event
    that leaves it without a rep (queued at intake, escalated or rerouted to the queue) and
    leaves it at its next assignment or when it is closed."""
    if not panels:
        return
    first_assignment = (
        Assignment.objects.filter(lead_id=OuterRef("lead_id"), started_at__gte=OuterRef("at"))
        .order_by("started_at")
        .values("started_at")[:1]
    )
    closed = Lead.objects.filter(pk=OuterRef("lead_id"), closed_at__gte=OuterRef("at")).values("closed_at")[:1]
    # The episodes of every group, the panels' or not (and of no group): a lead that a reroute
    # moved from a panel's group into another group's queue, or into the queue with no group,
    # left the first group's queue where its next episode began.
    entries = AuditEvent.objects.filter(QUEUE_ENTRY, at__lt=until)
    lookback = since - QUEUE_LOOKBACK
    # A lead still in the queue is looked for however long ago it entered it (else one stuck
    # there for longer than the lookback would drop out of "queued now"). Two reads, each by
    # its own index (the time's, the lead's), put together: as one condition ("at >= ... or
    # lead in the queue") PostgreSQL read the whole trail, most of a second at 200,000 leads.
    recent = entries.filter(at__gte=lookback)
    waiting = entries.filter(at__lt=lookback, lead_id__in=Lead.objects.filter(status=LeadStatus.QUEUED).values("id"))
    episodes = [
        row
        for part in (recent, waiting)
        for row in part.annotate(assigned_at=Subquery(first_assignment), closed_at=Subquery(closed)).values_list(
            "group", "lead_id", "at", "assigned_at", "closed_at"
        )
    ]
    step = (until - since) / QUEUE_POINTS
    ticks = [since + step * (i + 1) for i in range(QUEUE_POINTS)]
    # One lead's episodes, in order: each ends, at the latest, where its next one begins (a
    # queued lead rerouted and queued again is one lead in the queue, not two).
    by_lead: dict[int | None, dict[datetime, tuple[str, datetime | None]]] = {}
    for slug, lead_id, entered, assigned_at, closed_at in episodes:
        left = min((t for t in (assigned_at, closed_at) if t is not None), default=None)
        by_lead.setdefault(lead_id, {}).setdefault(entered, (slug, left))
    changes: dict[str, list[tuple[datetime, int]]] = {slug: [] for slug in panels}
    for lead_episodes in by_lead.values():
        starts = sorted(lead_episodes)
        for n, entered in enumerate(starts):
            slug, left = lead_episodes[entered]
            if n + 1 < len(starts) and (left is None or left > starts[n + 1]):
                left = starts[n + 1]
            if slug not in panels or (left is not None and left <= since):
                continue
            if entered <= now and (left is None or left > now):
                panels[slug].queue_now += 1
            changes[slug].append((max(entered, since), 1))
            if left is not None and left < until:
                changes[slug].append((left, -1))
    for slug in panels:
        counts, highs, peak = queue_levels(changes[slug], ticks)
        panels[slug].queue_points = list(zip(ticks, counts, strict=True))
        panels[slug].queue_highs = highs
        panels[slug].queue_since = since
        panels[slug].queue_max = peak


def queue_levels(changes: list[tuple[datetime, int]], points: list[datetime]) -> tuple[list[int], list[int], int]:
    """The queue's depth at each point, the most in it at any instant of each step (the one
    ending at the point: after the point before, up to it), and its peak at any instant, from
    its entries (+1) and exits (-1). At a point, every change at or before it counts: a lead
    that left at that very instant is no longer there. At one instant, leaving comes before
    entering (the peak is not a lead counted twice as it moves). One sweep in time order:
    checking each episode against each point was 20,000 queued leads times 48 points, a third
    of a second a page."""
    counts = [0] * len(points)
    highs = [0] * len(points)
    level = peak = point = high = 0  # high: the most in the step in progress
    for at, change in sorted(changes):
        while point < len(points) and points[point] < at:
            counts[point], highs[point] = level, high
            point += 1
            high = level  # the next step starts where this one ended
        level += change
        peak = max(peak, level)
        high = max(high, level)
    if point < len(points):
        counts[point], highs[point] = level, high
        counts[point + 1 :] = highs[point + 1 :] = [level] * (len(points) - point - 1)
    return counts, highs, peak  # every figure is a level the sweep passed through


# --- charts: server-rendered SVG geometry (no JavaScript, no CDN) ----------------------------


def share_chart(panel: GroupPanel, *, width: int = 520, bar: int = 10) -> dict[str, Any]:
    """Paired horizontal bars per rep: actual share of rotation turns vs. fair share."""
    label_w, gap = 150, 8
    # Right of the longer bar, its figures: room for the widest, "100.0% / 100.0%" (about 95 px
    # at 11 px), so that a full share is not cut off at the chart's edge.
    figures_w = 110
    plot_w = width - label_w - figures_w
    # The full width is the largest share shown, rounded up to a round figure: in a group of 25
    # a fair share is 4%, and bars drawn against 100% were a few pixels each, 3.2% and 3.5%
    # alike.
    largest = max((max(r.share, r.target_share) for r in panel.reps), default=0.0)
    scale = next((s for s in _SCALES if largest <= s), 1.0)
    rows = []
    for i, r in enumerate(panel.reps):
        y = 10 + i * (2 * bar + gap)
        rows.append(
            {
                "name": r.name,
                "y": y,
                "label_y": y + bar + 3,
                "actual_w": round(plot_w * r.share / scale, 1),
                "target_w": round(plot_w * r.target_share / scale, 1),
                "target_y": y + bar,
                "actual_pct": r.share_pct,
                "target_pct": r.target_share_pct,
                "text_x": label_w + round(plot_w * max(r.share, r.target_share) / scale, 1) + 4,
            }
        )
    height = 20 + len(rows) * (2 * bar + gap)
    return {
        "width": width,
        "height": height,
        "label_w": label_w,
        "plot_w": plot_w,
        "bar": bar,
        "rows": rows,
        "scale_pct": round(100 * scale),
    }


_SCALES = (0.05, 0.1, 0.2, 0.25, 0.5, 1.0)


def queue_chart(panel: GroupPanel, *, width: int = 520, height: int = 120) -> dict[str, Any]:
    """A step line of queue depth over the window: each step at the most waiting during it."""
    left, bottom, top = 36, 18, 8
    plot_w, plot_h = width - left - 8, height - bottom - top
    points = panel.queue_points
    peak = max(panel.queue_max, 1)
    n = max(len(points), 1)
    coords = []
    for i, value in enumerate(panel.queue_highs):
        x0 = left + plot_w * i / n
        x1 = left + plot_w * (i + 1) / n
        y = top + plot_h * (1 - value / peak)
        coords.append(f"{x0:.1f},{y:.1f} {x1:.1f},{y:.1f}")
    return {
        "width": width,
        "height": height,
        "left": left,
        "top": top,
        "bottom_y": top + plot_h,
        "right_x": left + plot_w,
        "peak": panel.queue_max,
        "polyline": " ".join(coords),
        # The chart's left edge is the period's start (as the page says it), not the first step's end.
        "start": panel.queue_since if points else None,
        "end": points[-1][0] if points else None,
        "step": (
            duration_text((points[-1][0] - panel.queue_since).total_seconds() / n)
            if points and panel.queue_since
            else ""
        ),
    }
