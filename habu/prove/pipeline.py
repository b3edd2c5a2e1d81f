"""Executing a k loop's pipeline (`habu.lower.pipeline`): the producer, the copies in flight and the
consumers, over the k tiles of a block, with the hardware's synchronisation semantics.

mbarrier (PTX ISA, "mbarrier"): a barrier initialised with count n completes its current phase when
n arrivals have been made and its transaction count (bytes expected by expect_tx, less bytes
completed by TMA's complete_tx) is zero; the pending count is then reset to n. A wait with parity p
returns once the phase of parity p has completed, i.e. while the barrier's current phase has the
other parity (a fresh barrier is in phase 0: a wait for parity 1 returns at once). The count must
be at least 1.

cp.async groups (PTX ISA, "cp.async.wait_group"): `wait_group N` returns once at most N of the
thread's committed groups are still in flight; a group's copies land when it completes.

`run_ring` runs the wgmma ring under several schedules (the producer ahead, the consumers ahead, the
copies landing as late as possible, one consumer ahead of the others): each must finish (no
deadlock), every consumer must read, at every k tile t, a stage whose every box holds tile t, no
copy may land in a stage a consumer still reads, and a `full` phase's expected bytes must be the
bytes its boxes bring. `delivered` gives the interpreter the tile each k step actually multiplies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

from habu.lower.pipeline import CpAsyncRing, MbarrierRing, Pipeline


@dataclass
class Barrier:
    count: int
    phase: int = 0  # phases completed
    pending: int = 0
    tx: int = 0

    def __post_init__(self) -> None:
        self.pending = self.count

    def completed(self, parity: int) -> bool:
        """`mbarrier.try_wait.parity`: the phase of this parity has completed."""
        return (self.phase & 1) != (parity & 1)

    def settle(self) -> None:
        if self.pending <= 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count


@dataclass
class RingRun:
    """One schedule's execution: what each consumer read at each k tile, and what went wrong."""

    reads: dict[tuple[int, int], list[int | None]] = field(default_factory=dict)  # (block, consumer) -> tiles
    faults: list[str] = field(default_factory=list)

    def fault(self, text: str) -> None:
        if text not in self.faults and len(self.faults) < 4:
            self.faults.append(text)


def _regions(ring: MbarrierRing) -> list[tuple[str, int]]:
    """The parts of a stage written separately: each TMA box, and each operand the producer copies."""
    tma = {ld.side: ld for ld in ring.loads}
    return [(side, j) for side in "AB" for j in range(tma[side].boxes if side in tma else 1)]


