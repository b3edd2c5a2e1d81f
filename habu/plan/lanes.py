"""Two launch lanes for a plan's independent kernels (`Plan.lanes` 2): the caller's stream and a side stream.
The runtime (habu/emit_cuda/call_plan.py) launches by `lane_schedule` over what each emitted kernel reads and
writes (`CudaKernel.reading`, `.writing`); `plan_accesses` says the same from the plan's nodes, for the search
and the pin (whether a plan has two kernels to put side by side).

A backward's kernels are not a chain: FFN-SKIP's dW2 = S3ᵀ·dT6 needs only the first kernel's dT6, so it
can run beside dT3 = dT6·W2ᵀ, and dW1 beside dX. At 128 tokens each of those products is bound by one
side of the memory: the dW products write a weight-sized gradient, dT3 and dX read a weight. Side by side
they share the HBM's read and write bandwidth instead of taking turns with it.

The schedule (`lane_schedule`) keeps every kernel's order against each kernel it conflicts with (one writes
what the other reads or writes, the zero fills and workspaces counted as writes):
- the kernels in ASAP levels (a kernel one level past the latest kernel it conflicts with), stable in the
  plan's order within a level; within a level no two kernels conflict;
- a level's first kernel on lane 0, its second on lane 1, alternating (a level's kernel that conflicts with
  lane 0's latest kernel is put first, so it follows it in stream order, where it may launch early);
- a kernel waits, by an event, for the latest kernel of the other lane that it conflicts with, or that one of
  its own lane's predecessors since then conflicts with (so the whole lane's order holds);
- lane 1 starts after everything the caller queued before the call (the fork) and lane 0 ends after lane 1's
  last kernel (the join), so the call is one step of the caller's stream, and capturable in a CUDA graph.

`schedule_faults` checks a schedule on its own terms: for every conflicting pair, the earlier one in the
plan's order completes before the later one starts (same lane in issue order, or an event chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from habu.plan.patterns import stored_nodes
from habu.spec.ir import Model, node_reads

Access = tuple[frozenset[str], frozenset[str]]  # (the tensors a launch reads, the tensors it writes)


@dataclass(frozen=True)
class LaneStep:
    """One launch of a two-lane schedule, in issue order."""

    launch: int  # the launch's place in the plan's order
    lane: int  # 0: the caller's stream; 1: the side stream
    waits: tuple[int, ...] = ()  # launches of the other lane whose completion it waits for (their events)


def conflicts(a: Access, b: Access) -> bool:
    """Whether two launches must keep their order: one writes what the other reads or writes."""
    (ra, wa), (rb, wb) = a, b
    return bool(wa & (rb | wb) or wb & ra)


def lane_schedule(accesses: Sequence[Access]) -> tuple[LaneStep, ...]:
    """The two-lane schedule of launches with these accesses (the module's text says how)."""
    n = len(accesses)
    before = [[i for i in range(j) if conflicts(accesses[i], accesses[j])] for j in range(n)]
    level: list[int] = []
    for j in range(n):
        level.append(1 + max((level[i] for i in before[j]), default=-1))
    steps: list[LaneStep] = []
    issued: list[list[int]] = [[], []]  # each lane's launches so far, in order
    for lv in range(max(level, default=-1) + 1):
        members = [j for j in range(n) if level[j] == lv]
        last0 = issued[0][-1] if issued[0] else None
        members.sort(key=lambda j: 0 if last0 is not None and last0 in before[j] else 1)  # stable
        for slot, j in enumerate(members):
            lane = slot % 2
            other = issued[1 - lane]
            # the other lane's latest launch this one conflicts with: waiting for it waits for everything
            # before it on that lane too
            waits = tuple(i for i in reversed(other) if i in before[j])[:1]
            steps.append(LaneStep(j, lane, waits))
            issued[lane].append(j)
    return tuple(steps)


def uses_side_lane(schedule: Sequence[LaneStep]) -> bool:
    return any(s.lane == 1 for s in schedule)


def plan_accesses(model: Model, kernels: Sequence[object]) -> list[Access]:
    """Each kernel's (reads, writes) by its nodes: it writes the nodes it stores (`stored_nodes`), and reads what
    its nodes read that it does not compute (a scatter's target too: it adds into it)."""
    defs = {eq.target: eq for eq in model.nodes}
    out: list[Access] = []
    for k in kernels:
        nodes = tuple(k.nodes)  # type: ignore[attr-defined]
        reads = set().union(*(node_reads(defs[n]) for n in nodes if n in defs)) - set(nodes)
        writes = set(stored_nodes(model, nodes))
        out.append((frozenset(reads - writes), frozenset(writes)))
    return out


def side_by_side(accesses: Sequence[Access]) -> bool:
    """Whether a second lane has anything to run: some level of the schedule holds two kernels."""
    return uses_side_lane(lane_schedule(accesses))


def schedule_faults(accesses: Sequence[Access], schedule: Sequence[LaneStep]) -> list[str]:
    """What breaks the plan's order in `schedule`: a launch missing or issued twice, or a conflicting pair
    whose earlier launch may not have completed when the later one starts."""
    n = len(accesses)
    order = [s.launch for s in schedule]
    if sorted(order) != list(range(n)):
        return [f"the schedule issues launches {order}, not each of 0..{n - 1} once"]
    faults: list[str] = []
    position = {s.launch: p for p, s in enumerate(schedule)}
    # known[p]: the launches known complete when schedule[p] starts (its lane's earlier launches, its waits'
    # and what they knew, transitively; lane 1's first launch knows what the fork saw: nothing of the call)
    known: list[set[int]] = []
    last_on: dict[int, int] = {}
    for p, s in enumerate(schedule):
        done: set[int] = set()
        prev = last_on.get(s.lane)
        if prev is not None:
            done |= known[prev] | {schedule[prev].launch}
        for w in s.waits:
            q = position.get(w)
            if q is None or q >= p:
                faults.append(f"launch {s.launch} waits for launch {w}, which is not issued before it")
                continue
            if schedule[q].lane == s.lane:
                faults.append(f"launch {s.launch} waits by an event for launch {w} of its own lane")
            done |= known[q] | {w}
        known.append(done)
        last_on[s.lane] = p
    for j in range(n):
        for i in range(j):
            if conflicts(accesses[i], accesses[j]) and i not in known[position[j]]:
                faults.append(f"launch {j} may start before launch {i} completes, and they share a tensor "
                              f"({', '.join(sorted(_shared(accesses[i], accesses[j])))})")
    return faults


def _shared(a: Access, b: Access) -> set[str]:
    (ra, wa), (rb, wb) = a, b
    return (wa & (rb | wb)) | (wb & ra)


__all__ = ["Access", "LaneStep", "conflicts", "lane_schedule", "plan_accesses", "schedule_faults", "side_by_side",
           "uses_side_lane"]
