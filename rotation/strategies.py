"""The routing strategies: pure functions over plain data (no ORM), shared by routing,
simulate and replay, and property-tested on their own.

Every strategy walks the members in *rotation order*: by position, starting at the pointer
and wrapping. The pointer then moves just past the member chosen, so a paused member keeps
its place and a member appended mid-cycle is reached in the current cycle.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    rep_id: int
    position: int
    weight: int = 1
    eligible: bool = True
    reason: str = ""
    open: int = 0


@dataclass(frozen=True)
class Pick:
    rep_id: int | None
    pointer: int
    current_weights: dict[str, int] = field(default_factory=dict)


def rotation_order(candidates: Sequence[Candidate], pointer: int) -> list[Candidate]:
    ordered = sorted(candidates, key=lambda c: (c.position, c.rep_id))
    start = next((i for i, c in enumerate(ordered) if c.position >= pointer), 0)
    return ordered[start:] + ordered[:start]


def round_robin(candidates: Sequence[Candidate], pointer: int) -> Pick:
    for c in rotation_order(candidates, pointer):
        if c.eligible:
            return Pick(c.rep_id, c.position + 1)
    return Pick(None, pointer)


SCALE_KEY = "_scale"
WEIGHT_KEY = "w:"  # "w:<rep id>": the weight the member's turns were laid out for


def weighted(candidates: Sequence[Candidate], pointer: int, current: Mapping[str, int]) -> Pick:
    """Smooth weighted round robin, as stride scheduling over a virtual clock.

    Member i's turns fall every `scale / w_i` ticks of virtual time (scale = 2 * lcm of the
    weights); the member whose next turn is soonest is chosen, ties by position, and the
    clock moves to that turn. So over any window of sum(weights) turns among a stable set
    of eligible members, each gets exactly its weight, interleaved: the turns form one
    periodic sequence, from *any* state. (nginx's running-weight form is only exact from a
    fresh cycle: after a member pauses, the others' running weights no longer sum to zero
    and the windows come out uneven.)

    State, keyed by rep id, relative to the clock: `n >= 0` ticks until the member's next
    turn; `-(n + 1)` while it is not eligible (the mark is how it is known to return). A
    member away earns nothing: its lead over the clock decays to zero, and it returns no
    sooner than that (and after the last turn taken, so the sequence stays periodic).

    Members of one weight keep their distance for ever (same stride), so where a member
    enters (joins, or comes back) matters: it takes the middle of the widest gap between
    the turns of the members of its weight already in rotation (no sooner than its own turn
    was due), not a fixed offset that could put two weight-1 reps back to back for good. A
    change of weights (any member's, as the state records them) re-places everyone so, in the
    order they were due. With none of its
    weight in rotation (a fresh group), members entering together are spread over the stride.
    """
    scale = 2 * math.lcm(*(c.weight for c in candidates)) if candidates else 2
    old_scale = int(current.get(SCALE_KEY) or scale)
    ticks: dict[str, int] = {}
    away: set[str] = set()
    entering: set[str] = set()  # eligible and joining, or back
    reweighed = old_scale != scale
    for c in candidates:
        key = str(c.rep_id)
        if not c.eligible:
            away.add(key)
        if key in current and current.get(WEIGHT_KEY + key, c.weight) != c.weight:
            reweighed = True  # (a weight recorded without a turn is a former member's: a joiner)
        if key not in current:
            ticks[key] = 0
            if c.eligible:
                entering.add(key)
            continue
        value = int(current[key])
        if value < 0:
            value = -value - 1
            if c.eligible:
                entering.add(key)
        if old_scale != scale:  # the weights changed: same virtual time, new unit
            value = -(-value * scale // old_scale)
        ticks[key] = value
    ordered = sorted(candidates, key=lambda c: (c.position, c.rep_id))
    # Members placed now take their first turn before the next turn of everyone else comes
    # round again (a tick under `due + stride`, where the next lead is `due` away): then the
    # first sum(weights) turns give each member exactly its weight.
    due = min(
        (ticks[str(c.rep_id)] for c in ordered if c.eligible and str(c.rep_id) not in entering and not reweighed),
        default=None,
    )

    def place(turns: list[int], earliest: int, stride: int) -> int:
        latest = stride if due is None else max(min(stride, due + stride - 1), 1)
        return _widest_gap(turns, min(earliest, latest), latest, stride)

    placed: dict[int, list[int]] = {}  # weight: the turns of its members in rotation
    if reweighed:
        # New weights: the members in rotation are placed again, in the order they were due;
        # the first of each weight keeps its turn (within its new stride).
        staying = [c for c in ordered if c.eligible and str(c.rep_id) not in entering]
        for c in sorted(staying, key=lambda c: (ticks[str(c.rep_id)], c.position, c.rep_id)):
            key, stride = str(c.rep_id), scale // c.weight
            if c.weight in placed:
                ticks[key] = place(placed[c.weight], 1, stride)
            else:
                ticks[key] = min(ticks[key], stride)
            placed.setdefault(c.weight, []).append(ticks[key])
    else:
        for c in ordered:
            if c.eligible and str(c.rep_id) not in entering:
                placed.setdefault(c.weight, []).append(ticks[str(c.rep_id)])
    fresh: dict[int, list[Candidate]] = {}
    for c in ordered:
        key = str(c.rep_id)
        if key not in entering:
            continue
        if c.weight not in placed:
            fresh.setdefault(c.weight, []).append(c)
            continue
        ticks[key] = place(placed[c.weight], max(ticks[key], 1), scale // c.weight)
        placed[c.weight].append(ticks[key])
    # None of their weight in rotation: those entering together are spread over the stride.
    waiting = {str(c.rep_id) for group in fresh.values() for c in group}
    for weight, group in fresh.items():
        stride = scale // weight
        for j, c in enumerate(group):
            key = str(c.rep_id)
            earliest = max(ticks[key], 1)
            ticks[key] = max(earliest, stride * (2 * j + 1) // (2 * len(group)))
            waiting.discard(key)
            if due is not None:
                latest = max(due + stride - 1, 1)
                ticks[key] = min(ticks[key], latest)
                # Beside members of other weights, half a stride from now can fall on their
                # turns (4:2:1 after the 1 was away: AACBAAB for good, where a fresh group
                # routes ABACABA): it takes the place that interleaves the rotation best.
                rotating = [m for m in ordered if m.eligible and str(m.rep_id) not in waiting]
                ticks[key] = _best_place(
                    rotating, ticks, key, min(earliest, latest), min(latest, max(earliest, stride)), scale
                )
    eligible = [c for c in ordered if c.eligible]
    chosen = min(eligible, key=lambda c: ticks[str(c.rep_id)]) if eligible else None
    if chosen is not None:
        # Exact from the first window: the next sum(weights) turns are those before the soonest
        # turn (the chosen one's) plus a whole scale, ties by position. A member whose first
        # turn lies a stride or more past it (placed again for new weights) would get one
        # turn fewer there; it takes its turn just before that instead.
        soonest = ticks[str(chosen.rep_id)]
        for c in eligible:
            key, stride = str(c.rep_id), scale // c.weight
            if (ticks[key], c.position, c.rep_id) >= (soonest + stride, chosen.position, chosen.rep_id):
                ticks[key] = soonest + stride - 1
    step = 0
    if chosen is not None:
        step = ticks[str(chosen.rep_id)]
        ticks[str(chosen.rep_id)] += scale // chosen.weight
    state = {}
    for key, value in ticks.items():
        value = max(value - step, 0)
        state[key] = -value - 1 if key in away else value
    state[SCALE_KEY] = scale
    state.update({WEIGHT_KEY + str(c.rep_id): c.weight for c in candidates})
    if chosen is None:
        return Pick(None, pointer, state)
    return Pick(chosen.rep_id, chosen.position + 1, state)


# Weighing the places costs (places x turns per cycle) steps, under the rotation lock (a few
# microseconds each): past this, the member keeps the place it was given (a few members of
# small weights are far below it).
_PLACE_MAX_STEPS = 1_500


def _best_place(
    members: Sequence[Candidate], ticks: Mapping[str, int], key: str, earliest: int, latest: int, scale: int
) -> int:
    """The tick in [earliest, latest] for member `key` (one of `members`, the eligible members
    placed) that makes the rotation's cycle the most even: the least any member's count over a
    run of turns strays from its share. Its tick as it is when no place does better, or when
    the cycle is too long to weigh every place."""
    preferred = ticks[key]
    total = sum(m.weight for m in members)
    if earliest >= latest:
        return preferred
    me = next(m for m in members if str(m.rep_id) == key)
    stride = scale // me.weight
    if total * total > 2 * _PLACE_MAX_STEPS:  # (about two places per turn)
        return preferred
    # Only the order of the turns matters, and every place strictly between two turns of the
    # others (on its stride's circle) gives the same: one place in each gap (its middle, or as
    # near as the bounds allow), one on each turn (a tie, by position), and the bounds.
    others = sorted(
        {
            (ticks[str(m.rep_id)] + k * (scale // m.weight)) % stride
            for m in members
            if m is not me
            for k in range(m.weight)
        }
    )
    options = {preferred, earliest, latest}
    for a, b in zip(others, others[1:] + [p + stride for p in others[:1]], strict=True):
        on = earliest + (a - earliest) % stride
        if on <= latest:
            options.add(on)
        inside = [earliest + (at - earliest) % stride for at in ((a + b) // 2, a + 1, b - 1) if a < at < b]
        options.update([tick for tick in inside if tick <= latest][:1])
    if len(options) * total > _PLACE_MAX_STEPS:
        return preferred

    def unevenness(tick: int) -> int:
        turns = sorted(
            (((tick if m is me else ticks[str(m.rep_id)]) + k * (scale // m.weight)) % scale, m.position, m.rep_id, i)
            for i, m in enumerate(members)
            for k in range(m.weight)
        )
        # Member i's drift from its share after t turns, count * total - t * weight, peaks just
        # after its turns and bottoms out just before them.
        count, low, high = [0] * len(members), [0] * len(members), [0] * len(members)
        for t, turn in enumerate(turns, start=1):
            i, weight = turn[3], members[turn[3]].weight
            low[i] = min(low[i], count[i] * total - (t - 1) * weight)
            count[i] += 1
            high[i] = max(high[i], count[i] * total - t * weight)
        return max(h - lo for h, lo in zip(high, low, strict=True))

    return min(sorted(options, key=lambda tick: (tick != preferred, tick)), key=unevenness)


def _widest_gap(turns: Sequence[int], earliest: int, latest: int, stride: int) -> int:
    """The tick in [earliest, latest] farthest (on the stride's circle) from every one of
    `turns`: the middle of the widest gap between them, or as near it as the bounds allow."""
    points = sorted(t % stride for t in turns)
    low, high = max(earliest, 1), max(latest, 1)
    options = {min(low, high), high}
    for a, b in zip(points, points[1:] + [points[0] + stride], strict=True):
        middle = ((a + b) // 2) % stride or stride
        options.add(min(max(middle, low), high))

    def distance(tick: int) -> int:
        return min(min((tick - p) % stride, (p - tick) % stride) for p in points)

    return max(sorted(options), key=distance)


def least_loaded(candidates: Sequence[Candidate], pointer: int) -> Pick:
    """Fewest open leads among the eligible; ties by rotation order."""
    best: Candidate | None = None
    for c in rotation_order(candidates, pointer):
        if c.eligible and (best is None or c.open < best.open):
            best = c
    if best is None:
        return Pick(None, pointer)
    return Pick(best.rep_id, best.position + 1)


def turn_weight(strategy: str, weight: int) -> int:
    """What a member's weight counts for in its share of turns: itself in a weighted group;
    nothing elsewhere (round robin gives each member one turn per round, least loaded goes by
    open leads), so each member counts 1 and the fair share is an equal one."""
    return weight if strategy == "weighted" else 1


def pick(strategy: str, candidates: Sequence[Candidate], pointer: int, current: Mapping[str, int]) -> Pick:
    if strategy == "weighted":
        return weighted(candidates, pointer, current)
    members = {str(c.rep_id) for c in candidates}
    kept = {k: v for k, v in current.items() if k in members}
    if strategy == "least_loaded":
        p = least_loaded(candidates, pointer)
    else:
        p = round_robin(candidates, pointer)
    return Pick(p.rep_id, p.pointer, kept)