class _Ring:
    """The state of one execution of an mbarrier ring over `steps` (k tiles per output tile)."""

    def __init__(self, ring: MbarrierRing, steps: Sequence[int]):
        self.ring, self.steps = ring, list(steps)
        self.total = sum(self.steps)
        # the last k tile of each output tile: the consumers release their stage after it
        ends, t = set(), 0
        for n in self.steps:
            t += n
            if n:
                ends.add(t - 1)
        self.ends = ends
        B, S = ring.cluster, ring.stages
        self.full = [[Barrier(ring.full_arrivals) for _ in range(S)] for _ in range(B)]
        self.empty = [[Barrier(ring.empty_arrivals) for _ in range(S)] for _ in range(B)]
        self.slots: list[list[dict[tuple[str, int], int]]] = [[{} for _ in range(S)] for _ in range(B)]
        self.held = [[0] * S for _ in range(B)]  # consumers of a block still reading each stage
        s0, p0 = ring.start_stage % S, ring.start_phase  # the state the kernel starts from
        self.prod = [[0, s0, p0] for _ in range(B)]  # (t, stage, phase) per block
        self.cons = {(b, c): [0, s0, p0, -1] for b in range(B) for c in range(ring.consumers)}  # t, stage, phase, held
        self.flight: list[tuple[int, int, tuple[str, int], int, int]] = []  # block, stage, region, tile, bytes
        self.run = RingRun({key: [] for key in self.cons})
        # B ahead (`MbarrierRing.ahead`): each k tile's output tile (its first k tile, its k tiles), and per
        # block the ahead cursor [t, stage, phase, end] while it runs and the output tiles it has run for
        self.first: dict[int, tuple[int, int]] = {}
        t = 0
        for n in self.steps:
            for j in range(n):
                self.first[t + j] = (t, n)
            t += n
        self.pre: list[list[int] | None] = [None] * B
        self.pre_done: list[set[int]] = [set() for _ in range(B)]
        if not 0 <= ring.start_stage < S:
            self.run.fault(f"the ring starts at stage {ring.start_stage}, outside its {S} stages")

    def _advance(self, state: list[int]) -> None:
        """The lowering's state update (`MbarrierRing.advance`, printed as habu::ring_advance)."""
        state[0] += 1
        stage, phase = self.ring.advance(state[1], state[2])
        if not 0 <= stage < self.ring.stages:
            self.run.fault(f"the ring's state update moves to stage {stage} at k tile {state[0]}, outside its "
                           f"{self.ring.stages} stages (it wraps at {self.ring.wrap})")
            stage = stage % self.ring.stages
        state[1], state[2] = stage, phase

    # -- the producer of block b
    def _cursor(self, b: int) -> list[int] | None:
        """The producer's next step: the ahead cursor at an output tile's start (until B's boxes of its first
        `ahead` k tiles are issued, from the main cursor's stage and phase), else the main cursor."""
        t, stage, phase = self.prod[b]
        if t >= self.total:
            return None
        if self.ring.ahead:
            t0, n = self.first[t]
            if t == t0 and t0 not in self.pre_done[b]:
                if self.pre[b] is None:
                    s0, p0 = self.ring.ahead_start(stage, phase)
                    self.pre[b] = [t0, s0 % self.ring.stages, p0, t0 + min(self.ring.ahead, n)]
                return self.pre[b]
        return self.prod[b]

    def producer_ready(self, b: int) -> bool:
        cur = self._cursor(b)
        return cur is not None and self.empty[b][cur[1]].completed(self.ring.producer_wait(cur[2]))

    def _in_flight(self, b: int, stage: int, t: int, sides: str) -> None:
        ring = self.ring
        for ld in ring.loads:
            if ld.side not in sides:
                continue
            for j in range(ld.boxes):
                for q in range(ring.cluster):
                    if ld.lands_in(j, q, b):
                        self.flight.append((q, stage, (ld.side, j), t, ld.box_bytes))

    def producer_act(self, b: int) -> None:
        ring = self.ring
        cur = self._cursor(b)
        assert cur is not None
        t, stage = cur[0], cur[1]
        full = self.full[b][stage]
        if cur is self.pre[b]:  # B's boxes ahead: their bytes posted, no arrival
            full.tx += ring.ahead_bytes
            self._in_flight(b, stage, t, "B")
            self._advance(cur)
            if cur[0] == cur[3]:
                self.pre_done[b].add(self.first[t][0])
                self.pre[b] = None
            return
        t0, n = self.first[t]
        rest = ring.ahead and t - t0 < min(ring.ahead, n)  # B went ahead: the rest of the fill
        full.tx += ring.expect_tx - (ring.ahead_bytes if rest else 0)
        self._in_flight(b, stage, t, "A" if rest else "AB")
        tma = {ld.side for ld in ring.loads}
        for side in "AB":
            if side not in tma:  # the producer threads' copies land before they arrive
                self._land(b, stage, (side, 0), t)
        full.pending -= ring.producer_arrivals
        full.settle()
        self._advance(self.prod[b])

    # -- the copies in flight
    def land_ready(self) -> bool:
        return bool(self.flight)

    def land_act(self) -> None:
        q, stage, region, t, nbytes = self.flight.pop(0)
        self._land(q, stage, region, t)
        bar = self.full[q][stage]
        bar.tx -= nbytes
        bar.settle()

    def _land(self, q: int, stage: int, region: tuple[str, int], t: int) -> None:
        if self.held[q][stage]:
            self.run.fault(f"tile {t}'s {region[0]} lands in stage {stage} of block {q} while a consumer still "
                           f"reads tile {self.slots[q][stage].get(region)} there")
        self.slots[q][stage][region] = t

    # -- consumer c of block b
    def consumer_ready(self, key: tuple[int, int]) -> bool:
        t, stage, phase, _ = self.cons[key]
        if t < self.total and self.ring.lag and key[1] > 0:  # the lag: the previous consumer is far enough into the tile
            t0, n = self.first[t]
            if self.cons[(key[0], key[1] - 1)][0] < t0 + self.ring.lag_tiles(n):
                return False
        return t < self.total and self.full[key[0]][stage].completed(self.ring.consumer_wait(phase))

    def consumer_act(self, key: tuple[int, int]) -> None:
        ring = self.ring
        b = key[0]
        st = self.cons[key]
        t, stage, _, held = st
        slot = ring.read_slot(stage) % ring.stages
        found = {self.slots[b][slot].get(r) for r in _regions(ring)}
        got = found.pop() if len(found) == 1 else None
        if got != t:
            have = ", ".join(f"{s}{j}: {self.slots[b][slot].get((s, j))}" for s, j in _regions(ring))
            self.run.fault(f"consumer {key[1]} of block {b} multiplies k tile {t} from stage {slot}, which holds "
                           f"tiles ({have})")
        self.run.reads[key].append(got)
        self.held[b][slot] += 1
        if held >= 0:
            self._release(b, held)
        st[3] = slot
        if t in self.ends:  # wgmma.wait_group 0, then the last stage is released
            self._release(b, slot)
            st[3] = -1
        self._advance(st)

    def _release(self, b: int, slot: int) -> None:
        self.held[b][slot] -= 1
        for r in range(self.ring.cluster):  # thread r of the warpgroup arrives on block r's barrier
            bar = self.empty[r][slot]
            bar.pending -= 1
            bar.settle()

    def finished(self) -> bool:
        return not self.flight and all(p[0] == self.total for p in self.prod) and \
            all(c[0] == self.total for c in self.cons.values())

    def stuck(self) -> str:
        waits = []
        for b, (t, stage, phase) in enumerate(self.prod):
            if t < self.total:
                bar = self.empty[b][stage]
                waits.append(f"the producer of block {b} waits empty[{stage}] for parity "
                             f"{self.ring.producer_wait(phase)} at k tile {t} (the barrier is in phase {bar.phase})")
        for (b, c), (t, stage, phase, _) in self.cons.items():
            if t < self.total:
                bar = self.full[b][stage]
                waits.append(f"consumer {c} of block {b} waits full[{stage}] for parity "
                             f"{self.ring.consumer_wait(phase)} at k tile {t} (phase {bar.phase}, {bar.pending} "
                             f"arrival(s) and {bar.tx} byte(s) missing)")
        return "the pipeline deadlocks: " + "; ".join(waits[:3])


