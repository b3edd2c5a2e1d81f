"""The rules of the fused attention kernel's wgmma main loop (habu/lower/attention_wgmma.py): every rule of the
FA2 kernel (habu/prove/rules_attention.py: bounds, the causal skip, the unmasked tiles, the grid, shared
memory, now of the wgmma layout), and: a target with wgmma and TMA and a kernel the loop runs (`wgmma_refusal`);
its ring delivering every KV tile to its step under every schedule (`pipeline-schedule`, habu.prove.pipeline:
a consumer releases a tile's stage once the next tile's S is issued behind its P·V);
the register split (`setmaxnreg-pool`, `register-budget`); a persistent kernel's walk over its work tiles
(`attention-persistent-walk`, every grid of up to 16 work tiles) and Q's single buffer passed from tile to tile
(`attention-q-handoff`, habu.prove.q_handoff); Q's, K's and V's tensor maps (`tma-rank`,
`tma-stride-16B`, `tma-box`, `tma-swizzle`) and every box landing 1024-byte aligned (`tma-smem-align`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import z3

from habu.lower.access import size_of
from habu.lower.attention import AttentionLowering
from habu.lower.attention_wgmma import BASE_ALIGN, SPAN, AttentionWgmmaLowering, wgmma_refusal
from habu.lower.pipeline import MbarrierRing
from habu.prove.interp_attention_wgmma import walk
from habu.prove.obligation import Context, Obligation
from habu.prove.pipeline import pipeline_problem
from habu.prove.q_handoff import handoff_problem
from habu.prove.rules_attention import ATTENTION_RULES, attention_obligations
from habu.prove.rules_fields import FIELD_RULES


def ring_problem(ring: MbarrierRing) -> str | None:
    """The first fault of the K/V ring under every schedule habu.prove.pipeline runs (a consumer releases a tile's
    stage once the next tile's S is issued, the last at once, as the contraction's consumers do); None: sound."""
    return pipeline_problem(ring)


# the work-tile counts the walk rule runs every grid of (one block to one a tile), and an H200's grid over many
WALK_WORK = tuple(range(1, 17))
WALK_LARGE = ((1000, 132), (4096, 132))


def walk_problem(lw: AttentionWgmmaLowering) -> str | None:
    """The first (work tiles, grid) whose blocks' walks (`walk`: the kernel's loop) do not take every work tile
    exactly once; None: the walk partitions the work for every grid checked."""
    cases = [(w, g) for w in WALK_WORK for g in range(1, w + 1)] + list(WALK_LARGE)
    for work, grid in cases:
        visits = sorted(t for b in range(grid) for t in walk(lw, b, grid, work))
        if visits != list(range(work)):
            twice = sorted({t for t in visits if visits.count(t) > 1})
            never = sorted(set(range(work)) - set(visits))
            return (f"a grid of {grid} block(s) over {work} work tiles takes tiles {twice[:4]} twice and "
                    f"{never[:4]} never (or a block's walk repeats a tile: it would loop forever)")
    return None


def attention_family_obligations(name: str, lw: Any, ctx: Context) -> Iterator[Obligation]:
    """The attention family's rules: the FA2 kernel's, and the wgmma main loop's where it runs."""
    assert isinstance(lw, AttentionLowering)
    yield from attention_obligations(name, lw, ctx)
    if isinstance(lw, AttentionWgmmaLowering):
        yield from wgmma_obligations(name, lw, ctx)


