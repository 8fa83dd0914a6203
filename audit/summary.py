"""One plain sentence per audit event, for the managers reading the trail in the admin: who
got the lead and why, with the reps' names (the explanation itself holds rep ids)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

_AWAY_UNTIL = "out of office until "  # rotation/eligibility.py's reason, with an ISO timestamp


def rep_ids(explanation: Mapping[str, Any], rep_id: int | None) -> set[int]:
    """The rep ids a summary names: the event's rep, and the ones its explanation refers to."""
    ids = {rep_id} if rep_id is not None else set()
    owner_match = explanation.get("owner_match")
    owner = owner_match.get("owner") if isinstance(owner_match, Mapping) else None
    for value in (*(explanation.get(key) for key in ("chosen", "to_rep", "from_rep")), owner):
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return ids


def _reason(reason: Any) -> str:
    """A reason in a sentence: the time an absent rep is back to the minute, in UTC as the
    trail's times are ("out of office until 2027-01-05 08:30 UTC"), not an ISO timestamp."""
    text = str(reason)
    if text.startswith(_AWAY_UNTIL):
        try:
            back = datetime.fromisoformat(text.removeprefix(_AWAY_UNTIL)).astimezone(UTC)
        except ValueError:
            return text
        return f"{_AWAY_UNTIL}{back:%Y-%m-%d %H:%M} UTC"
    return text


def _name(rep: Any, names: Mapping[int, str]) -> str:
    if rep is None:
        return "nobody"
    return f"{names[rep]} (#{rep})" if rep in names else f"rep #{rep}"


def _skipped(candidates: Iterable[Mapping[str, Any]], chosen: Any = None) -> str:
    """The candidates passed over, each with why (the chosen one is named apart)."""
    parts = [
        f"{c.get('name') or _name(c.get('rep'), {})}: {_reason(c.get('reason'))}"
        + (f" (weight {c['weight']})" if c.get("weight") is not None else "")
        for c in candidates
        if c.get("reason") != "chosen" and (chosen is None or c.get("rep") != chosen)
    ]
    return "; ".join(parts)


# How the group was found when no rule matched (the decision's `group_source`).
_GROUP_SOURCES = {"requested": "the group the lead asked for", "default": "the default group"}


def _owner_passed_over(owner_match: Any, names: Mapping[int, str]) -> str:
    """An account owner the lead did not go to, and why (the rotation or the queue took it)."""
    if not isinstance(owner_match, Mapping) or not owner_match.get("owner_skipped"):
        return ""
    owner = _name(owner_match.get("owner"), names)
    why = _reason(owner_match["owner_skipped"])
    return f"; account owner {owner} of {owner_match.get('account')} passed over: {why}"


def _missed(e: Mapping[str, Any], names: Mapping[int, str]) -> str:
    """An escalation's cause: whose SLA ran out, on which attempt, how late, found by what."""
    text = f"SLA of {_name(e.get('from_rep'), names)} missed (attempt {e.get('missed_attempt')}"
    if e.get("late_by_s") is not None:
        text += f", {e['late_by_s']} s after the due time"
    if e.get("trigger") == "sweep":
        text += ", found by the sweep"
    text += ")"
    if e.get("auto_paused") is not None:
        text += f"; {_name(e['auto_paused'], names)} paused in the group automatically (missed SLAs in a row)"
    return text + ". "


def event_summary(*, type: str, explanation: Mapping[str, Any], rep_id: int | None, names: Mapping[int, str]) -> str:
    """`names`: rep id -> name for the ids `rep_ids` returns (missing ones are shown by id)."""
    e = explanation
    candidates = e.get("candidates") or []
    names = {**{c["rep"]: c["name"] for c in candidates if c.get("rep") is not None and c.get("name")}, **names}
    where = f"group {e.get('group')} ({e.get('strategy')})" if e.get("group") else "no group"
    if e.get("rule"):
        rule = f"rule “{e['rule']}” matched{_matched_on(e.get('matched_on'))}, {where}"
    elif e.get("group") and e.get("group_source") in _GROUP_SOURCES:
        rule = f"no rule matched, {where} as {_GROUP_SOURCES[e['group_source']]}"
    else:
        rule = f"no rule matched, {where}"
    # An escalation does not run the rules again: the lead stays in its group.
    decided = "rule" in e or "group_source" in e
    cause = _missed(e, names) if type == "lead.escalated" else ""
    if type == "lead.rerouted" and not e.get("unchanged") and e.get("from_status"):
        origin = "the fallback queue" if e.get("from_rep") is None else _name(e["from_rep"], names)
        cause = f"Rerouted from {origin}" + (f" in group {e['from_group']}" if e.get("from_group") else "")
        cause += f" (was {e['from_status']}). "
    passed_over = _owner_passed_over(e.get("owner_match"), names)
    if type in ("lead.assigned", "lead.rerouted", "lead.escalated") and e.get("chosen") is not None:
        default_reason = "escalation" if type == "lead.escalated" else "rotation"
        weight = next((c.get("weight") for c in candidates if c.get("rep") == e.get("chosen")), None)
        how = e.get("reason") or default_reason
        how += f", weight {weight}" if weight is not None else ""
        text = f"Given to {_name(e.get('chosen'), names)} ({how})"
        if e.get("unchanged"):  # a reroute that found the lead where it already was
            text = f"Kept by {_name(e.get('chosen'), names)}, who already had it (assignment unchanged)"
        if e.get("trigger") == "queue_drain":
            text += " from the fallback queue"
            if e.get("queued_because"):
                text += f" (queued because: {e['queued_because']})"
            if e.get("drained_because"):
                text += f", when {e['drained_because']}"
        if not e.get("unchanged") and e.get("reason") == "owner_match" and e.get("account"):
            text += f", as the account owner of {e['account']} (the rotation untouched)"
        if decided:
            text += f": {rule}"
        text += passed_over
        if "pointer_before" in e:
            text += f"; pointer {e.get('pointer_before')} → {e.get('pointer_after')}"
        skipped = _skipped(candidates, e.get("chosen"))
        return cause + text + (f". Not chosen: {skipped}." if skipped else ".")
    if type in ("lead.queued", "lead.rerouted", "lead.escalated"):
        skipped = _skipped(candidates)
        text = f"Sent to the fallback queue: {e.get('queue_reason') or 'no eligible rep'}"
        if not decided:
            text += f"; {where}"
        elif e.get("rule") or e.get("group"):  # with neither, the queue reason just said so
            text += f"; {rule}"
        text += passed_over
        return cause + text + (f". Candidates: {skipped}." if skipped else ".")
    if type == "lead.reassigned":
        was = "the fallback queue" if e.get("from_rep") is None else _name(e.get("from_rep"), names)
        text = f"Assigned by hand from {was} to {_name(e.get('to_rep'), names)}"
        text += f": “{e.get('reason', '')}”"
        if e.get("not_eligible_because"):
            text += f"; the rep was not eligible ({_reason(e['not_eligible_because'])})"
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
    if type == "client.changed" and isinstance(e.get("change"), str):
        return _client_summary(e)
    return ""