Agent = tuple[Callable[[], bool], Callable[[], None]]  # (ready?, act)


def _policies(ring: MbarrierRing) -> list[tuple[str, Callable[[_Ring], list[Agent]]]]:
    """Schedules, as agent priorities: at each step the first agent that can act does."""
    def producers(r: _Ring):
        return [(lambda b=b: r.producer_ready(b), lambda b=b: r.producer_act(b)) for b in range(ring.cluster)]

    def consumers(r: _Ring, reverse: bool = False):
        keys = sorted(r.cons, reverse=reverse)
        return [(lambda k=k: r.consumer_ready(k), lambda k=k: r.consumer_act(k)) for k in keys]

    def landing(r: _Ring):
        return [(r.land_ready, r.land_act)]

    return [
        ("the producer ahead", lambda r: producers(r) + landing(r) + consumers(r)),
        ("the consumers ahead", lambda r: consumers(r) + producers(r) + landing(r)),
        ("the copies landing last", lambda r: producers(r) + consumers(r) + landing(r)),
        ("the first consumer ahead of the others", lambda r: consumers(r)[:1] + producers(r) + landing(r)
         + consumers(r, True)),
    ]


def _execute(ring: MbarrierRing, steps: tuple[int, ...], order) -> RingRun:
    r = _Ring(ring, steps)
    agents = order(r)
    while True:
        for ready, act in agents:
            if ready():
                act()
                break
        else:
            if not r.finished():
                r.run.fault(r.stuck())
            return r.run


