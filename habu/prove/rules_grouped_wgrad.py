"""The rules of a grouped weight gradient (habu/lower/grouped_wgrad.py): every load and the store in bounds and
free of 32-bit wrap-around (a masked lane computes no address: its offset is taken only where its row and
column are inside), its grid within the launch limits, the 16-byte chunks its producer moves whole and
aligned (#M and #N multiples of 8, and of 4 f32 for an f32 A), its shared memory within the block's limit, the
main loop's maps (`wgrad_refusal`) and its ring delivering every k tile to its step (`pipeline-schedule`).
The output's first index is the block's group where the node stores at E[r]: equal for every row of the group
because E is grouped, which the kernel checks row by row (`grouping_ok`, as the grouped GEMM does)."""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.grouped_wgrad import OFFSET_BYTES, GroupedWgradLowering, wgrad_refusal
from habu.prove.obligation import Context, Obligation
from habu.prove.pipeline import pipeline_problem
from habu.prove.rules_fields import FIELD_RULES, _grid


def grouped_wgrad_obligations(name: str, lw: GroupedWgradLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import R, _access_obligations  # rules.py imports this module

    k, s, t = lw.kernel, ctx.ext, ctx.target
    axes = {"k": (s[lw.r], 1), "m": (s[lw.m], 1), "n": (s[lw.n], 1), "g": (s[lw.g], 1)}
    for acc, what in ((lw.a, "every load"), (lw.b, "every load"), (lw.out, "every store"),
                      *(((lw.row_scale, "every load"),) if lw.row_scale is not None else ())):
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, what)
    if lw.node.scatter is not None:
        ok = lw.out.dtype == "f32"
        yield Obligation(R["scatter-accumulates"], name, lw.out.tensor,
                         f"each block adds its tile into {lw.out.tensor} (f32), the only block with that tile", ok,
                         detail=f"{lw.out.tensor} is {lw.out.dtype}")
    refusal = wgrad_refusal(k, lw.a.dtype, lw.b.dtype, lw.row_scale is not None)
    if refusal is None and not (t.wgmma and t.setmaxnreg):
        refusal = f"{t.name} has no wgmma"
    if refusal is None and lw.loop is None:
        refusal = "the stage tiles have no maps for this tile"
    yield Obligation(R["supported-path"], name, None, "the grouped weight-gradient loop runs this kernel",
                     refusal is None, detail=refusal or "")
    groups = s[lw.g]
    yield Obligation(R["supported-path"], name, None, f"the number of groups #{lw.g} is known when the kernel is "
                     "compiled", isinstance(groups, int), detail=f"#{lw.g} is a runtime extent")
    yield Obligation(R["threads"], name, None, f"{lw.threads} threads per block ≤ {t.max_threads_per_block}",
                     lw.threads <= t.max_threads_per_block, detail=f"{lw.threads} threads")
    yield Obligation(R["vector-align"], name, None, f"A's rows are whole chunks of 8 elements (#{lw.m} a multiple of 8)",
                     s[lw.m] % 8 == 0, detail=f"#{lw.m} is not a multiple of 8: a chunk of 8 would straddle a row's end")
    yield Obligation(R["vector-align"], name, None, f"B's rows are whole 16-byte chunks (#{lw.n} a multiple of 8)",
                     s[lw.n] % 8 == 0, detail=f"#{lw.n} is not a multiple of 8")
    if lw.loop is not None:
        smem = lw.dynamic_smem_bytes() + OFFSET_BYTES * (groups + 1 if isinstance(groups, int) else 1)
        most = t.smem_per_block
        yield Obligation(R["smem-budget"], name, None, f"{smem} bytes of stage tiles, barriers, staged indices and offsets ≤ {most}",
                         smem <= most, detail=f"{smem} bytes of shared memory; a block may have {most}")
        split = lw.loop.registers
        yield Obligation(R["setmaxnreg-pool"], name, None, split.describe(), split.fits,
                         detail=f"{split.describe()}: setmaxnreg.inc would wait for registers the CTA does not have")
        problem = pipeline_problem(lw.loop.ring)
        yield Obligation(FIELD_RULES["pipeline-schedule"], name, None,
                         f"the ring of {lw.loop.ring.stages} stages delivers every k tile to its step",
                         problem is None, detail=problem or "")
    gx, gy = lw.grid(s)
    yield _grid(name, "x", "output tiles of a group", gx, t.max_grid_x)
    yield _grid(name, "y", "one block row per group", gy, t.max_grid_yz)


__all__ = ["grouped_wgrad_obligations"]
