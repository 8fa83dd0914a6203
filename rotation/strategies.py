"""The routing strategies: pure functions over plain data (no ORM), shared by routing,
simulate and replay, and property-tested on their own.

Every strategy walks the members in *rotation order*: by position, starting at the pointer
and wrapping. The pointer then moves just past the member chosen, so a paused member keeps
its place and a member appended mid-cycle is reached in the current cycle.
"""

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


def weighted(candidates: Sequence[Candidate], pointer: int, current: Mapping[str, int]) -> Pick:
    """Smooth weighted round robin (as in nginx).

    Each eligible member earns its weight; the one with the highest running weight is chosen
    and pays back the eligible total. Over any window of sum(weights) turns among a stable
    set, each member gets exactly its weight, interleaved. A member that is not eligible
    earns nothing while away (its running weight is frozen), so it returns with no catch-up
    burst. Ties go to rotation order.
    """
    members = {str(c.rep_id) for c in candidates}
    weights = {k: v for k, v in current.items() if k in members}
    order = rotation_order(candidates, pointer)
    eligible = [c for c in order if c.eligible]
    if not eligible:
        return Pick(None, pointer, weights)
    total = 0
    for c in eligible:
        key = str(c.rep_id)
        weights[key] = weights.get(key, 0) + c.weight
        total += c.weight
    best = eligible[0]
    for c in eligible[1:]:
        if weights[str(c.rep_id)] > weights[str(best.rep_id)]:
            best = c
    weights[str(best.rep_id)] -= total
    return Pick(best.rep_id, best.position + 1, weights)


def least_loaded(candidates: Sequence[Candidate], pointer: int) -> Pick:
    """Fewest open leads among the eligible; ties by rotation order."""
    best: Candidate | None = None
    for c in rotation_order(candidates, pointer):
        if c.eligible and (best is None or c.open < best.open):
            best = c
    if best is None:
        return Pick(None, pointer)
    return Pick(best.rep_id, best.position + 1)


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