def _ring_problem(ring: MbarrierRing) -> str | None:
    if ring.stages < 1:
        return f"the ring has {ring.stages} stages"
    if ring.full_arrivals < 1 or ring.empty_arrivals < 1:
        return f"an mbarrier is initialised with {min(ring.full_arrivals, ring.empty_arrivals)} arrivals (at least 1)"
    for q in range(ring.cluster):
        brought = sum(ld.bytes_into(q) for ld in ring.loads)
        if brought != ring.expect_tx:
            return (f"a full phase of block {q} expects {ring.expect_tx} bytes, but the TMA boxes of a k tile "
                    f"bring {brought}")
    return None


@cache
def run_ring(ring: MbarrierRing, steps: tuple[int, ...]) -> tuple[RingRun, ...]:
    """The ring executed over a block's output tiles of `steps` k tiles each, under every schedule."""
    problem = _ring_problem(ring)
    if problem is not None:
        return (RingRun({(b, c): [None] * sum(steps) for b in range(max(1, ring.cluster))
                         for c in range(ring.consumers)}, [problem]),)
    return tuple(_execute(ring, steps, order) for _name, order in _policies(ring))


@cache
def run_cp_async(ring: CpAsyncRing, steps: tuple[int, ...]) -> RingRun:
    """The mma.sync ring: all threads in step (a barrier per k tile), groups landing when waited for."""
    run = RingRun({(0, 0): []})
    S = ring.stages
    if S < 1:
        run.fault(f"the ring has {S} stages")
        run.reads[(0, 0)] = [None] * sum(steps)
        return run
    slots: list[int | None] = [None] * S
    groups: list[list[tuple[int, int]]] = []  # committed groups: (stage, tile) copies
    landed = 0  # groups complete
    uses = 0

    def issue(t: int, reading: int | None) -> None:
        st = ring.stage(uses + t)
        if reading is not None and st == reading:
            run.fault(f"tile {t}'s copy goes to stage {st} while the block still reads tile {reading_tile} there")
        groups[-1].append((st, t))

    for n in steps:
        for p in range(ring.prologue):
            groups.append([])
            if p < n:
                issue(p, None)
        for j in range(n):
            while len(groups) - landed > ring.wait_groups and landed < len(groups):
                for st, t in groups[landed]:
                    slots[st] = t
                landed += 1
            st = ring.stage(uses + j)
            reading_tile = j
            groups.append([])
            if j + ring.prologue < n:
                issue(j + ring.prologue, st)
            got = slots[st]
            if got != j:
                run.fault(f"iteration {j} multiplies stage {st}, which holds tile {got} (its copy "
                          f"{'has not landed' if any(t == j for g in groups[landed:] for _, t in g) else 'was overwritten'})")
            run.reads[(0, 0)].append(got)
        while landed < len(groups):  # cp.async.wait_group 0 at the tile's end
            for st, t in groups[landed]:
                slots[st] = t
            landed += 1
        uses += n
        slots = [None] * S  # the next output tile's tiles are numbered from 0 again
    return run


def _relative(reads: list[int | None], steps: tuple[int, ...]) -> list[list[int | None]]:
    """Global k-tile numbers (mbarrier ring) back to each output tile's own numbering."""
    out, t = [], 0
    for n in steps:
        out.append([None if x is None or not t <= x < t + n else x - t for x in reads[t:t + n]])
        t += n
    return out


