"""The routing strategies: table tests and hypothesis properties (pure, no database)."""

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rotation.strategies import SCALE_KEY, Candidate, least_loaded, pick, round_robin, weighted

# --- helpers ---------------------------------------------------------------------------------


def run_weighted(weights: list[int], schedule: list[frozenset[int]]) -> list[int | None]:
    """Routes one lead per entry of `schedule` (the set of eligible member indexes that turn)."""
    state: dict[str, int] = {}
    pointer = 0
    picks: list[int | None] = []
    for eligible in schedule:
        cands = [Candidate(i, i, w, i in eligible) for i, w in enumerate(weights)]
        p = weighted(cands, pointer, state)
        assert p.rep_id is None or p.rep_id in eligible
        pointer, state = p.pointer, p.current_weights
        picks.append(p.rep_id)
    return picks


def stable_windows(weights, schedule, picks, length=None):
    """Every window of sum(weights of the eligible set) turns whose eligible set is stable."""
    for start in range(len(schedule)):
        eligible = schedule[start]
        if not eligible:
            continue
        total = sum(weights[i] for i in eligible)
        n = length(total) if length else total
        end = start + n
        if end > len(schedule) or any(schedule[t] != eligible for t in range(start, end)):
            continue
        yield eligible, total, picks[start:end]


@st.composite
def weights_and_schedule(draw, max_members=5, max_weight=6, max_turns=120):
    weights = draw(st.lists(st.integers(1, max_weight), min_size=1, max_size=max_members))
    n = len(weights)
    # Runs of turns, each with its own eligible set: pauses, returns, caps, absences.
    runs = draw(
        st.lists(
            st.tuples(st.frozensets(st.integers(0, n - 1)), st.integers(1, 3 * sum(weights))),
            min_size=1,
            max_size=6,
        )
    )
    schedule = [eligible for eligible, length in runs for _ in range(length)][:max_turns]
    return weights, schedule


# --- weighted --------------------------------------------------------------------------------


def test_weighted_table():
    # 5:1:1 interleaves the heavy member instead of handing it five in a row.
    assert run_weighted([5, 1, 1], [frozenset({0, 1, 2})] * 7) == [0, 1, 0, 0, 0, 2, 0]
    assert run_weighted([1, 1, 1], [frozenset({0, 1, 2})] * 6) == [0, 1, 2, 0, 1, 2]
    assert run_weighted([2, 1], [frozenset({0, 1})] * 6) == [0, 1, 0, 0, 1, 0]


@settings(max_examples=300, deadline=None)
@given(weights_and_schedule())
def test_weighted_exact_share_over_every_window_of_a_stable_set(case):
    weights, schedule = case
    picks = run_weighted(weights, schedule)
    for eligible, _total, window in stable_windows(weights, schedule, picks):
        assert Counter(window) == {i: weights[i] for i in eligible}, (weights, schedule, picks)


@settings(max_examples=300, deadline=None)
@given(weights_and_schedule())
def test_weighted_interleaves_no_bursts(case):
    """In any m consecutive turns of a stable set, nobody gets much more than its share."""
    weights, schedule = case
    picks = run_weighted(weights, schedule)
    for start in range(len(schedule)):
        eligible = schedule[start]
        total = sum(weights[i] for i in eligible)
        for m in range(1, total + 1):
            if start + m > len(schedule) or schedule[start + m - 1] != eligible:
                break
            counts = Counter(picks[start : start + m])
            for i in eligible:
                assert counts[i] <= math.ceil(m * weights[i] / total) + 2, (weights, schedule, picks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_weighted_from_a_fresh_start_stays_near_its_share(weights):
    """As smooth as nginx's SWRR: any m consecutive turns give each member its share of m,
    rounded, give or take one."""
    total = sum(weights)
    picks = run_weighted(weights, [frozenset(range(len(weights)))] * (3 * total))
    for start in range(len(picks)):
        for m in range(1, min(total, len(picks) - start) + 1):
            counts = Counter(picks[start : start + m])
            for i, w in enumerate(weights):
                assert counts[i] <= math.ceil(m * w / total) + 1
                assert counts[i] >= math.floor(m * w / total) - 1


@settings(max_examples=300, deadline=None)
@given(weights_and_schedule())
def test_weighted_never_starves_a_member_that_stays_eligible(case):
    weights, schedule = case
    picks = run_weighted(weights, schedule)
    bound = 2 * sum(weights)
    for i in range(len(weights)):
        gap = 0
        for eligible, got in zip(schedule, picks, strict=True):
            if i not in eligible:
                gap = 0
                continue
            gap = 0 if got == i else gap + 1
            assert gap <= bound, (weights, schedule, picks, i)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=2, max_size=5), st.integers(1, 200), st.data())
