"""Configuration writes (groups, reps, memberships, absences, rules), each audited.

The admin and the API both come through here, so a change made in either place leaves the
same trace. Only `membership_add` and `membership_remove` take the rotation lock: the one
allocates the new member's position, which must not race with routing reading the member
list; the other drops the member's place on the weighted clock (never the pointer).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import connection, transaction
from django.db.models import PROTECT, Max, Model, ProtectedError, Q
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Event, audit_record, audit_record_many
from routing_project.db import set_lock_timeout

from .domains import domain_unicode
from .eligibility import working_hours_starts
from .hooks import capacity_freed, capacity_frees_at, group_deleting
from .models import Absence, Account, Group, Membership, Rep, RotationState, RoutingRule
from .strategies import WEIGHT_KEY


def _values(obj: Model, fields: Iterable[str]) -> dict[str, Any]:
    return {name: _plain(getattr(obj, name, None)) for name in fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Model):
        return value.pk
    if isinstance(value, Decimal):
        return format(value, "f")  # "100000", never "1E+5" (as a form reads "1e5")
    if value is not None and not isinstance(value, str | int | float | bool | list | dict):
        return str(value)
    return value


def _field_names(obj: Model) -> list[str]:
    return [f.attname for f in obj._meta.concrete_fields if f.attname not in ("created_at", "updated_at", "joined_at")]


def _attnames(obj: Model, names: Iterable[str]) -> list[str]:
    """Field names (`group`) as the attributes that hold their stored value (`group_id`)."""
    by_name = {f.name: f.attname for f in obj._meta.concrete_fields}
    by_name.update({f.attname: f.attname for f in obj._meta.concrete_fields})
    return [by_name[n] for n in names if n in by_name and by_name[n] not in ("id", "created_at", "updated_at")]


@dataclass
class _Change:
    """What an edit really changes, found against the stored row before it is written:
    the fields whose value differs and their values before (a field sent unchanged is no
    change, so that an edit that changes nothing writes no event)."""

    created: bool
    fields: list[str]
    before: dict[str, Any]

    def explanation(self, obj: Model, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"action": "created" if self.created else "changed", **extra}
        out["changes"] = _values(obj, self.fields)
        if not self.created:
            out["before"] = self.before
        return out


def _freed_because(what: str, change: _Change, obj: Model, fields: Iterable[str], actor: str) -> str:
    """A change that freed capacity, in words, for the audit events of the queued leads its
    drain routes: "rep 7's membership of group 'emea' changed: max_open 1 → 2 (api:ops)". Values
    as the trail's summaries write a change (JSON: `active false → true`, not Python's `False`)."""
    shown = [] if change.created else [name for name in change.fields if name in fields]

    def said(value: Any) -> str:
        return json.dumps(_plain(value), ensure_ascii=False, default=str)

    edits = ", ".join(f"{name} {said(change.before.get(name))} → {said(getattr(obj, name, None))}" for name in shown)
    return f"{what}: {edits} ({actor})" if edits else f"{what} ({actor})"


def _change(obj: Model, changed: Iterable[str] | None) -> _Change:
    """Call before saving `obj`; `changed`: the fields the caller edited (None: any)."""
    if obj.pk is None or obj._state.adding:
        return _Change(True, _field_names(obj), {})
    names = _attnames(obj, _field_names(obj) if changed is None else changed)
    # The fields the caller did not edit take their stored values: a form read minutes ago (a
    # second tab) saves what its user changed over the row as it is now, instead of putting
    # back what a colleague changed meanwhile (a group made inactive, a member's weight).
    kept = [] if changed is None else [name for name in _field_names(obj) if name not in names]
    if names or kept:
        stored = type(obj)._base_manager.filter(pk=obj.pk).values(*names, *kept).first()
    else:
        stored = {} if type(obj)._base_manager.filter(pk=obj.pk).exists() else None
    if stored is None:
        # Deleted by another request since it was read: saved, it would come back (Django
        # inserts a row its update did not find), without its members or its trail.
        raise _gone(obj)
    for name in kept:
        setattr(obj, name, stored[name])
    fields = [name for name in names if stored[name] != getattr(obj, name, None)]
    return _Change(False, fields, {name: _plain(stored[name]) for name in fields})


# The highest position a member may be given (API, admin), and the highest one appending may
# reach (far past it, appending would overflow the column). The room between them is for the
# joiners appended after a member given the highest: one request giving a member the very
# last position left every later joiner without a place to be appended to.
MAX_GIVEN_POSITION = 100_000
MAX_POSITION = 1_000_000


def given_position_refused(position: int | None, current: int | None) -> str | None:
    """Why a position given to a member (`current`: its position now, None for a joiner) is
    refused, or None. A member appended past MAX_GIVEN_POSITION keeps its own through an edit
    that sends it back unchanged (an admin page validates every row, changed or not)."""
    if position is None or position <= MAX_GIVEN_POSITION or position == current:
        return None
    return POSITION_TOO_HIGH


POSITION_TOO_HIGH = (
    f"Ensure this value is less than or equal to {MAX_GIVEN_POSITION} "
    "(the positions above it are for the members appended after)."
)


# The highest rule priority the API and the admin take.
MAX_PRIORITY = 1_000_000
# Membership fields whose change can let a member take more leads.
FREES_CAPACITY = frozenset({"active", "max_open", "max_per_day", "weight"})
# Rep fields whose change can make the rep available now: re-activated, or working hours (or
# the time zone they are read in) that take in the present moment.
REP_FREES_CAPACITY = frozenset({"active", "working_hours", "timezone"})
# Group fields whose change can let its queued leads be routed now.
GROUP_FREES_CAPACITY = frozenset({"active", "timezone", "max_attempts"})
# Membership fields that escalation writes too (leads/actions.py, `_count_miss`).
ESCALATION_WRITES = frozenset({"active", "paused_reason", "consecutive_misses"})


def serialize_on(name: str) -> None:
    """Holds `name`'s lock until the transaction ends (PostgreSQL; SQLite's immediate
    transactions are serialized already)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])