def delivered(pipeline: Pipeline | None, steps: int, rank: int = 0) -> tuple[list[int | None], str | None]:
    """The k tile each of a block's `steps` k steps multiplies (None: no tile of this output tile,
    e.g. a stage read before its bytes landed), and the first fault of a schedule that went wrong
    (the interpreter then multiplies what that schedule read). A block that runs one output tile
    of `steps` k tiles may not show what a persistent block's later tiles do (the ring continues
    where it stopped): the fault is then the one `pipeline_problem` finds over `rule_steps`."""
    if pipeline is None:
        return list(range(max(0, steps))), None
    later = pipeline_problem(pipeline)
    if steps <= 0:
        return [], later
    if isinstance(pipeline, CpAsyncRing):
        run = run_cp_async(pipeline, (steps,))
        return run.reads[(0, 0)], (run.faults[0] if run.faults else later)
    runs = run_ring(pipeline, (steps,))
    bad = next((r for r in runs if r.faults), runs[0])
    rank = rank if rank < max(1, pipeline.cluster) else 0
    reads: list[int | None] = list(range(steps))
    for c in range(pipeline.consumers):  # the first consumer that read a wrong tile at a step spoils it
        got = _relative((bad.reads.get((rank, c), []) + [None] * steps)[:steps], (steps,))[0]
        reads = [r if r != i else g for i, (r, g) in enumerate(zip(reads, got, strict=True))]
    return reads, (bad.faults[0] if bad.faults else later)


# the k-tile counts of a block's output tiles the rule runs: one tile, one longer than two passes
# of the ring, and a persistent block whose tiles (one empty: a split past the last k tile) continue
# the ring where the previous one left it
def rule_steps(stages: int) -> tuple[tuple[int, ...], ...]:
    s = max(1, stages)
    return ((1,), (2 * s + 1,), (s, 0, 1, s + 1, 2))


# habu::ring_init (habu/sync/mbarrier.cuh) initialises stage s's full barrier at bars + 16·s and its
# empty barrier at bars + 16·s + 8
RING_INIT_STRIDE, RING_INIT_EMPTY = 16, 8


def barrier_problem(ring: MbarrierRing) -> str | None:
    """Whether every stage's barriers are where the kernel waits and arrives on them
    (`MbarrierRing.full_barrier`, `empty_barrier`, what the emitter prints) and where habu::ring_init
    initialised them, 8-byte mbarriers apart; the first stage that differs, or None."""
    for s in range(ring.stages):
        at = (ring.full_barrier(0, s), ring.empty_barrier(0, s))
        want = (RING_INIT_STRIDE * s, RING_INIT_STRIDE * s + RING_INIT_EMPTY)
        if at != want:
            return (f"stage {s}'s full and empty barriers are used at bytes {at[0]} and {at[1]} of the ring, but "
                    f"habu::ring_init initialised them at {want[0]} and {want[1]}")
    return None


@cache
def pipeline_problem(pipeline: Pipeline) -> str | None:
    """The first fault of the pipeline over `rule_steps`, under every schedule; None: it is sound."""
    if isinstance(pipeline, MbarrierRing):
        problem = barrier_problem(pipeline)
        if problem is not None:
            return problem
    for steps in rule_steps(pipeline.stages):
        if isinstance(pipeline, CpAsyncRing):
            run = run_cp_async(pipeline, steps)
            if run.faults:
                return f"over output tiles of {list(steps)} k tiles: {run.faults[0]}"
            continue
        for (name, _), run in zip(_policies(pipeline), run_ring(pipeline, steps), strict=False):
            if run.faults:
                return f"over output tiles of {list(steps)} k tiles, {name}: {run.faults[0]}"
    return None


__all__ = ["barrier_problem", "delivered", "pipeline_problem", "rule_steps", "run_cp_async", "run_ring"]
