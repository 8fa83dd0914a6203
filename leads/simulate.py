"""Simulate: what routing would do with a lead right now, without writing anything.

The same steps as intake (rules, the lead's own group, the default group; the account owner;
the group's members read now; the pure pick), minus the locks and the writes. It reads the
rotation row without locking it, so under concurrent intake the answer is a snapshot.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from rotation.eligibility import eligibility
from rotation.models import Group, Rep, RotationState

from . import ownership, routing
from .models import DEDUP_STATUSES, Lead
from .services import lead_resolve_group, normalize_email


def routing_simulate(*, data: dict[str, Any], requested: Group | None) -> dict[str, Any]:
    now = timezone.now()
    resolution = lead_resolve_group(data=data, requested=requested)
    group = resolution.group
    result: dict[str, Any] = {
        "rule": resolution.rule,
        "rules_tried": resolution.rules_tried,
        "matched_on": resolution.matched_on if resolution.rule is not None else None,
        "group_source": resolution.source,
        "group": group.slug if group else None,
        "strategy": group.strategy if group else None,
        "rep": None,
        "reason": None,
        "queue_reason": None,
        "duplicate_of": None,
        "account": resolution.owner.domain if resolution.owner else None,
        "pointer_before": None,
        "pointer_after": None,
        "candidates": [],
    }
    window = group.dedup_days if group else 30
    duplicate = window and (
        Lead.objects.filter(
            email_normalized=normalize_email(data["email"]),
            status__in=DEDUP_STATUSES,
            created_at__gte=now - timedelta(days=window),
        )
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if duplicate:  # 0: the group keeps no window
        result["duplicate_of"] = duplicate
        return result
    if group is None:
        result["queue_reason"] = "no rule matched and there is no default group"
        return result
    if not group.active:
        result["queue_reason"] = f"group '{group.slug}' is inactive"
        return result
    state = RotationState.objects.filter(group=group).first() or RotationState(group=group)
    facts, decision = ownership.group_decide(owner=resolution.owner, group=group, state=state, now=now)
    described = {c["rep"]: c for c in decision.candidates}
    for f in facts:
        ok, why = eligibility(f, now)
        reason = described[f.rep_id]["reason"] if f.rep_id in described else (why or "eligible")
        result["candidates"].append(
            {"rep": {"id": f.rep_id, "name": f.rep_name, "email": f.rep_email}, "eligible": ok, "reason": reason}
        )
        if f.rep_id == decision.rep_id:
            result["rep"] = {"id": f.rep_id, "name": f.rep_name, "email": f.rep_email}
    # The account owner when it is not a member: routing's explanation names it too (with why).
    members = {f.rep_id for f in facts}
    for c in decision.candidates:
        if c["rep"] not in members:
            rep = Rep.objects.filter(id=c["rep"]).values("id", "name", "email").first()
            result["candidates"].append({"rep": rep, "eligible": c["eligible"], "reason": c["reason"]})
    result["pointer_before"], result["pointer_after"] = decision.pointer_before, decision.pointer_after
    if decision.rep_id is not None:
        result["reason"] = decision.reason
    else:
        result["queue_reason"] = routing.queue_reason(group, decision)
    if "owner_match" in decision.notes:
        result["owner_skipped"] = decision.notes["owner_match"]["owner_skipped"]
    return result