# --- groups ----------------------------------------------------------------------------------


@transaction.atomic
def group_save(*, group: Group, actor: str, changed: Iterable[str] | None = None) -> Group:
    # Routing locks the group's row with its rotation row: this edit (or a move of the
    # default flag, which locks the old default's row) waits for it no longer than routing does.
    set_lock_timeout()
    change = _change(group, changed)
    if group.is_default:
        # One default group: moving the flag is a change to the old default too. Moves are
        # serialized, so that two at once end with the later one default, never a conflict.
        serialize_on("rotation.default_group")
        # The old default's row with this group's, in id order: the order routing locks group
        # rows in (a batch routing into both waits for this change, without a deadlock).
        locked = Group.objects.select_for_update().filter(Q(is_default=True) | Q(pk=group.pk)).order_by("pk")
        for old in [g for g in locked if g.pk != group.pk]:
            old.is_default = False
            old.save(update_fields=["is_default", "updated_at"])
            audit_record(
                type=AuditEvent.Type.GROUP_CHANGED,
                actor=actor,
                group=old.slug,
                explanation={"action": "changed", "changes": {"is_default": False}, "before": {"is_default": True}},
            )
    # The slug's uniqueness was checked with the request's other fields (the serializer, the
    # admin form); a group made with it since is the database's to refuse (its unique index and
    # group_slug_unique_without_case): a 409 like every change made at the same time, where
    # checking it again here answered a 400 with the bare constraint's name under "__all__".
    group.clean_fields(exclude=[f.name for f in Group._meta.fields if f.name != "slug"])
    group.full_clean(exclude=["slug"])
    group.save()
    RotationState.objects.get_or_create(group=group)
    turned_on = group.auto_pause_after_misses and not change.before.get("auto_pause_after_misses")
    if "auto_pause_after_misses" in change.fields and turned_on and not change.created:
        # Misses count from now. Those made while it was off would pause a member at its next
        # miss, past a threshold no one had set.
        Membership.objects.filter(group=group, consecutive_misses__gt=0).update(consecutive_misses=0)
    # Leads kept in the queue for their account's owner may go to the rotation now.
    to_rotation = "owner_match_fallback_to_rotation" in change.fields and group.owner_match_fallback_to_rotation
    # The new default takes the queued leads no group holds (queued for want of one): its
    # drain routes them again, rules first (leads.actions._orphans_route).
    made_default = "is_default" in change.fields and group.is_default
    if group.active and (
        change.created or to_rotation or made_default or GROUP_FREES_CAPACITY.intersection(change.fields)
    ):
        # A group (re)activated routes its queued leads; a new time zone moves its day (the
        # daily caps start again), and more attempts let escalated-out leads back in.
        what = f"group '{group.slug}' created" if change.created else f"group '{group.slug}' changed"
        fields = (*GROUP_FREES_CAPACITY, "owner_match_fallback_to_rotation", "is_default")
        capacity_freed(group_ids=[group.pk], because=_freed_because(what, change, group, fields, actor))
    if not change.fields:
        return group  # an edit that changes nothing: no event
    audit_record(
        type=AuditEvent.Type.GROUP_CHANGED, actor=actor, group=group.slug, explanation=change.explanation(group)
    )
    return group