def _client_summary(e: Mapping[str, Any]) -> str:
    """Who may call in or is called out: an API client, a web-form source, a webhook endpoint."""
    if e.get("api_client") is not None:
        text = f"API client “{e['api_client']}”"
    elif e.get("intake_source") is not None:
        text = f"Web-form source “{e['intake_source']}”"
    elif e.get("webhook_endpoint") is not None:
        text = f"Webhook endpoint #{e['webhook_endpoint']}"
    else:
        text = "Client"
    text += f" {e['change']}"
    details = []
    if isinstance(e.get("scopes"), list):
        details.append(f"scopes {', '.join(str(s) for s in e['scopes'])}")
    if e.get("url"):
        details.append(f"url {e['url']}")
    if isinstance(e.get("fields"), Mapping):
        details.extend(f"{field} {_value(value)}" for field, value in e["fields"].items())
    elif isinstance(e.get("fields"), list):
        details.append(f"fields {', '.join(str(f) for f in e['fields'])}")
    return text + (f" ({'; '.join(details)})" if details else "") + "."


_OPS = {"equals": "=", "in": "in", "not_in": "not in", "contains": "contains", "gte": "≥", "lte": "≤"}


def _matched_on(conditions: Any) -> str:
    """ " (country "FR" in ["FR","BE"]; score 80 ≥ 50)": each condition with the lead's value."""
    if not isinstance(conditions, list) or not conditions:
        return ""
    parts = []
    for c in conditions:
        if not isinstance(c, Mapping):
            continue
        field = str(c.get("field"))
        if c.get("op") == "exists":
            parts.append(f"{field} {'present' if c.get('value', True) is not False else 'absent'}")
        else:
            op = _OPS.get(str(c.get("op")), str(c.get("op")))
            parts.append(f"{field} {_value(c.get('lead'))} {op} {_value(c.get('value'))}")
    return f" ({'; '.join(parts)})" if parts else ""


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
    if isinstance(e.get("account"), str):
        text += f" account {e['account']}"
    changes = e.get("changes")
    if action in ("changed", "auto_paused") and isinstance(changes, Mapping) and changes:
        before = e.get("before")
        before = before if isinstance(before, Mapping) else {}
        parts = [
            f"{field} {_value(before[field])} → {_value(value)}" if field in before else f"{field} {_value(value)}"
            for field, value in changes.items()
        ]
        text += ": " + "; ".join(parts)
    window = e.get("changes") if action == "created" else e.get("before") if action == "deleted" else None
    if isinstance(window, Mapping) and window.get("starts_at") and window.get("ends_at"):  # an absence
        text += f": out of office from {window['starts_at']} to {window['ends_at']}"
        text += f" ({window['reason']})" if window.get("reason") else ""
    if action == "joined" and isinstance(changes, Mapping):  # the terms it joined on
        terms = [f"position {changes['position']}"] if changes.get("position") is not None else []
        terms += [f"weight {changes['weight']}"] if changes.get("weight") is not None else []
        terms += [f"{cap} {changes[cap]}" for cap in ("max_open", "max_per_day") if changes.get(cap) is not None]
        if changes.get("active") is False:
            terms.append("paused" + (f" ({changes['paused_reason']})" if changes.get("paused_reason") else ""))
        text += f" at {', '.join(terms)}" if terms else ""
    if action == "removed" and e.get("position") is not None:
        text += f" from the rotation (was at position {e['position']})"
    return text + "."
