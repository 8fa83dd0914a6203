"""Replay: route a past window's leads again, in memory, through the current or a proposed
configuration, and compare per-rep counts with what routing actually did. Writes nothing.

What a replay takes from where:

- the turns: every routing decision recorded in the audit trail in [since, until) (intake,
  bulk import, escalation, reroute, queue drain: each event whose explanation carries the
  decision), in the order they were taken; a queue drain's decision is no turn for a lead the
  replay has already given a rep (in the replay it was never queued), and a reroute that picks
  the rep the replay gave the lead to leaves it there without moving the rotation, as routing
  does (`unchanged`);
- the rotation's starting point per group: the pointer and weights recorded before the group's
  first decision in the window (the rotation row now, for a group with none);
- availability at the time (rep inactive, paused, out of office, outside working hours or
  working hours unreadable, already had the lead): from the record of each decision, since that
  is what was true then; a member with no record for that decision (a lead the rules now send
  elsewhere) is judged from the current configuration at the decision's time (absences,
  working hours);
- configuration (strategy, members and their weights, caps, rules): the current one, with the
  proposed overrides; each lead's group is resolved again by the active rules (or the proposed
  ones), then its own group, then the default group, on the facts the lead had at the decision
  (a country or a score edited since is undone from the edit's `lead.changed` event; the
  attributes and the email, which those events do not hold, are read as they are now); a
  proposed `active` overrides the recorded pause; members that joined after a decision are not
  candidates for it;
- counts for caps and least-loaded: the open/today counts routing read then (recorded when it
  needed them), shifted by how many more or fewer leads the replay has given each rep so far;
  without a record, today's count is rebuilt from assignments and the open count from leads
  still open that were assigned before the window (an approximation: closes inside the window
  are not replayed);
- the account's owner takes its leads (no turn) while it may, as at intake: a member of the
  group, eligible then under the proposed configuration; otherwise the group's fallback (the
  rotation, or the queue) decides. The owner is the one routing considered then, or, for a
  lead the rules now send to another group, the account's owner now.

So a replay of the live configuration over a window in which the configuration did not change
reproduces what routing did, turn by turn.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q

from audit.models import AuditEvent
from rotation import strategies
from rotation.eligibility import MemberFacts, eligibility, within_working_hours
from rotation.models import Absence, Group, Membership, Rep, RotationState, Strategy
from rotation.rules import RuleError, RuleSpec, lead_facts, match_rules, validate_conditions

from . import ownership, routing
from .models import OPEN_STATUSES, Assignment, Lead
from .services import active_rules

UNAVAILABLE = (
    "rep inactive",
    "paused in this group",
    "out of office",
    "outside working hours",
    "working hours unreadable",
    "already had this lead",
)
MEMBER_OVERRIDES = {"weight", "active", "max_open", "max_per_day"}
GROUP_OVERRIDES = {"strategy", "members"}
CONFIG_KEYS = GROUP_OVERRIDES | {"groups", "rules"}
RULE_KEYS = {"id", "name", "priority", "conditions", "group", "active"}


Counts = Callable[[int, datetime, Mapping[str, Any] | None], tuple[int, int]]


class ReplayError(ValueError):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


@dataclass(frozen=True)
class MemberConfig:
    rep_id: int
    name: str
    email: str
    position: int
    weight: int
    active: bool
    rep_active: bool
    max_open: int | None
    max_per_day: int | None
    joined_at: datetime
    timezone: str
    working_hours: Mapping[str, Any] | None


@dataclass
class GroupConfig:
    id: int
    slug: str
    strategy: str
    timezone: str
    active: bool
    members: dict[int, MemberConfig]
    active_override: dict[int, bool] = field(default_factory=dict)
    owner_fallback: bool = True  # Group.owner_match_fallback_to_rotation


# --- configuration -----------------------------------------------------------------------------


def _current_groups() -> dict[str, GroupConfig]:
    groups = {
        g.slug: GroupConfig(
            g.id, g.slug, g.strategy, g.timezone, g.active, {}, owner_fallback=g.owner_match_fallback_to_rotation
        )
        for g in Group.objects.order_by("slug")
    }
    by_id = {g.id: g for g in groups.values()}
    for m in Membership.objects.select_related("rep").order_by("position"):
        by_id[m.group_id].members[m.rep_id] = MemberConfig(
            m.rep_id,
            m.rep.name,
            m.rep.email,
            m.position,
            m.weight,
            m.active,
            m.rep.active,
            m.max_open,
            m.max_per_day,
            m.joined_at,
            m.rep.timezone,
            m.rep.working_hours,
        )
    return groups


# A member's overrides as a saved member takes them (the model's and the API's limits): a
# proposal is one that could be saved.
_MEMBER_COUNTS = (("weight", 1, 1000, False), ("max_open", 0, 1_000_000, True), ("max_per_day", 0, 1_000_000, True))


def _count(value: Any, name: str, minimum: int, maximum: int, allow_null: bool) -> int | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}{' or null' if allow_null else ''}.")
    return value


def _apply_group(group: GroupConfig, spec: Any, where: str, errors: list[str]) -> None:
    if not isinstance(spec, dict):
        errors.append(f"{where}: must be an object with strategy and/or members.")
        return
    for key in sorted(set(spec) - GROUP_OVERRIDES):
        errors.append(f"{where}: unknown key '{key}' (use strategy, members).")
    if "strategy" in spec:
        if spec["strategy"] not in Strategy.values:
            errors.append(f"{where}.strategy: one of {', '.join(Strategy.values)}.")
        else:
            group.strategy = spec["strategy"]
    members = spec.get("members", {})
    if not isinstance(members, dict):
        errors.append(f"{where}.members: an object keyed by rep id.")
        return
    for key, override in members.items():
        # The id as the API gives it: ASCII digits only (int() also reads " 1", "1_0" and "١").
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            errors.append(f"{where}.members: '{key}' is not a rep id.")
            continue
        rep_id = int(key)
        member = group.members.get(rep_id)
        if member is None:
            errors.append(f"{where}.members: rep {rep_id} is not a member of '{group.slug}'.")
            continue
        if not isinstance(override, dict):
            errors.append(f"{where}.members.{rep_id}: an object of {', '.join(sorted(MEMBER_OVERRIDES))}.")
            continue
        # Every problem of the member named, not only its first.
        problems = [f"unknown key '{name}'." for name in sorted(set(override) - MEMBER_OVERRIDES)]
        changes: dict[str, Any] = {}
        for name, minimum, maximum, allow_null in _MEMBER_COUNTS:
            if name in override:
                try:
                    changes[name] = _count(override[name], name, minimum, maximum, allow_null)
                except ValueError as exc:
                    problems.append(str(exc))
        if "active" in override and not isinstance(override["active"], bool):
            problems.append("active must be true or false.")
        if problems:
            errors.extend(f"{where}.members.{rep_id}: {problem}" for problem in problems)
            continue
        if "active" in override:
            group.active_override[rep_id] = override["active"]
        group.members[rep_id] = replace(member, **changes)


def replay_config(*, config: Any, group: str | None) -> tuple[dict[str, GroupConfig], list[RuleSpec] | None]:
    """The current configuration with the proposed overrides applied; ReplayError names every
    problem. `config` may hold `strategy`/`members` (for `group`), `groups` (by slug) and
    `rules` (replacing the active rules)."""
    groups = _current_groups()
    errors: list[str] = []
    # An unknown group and the configuration's problems are named together (one 400 naming
    # every bad field); the overrides meant for an unknown group cannot be checked.
    unknown_group = {"group": [f"No group with slug '{group}'."]} if group is not None and group not in groups else {}
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ReplayError({**unknown_group, "config": ["Must be an object (strategy, members, groups, rules)."]})
    for key in sorted(set(config) - CONFIG_KEYS):
        errors.append(f"unknown key '{key}' (use {', '.join(sorted(CONFIG_KEYS))}).")
    own = {k: v for k, v in config.items() if k in GROUP_OVERRIDES}
    if own:
        if group is None:
            errors.append("strategy and members apply to the replayed group: name it in 'group' (or use 'groups').")
        elif not unknown_group:
            _apply_group(groups[group], own, group, errors)
    per_group = config.get("groups", {})
    if not isinstance(per_group, dict):
        errors.append("groups: an object keyed by group slug.")
        per_group = {}
    for slug, spec in per_group.items():
        if slug not in groups:
            errors.append(f"groups: no group with slug '{slug}'.")
            continue
        if group is not None and slug != group:
            # Its figures are not in the answer, and no change to it moves a figure of the
            # replayed group (rules pick the group first): taken without a word, it read as "no
            # change" to a proposal that was never looked at.
            errors.append(
                f"groups.{slug}: the replay covers group '{group}' only; leave 'group' out to replay every group."
            )
            continue
        _apply_group(groups[slug], spec, f"groups.{slug}", errors)
    rules: list[RuleSpec] | None = None
    if "rules" in config:
        rules = []
        if not isinstance(config["rules"], list):
            errors.append("rules: a list of {name, priority, conditions, group}.")
        else:
            for i, spec in enumerate(config["rules"]):
                where = f"rules[{i}]"
                if not isinstance(spec, dict) or not isinstance(spec.get("group"), str):
                    errors.append(f"{where}: an object with name, priority, conditions and group (slug).")
                    continue
                # The rules as GET /api/v1/rules/ lists them may be sent back edited: `id` is
                # ignored and a rule with `active: false` is left out, as routing leaves it out.
                # Every problem of the rule is named, not only its first.
                keys = ", ".join(sorted(RULE_KEYS))
                problems = [f"unknown key '{key}' (use {keys})." for key in sorted(set(spec) - RULE_KEYS)]
                name = spec.get("name")
                if name is not None and not (isinstance(name, str) and 0 < len(name) <= 200):
                    problems.append("name must be text of 1 to 200 characters.")  # as a saved rule's
                if spec["group"] not in groups:
                    problems.append(f"no group with slug '{spec['group']}'.")
                priority = spec.get("priority", 100)
                if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 1_000_000:
                    problems.append("priority must be an integer from 0 to 1000000.")
                active = spec.get("active", True)
                if not isinstance(active, bool):
                    problems.append("active must be true or false.")
                conditions: list[dict[str, Any]] = []
                if spec.get("conditions") == []:
                    problems.append("a rule needs at least one condition (as a saved rule does).")
                else:
                    try:
                        conditions = validate_conditions(spec.get("conditions"))
                    except RuleError as exc:
                        problems.extend(exc.messages)
                if problems:
                    errors.extend(f"{where}: {problem}" for problem in problems)
                    continue
                if active:
                    name = name or where
                    # Ids rising in the order listed: a priority tie goes to the rule listed
                    # first, as routing gives it to the rule saved first (the list's order).
                    rules.append(RuleSpec(i - len(config["rules"]), name, priority, conditions, spec["group"]))
    if errors or unknown_group:
        raise ReplayError({**unknown_group, **({"config": errors} if errors else {})})
    return groups, rules


# --- the replay --------------------------------------------------------------------------------


@dataclass
class _GroupRun:
    config: GroupConfig
    pointer: int
    weights: dict[str, int]
    started: bool = False


def _recorded_unavailable(reason: str) -> str:
    return reason if reason.startswith(UNAVAILABLE) else ""


def routing_replay(
    *, since: datetime, until: datetime, group: str | None = None, config: Any = None, max_turns: int | None = None
) -> dict[str, Any]:
    """Routes the window's decisions again in memory and returns per-rep counts, actual vs
    proposed, per group. Reads only. With `max_turns`, a larger window is refused (the API
    bounds the work one request may ask for; the command does not)."""
    if until <= since:
        raise ReplayError({"until": ["Must be after since."]})
    groups, proposed_rules = replay_config(config=config, group=group)
    # Without proposed rules, the active ones: they are part of the current configuration. So
    # every group's decisions are read, also for one group: a rule may send leads into it.
    rules = active_rules() if proposed_rules is None else proposed_rules
    events = AuditEvent.objects.filter(at__gte=since, at__lt=until).filter(
        Q(explanation__has_key="candidates") | Q(explanation__has_key="group_source")
    )
    if max_turns is not None and events.count() > max_turns:
        raise ReplayError(
            {"since": [f"The window holds more than {max_turns} routing decisions; narrow it or use replay_routing."]}
        )
    turns = list(events.order_by("id").values("id", "type", "at", "lead_id", "group", "rep_id", "explanation"))
    # A manager's reassign takes no turn, but it is who holds the lead when a reroute comes.
    reassigns = deque(
        AuditEvent.objects.filter(type=AuditEvent.Type.LEAD_REASSIGNED, at__gte=since, at__lt=until)
        .order_by("id")
        .values_list("id", "lead_id", "group", "explanation")
    )

    leads: dict[int, dict[str, Any]] = {}
    default_group = next((g.slug for g in Group.objects.filter(is_default=True)), None)
    ids = {t["lead_id"] for t in turns if "group_source" in t["explanation"]}
    for row in Lead.objects.filter(id__in=ids).values(
        "id",
        "email",
        "country",
        "region",
        "source",
        "product",
        "score",
        "company_size",
        "attributes",
        "requested_group",
    ):
        leads[row["id"]] = dict(row)
    # The routing facts each decision read: the lead's now, with the edits made after the
    # decision undone (a PATCH records the facts it changed, before and after, and never moves
    # the lead: its decisions stand on what the lead said then). Newest edit first.
    edits: dict[int, list[tuple[int, Mapping[str, Any]]]] = defaultdict(list)
    if turns:
        for edited_lead, event_id, change in (
            AuditEvent.objects.filter(type=AuditEvent.Type.LEAD_CHANGED, lead_id__in=ids, id__gt=turns[0]["id"])
            .order_by("-id")
            .values_list("lead_id", "id", "explanation")
        ):
            facts = change.get("facts") if isinstance(change, dict) else None
            if edited_lead is not None and isinstance(facts, dict):
                edits[edited_lead].append((event_id, facts))

    def facts_then(lead_id: int, event_id: int) -> dict[str, Any]:
        lead = leads[lead_id]
        later = [facts for edited, facts in edits.get(lead_id, ()) if edited > event_id]
        if not later:
            return lead
        then = dict(lead)
        for facts in later:
            for name, values in facts.items():
                if name in then and isinstance(values, list) and len(values) == 2:
                    then[name] = values[0]
        return then

    absences: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for rep_id, starts, ends in Absence.objects.filter(starts_at__lt=until, ends_at__gt=since).values_list(
        "rep_id", "starts_at", "ends_at"
    ):
        absences[rep_id].append((starts, ends))

    runs: dict[str, _GroupRun] = {}
    actual: dict[str, Counter[int | None]] = defaultdict(Counter)
    proposed: dict[str, Counter[int | None]] = defaultdict(Counter)
    delta_open: Counter[tuple[str, int]] = Counter()
    delta_today: Counter[tuple[str, int, datetime]] = Counter()
    replayed_today: Counter[tuple[str, int, datetime]] = Counter()
    actual_in_window: Counter[tuple[str, int]] = Counter()
    baseline_cache: dict[tuple[str, Any, int, datetime | None], int] = {}
    changed = in_scope = 0
    queued_because: dict[str, Counter[str]] = defaultdict(Counter)
    moves: Counter[tuple[str, str]] = Counter()  # (the group routing used, the replay's): decisions
    given: dict[int, tuple[str, int]] = {}  # the leads the replay has given a rep: group and rep
    seen: set[int] = set()  # the leads the replay has decided (or a manager reassigned) so far
    queued_none = "(no group)"

    # Each group's first recorded decision in the window: the rotation stood there when the
    # window began (whichever turn, kept or moved by the rules, reaches the group first).
    firsts: dict[str, Mapping[str, Any]] = {}
    for turn in turns:
        if turn["group"] and turn["group"] not in firsts and "pointer_before" in turn["explanation"]:
            firsts[turn["group"]] = turn["explanation"]

    def run_for(slug: str) -> _GroupRun:
        if slug not in runs:
            g = groups[slug]
            first = firsts.get(slug)
            if first is not None:
                pointer, weights = first["pointer_before"], dict(first.get("current_weights_before") or {})
            else:
                state = RotationState.objects.filter(group_id=g.id).first()
                pointer = state.pointer if state else 0
                weights = dict(state.current_weights or {}) if state else {}
            runs[slug] = _GroupRun(g, pointer, weights)
        return runs[slug]

    def baseline(kind: str, g: GroupConfig, rep_id: int, day: datetime | None) -> int:
        key = (kind, g.id, rep_id, day)
        if key not in baseline_cache:
            if kind == "open":
                baseline_cache[key] = Lead.objects.filter(
                    group_id=g.id, owner_id=rep_id, status__in=OPEN_STATUSES, assigned_at__lt=since
                ).count()
            else:
                assert day is not None
                baseline_cache[key] = (
                    Assignment.objects.filter(
                        group_id=g.id, rep_id=rep_id, started_at__gte=day, started_at__lt=since
                    ).count()
                    if day < since
                    else 0
                )
        return baseline_cache[key]

    def counts_for(g: GroupConfig) -> Counts:
        def counts(rep_id: int, day: datetime, record: Mapping[str, Any] | None) -> tuple[int, int]:
            """(open, today) as routing would read them in the replayed history."""
            if record is not None and "open" in record:
                open_ = record["open"] + delta_open[(g.slug, rep_id)]
            else:
                open_ = baseline("open", g, rep_id, None) + delta_open[(g.slug, rep_id)] + _actual_open_so_far(rep_id)
            if record is not None and "today" in record:
                today = record["today"] + delta_today[(g.slug, rep_id, day)]
            else:
                today = baseline("today", g, rep_id, day) + replayed_today[(g.slug, rep_id, day)]
            return max(open_, 0), max(today, 0)

        def _actual_open_so_far(rep_id: int) -> int:
            return actual_in_window[(g.slug, rep_id)]

        return counts

    for turn in turns:
        while reassigns and reassigns[0][0] < turn["id"]:
            _, reassigned, slug, change = reassigns.popleft()
            to_rep = change.get("to_rep") if isinstance(change, dict) else None
            if reassigned is not None and slug and isinstance(to_rep, int):
                given[reassigned] = (slug, to_rep)
                seen.add(reassigned)
        ex: dict[str, Any] = turn["explanation"]
        at: datetime = turn["at"]
        actual_group = turn["group"] or None
        actual_rep = ex.get("chosen")
        actual[actual_group or queued_none][actual_rep] += 1
        # A queue drain's turn for a lead the replay has given a rep: in the replay the lead
        # was never in the queue, so no turn (and no second rep) for it.
        drained_already = ex.get("trigger") == "queue_drain" and turn["lead_id"] in given

        target = actual_group
        if "group_source" in ex and turn["lead_id"] in leads:
            lead = facts_then(turn["lead_id"], turn["id"])
            match = match_rules(rules, lead_facts(lead))
            if match.rule is not None:
                target = match.rule.group_slug
            elif lead["requested_group"] and lead["requested_group"] in groups:
                target = lead["requested_group"]
            else:
                target = default_group
        picked: int | None = None
        why_queued = ""
        if target is None:
            why_queued = "no rule matched and there is no default group"
        elif target not in groups:
            why_queued = f"no group '{target}' now"
        elif not groups[target].active:
            why_queued = f"group '{target}' inactive"
        if not drained_already and target is not None and target in groups and groups[target].active:
            same_group = target == actual_group
            if same_group:
                owner = _recorded_owner(ex)
            else:  # the rules now send the lead here: its account's owner now, if any
                moved = leads.get(turn["lead_id"] or 0)
                owner = _account_owner(moved["email"]) if moved else None
            run = run_for(target)
            # A reroute whose pick is the rep the replay gave the lead to in this group leaves
            # the lead there and the rotation where it was, as routing does (`unchanged`).
            lead_id: int | None = turn["lead_id"]
            holding: tuple[str, int] | None = None
            if turn["type"] == AuditEvent.Type.LEAD_REROUTED and lead_id is not None:
                if lead_id in seen:
                    holding = given.get(lead_id)
                elif ex.get("from_group") and isinstance(ex.get("from_rep"), int):
                    holding = (ex["from_group"], ex["from_rep"])  # decided before the window
            picked, why_queued = _replay_turn(
                run=run,
                recorded={c["rep"]: c for c in ex.get("candidates", [])} if same_group else {},
                at=at,
                absences=absences,
                counts=counts_for(run.config),
                owner=owner,
                holding=holding[1] if holding is not None and holding[0] == target else None,
            )
        if not drained_already:
            proposed[target or queued_none][picked] += 1
            if picked is None:
                queued_because[target or queued_none][why_queued] += 1
            if (target or queued_none) != (actual_group or queued_none):
                moves[(actual_group or queued_none, target or queued_none)] += 1
        if turn["lead_id"] is not None and not drained_already:
            seen.add(turn["lead_id"])
            if picked is not None and target is not None:
                given[turn["lead_id"]] = (target, picked)
            else:
                given.pop(turn["lead_id"], None)
        # For one group: the decisions routing took there, or the replay takes there.
        if group is None or group in (actual_group, target):
            in_scope += 1
            if (target, picked) != (actual_group, actual_rep):
                changed += 1
        # What the replay gave beyond (or short of) what routing gave: shifts the recorded counts.
        if picked is not None and target is not None and target in groups:
            day = routing.day_start(at, groups[target].timezone)
            delta_open[(target, picked)] += 1
            delta_today[(target, picked, day)] += 1
            replayed_today[(target, picked, day)] += 1
        if actual_rep is not None and actual_group is not None and actual_group in groups:
            day = routing.day_start(at, groups[actual_group].timezone)
            delta_open[(actual_group, actual_rep)] -= 1
            delta_today[(actual_group, actual_rep, day)] -= 1
            actual_in_window[(actual_group, actual_rep)] += 1

    return _report(
        since=since,
        until=until,
        group=group,
        config=config,
        groups=groups,
        actual=actual,
        proposed=proposed,
        turns=in_scope,
        changed=changed,
        queued_none=queued_none,
        queued_because=queued_because,
        moves=moves,
    )


def _hours_reason(m: MemberConfig, at: datetime) -> str:
    """As `eligibility`: outside the rep's working hours, or hours written around validation
    that cannot be read (which keep the rep out, never fail the replay)."""
    try:
        return "" if within_working_hours(m.working_hours, m.timezone, at) else "outside working hours"
    except (ValueError, TypeError, AttributeError, KeyError):
        return "working hours unreadable (fix them on the rep)"


def _recorded_owner(ex: Mapping[str, Any]) -> int | None:
    """The account owner routing considered for this decision (it took the lead, or was skipped)."""
    if ex.get("reason") == ownership.OWNER_MATCH:
        return ex.get("chosen")
    skipped = ex.get("owner_match")
    return skipped.get("owner") if isinstance(skipped, dict) else None


def _account_owner(email: str) -> int | None:
    hint = ownership.account_owner_lookup(email=email)
    return hint.rep_id if hint is not None else None


def _replay_turn(
    *,
    run: _GroupRun,
    recorded: Mapping[int, Mapping[str, Any]],
    at: datetime,
    absences: Mapping[int, list[tuple[datetime, datetime]]],
    counts: Counts,
    owner: int | None = None,
    holding: int | None = None,
) -> tuple[int | None, str]:
    """The member the decision goes to: as at intake (leads/ownership.py), the account `owner`
    when it is a member eligible then (the rotation does not move), else the rotation, or
    nobody when the group keeps such leads for the owner. A reroute that picks the member
    `holding` the lead leaves it with them: nothing is given out, the rotation does not move.
    With nobody, why, in words (the report counts the reasons)."""
    g = run.config
    day = routing.day_start(at, g.timezone)
    candidates: list[strategies.Candidate] = []
    for m in g.members.values():
        if m.joined_at > at and m.rep_id not in recorded:
            continue  # joined after this decision
        record = recorded.get(m.rep_id)
        if record is not None:
            why = _recorded_unavailable(str(record.get("reason") or ""))
        elif not m.rep_active:
            why = "rep inactive"
        elif not m.active:
            why = "paused in this group"
        elif any(s <= at < e for s, e in absences.get(m.rep_id, ())):
            why = "out of office"
        else:
            why = _hours_reason(m, at)
        override = g.active_override.get(m.rep_id)
        if override is False:
            why = why or "paused in this group (proposed)"
        elif override is True and why.startswith("paused in this group"):
            why = ""
        open_, today = counts(m.rep_id, day, record)
        ok = not why
        if ok:
            facts = MemberFacts(
                m.rep_id,
                m.name,
                m.email,
                m.position,
                m.weight,
                True,
                True,
                max_open=m.max_open,
                max_per_day=m.max_per_day,
                open=open_,
                assigned_today=today,
            )
            ok, why = eligibility(facts, at)
        candidates.append(strategies.Candidate(m.rep_id, m.position, m.weight, ok, why, open_))
    if owner is not None:
        if any(c.rep_id == owner and c.eligible for c in candidates):
            return owner, ""
        # As at intake: a lead is never kept for an owner who already had it.
        had_it = any(c.rep_id == owner and c.reason.startswith("already had this lead") for c in candidates)
        if not g.owner_fallback and not had_it:
            return None, "kept for its account's owner, not eligible then"
    pick = strategies.pick(g.strategy, candidates, run.pointer, run.weights)
    if pick.rep_id is not None and pick.rep_id != holding:
        run.pointer = pick.pointer
        run.weights = pick.current_weights if g.strategy == Strategy.WEIGHTED else {}
    if pick.rep_id is not None:
        return pick.rep_id, ""
    if not candidates:
        return None, "no member then (its members joined after the decision)" if g.members else "no members"
    # The reason of most members, as the rotation view words it (counts and dates left out).
    reasons = Counter(c.reason.split(" (")[0] for c in candidates)
    return None, f"no eligible member ({reasons.most_common(1)[0][0]})"


def _report(
    *,
    since: datetime,
    until: datetime,
    group: str | None,
    config: Any,
    groups: Mapping[str, GroupConfig],
    actual: Mapping[str, Counter[int | None]],
    proposed: Mapping[str, Counter[int | None]],
    turns: int,
    changed: int,
    queued_none: str,
    queued_because: Mapping[str, Counter[str]],
    moves: Counter[tuple[str, str]],
) -> dict[str, Any]:
    current = _current_groups()
    slugs: list[str] = [group] if group is not None else sorted(set(actual) | set(proposed))

    def shown(slug: str) -> str:
        return "none" if slug == queued_none else slug  # the leads no group takes

    out = []
    names = {m.rep_id: (m.name, m.email) for g in current.values() for m in g.members.values()}
    seen: set[int | None] = set()
    for s in slugs:
        seen.update(actual.get(s, Counter()), proposed.get(s, Counter()))
    missing = seen - set(names) - {None}
    if missing:
        names.update({r.id: (r.name, r.email) for r in Rep.objects.filter(id__in=missing)})
    for slug in slugs:
        a, p = actual.get(slug, Counter()), proposed.get(slug, Counter())
        g, now = groups.get(slug), current.get(slug)
        reps = []
        order = list(g.members) if g else []
        order += sorted({r for r in (*a, *p) if r is not None and r not in order})
        for rep_id in order:
            name, email = names.get(rep_id, ("", ""))
            reps.append(
                {
                    "rep": {"id": rep_id, "name": name, "email": email},
                    "weight": now.members[rep_id].weight if now and rep_id in now.members else None,
                    "proposed_weight": g.members[rep_id].weight if g and rep_id in g.members else None,
                    "actual": a.get(rep_id, 0),
                    "proposed": p.get(rep_id, 0),
                    "difference": p.get(rep_id, 0) - a.get(rep_id, 0),
                }
            )
        out.append(
            {
                "group": None if slug == queued_none else slug,
                "strategy": now.strategy if now else None,
                "proposed_strategy": g.strategy if g else None,
                "actual_total": sum(a.values()),
                "proposed_total": sum(p.values()),
                "queued": {"actual": a.get(None, 0), "proposed": p.get(None, 0)},
                # Why the replay queued what it queued here, and the decisions the rules now send
                # to another group or bring from one: the totals reconcile with `actual_total`.
                "proposed_queued_because": dict(queued_because.get(slug, Counter()).most_common()),
                "moved_to": {shown(to): n for (fr, to), n in sorted(moves.items()) if fr == slug},
                "moved_from": {shown(fr): n for (fr, to), n in sorted(moves.items()) if to == slug},
                "reps": reps,
            }
        )
    return {
        "since": _utc(since),
        "until": _utc(until),
        "group": group,
        "config": config or {},
        "turns": turns,
        "changed": changed,
        "groups": out,
    }


def _utc(moment: datetime) -> str:
    """In UTC with a Z, as the API writes every time."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