class InUse(ProtectedError):
    """A group that rows point at through a protected foreign key (leads, rules): kept."""

    def __init__(self, what: list[str]) -> None:
        super().__init__(f"In use by {', '.join(what)}.", set())
        self.what = what


def kept_by(obj: Model) -> list[str]:
    """What keeps `obj` from being deleted: the kinds of rows that point at it through a
    protected foreign key, one indexed EXISTS each. Django's delete loads every such row
    before it refuses (a busy group's year of leads and assignments: seconds)."""
    kept = []
    for rel in obj._meta.related_objects:
        model = rel.related_model
        if rel.on_delete is not PROTECT or isinstance(model, str):
            continue
        if model._base_manager.filter(**{rel.field.name: obj}).exists():
            kept.append(str(model._meta.verbose_name_plural))
    return kept


@transaction.atomic
def group_delete(*, group: Group, actor: str) -> None:
    slug = group.slug
    # Refused before the rotation row is taken: routing into the group never waits on a
    # delete that cannot happen. (Leads arriving meanwhile are refused by the delete itself.)
    if kept := kept_by(group):
        raise InUse(kept)
    # The rotation row goes with the group: taken first, as routing takes it, with its timeout.
    _rotation_row_locked(group.pk)
    _still_there(group)
    # Each member's trail ends with leaving the group, as when removed one by one.
    removed = [(slug, m) for m in Membership.objects.filter(group=group).order_by("position")]
    # Its webhook endpoints go with it (the foreign key cascades): their trails end here too.
    ended = group_deleting(group_id=group.pk, slug=slug, actor=actor)
    before = {"before": _values(group, _field_names(group))}
    group.delete()
    deleted = Event(AuditEvent.Type.GROUP_CHANGED, actor, group=slug, explanation={"action": "deleted", **before})
    audit_record_many(events=[deleted, *_removals(removed, actor=actor, because="group deleted"), *ended])


# --- reps ------------------------------------------------------------------------------------


@transaction.atomic
def rep_save(*, rep: Rep, actor: str, changed: Iterable[str] | None = None) -> Rep:
    # A reassign to this rep holds its row for its routing transaction: this edit waits for it
    # no longer than routing waits.
    set_lock_timeout()
    # clean() refuses an e-mail taken in any case, naming the field. One saved by another
    # request since is the database's to refuse: a 409 like every other change made at the same
    # time, not the constraint's bare name as a 400.
    rep.full_clean(validate_constraints=False)
    change = _change(rep, changed)
    rep.save()
    if rep.active and not change.created and REP_FREES_CAPACITY.intersection(change.fields):
        # A rep re-activated, or now within its hours, takes leads: drain its groups' queues
        # after commit.
        group_ids = list(Membership.objects.filter(rep=rep).values_list("group_id", flat=True))
        capacity_freed(
            group_ids=group_ids,
            because=_freed_because(f"rep {rep.pk} changed", change, rep, REP_FREES_CAPACITY, actor),
        )
        # And when its new hours begin, if that is before the next `escalation_arm` looks
        # (it publishes the drains of hours beginning from a minute or so ahead): a start a few
        # seconds off was left to the queue sweep, and a lead arriving first took the place.
        now = timezone.now()
        horizon = now + timedelta(seconds=settings.ESCALATION_TIMER_HORIZON_S)
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):  # validated by full_clean
            for at in working_hours_starts(rep.working_hours, rep.timezone, now, horizon):
                capacity_frees_at(
                    group_ids=group_ids, at=at, because=f"rep {rep.pk}'s working hours began ({rep.timezone})"
                )
    if not rep.active and "active" in change.fields and Account.objects.filter(owner=rep).exists():
        # Only an active rep owns its accounts' leads: those held for this one are free now.
        _owner_kept_leads_freed(because=f"account owner rep {rep.pk} deactivated ({actor})")
    if not change.fields:
        return rep
    # The e-mail too: it is where the rep's leads are announced.
    audit_record(type=AuditEvent.Type.REP_CHANGED, actor=actor, rep_id=rep.pk, explanation=change.explanation(rep))
    return rep


