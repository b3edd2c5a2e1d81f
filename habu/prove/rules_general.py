"""The rules of a general kernel: every load and the store in bounds and (in 32 bits) free of
wrap-around, over every output coordinate and every reduction loop iteration; a scatter adds with
f32 atomicAdd; threads per block within the limit. Its grid and 32-bit thread index are `launch_obligations`' (habu.prove.rules_fields)."""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.general import GeneralLowering
from habu.prove.obligation import Context, Obligation


def general_obligations(name: str, lw: GeneralLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import (  # the shared access rules (rules.py imports this module)
        R,
        _access_obligations,
        scatter_accumulates,
    )

    s = ctx.ext
    axes = {f"e{i}": (s[e], 1) for i, e in enumerate(lw.extents)} | {a: (s[e], 1) for a, e in lw.loops}
    for _ld, acc in lw.loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every load")
    yield from _access_obligations(name, lw.out, axes, ctx, lw.index_width, "every store")
    if lw.scatters:
        yield scatter_accumulates(name, lw.store, lw.out, "threads whose indices repeat would overwrite each other")
    yield from _vector_obligations(name, lw, ctx)
    yield Obligation(R["threads"], name, None, f"{lw.kernel.threads} threads per block",
                     lw.kernel.threads <= ctx.target.max_threads_per_block, detail=f"{lw.kernel.threads} threads")


def _vector_obligations(name: str, lw: GeneralLowering, ctx: Context) -> Iterator[Obligation]:
    """`vector` > 1: the lowering's vector shape holds (`vector_refusal`), the last extent is a multiple of
    the vector (a vector never crosses a row: the guard printed at its first element holds for all, and
    `lane_coordinates` is the element the vector access reaches), and each vector access starts aligned
    (every stride outside its innermost dimension a multiple of the vector)."""
    from habu.prove.rules import R

    n = lw.vector
    if n == 1:
        return
    refusal = lw.vector_refusal()
    if refusal is not None:
        yield Obligation(R["vector-align"], name, lw.out.tensor, f"{n}-element vectors a thread", False, detail=refusal)
        return
    for tensor, statement, holds, detail in lw.vector_conditions(ctx.ext):
        yield Obligation(R["vector-align"], name, tensor, statement, holds, detail=detail)