def test_weighted_returning_member_gets_no_catch_up_burst(weights, away_turns, data):
    everyone = frozenset(range(len(weights)))
    who = data.draw(st.integers(0, len(weights) - 1))
    before = data.draw(st.integers(0, 2 * sum(weights)))
    back = 2 * sum(weights)
    schedule = [everyone] * before + [everyone - {who}] * away_turns + [everyone] * back
    picks = run_weighted(weights, schedule)
    after = picks[before + away_turns :]
    total = sum(weights)
    for m in range(1, total + 1):
        assert after[:m].count(who) <= math.ceil(m * weights[who] / total) + 1
    assert after[:total].count(who) == weights[who]


def test_weighted_state_marks_members_away_and_keeps_the_scale():
    cands = [Candidate(1, 0, 2, True), Candidate(2, 1, 1, False)]
    p = weighted(cands, 0, {})
    assert p.rep_id == 1
    assert p.current_weights[SCALE_KEY] == 4
    assert p.current_weights["2"] < 0  # away
    # A weight change keeps the virtual time: no crash, no catch-up, still exact afterwards.
    cands = [Candidate(1, 0, 3, True), Candidate(2, 1, 1, True)]
    state = p.current_weights
    seq = []
    pointer = p.pointer
    for _ in range(8):
        p = weighted(cands, pointer, state)
        pointer, state = p.pointer, p.current_weights
        seq.append(p.rep_id)
    assert Counter(seq[-4:]) == {1: 3, 2: 1}


def test_weighted_nobody_eligible():
    p = weighted([Candidate(1, 0, 1, False)], 3, {})
    assert p.rep_id is None and p.pointer == 3


# --- least loaded ----------------------------------------------------------------------------


def test_least_loaded_table():
    cands = [Candidate(1, 0, open=3), Candidate(2, 1, open=1), Candidate(3, 2, open=1), Candidate(4, 3, open=0)]
    assert least_loaded(cands, 0).rep_id == 4
    cands[3] = Candidate(4, 3, open=0, eligible=False)
    assert least_loaded(cands, 0).rep_id == 2  # tie 2/3: rotation order from the pointer
    assert least_loaded(cands, 2).rep_id == 3
    assert least_loaded(cands, 3).rep_id == 2  # wraps


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=8),
    st.integers(0, 10),
)
def test_least_loaded_fewest_open_ties_by_rotation_order(members, pointer):
    cands = [Candidate(i + 10, i, 1, ok, "", open_) for i, (open_, ok) in enumerate(members)]
    p = least_loaded(cands, pointer)
    eligible = [c for c in cands if c.eligible]
    if not eligible:
        assert p.rep_id is None and p.pointer == pointer
        return
    fewest = min(c.open for c in eligible)
    tied = [c for c in eligible if c.open == fewest]
    # rotation order: first at or after the pointer, wrapping
    later = [c for c in tied if c.position >= pointer]
    expected = (later or tied)[0]
    assert p.rep_id == expected.rep_id and p.pointer == expected.position + 1


def test_newcomer_takes_leads_until_level():
    opens = {1: 4, 2: 4, 3: 0}
    pointer, got = 0, []
    for _ in range(9):
        cands = [Candidate(r, r - 1, open=o) for r, o in opens.items()]
        p = least_loaded(cands, pointer)
        got.append(p.rep_id)
        opens[p.rep_id] += 1
        pointer = p.pointer
    assert got[:4] == [3, 3, 3, 3] and Counter(got[4:]) == {1: 2, 2: 2, 3: 1}


# --- round robin under joins, pauses, returns and removals ------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("route"), st.just(0)),
        st.tuples(st.just("route"), st.just(0)),
        st.tuples(st.just("route"), st.just(0)),
        st.tuples(st.just("join"), st.just(0)),
        st.tuples(st.just("pause"), st.integers(0, 20)),
        st.tuples(st.just("back"), st.integers(0, 20)),
        st.tuples(st.just("remove"), st.integers(0, 20)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), OPS)