@transaction.atomic
def rep_delete(*, rep: Rep, actor: str) -> None:
    """Deletes a rep (its memberships and accounts with it), each group's and account's trail
    ending with the removal."""
    rep_id = rep.pk
    set_lock_timeout()
    # Its groups' rotation rows first, in group id order, as routing takes them, then the rep's
    # row: routing that read the member before this commits would otherwise go on to give it a
    # lead, whose foreign key then waits on the deleted row and fails (a 409 for a good lead).
    # Membership removal takes the rotation row too (membership_remove).
    groups = sorted(set(Membership.objects.filter(rep=rep).values_list("group_id", flat=True)))
    for group_id in groups:
        _rotation_row_locked(group_id)
    _still_there(rep)
    removed = [
        (m.group.slug, m) for m in Membership.objects.filter(rep=rep).select_related("group").order_by("group_id")
    ]
    for _slug, m in removed:
        if m.group_id not in groups:  # joined a group since the read above (rare): its row too
            _rotation_row_locked(m.group_id)
    # Its accounts go with it (the foreign key cascades): their trails end here too.
    accounts = list(Account.objects.filter(owner=rep).order_by("domain").values_list("domain", flat=True))
    before = {"before": _values(rep, _field_names(rep))}
    rep.delete()
    lost = [
        Event(
            AuditEvent.Type.ACCOUNT_CHANGED,
            actor,
            rep_id=rep_id,
            explanation={"action": "deleted", "account": domain, "because": "rep deleted"},
        )
        for domain in accounts
    ]
    deleted = Event(AuditEvent.Type.REP_CHANGED, actor, rep_id=rep_id, explanation={"action": "deleted", **before})
    audit_record_many(events=[*_removals(removed, actor=actor, because="rep deleted"), *lost, deleted])


# --- memberships -----------------------------------------------------------------------------


def _rotation_row_locked(group_id: int) -> RotationState | None:
    """The group's rotation row, locked as routing locks it, waiting no longer than routing
    does (ROUTING_LOCK_TIMEOUT_MS, for this transaction): held past it, the lock timeout is
    raised (a 503 with Retry-After in the API) rather than the request hanging with it."""
    set_lock_timeout()
    return RotationState.objects.select_for_update(no_key=True).filter(group_id=group_id).first()


_M = TypeVar("_M", bound=Model)


def _gone(obj: Model) -> ObjectDoesNotExist:
    """The model's DoesNotExist for `obj`, deleted by another request since it was read."""
    does_not_exist: type[ObjectDoesNotExist] = type(obj).DoesNotExist  # type: ignore[attr-defined]
    return does_not_exist(f"{obj._meta.verbose_name} {obj.pk} was deleted by another request.")


def _still_there(obj: _M) -> _M:
    """Locks the row about to be deleted and returns it as stored, or raises its model's
    DoesNotExist when another request deleted it first: of two deletes at once, one deletes
    (and is audited), the other finds nothing to delete (a 404 in the API), rather than both
    saying they did. Its row alone: the model's ordering (a member's by group) would join,
    and lock, the rows it names."""
    stored = type(obj)._base_manager.select_for_update(of=("self",)).filter(pk=obj.pk).order_by().first()
    if stored is None:
        raise _gone(obj)
    return stored


