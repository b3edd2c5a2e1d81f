"""The rule of a kernel that warms the plan's next kernel's first boxes into the L2 (`warm_next`,
habu/lower/warm_next.py). A prefetch changes no value, so what is checked is that it warms what it says, by
running the two maps the emitter prints at the plan's sizes (a runtime extent, or a shape of too many boxes, at a
few witness values): the producer threads' box indices (`WarmNext.first`, `stride`) cover each index once for
grids of several sizes, and the decode (`WarmNext.origin`) gives each box the next kernel's producer loads in each
split's first `warm_next` k tiles exactly once and no other (but boxes past the tensor along k, which the TMA unit
clips whole), through a tensor map of the next kernel's own operand, a model input no kernel of the plan writes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from habu.lower.contraction import ContractionLowering
from habu.lower.warm_next import WarmNext
from habu.prove.obligation import Context, Obligation, Rule

WARM_RULES = {r.name: r for r in (
    Rule("warm-next", "the boxes a producer warms for the plan's next kernel are that kernel's first boxes of a "
         "model input, each once", "PTX ISA: cp.async.bulk.prefetch.tensor (a hint; the map's bounds clip the box)"),
)}
WITNESSES = (1, 97, 1000)  # a runtime extent's values the decode is run at
MOST_BOXES = 1 << 18  # a shape of more boxes is run at the witnesses instead
GRIDS = (1, 3, 112, 132)  # grids the threads' box indices are run over


def next_kernel_boxes(warm: WarmNext, s: dict[str, int]) -> set[tuple[int, int]]:
    """Every box the next kernel's producer loads of the operand in each split's first `warm.tiles` k tiles, from
    that kernel's own lowering: its tiles along the operand's rows, its splits of k (each ending at the tensor's
    last k tile) and its boxes per k tile (`TmaOperandLoad.origin`)."""
    nxt = warm.next_kernel
    ld = next(x for x in nxt.pipeline.loads if x.side == warm.side)
    row_tiles, size = (nxt.tiles_m(s), nxt.bm) if warm.side == "A" else (nxt.tiles_n(s), nxt.bn)
    per, k_tiles = nxt.k_tiles_per_split(s), nxt.k_tiles(s)
    return {ld.origin(r * size, ld.k_coordinate(q * per, j), b)
            for r in range(row_tiles) for q in range(nxt.kernel.split_k) for j in range(min(warm.tiles, per))
            for b in range(ld.boxes) if q * per + j < k_tiles}


def warm_mismatch(warm: WarmNext, sizes: dict[str, int]) -> str | None:
    """Where the threads' indices or the decode of the warmed boxes differ from the next kernel's own boxes at
    `sizes` (None: nowhere)."""
    count = warm.count(sizes)
    for grid in GRIDS:
        taken = Counter(i for block in range(grid) for t in range(warm.threads)
                        for i in range(warm.first(block, grid, t), count, warm.stride(grid)))
        if set(taken) != set(range(count)) or any(n > 1 for n in taken.values()):
            missed = sorted(set(range(count)) - set(taken))
            return (f"over a grid of {grid} blocks, box index {missed[0]} is warmed by no thread" if missed else
                    f"over a grid of {grid} blocks, a box index is warmed {max(taken.values())} times")
    warmed = Counter(tuple(warm.origin(i, sizes)) for i in range(count))
    twice = [box for box, n in warmed.items() if n > 1]
    if twice:
        return f"box {twice[0]} is warmed {warmed[twice[0]]} times"
    loaded = next_kernel_boxes(warm, sizes)
    extra = {b for b in set(warmed) - loaded if not warm.past_k(b, sizes)}
    missed = loaded - set(warmed)
    if extra:
        return f"box {sorted(extra)[0]} is warmed but the next kernel does not load it in its first k tiles"
    if missed:
        return f"box {sorted(missed)[0]} of the next kernel's first k tiles is not warmed"
    return None


def warm_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    warm = lw.warm
    if warm is None:
        return
    tensor = warm.map.tensor
    inputs = {t.name for t in ctx.model.inputs}
    written = {n for kernel in ctx.plan.kernels for n in kernel.nodes}
    yield Obligation(WARM_RULES["warm-next"], name, tensor, f"{tensor}, warmed for the next kernel, is a model input "
                     "no kernel of the plan writes", tensor in inputs and tensor not in written,
                     detail=f"{tensor} is {'an input' if tensor in inputs else 'not a model input'}"
                            f"{', written by the plan' if tensor in written else ''}")
    extents = (warm.rows, warm.k)
    fixed = {e: v for e, v in ctx.ext.items() if isinstance(v, int)}
    whole = all(e in fixed for e in extents) and warm.count(fixed) <= MOST_BOXES
    runs = [fixed] if whole else [{**fixed, **dict.fromkeys(extents, w)} for w in WITNESSES]
    mismatch = next((f"at {', '.join(f'{e}={s[e]}' for e in extents)}: {m}" for s in runs
                     if (m := warm_mismatch(warm, s)) is not None), None)
    yield Obligation(WARM_RULES["warm-next"], name, tensor, f"the warmed boxes of {tensor} are the next kernel's "
                     f"first {warm.tiles} k tiles' boxes, each once", mismatch is None, detail=mismatch or "")


__all__ = ["WARM_RULES", "next_kernel_boxes", "warm_mismatch", "warm_obligations"]
