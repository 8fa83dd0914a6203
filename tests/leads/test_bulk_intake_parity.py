"""The bulk import and API intake take the same turns: the same leads routed both ways into
two groups configured alike give the same sequence of reps, for every strategy, with members
paused and capped (a cap of 0 among them), across the import's batches."""

import io

import pytest

from audit.models import AuditEvent
from leads.bulk import leads_import
from leads.models import Lead
from rotation import services
from rotation.models import Group, Membership
from tests.factories import GroupFactory, RepFactory

pytestmark = pytest.mark.django_db

# (weight, active, max_open, max_per_day) of each member, in rotation order.
MEMBERS = [
    (3, True, 9, None),
    (2, True, None, 4),
    (1, False, None, None),  # paused
    (1, True, 0, None),  # a cap of 0 takes nothing
    (2, True, None, 8),
    (1, True, 3, None),
]
LEADS = 30


def configured_group(slug: str, strategy: str) -> list[int]:
    group = GroupFactory(slug=slug, strategy=strategy)
    reps = []
    for weight, active, max_open, max_per_day in MEMBERS:
        rep = RepFactory()
        services.membership_add(
            group=group, rep=rep, actor="test", weight=weight, active=active, max_open=max_open, max_per_day=max_per_day
        )
        reps.append(rep.id)
    return reps


def decisions(slug: str, reps: list[int]) -> list[tuple]:
    """Each lead's decision as its audit event explains it, reps by place in the group: the
    queue reason, the pointer before and after, and every candidate's reason."""
    out = []
    for event in AuditEvent.objects.filter(group=slug, type__in=["lead.assigned", "lead.queued"]).order_by("id"):
        ex = event.explanation
        out.append(
            (
                event.type,
                (ex.get("queue_reason") or "").replace(slug, "<group>"),
                ex.get("pointer_before"),
                ex.get("pointer_after"),
                [(reps.index(c["rep"]), c["eligible"], c["reason"]) for c in ex.get("candidates", [])],
            )
        )
    return out


def sequence(slug: str, reps: list[int]) -> list[int | None]:
    """The members (by place in the group) given each lead, in arrival order; None: queued."""
    owners = Lead.objects.filter(group__slug=slug).order_by("id").values_list("owner_id", flat=True)
    return [reps.index(owner) if owner is not None else None for owner in owners]


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_import_and_intake_give_the_same_reps_in_the_same_order(post_lead, strategy):
    posted_reps = configured_group("posted", strategy)
    imported_reps = configured_group("imported", strategy)

    for i in range(LEADS):
        assert post_lead(email=f"p{i}@customer.example", group="posted").status_code == 201
    text = io.StringIO("email,group\n" + "".join(f"i{i}@customer.example,imported\n" for i in range(LEADS)))
    report = leads_import(lines=text, actor="import:test", batch_size=7)
    assert report.imported == LEADS and report.invalid == 0

    posted = sequence("posted", posted_reps)
    assert len(posted) == LEADS
    assert sequence("imported", imported_reps) == posted
    assert decisions("imported", imported_reps) == decisions("posted", posted_reps)
    # The configuration did bite: the paused member and the cap of 0 took nothing, the capped
    # members stopped at their caps, and some leads were queued once everyone was full.
    assert 2 not in posted and 3 not in posted
    assert posted.count(1) <= 4 and posted.count(5) <= 3
    assert posted[-(LEADS - 24) :] == [None] * (LEADS - 24)


@pytest.mark.parametrize("strategy", ["round_robin", "weighted", "least_loaded"])
def test_import_and_intake_stay_in_step_across_configuration_changes(post_lead, strategy):
    """Between runs, the same changes in both groups: a member paused and back, a joiner, a
    weight changed. The rotation state each way leaves is the state the next run starts from."""
    groups: dict[str, list[int]] = {}
    for slug in ("posted", "imported"):
        group = GroupFactory(slug=slug, strategy=strategy)
        groups[slug] = []
        for weight in (2, 1, 3, 1):
            rep = RepFactory()
            services.membership_add(group=group, rep=rep, actor="test", weight=weight)
            groups[slug].append(rep.id)

    def route(count: int, run: int) -> None:
        for i in range(count):
            assert post_lead(email=f"p{run}-{i}@customer.example", group="posted").status_code == 201
        rows = "".join(f"i{run}-{i}@customer.example,imported\n" for i in range(count))
        assert (
            leads_import(lines=io.StringIO("email,group\n" + rows), actor="import:test", batch_size=5).imported == count
        )

    def change(place: int, **fields) -> None:
        # Through the service, as sales ops would (audited, drains the queue if any).
        for slug, reps in groups.items():
            membership = Membership.objects.get(group__slug=slug, rep_id=reps[place])
            for name, value in fields.items():
                setattr(membership, name, value)
            services.membership_update(membership=membership, actor="test", changed=list(fields))

    route(10, 1)
    change(place=0, active=False)
    change(place=2, weight=1)
    for slug, reps in groups.items():
        rep = RepFactory()
        services.membership_add(group=Group.objects.get(slug=slug), rep=rep, actor="test", weight=2)
        reps.append(rep.id)
    route(12, 2)
    change(place=0, active=True)
    route(12, 3)

    posted = sequence("posted", groups["posted"])
    assert sequence("imported", groups["imported"]) == posted
    assert decisions("imported", groups["imported"]) == decisions("posted", groups["posted"])
    assert 4 in posted and 0 in posted[22:] and 0 not in posted[10:22]