def test_round_robin_invariants(initial, ops):
    """Model: members by position; joiners appended (never before the pointer), removal never
    renumbers. Invariants: every turn goes to the first eligible member at or after the pointer
    (wrapping); between two turns of a member that stayed eligible, every other member that stayed
    eligible (and present) got exactly one turn; a joiner is served before anyone is served twice."""
    members: dict[int, dict] = {}
    next_rep = 0

    def add() -> None:
        nonlocal next_rep
        top = max((m["pos"] for m in members.values()), default=-1)
        members[next_rep] = {"pos": max(top + 1, pointer), "on": True}
        next_rep += 1

    pointer = 0
    for _ in range(initial):
        add()
    history: list[tuple[int | None, frozenset[int]]] = []  # (picked, members eligible that turn)
    joined_at: dict[int, int] = {}
    for op, arg in ops:
        ids = sorted(members)
        if op == "join":
            add()
            joined_at[next_rep - 1] = len(history)
        elif op in ("pause", "back", "remove") and ids:
            rep = ids[arg % len(ids)]
            if op == "remove":
                del members[rep]
            else:
                members[rep]["on"] = op == "back"
        elif op == "route":
            cands = [Candidate(r, m["pos"], 1, m["on"]) for r, m in members.items()]
            p = round_robin(cands, pointer)
            eligible = frozenset(r for r, m in members.items() if m["on"])
            if eligible:
                ordered = sorted((m["pos"], r) for r, m in members.items() if m["on"])
                after = [r for pos, r in ordered if pos >= pointer]
                assert p.rep_id == (after or [ordered[0][1]])[0]
                assert p.pointer == members[p.rep_id]["pos"] + 1
            else:
                assert p.rep_id is None and p.pointer == pointer
            pointer = p.pointer
            history.append((p.rep_id, eligible))
    # Fairness between two turns of one member, over members eligible throughout.
    for rep in {r for r, _ in history if r is not None}:
        turns = [t for t, (r, _) in enumerate(history) if r == rep]
        for a, b in zip(turns, turns[1:], strict=False):
            span = history[a : b + 1]
            steady = frozenset.intersection(*(e for _, e in span))
            if rep not in steady:
                continue
            served = Counter(r for r, _ in history[a + 1 : b])
            for other in steady - {rep}:
                assert served[other] == 1, (initial, ops)
    # A joiner (eligible from the start) is served before any steady member is served twice.
    for rep, t0 in joined_at.items():
        later = history[t0:]
        if not later or not all(rep in e for _, e in later):
            continue
        picks = [r for r, _ in later]
        if rep in picks:
            first = picks.index(rep)
            assert all(c <= 1 for r, c in Counter(picks[:first]).items() if all(r in e for _, e in later))


def test_pick_keeps_only_members_weights():
    p = pick("round_robin", [Candidate(1, 0)], 0, {"1": 3, "9": 4})
    assert p.current_weights == {"1": 3}


def burstiness(weights: list[int], picks: list[int | None]) -> float:
    """The most any member's count in a window of up to sum(weights) turns strays from its share."""
    total, worst = sum(weights), 0.0
    for start in range(len(picks)):
        for m in range(1, min(total, len(picks) - start) + 1):
            counts = Counter(picks[start : start + m])
            worst = max(worst, *(abs(counts[i] - m * w / total) for i, w in enumerate(weights)))
    return worst


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([[4, 1, 1], [5, 1, 1], [2, 1, 1], [3, 1, 1], [2, 1, 1, 1], [4, 2, 1, 1], [2, 2, 1, 1]]),
    st.integers(0, 8),
    st.integers(1, 10),
    st.data(),
)
def test_weighted_a_member_back_from_a_pause_is_as_interleaved_as_a_fresh_group(weights, before, away, data):
    """Members of one weight keep their distance for ever: one coming back must not land next
    to another of its weight (4:1:1 turning into AABC AAAA BC for good)."""
    everyone, total = frozenset(range(len(weights))), sum(weights)
    who = data.draw(st.integers(0, len(weights) - 1))
    fresh = burstiness(weights, run_weighted(weights, [everyone] * (4 * total))[total:])
    picks = run_weighted(weights, [everyone] * before + [everyone - {who}] * away + [everyone] * (5 * total))
    assert burstiness(weights, picks[-3 * total :]) <= fresh + 1e-9, picks


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([[4, 2, 1], [1, 2, 4], [5, 2, 1], [4, 3, 1], [5, 3, 1], [6, 3, 1]]),
    st.integers(0, 8),
    st.integers(1, 10),
    st.data(),
)
def test_weighted_a_member_of_its_own_weight_back_from_a_pause_is_as_interleaved_as_a_fresh_group(
    weights, before, away, data
):
    """With no other member of its weight, one coming back took its turn half a stride from the
    lead it came back at, which could fall on the turns of members of other weights: 4:2:1 after
    the 1 was away routed AACBAAB for good, where a fresh group routes ABACABA."""
    everyone, total = frozenset(range(len(weights))), sum(weights)
    who = data.draw(st.integers(0, len(weights) - 1))
    fresh = burstiness(weights, run_weighted(weights, [everyone] * (4 * total))[total:])
    picks = run_weighted(weights, [everyone] * before + [everyone - {who}] * away + [everyone] * (5 * total))
    assert burstiness(weights, picks[-3 * total :]) <= fresh + 1e-9, picks
    assert exact_windows(weights, picks[before + away :]), picks  # and exact from its return