def next_position(group: Group, *, moved: Membership | None = None) -> int:
    """A joiner takes the next natural position: after the last member, and never before the
    pointer, so that it is reached in the current cycle. A member `moved` to the end is
    placed after the others, as if it joined again."""
    state = _rotation_row_locked(group.pk)
    others = Membership.objects.filter(group=group)
    if moved is not None:
        others = others.exclude(pk=moved.pk)
    top = others.aggregate(m=Max("position"))["m"]
    after_last = 0 if top is None else top + 1
    position = max(after_last, state.pointer if state else 0)
    if position > MAX_POSITION:
        raise ValidationError(
            {"position": [f"The last position is {MAX_POSITION:,}, the highest: give this member a free position."]}
        )
    return position


@transaction.atomic
def membership_add(*, group: Group, rep: Rep, actor: str, position: int | None = None, **fields: Any) -> Membership:
    RotationState.objects.get_or_create(group=group)
    if position is None:
        position = next_position(group)
    membership = Membership(group=group, rep=rep, position=position, **fields)
    membership.save()
    # A joiner can take queued leads.
    capacity_freed(group_ids=[group.pk], because=f"rep {rep.pk} joined group '{group.slug}' ({actor})")
    audit_record(
        type=AuditEvent.Type.MEMBERSHIP_CHANGED,
        actor=actor,
        group=group.slug,
        rep_id=rep.pk,
        explanation={"action": "joined", "changes": _values(membership, _field_names(membership))},
    )
    return membership


@transaction.atomic
def membership_update(
    *, membership: Membership, actor: str, changed: Iterable[str], to_end: bool = False
) -> Membership:
    """`to_end`: the member moves to the end of the rotation (the admin's position left
    empty), placed as a joiner is."""
    # The member's row, as escalation takes it (under its routing locks), waited for no longer
    # than routing waits; removed meanwhile, the edit has nothing to write.
    set_lock_timeout()
    if to_end:
        # Under the rotation row's lock, taken before the member's row as routing takes them.
        membership.position = next_position(membership.group, moved=membership)
        changed = [*changed, "position"]
    # The member's row only: `first()` alone would order by the model's ordering, joining the
    # group's row and locking it FOR UPDATE too, against routing's lock order (a deadlock
    # with an escalation that holds the group's rows and waits for this member's).
    paused_reason = (
        Membership.objects.select_for_update(of=("self",))
        .filter(pk=membership.pk)
        .order_by("pk")
        .values_list("paused_reason", flat=True)
        .first()
    )
    if paused_reason is None:
        raise Membership.DoesNotExist("No such member: removed from the group meanwhile.")
    change = _change(membership, [c for c in changed if c not in ("group", "rep", "group_id", "rep_id")])
    # Escalation counts SLA misses and auto-pauses the member under its own lock, between this
    # edit's read and its write: those fields are written only when this edit changes them, or
    # the row as read before would undo the pause (unaudited) or the miss count.
    written = [
        f.attname
        for f in Membership._meta.concrete_fields
        if not f.primary_key and (f.attname not in ESCALATION_WRITES or f.attname in change.fields)
    ]
    if "active" in change.fields and membership.active:
        # Un-paused (by hand, or after an auto-pause): the miss count starts again.
        membership.paused_reason, membership.consecutive_misses = "", 0
        written += ["paused_reason", "consecutive_misses"]
        if paused_reason:  # the audit says which pause (an auto-pause, and why) was lifted
            change.fields.append("paused_reason")
            change.before["paused_reason"] = paused_reason
    membership.save(update_fields=written)
    if unwritten := sorted(ESCALATION_WRITES.difference(written)):
        membership.refresh_from_db(fields=unwritten)  # answered as stored: paused meanwhile, it says so
    if membership.active and FREES_CAPACITY.intersection(change.fields):
        # Un-paused or a cap raised: drain the queue.
        what = f"rep {membership.rep_id}'s membership of group '{membership.group.slug}' changed"
        capacity_freed(
            group_ids=[membership.group_id], because=_freed_because(what, change, membership, FREES_CAPACITY, actor)
        )
    if not change.fields:
        return membership
    audit_record(
        type=AuditEvent.Type.MEMBERSHIP_CHANGED,
        actor=actor,
        group=membership.group.slug,
        rep_id=membership.rep_id,
        explanation=change.explanation(membership),
    )
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor: str) -> None:
    """Leaves the rotation without touching the pointer; added again, the rep is a new joiner.
    Its own place on the weighted clock goes with it (under the rotation lock): routing drops
    it at the next lead anyway, but a rep added back before that would have found it."""
    state = _rotation_row_locked(membership.group_id)
    # The row as stored (an admin form may hold edits; escalation may have paused it).
    removed = (membership.group.slug, _still_there(membership))
    # Its next turn and the weight that turn was laid out for: a weight left behind would read,
    # to a rep added back with another one, as a change of weights (everyone placed again).
    own = {str(membership.rep_id), f"{WEIGHT_KEY}{membership.rep_id}"}
    if state is not None and own.intersection(state.current_weights or {}):
        state.current_weights = {k: v for k, v in state.current_weights.items() if k not in own}
        state.save(update_fields=["current_weights", "updated_at"])
    membership.delete()
    audit_record_many(events=_removals([removed], actor=actor))