def wgmma_obligations(name: str, lw: AttentionWgmmaLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import R  # rules.py imports this module

    t, s = ctx.target, ctx.ext
    refusal = wgmma_refusal(lw, t.wgmma and t.tma)
    yield Obligation(R["supported-path"], name, None, "the wgmma main loop runs this attention kernel",
                     refusal is None, detail=refusal or "")
    if refusal is not None:
        return
    assert lw.ring is not None and lw.split is not None
    problem = ring_problem(lw.ring)
    yield Obligation(FIELD_RULES["pipeline-schedule"], name, None,
                     f"the K/V ring of {lw.ring.stages} stages delivers every KV tile to its step", problem is None,
                     detail=problem or "")
    if lw.persistent:
        walk = walk_problem(lw)
        yield Obligation(ATTENTION_RULES["attention-persistent-walk"], name, None, "every grid's blocks take every "
                         "work tile once", walk is None, detail=walk or "")
        handoff = handoff_problem(lw)
        if handoff is None and not (lw.q_bar + 8 <= lw.q_empty and lw.q_empty + 8 <= lw.ring.base
                                    and lw.q_empty % 8 == 0):
            handoff = (f"the Q-empty barrier at byte {lw.q_empty} is not its own 8 aligned bytes between Q's barrier "
                       f"({lw.q_bar}) and the ring's ({lw.ring.base})")
        yield Obligation(ATTENTION_RULES["attention-q-handoff"], name, None, "Q's single buffer passes from tile to "
                         "tile without an overwrite or a deadlock", handoff is None, detail=handoff or "")
    split = lw.split
    yield Obligation(R["setmaxnreg-pool"], name, None, split.describe(), split.fits,
                     detail=f"{split.demand} registers asked of a {split.pool}-register pool")
    yield Obligation(R["register-budget"], name, None,
                     f"about {lw.register_need} registers per consumer thread (S {lw.s_registers}, O "
                     f"{lw.o_registers}) ≤ {split.consumer} (after setmaxnreg)", lw.register_need <= split.consumer,
                     detail=f"{lw.register_need} registers, {split.consumer} available")
    k = lw.kernel
    for acc in (lw.q, lw.k, lw.v):
        yield Obligation(R["tma-rank"], name, acc.tensor, f"rank {len(acc.extents)} descriptor",
                         1 <= len(acc.extents) <= 5, detail=f"rank {len(acc.extents)}")
        dims_ok = z3.And(*[z3.And(size_of(x, s) >= 1, size_of(x, s) <= 2**32) for x in acc.bounded_extents()])
        yield Obligation(R["tma-dims"], name, acc.tensor, "every global dim is 1..2^32", dims_ok,
                         detail="a dimension exceeds 2^32")
        strides = [acc.stride(i, s) * 2 for i in range(len(acc.positions) - 1)]
        stride_ok = z3.And(*[z3.And(x % 16 == 0, x < 2**40) for x in strides]) if strides else True
        yield Obligation(R["tma-stride-16B"], name, acc.tensor,
                         f"every stride of {acc.tensor} but the innermost is a multiple of 16 bytes, below 2^40",
                         stride_ok, detail=f"a row stride of {acc.tensor} is not a multiple of 16 bytes")
        rows = k.bm if acc is lw.q else k.bn
        yield Obligation(R["tma-box"], name, acc.tensor, f"box {SPAN}x{rows}: dims 1..256, inner 128 bytes",
                         1 <= rows <= 256, detail=f"box {SPAN}x{rows}")
        yield Obligation(R["tma-swizzle"], name, acc.tensor, f"{lw.qk_desc.swizzle}-byte swizzle covers the "
                         f"{SPAN * 2}-byte inner box", lw.qk_desc.swizzle >= SPAN * 2, detail="inner box too wide")
    dsts = [lw.q_box_dst(b) for b in range(lw.q_boxes)]
    for st in range(lw.ring.stages):
        dsts += [lw.k_box_dst(st, b) for b in range(lw.q_boxes)] + [lw.v_box_dst(st, b) for b in range(lw.v_boxes)]
    bad = [d for d in dsts if d % BASE_ALIGN]
    yield Obligation(R["tma-smem-align"], name, None, f"every TMA box of Q, K and V lands {BASE_ALIGN}-byte aligned",
                     not bad, detail=f"a box at byte {bad[0] if bad else 0}")


__all__ = ["attention_family_obligations", "ring_problem", "wgmma_obligations"]
