"""Hypothesis drives random sequences of joins, pauses, returns, removals and leads through
the real intake service on the database, and checks round robin's promises over the history."""

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from leads.services import lead_intake
from rotation import services
from rotation.models import Membership, RotationState
from tests.factories import GroupFactory, RepFactory

pytestmark = pytest.mark.django_db

_seq = itertools.count()


class RoundRobinMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = GroupFactory(slug=f"prop-{next(_seq)}")
        self.members: list[int] = []  # rep ids in rotation order (join order)
        self.paused: set[int] = set()
        self.history: list[int | None] = []  # owner per lead, None when queued
        # Since the last change of membership or pauses: who got what, in order.
        self.stable_run: list[int] = []

    def eligible(self) -> list[int]:
        return [m for m in self.members if m not in self.paused]

    def changed(self) -> None:
        self.stable_run = []

    @rule()
    def join(self) -> None:
        rep = RepFactory()
        services.membership_add(group=self.group, rep=rep, actor="test")
        self.members.append(rep.id)
        self.changed()

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        rep_id = data.draw(st.sampled_from(self.members))
        Membership.objects.filter(group=self.group, rep_id=rep_id).update(active=False)
        self.paused.add(rep_id)
        self.changed()

    @precondition(lambda self: self.paused)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        rep_id = data.draw(st.sampled_from(sorted(self.paused)))
        Membership.objects.filter(group=self.group, rep_id=rep_id).update(active=True)
        self.paused.discard(rep_id)
        self.changed()

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        rep_id = data.draw(st.sampled_from(self.members))
        services.membership_remove(membership=Membership.objects.get(group=self.group, rep_id=rep_id), actor="test")
        self.members.remove(rep_id)
        self.paused.discard(rep_id)
        self.changed()

    @rule(n=st.integers(min_value=1, max_value=6))
    def leads(self, n: int) -> None:
        for _ in range(n):
            result = lead_intake(
                data={"email": f"p{next(_seq)}@prop.example"},
                requested=self.group,
                client=None,
                actor="test",
                render=lambda lead, dup: b"",
            )
            owner = result.lead.owner_id
            eligible = self.eligible()
            if not eligible:
                assert owner is None and result.lead.status == "queued"
            else:
                assert owner in eligible, "only an eligible member gets a lead"
                self.stable_run.append(owner)
            self.history.append(owner)

    @invariant()
    def stable_runs_are_strict_rotations(self) -> None:
        """Between two changes, the eligible members are served in rotation order: every
        window of len(eligible) consecutive leads holds each eligible member exactly once."""
        eligible = self.eligible()
        run = self.stable_run
        if not eligible or not run:
            return
        n = len(eligible)
        for i in range(len(run) - n + 1):
            assert sorted(run[i : i + n]) == sorted(eligible)
        # And in membership order, wrapping.
        order = {rep: i for i, rep in enumerate(self.members_by_position())}
        for a, b in zip(run, run[1:], strict=False):
            nxt = [m for m in self.members_by_position() if m in eligible]
            assert nxt[(nxt.index(a) + 1) % n] == b, (a, b, order)

    @invariant()
    def pointer_is_just_past_the_last_chosen(self) -> None:
        last = next((o for o in reversed(self.history) if o is not None), None)
        state = RotationState.objects.get(group=self.group)
        if last is not None and last in self.members:
            position = Membership.objects.get(group=self.group, rep_id=last).position
            assert state.pointer == position + 1

    def members_by_position(self) -> list[int]:
        return list(Membership.objects.filter(group=self.group).order_by("position").values_list("rep_id", flat=True))


def test_round_robin_properties(db):
    run_state_machine_as_test(
        RoundRobinMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
