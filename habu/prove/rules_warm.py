"""The rule of a kernel that warms the plan's next kernel's first boxes into the L2 (`warm_next`,
habu/lower/warm_next.py). A prefetch changes no value, so what is checked is that it warms what it says: the
decode of its box index, run over every index at the plan's sizes (a runtime extent at a few witness values),
gives each box the next kernel's producer loads in each split's first `warm_next` k tiles exactly once and no
other, through a tensor map of the next kernel's own operand (a model input no kernel of the plan writes)."""

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
MOST_BOXES = 1 << 18  # a larger shape is run at its witnesses only


def warm_mismatch(warm: WarmNext, sizes: dict[str, int]) -> str | None:
    """Where the decode of the warmed boxes differs from the next kernel's own boxes at `sizes` (None: nowhere)."""
    count = warm.count(sizes)
    if count > MOST_BOXES:
        return None
    warmed = Counter(tuple(warm.origin(i, sizes)) for i in range(count))
    twice = [box for box, n in warmed.items() if n > 1]
    if twice:
        return f"box {twice[0]} is warmed {warmed[twice[0]]} times"
    loaded = warm.loaded(sizes)
    extra, missed = set(warmed) - loaded, loaded - set(warmed)
    if extra:
        return f"box {sorted(extra)[0]} is warmed but the next kernel does not load it in its first k tiles"
    if missed:
        return f"box {sorted(missed)[0]} of the next kernel's first k tiles is not warmed"
    return None


def warm_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    warm = lw.warm
    if warm is None:
        return
    tensor = warm.access.tensor
    inputs = {t.name for t in ctx.model.inputs}
    written = {n for kernel in ctx.plan.kernels for n in kernel.nodes}
    yield Obligation(WARM_RULES["warm-next"], name, tensor, f"{tensor}, warmed for the next kernel, is a model input "
                     "no kernel of the plan writes", tensor in inputs and tensor not in written,
                     detail=f"{tensor} is {'an input' if tensor in inputs else 'not a model input'}"
                            f"{', written by the plan' if tensor in written else ''}")
    extents = (warm.rows, warm.k)
    fixed = {e: v for e, v in ctx.ext.items() if isinstance(v, int)}
    runs = [fixed] if all(e in fixed for e in extents) else [
        {**fixed, **{e: w for e in extents if e not in fixed}} for w in WITNESSES]
    mismatch = next((f"at {', '.join(f'{e}={s[e]}' for e in extents)}: {m}" for s in runs
                     if (m := warm_mismatch(warm, s)) is not None), None)
    yield Obligation(WARM_RULES["warm-next"], name, tensor, f"the warmed boxes of {tensor} are the next kernel's "
                     f"first {warm.tiles} k tiles' boxes, each once", mismatch is None, detail=mismatch or "")


__all__ = ["WARM_RULES", "warm_mismatch", "warm_obligations"]
