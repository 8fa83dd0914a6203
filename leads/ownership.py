"""Account ownership (sticky routing): a lead whose email domain belongs to an account owned
by an active rep goes to that rep, skipping the rotation. A domain belongs to the account of
its own name, else of the nearest domain it is under (`eu.acme.com` to `acme.com`), down to the
registered one (never `co.uk`).

The account is looked up before the lock (by domain); whether its owner may take the lead is
decided after the lock, from the member facts routing reads there. The owner takes the lead
when it is a member of the resolved group and eligible there right now (active, in the group,
not away, within working hours, under its caps): the group still owns the lead's SLA,
escalation and caps, so a rep outside the group does not take it. Otherwise the group's
`owner_match_fallback_to_rotation` decides: route through the rotation (default), or queue the
lead with the reason, for a manager to give it to the owner. A lead the owner already had (and
let escalate) is not kept for it: the rotation decides, as the escalation does.

An owner match does not move the rotation (pointer and weights unchanged); it counts toward the
owner's open leads and today's count like any assignment.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from publicsuffixlist import PublicSuffixList

from rotation.domains import domain_unicode
from rotation.eligibility import MemberFacts, eligibility
from rotation.models import Account, Group, Rep, RotationState
from routing_project import configcache

from . import routing

OWNER_MATCH = "owner_match"


@dataclass(frozen=True)
class OwnerHint:
    rep_id: int
    domain: str


def email_domain(email: str) -> str:
    """The domain an account is looked up by (`domain_unicode`: accounts are kept so)."""
    return domain_unicode(email.rsplit("@", 1)[-1]) if "@" in email else ""


def account_domains(domain: str) -> list[str]:
    """The account domains an email domain belongs to, the most specific first: itself and
    the domains it is under, down to the one registered (`eu.mail.acme.co.uk`: itself,
    `mail.acme.co.uk`, `acme.co.uk`, never `co.uk`, by the public suffix list): a contact
    writing from a company's subdomain is the company's, and an account named for a public
    suffix takes only its own address."""
    if not domain:
        return []
    registered = _public_suffixes().privatesuffix(domain)
    labels = domain.split(".")
    down_to = len(labels) - len(registered.split(".")) if registered else 0
    return [".".join(labels[i:]) for i in range(down_to + 1)]


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    return PublicSuffixList()  # the list the package ships (no download)


def account_owner_lookup(*, email: str) -> OwnerHint | None:
    """The active rep owning the account of this email's domain (or of the nearest domain
    it is under), if any (before the lock)."""
    domain = email_domain(email)
    if not domain:
        return None
    return configcache.cached("account-owner", domain, lambda: account_owners([domain]).get(domain))


def account_owners(domains: Iterable[str]) -> dict[str, OwnerHint]:
    """For each of these email domains that belongs to an account with an active owner (its
    own, else the nearest domain it is under: `account_domains`), that owner and the account's
    domain. One look-up for all (bulk import's per batch). On PostgreSQL the domains go as one
    array parameter: an IN list of a batch's hundreds of domains cost more to build and send
    than the look-up itself."""
    wanted = {d: account_domains(d) for d in set(domains) - {""}}
    values = sorted({a for candidates in wanted.values() for a in candidates})
    if not values:
        return {}
    if connection.vendor != "postgresql":
        found = dict(Account.objects.filter(domain__in=values, owner__active=True).values_list("domain", "owner_id"))
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT a.domain, a.owner_id FROM {Account._meta.db_table} a"  # noqa: S608 - the models' tables
                f" JOIN {Rep._meta.db_table} r ON r.id = a.owner_id WHERE r.active AND a.domain = ANY(%s::text[])",
                [values],
            )
            found = dict(cursor.fetchall())
    owners = {}
    for domain, candidates in wanted.items():
        account = next((a for a in candidates if a in found), None)
        if account is not None:
            owners[domain] = OwnerHint(found[account], account)
    return owners


def owner_decide(
    *,
    owner: OwnerHint | None,
    group: Group,
    strategy: str,
    pointer: int,
    current_weights: dict[str, int],
    facts: Iterable[MemberFacts],
    now: datetime,
    exclude: Iterable[int] = (),
) -> routing.Decision:
    """Pure over its inputs: the owner when it may take the lead, else the rotation's decision
    (or none, when the group queues leads whose owner is not eligible)."""
    facts, excluded = list(facts), set(exclude)
    if owner is None:
        return routing.decide(
            strategy=strategy, pointer=pointer, current_weights=current_weights, facts=facts, now=now, exclude=exclude
        )
    mine = next((f for f in facts if f.rep_id == owner.rep_id), None)
    if mine is None:
        ok, why = False, f"not a member of group '{group.slug}'"
    elif owner.rep_id in excluded:
        ok, why = False, "already had this lead"
    else:
        ok, why = eligibility(mine, now)
    # The rotation stays where it was, weights included; the audit says where that was.
    unchanged = dict(current_weights) if strategy == "weighted" else {}
    if ok and mine is not None:
        return routing.Decision(
            rep_id=mine.rep_id,
            rep_name=mine.rep_name,
            rep_email=mine.rep_email,
            pointer_before=pointer,
            pointer_after=pointer,
            weights_before=unchanged,
            weights_after=unchanged,
            candidates=[
                {
                    "rep": mine.rep_id,
                    "name": mine.rep_name,
                    "position": mine.position,
                    "eligible": True,
                    "reason": f"account owner ({owner.domain})",
                    **_counts_read(mine, strategy),
                }
            ],
            reason=OWNER_MATCH,
            notes={"account": owner.domain},
        )
    note = {"account": owner.domain, "owner": owner.rep_id, "owner_skipped": why}
    # A lead is kept for an owner who may still take it, never for one who had it (and let its
    # SLA run out): like the escalation, the rotation gives it to someone else.
    if not group.owner_match_fallback_to_rotation and owner.rep_id not in excluded:
        return routing.Decision(
            rep_id=None,
            rep_name="",
            rep_email="",
            pointer_before=pointer,
            pointer_after=pointer,
            weights_before=unchanged,
            weights_after=unchanged,
            candidates=[
                {
                    "rep": owner.rep_id,
                    "name": mine.rep_name if mine else "",
                    "position": mine.position if mine else None,
                    "eligible": False,
                    "reason": why,
                    **(_counts_read(mine, strategy) if mine else {}),
                }
            ],
            queue_reason=f"account owner not eligible ({why}); group '{group.slug}' keeps such leads for the owner",
            notes={"owner_match": note},
        )
    decision = routing.decide(
        strategy=strategy, pointer=pointer, current_weights=current_weights, facts=facts, now=now, exclude=exclude
    )
    decision.notes["owner_match"] = note
    return decision


def _counts_read(facts: MemberFacts, strategy: str) -> dict[str, int]:
    """As `routing.decide` records them: the counts routing read (only those it needed), which
    replay starts from."""
    counts = {}
    if strategy == "least_loaded" or facts.max_open is not None:
        counts["open"] = facts.open
    if facts.max_per_day is not None:
        counts["today"] = facts.assigned_today
    return counts


def group_decide(
    *,
    owner: OwnerHint | None,
    group: Group,
    state: RotationState,
    now: datetime,
    exclude: Iterable[int] = (),
    facts: list[MemberFacts] | None = None,
) -> tuple[list[MemberFacts], routing.Decision]:
    """The step every routing path shares: read the members now (after the rotation lock,
    when routing for real; `facts` when the caller read them, e.g. for a batch) and decide
    from the group's rotation state."""
    if facts is None:
        facts = routing.member_facts(group, now)
    decision = owner_decide(
        owner=owner,
        group=group,
        strategy=group.strategy,
        pointer=state.pointer,
        current_weights=state.current_weights or {},
        facts=facts,
        now=now,
        exclude=exclude,
    )
    return facts, decision