def _removals(memberships: Iterable[tuple[str, Membership]], *, actor: str, because: str = "") -> list[Event]:
    """The membership.changed events of members (group slug, membership as it was) leaving,
    each with a snapshot of the membership (weight, caps, paused...), as a deleted group, rep
    or rule leaves one: re-adding the member as it was needs it."""
    extra = {"because": because} if because else {}
    return [
        Event(
            AuditEvent.Type.MEMBERSHIP_CHANGED,
            actor,
            group=slug,
            rep_id=m.rep_id,
            explanation={
                "action": "removed",
                "position": m.position,
                **extra,
                "before": _values(m, _field_names(m)),
            },
        )
        for slug, m in memberships
    ]


# --- absences and rules ----------------------------------------------------------------------


def _absence_ends_because(absence: Absence) -> str:
    return (
        f"back from out of office: rep {absence.rep_id}'s absence {absence.pk} ended at {absence.ends_at.isoformat()}"
    )


@transaction.atomic
def absence_add(*, absence: Absence, actor: str) -> Absence:
    absence.full_clean()
    absence.save()
    # Back when it ends: the rep's groups' queues are drained then (leads/scheduling.py).
    capacity_frees_at(
        group_ids=Membership.objects.filter(rep_id=absence.rep_id).values_list("group_id", flat=True),
        at=absence.ends_at,
        because=_absence_ends_because(absence),
    )
    audit_record(
        type=AuditEvent.Type.ABSENCE_CHANGED,
        actor=actor,
        rep_id=absence.rep_id,
        explanation={"action": "created", "changes": _values(absence, ["id", "starts_at", "ends_at", "reason"])},
    )
    return absence


@transaction.atomic
def absence_update(*, absence: Absence, actor: str, changed: Iterable[str]) -> Absence:
    """An existing absence edited (the admin's inline): audited as a change with the values
    before, and the queues drained since the rep may be back now, or at the new end."""
    absence.full_clean()
    change = _change(absence, changed)
    absence.save()
    if not change.fields:
        return absence
    group_ids = list(Membership.objects.filter(rep_id=absence.rep_id).values_list("group_id", flat=True))
    # Shortened, or moved later: the rep may be back already.
    edited = _freed_because(
        f"rep {absence.rep_id}'s absence {absence.pk} changed", change, absence, ("starts_at", "ends_at"), actor
    )
    capacity_freed(group_ids=group_ids, because=edited)
    capacity_frees_at(group_ids=group_ids, at=absence.ends_at, because=_absence_ends_because(absence))
    audit_record(
        type=AuditEvent.Type.ABSENCE_CHANGED,
        actor=actor,
        rep_id=absence.rep_id,
        explanation=change.explanation(absence, id=absence.pk),
    )
    return absence


@transaction.atomic
def absence_remove(*, absence: Absence, actor: str) -> None:
    rep_id, absence_id = absence.rep_id, absence.pk
    set_lock_timeout()
    _still_there(absence)
    # The window itself stays in the trail: which days the rep was marked away, taken back.
    before = _values(absence, ["id", "starts_at", "ends_at", "reason"])
    absence.delete()
    # Back from out of office: drain the queues of the rep's groups after commit.
    capacity_freed(
        group_ids=Membership.objects.filter(rep_id=rep_id).values_list("group_id", flat=True),
        because=f"back from out of office: rep {rep_id}'s absence {absence_id} deleted ({actor})",
    )
    audit_record(
        type=AuditEvent.Type.ABSENCE_CHANGED,
        actor=actor,
        rep_id=rep_id,
        explanation={"action": "deleted", "id": absence_id, "before": before},
    )


