"""One plain sentence per audit event, for the managers reading the trail in the admin: who
got the lead and why, with the reps' names (the explanation itself holds rep ids)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def rep_ids(explanation: Mapping[str, Any], rep_id: int | None) -> set[int]:
    """The rep ids a summary names: the event's rep, and the ones its explanation refers to."""
    ids = {rep_id} if rep_id is not None else set()
    for key in ("chosen", "to_rep", "from_rep"):
        value = explanation.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return ids


def _name(rep: Any, names: Mapping[int, str]) -> str:
    if rep is None:
        return "nobody"
    return f"{names[rep]} (#{rep})" if rep in names else f"rep #{rep}"


def _skipped(candidates: Iterable[Mapping[str, Any]]) -> str:
    parts = [f"{c.get('name') or _name(c.get('rep'), {})}: {c.get('reason')}" for c in candidates]
    return "; ".join(p for p in parts if not p.endswith(": chosen"))


def event_summary(*, type: str, explanation: Mapping[str, Any], rep_id: int | None, names: Mapping[int, str]) -> str:
    """`names`: rep id -> name for the ids `rep_ids` returns (missing ones are shown by id)."""
    e = explanation
    candidates = e.get("candidates") or []
    names = {**{c["rep"]: c["name"] for c in candidates if c.get("rep") is not None and c.get("name")}, **names}
    rule = f"rule “{e['rule']}” matched" if e.get("rule") else f"no rule matched (group from {e.get('group_source')})"
    where = f"group {e.get('group')} ({e.get('strategy')})" if e.get("group") else "no group"
    if type in ("lead.assigned", "lead.rerouted", "lead.escalated") and "chosen" in e:
        text = f"Given to {_name(e.get('chosen'), names)} ({e.get('reason', 'rotation')})"
        if e.get("unchanged"):  # a reroute that found the lead where it already was
            text = f"Kept by {_name(e.get('chosen'), names)}, who already had it (assignment unchanged)"
        if "rule" in e or "group_source" in e:
            text += f": {rule}, {where}"
        if "pointer_before" in e:
            text += f"; pointer {e.get('pointer_before')} → {e.get('pointer_after')}"
        skipped = _skipped(candidates)
        return text + (f". Not chosen: {skipped}." if skipped else ".")
    if type == "lead.queued" or (type in ("lead.rerouted", "lead.escalated") and e.get("queue_reason")):
        skipped = _skipped(candidates)
        text = f"Sent to the fallback queue: {e.get('queue_reason') or 'no eligible rep'}; {rule}, {where}"
        return text + (f". Candidates: {skipped}." if skipped else ".")
    if type == "lead.reassigned":
        was = "the fallback queue" if e.get("from_rep") is None else _name(e.get("from_rep"), names)
        text = f"Assigned by hand from {was} to {_name(e.get('to_rep'), names)}"
        text += f": “{e.get('reason', '')}”"
        if e.get("not_eligible_because"):
            text += f"; the rep was not eligible ({e['not_eligible_because']})"
        if e.get("over_cap"):
            text += f"; over cap ({', '.join(e.get('caps', {}).get('exceeded', []))})"
        if e.get("member_of_group") is False:
            text += "; not a member of the lead's group"
        return text + "; the rotation pointer did not move."
    if type == "lead.duplicate":
        return f"Duplicate of lead #{e.get('duplicate_of')}: {e.get('note', 'same email has an open lead')}."
    if type == "lead.closed":
        return f"Closed as {e.get('outcome')} (was {e.get('from_status')})."
    if type == "lead.accepted":
        return f"Accepted by {_name(rep_id, names)}."
    if type == "lead.received":
        text = "Received"
        if e.get("import"):
            text += f" in import {e['import']}, line {e.get('line')}"
        elif e.get("client"):
            text += f" from API client {e['client']}"
        if e.get("source"):
            text += f", source {e['source']}"
        if e.get("requested_group"):
            text += f", asking for group {e['requested_group']}"
        return text + "."
    if type == "lead.changed" and e.get("because"):
        return f"SLA due time cleared: {e['because']}."
    if type == "lead.changed":
        facts = e.get("facts")
        if not isinstance(facts, dict):
            facts = {}
        changes = [
            f"{name} {_value(pair[0])} → {_value(pair[1])}" for name, pair in sorted(facts.items()) if len(pair) == 2
        ]
        text = f"Fields edited: {', '.join(e.get('fields') or [])}"
        if changes:
            text += f" ({'; '.join(changes)})"
        return text + "; the lead was not moved (a reroute moves it)."
    if not type.startswith("lead.") and isinstance(e.get("action"), str):
        return _config_summary(e)
    return ""


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:79] + "…"


def _config_summary(e: Mapping[str, Any]) -> str:
    """A configuration change (group, rep, membership, rule, absence, account, client): what
    was done and, for an edit, each field before and after; else a pause and a removal read
    the same ("-") in the trail."""
    action = str(e["action"])
    text = "Paused automatically" if action == "auto_paused" else action.replace("_", " ").capitalize()
    if e.get("rule"):
        text += f" rule “{e['rule']}”"
    changes = e.get("changes")
    if action in ("changed", "auto_paused") and isinstance(changes, Mapping) and changes:
        before = e.get("before")
        before = before if isinstance(before, Mapping) else {}
        parts = [
            f"{field} {_value(before[field])} → {_value(value)}" if field in before else f"{field} {_value(value)}"
            for field, value in changes.items()
        ]
        text += ": " + "; ".join(parts)
    if action == "removed" and e.get("position") is not None:
        text += f" from the rotation (was at position {e['position']})"
    return text + "."
