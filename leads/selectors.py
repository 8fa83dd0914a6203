"""Reads: the rotation view."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from rotation.eligibility import eligibility
from rotation.models import Group, RotationState
from rotation.strategies import turn_weight

from . import routing
from .models import Assignment

# How far the rotation view plays the rotation out to say when each member's next turn comes:
# 500 leads, fewer in a group of more than 20 members (each lead played out weighs every
# member: a bound on the work, about 10,000 member-steps, so a large group's page stays quick).
AHEAD_LIMIT = 500
_AHEAD_WORK = 10_000


def ahead_limit(members: int) -> int:
    return max(50, min(AHEAD_LIMIT, _AHEAD_WORK // max(members, 1)))


def rotation_view(*, group: Group) -> dict[str, Any]:
    """Pointer, who is next, and each member's eligibility right now, with counts today and
    this week against the member's fair share of turns (`share`: its weight's share of the
    active members' in a weighted group, an equal share in the others, whose rotation gives
    weights no say). Read without the lock: a snapshot."""
    now = timezone.now()
    state = RotationState.objects.filter(group=group).first() or RotationState(group=group)
    facts = routing.member_facts(group, now, with_counts=True)
    decision = routing.decide(
        strategy=group.strategy,
        pointer=state.pointer,
        current_weights=state.current_weights or {},
        facts=facts,
        now=now,
    )
    # Played out only where the group routes at all: an inactive group's leads are queued.
    ahead = (
        routing.turns_ahead(
            strategy=group.strategy,
            pointer=state.pointer,
            current_weights=state.current_weights or {},
            facts=facts,
            now=now,
            limit=ahead_limit(len(facts)),
        )
        if group.active
        else {}
    )
    # This week's assignments per rep; of them, those it got by escalation (a lead another rep
    # let run out: an escalation is a rotation turn, README) and those whose SLA it let run out.
    weekly = {
        rep_id: (n, escalated, missed)
        for rep_id, n, escalated, missed in Assignment.objects.filter(
            group=group, started_at__gte=routing.week_start(now, group.timezone)
        )
        .values_list("rep_id")
        .annotate(
            n=Count("id"),
            escalated=Count("id", filter=Q(reason=Assignment.Reason.ESCALATION)),
            missed=Count("id", filter=Q(end_reason="sla_missed")),
        )
        .values_list("rep_id", "n", "escalated", "missed")
    }
    week = {rep_id: n for rep_id, (n, _, _) in weekly.items()}
    active_weight = sum(turn_weight(group.strategy, f.weight) for f in facts if f.member_active and f.rep_active) or 1
    week_total = sum(week.values())
    members = []
    next_rep = None
    for f in facts:
        # An inactive group routes nothing (its leads are queued): that keeps every member out first.
        ok, reason = eligibility(f, now) if group.active else (False, "group inactive")
        rep = {"id": f.rep_id, "name": f.rep_name, "email": f.rep_email}
        if f.rep_id == decision.rep_id:
            next_rep = rep
        current = (state.current_weights or {}).get(str(f.rep_id))
        if isinstance(current, int) and current < 0:
            current = -current - 1  # stored marked while away (rotation/strategies.py): the same distance
        members.append(
            {
                "rep": rep,
                "position": f.position,
                "weight": f.weight,
                "active": f.member_active,
                "eligible": ok,
                "reason": reason or None,
                "current_weight": current if group.strategy == "weighted" else None,
                "leads_ahead": ahead.get(f.rep_id),
                "open": f.open,
                "assigned_today": f.assigned_today,
                "assigned_week": week.get(f.rep_id, 0),
                "escalated_to_week": weekly.get(f.rep_id, (0, 0, 0))[1],
                "sla_missed_week": weekly.get(f.rep_id, (0, 0, 0))[2],
                "share": (
                    round(turn_weight(group.strategy, f.weight) / active_weight, 4)
                    if f.member_active and f.rep_active
                    else 0.0
                ),
                "share_week": round(week.get(f.rep_id, 0) / week_total, 4) if week_total else None,
            }
        )
    return {
        "group": group.slug,
        "strategy": group.strategy,
        "active": group.active,
        "pointer": state.pointer,
        "turns": state.turns,
        "next": next_rep if group.active else None,
        "members": members,
    }