@transaction.atomic
def rule_save(*, rule: RoutingRule, actor: str, changed: Iterable[str] | None = None) -> RoutingRule:
    try:
        rule.full_clean()
    except ValidationError as exc:
        # Conditions saved before a check that now refuses them (one no lead can match), left
        # as they are by this edit: the rule can still be switched off, renamed or moved.
        stored = None if rule._state.adding else RoutingRule.objects.filter(pk=rule.pk).values("conditions").first()
        errors = exc.update_error_dict({})
        if stored is None or stored["conditions"] != rule.conditions or "conditions" not in errors:
            raise
        del errors["conditions"]
        if errors:
            raise ValidationError(errors) from exc
    change = _change(rule, changed)
    rule.save()
    if not change.fields:
        return rule
    explanation = change.explanation(rule, rule=rule.name)
    if "group_id" in change.fields:  # the group as the API and the trail name it, beside its id
        explanation["changes"]["group"] = rule.group.slug
    events = [Event(AuditEvent.Type.RULE_CHANGED, actor, group=rule.group.slug, explanation=explanation)]
    if "group_id" in change.before:  # moved: the trail of the group it sent leads to says so too
        old = Group.objects.filter(pk=change.before["group_id"]).values_list("slug", flat=True).first()
        if old:
            explanation["before"]["group"] = old
            events.append(Event(AuditEvent.Type.RULE_CHANGED, actor, group=old, explanation=explanation))
    audit_record_many(events=events)
    return rule


@transaction.atomic
def rule_delete(*, rule: RoutingRule, actor: str) -> None:
    set_lock_timeout()
    _still_there(rule)
    name, group, before = rule.name, rule.group.slug, _values(rule, _field_names(rule))
    before["group"] = group
    rule.delete()
    audit_record(
        type=AuditEvent.Type.RULE_CHANGED,
        actor=actor,
        group=group,
        explanation={"action": "deleted", "rule": name, "before": before},
    )


# --- accounts (sticky routing) ---------------------------------------------------------------


def _owner_kept_leads_freed(*, because: str) -> None:
    """An account's owner or domain changed: the leads a group keeps queued for an account
    owner (`owner_match_fallback_to_rotation` off) may be routed now, to the new owner or
    through the rotation. Only those groups keep such leads; draining one with none is a read."""
    capacity_freed(
        group_ids=Group.objects.filter(owner_match_fallback_to_rotation=False, active=True).values_list(
            "pk", flat=True
        ),
        because=because,
    )


@transaction.atomic
def account_save(*, account: Account, actor: str, changed: Iterable[str] | None = None) -> Account:
    account.domain = domain_unicode(account.domain)
    account.full_clean()
    change = _change(account, changed)
    account.save()
    if change.created:
        change.fields = ["domain", "name", "owner_id"]
    elif {"domain", "owner_id"}.intersection(change.fields):
        # Held for the old owner (or domain): they may go elsewhere now.
        what = f"account '{account.domain}' changed"
        _owner_kept_leads_freed(because=_freed_because(what, change, account, ("domain", "owner_id"), actor))
    if not change.fields:
        return account
    audit_record(
        type=AuditEvent.Type.ACCOUNT_CHANGED,
        actor=actor,
        rep_id=account.owner_id,
        explanation=change.explanation(account, account=account.domain),
    )
    return account


@transaction.atomic
def account_delete(*, account: Account, actor: str) -> None:
    domain, owner_id = account.domain, account.owner_id
    account.delete()
    # Leads held for its owner now go through the rotation.
    _owner_kept_leads_freed(because=f"account '{domain}' of rep {owner_id} deleted ({actor})")
    audit_record(
        type=AuditEvent.Type.ACCOUNT_CHANGED,
        actor=actor,
        rep_id=owner_id,
        explanation={"action": "deleted", "account": domain},
    )
