"""The rules of a general kernel: every load and the store in bounds and (in 32 bits) free of
wrap-around, over every output coordinate and every reduction loop iteration; a scatter adds with
f32 atomicAdd; threads per block within the limit. Its grid and 32-bit thread index are `launch_obligations`' (habu.prove.rules_fields)."""

from __future__ import annotations

from collections.abc import Iterator

import z3

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
    s = ctx.ext
    last = lw.extents[-1]
    yield Obligation(R["vector-align"], name, lw.out.tensor,
                     f"{n}-element vectors stay inside a row (#{last} a multiple of {n})", s[last] % n == 0,
                     detail=f"#{last} is not a multiple of {n}")
    for acc in (*(a for _, a in lw.loads), lw.out):
        if not lw.contiguous(acc):
            continue
        strides = [acc.stride(i, s) % n == 0 for i in range(len(acc.positions) - 1)]
        yield Obligation(R["vector-align"], name, acc.tensor,
                         f"{n}-element vectors of {acc.tensor} start aligned (its outer strides multiples of {n})",
                         z3.And(*strides) if strides else True,
                         detail=f"a stride of {acc.tensor} is not a multiple of {n}")