def reweighted(before: list[int], turns: int, after: list[int], then: int) -> list[int | None]:
    """`turns` leads with weights `before`, then `then` leads with `after` (same members):
    the picks after the change."""
    state: dict[str, int] = {}
    pointer = 0
    picks: list[int | None] = []
    for weights, n in ((before, turns), (after, then)):
        cands = [Candidate(i, i, w, True) for i, w in enumerate(weights)]
        picks = []
        for _ in range(n):
            p = weighted(cands, pointer, state)
            state, pointer = p.current_weights, p.pointer
            picks.append(p.rep_id)
    return picks


def fresh_burstiness(weights: list[int]) -> float:
    everyone = frozenset(range(len(weights)))
    return burstiness(weights, run_weighted(weights, [everyone] * (4 * sum(weights)))[sum(weights) :])


def test_weighted_new_weights_are_as_interleaved_as_a_fresh_group():
    weights = [3, 1, 1]
    picks = reweighted([1, 1, 1], 1, weights, 5 * sum(weights))
    assert burstiness(weights, picks[-3 * sum(weights) :]) <= fresh_burstiness(weights) + 1e-9, picks


def test_weighted_a_weight_change_that_keeps_the_lcm_is_seen_too():
    """2:2:1 to 2:1:1 leaves lcm(weights) as it was: the state's own record of the weights
    tells the change (it routed AABC AABC... for good)."""
    weights = [2, 1, 1]
    picks = reweighted([2, 2, 1], 5, weights, 6 * sum(weights))
    assert burstiness(weights, picks[-3 * sum(weights) :]) <= fresh_burstiness(weights) + 1e-9, picks
    assert Counter(picks[: sum(weights)]) == {0: 2, 1: 1, 2: 1}  # exact from the first window


def exact_windows(weights: list[int], picks: list[int | None]) -> bool:
    total = sum(weights)
    expected = dict(enumerate(weights))
    return all(Counter(picks[start : start + total]) == expected for start in range(len(picks) - total + 1))


def test_weighted_new_weights_are_exact_from_the_first_window():
    """4:4:1 turned into 4:4:3 gave the next 11 leads 4/5/2: the member whose weight was raised
    had its first turn placed a whole stride after the soonest one, and lost the tie there."""
    cases = [([4, 4, 1], 15, [4, 4, 3]), ([5, 2, 2], 1, [6, 5, 4]), ([1, 1, 3, 1], 7, [1, 5, 6, 2])]
    for before, turns, after in cases:
        picks = reweighted(before, turns, after, 3 * sum(after))
        assert Counter(picks[: sum(after)]) == dict(enumerate(after)), (before, turns, after, picks)
        assert exact_windows(after, picks), (before, turns, after, picks)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=5),
    st.integers(0, 40),
)
def test_weighted_exact_over_every_window_after_a_weight_change(pairs, turns):
    before, after = [b for b, _ in pairs], [a for _, a in pairs]
    picks = reweighted(before, turns, after, 3 * sum(after))
    assert exact_windows(after, picks), (before, turns, after, picks)


def test_a_least_loaded_decision_says_for_each_member_passed_over_whether_load_or_order_did_it():
    """Each one not chosen read "more open leads or later in order": which of the two was left
    to the reader."""
    from django.utils import timezone

    from leads.routing import decide
    from rotation.eligibility import MemberFacts

    facts = [
        MemberFacts(1, "Ann", "a@x", 0, 1, True, True, open=1),
        MemberFacts(2, "Bob", "b@x", 1, 1, True, True, open=1),
        MemberFacts(3, "Cy", "c@x", 2, 1, True, True, open=4),
    ]
    decision = decide(strategy="least_loaded", pointer=0, current_weights={}, facts=facts, now=timezone.now())
    reasons = {c["rep"]: c["reason"] for c in decision.candidates}
    assert reasons == {
        1: "chosen",
        2: "as few open leads, later in the rotation order",
        3: "more open leads (4 against 1)",
    }
