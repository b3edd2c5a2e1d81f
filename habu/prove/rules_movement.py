"""The contraction's data movement rules: each operand's copy (ldg and cp.async vectors, TMA loads, gather4,
staging), the output's TMA store and the cluster's tiles, as z3 obligations (habu/prove/rules.py gathers them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import z3

from habu.lower import ContractionLowering
from habu.lower.access import Access, cdiv, size_of
from habu.lower.contraction import is_batch_axis
from habu.lower.staging import main_loop_move
from habu.prove.obligation import Context, Obligation


def _batch(p) -> bool:
    """A batched contraction's batch position (an outer dimension of the operand's 2-D view)."""
    return p.kind == "axis" and is_batch_axis(p.axis)


def _row_stride_bytes(access: Access, ctx: Context, inner_pos: int) -> Any:
    """Bytes between consecutive rows of the 2-D view a tile load walks (the outer position's stride)."""
    outer = [i for i in range(len(access.positions)) if i != inner_pos and not _batch(access.positions[i])]
    return access.stride(outer[0], ctx.ext) * ctx.dtype_bytes(access) if outer else 0


def cluster_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    """Blocks of a cluster along m compute tiles (c·pm + rank, tn) together and multicast B's tile."""
    from habu.prove.rules import R  # rules.py imports this module

    k, t, s = lw.kernel, ctx.target, ctx.ext
    c = k.cluster_m
    yield Obligation(R["target-feature"], name, lw.b.tensor,
                     f"thread-block clusters and TMA multicast exist on {t.name}", t.clusters and t.tma,
                     detail=f"{t.name} has no clusters")
    yield Obligation(R["cluster-tiles"], name, lw.out.tensor,
                     f"the {k.tile_m}-row tiles of #{lw.m} come in whole groups of {c} (⌈#{lw.m}/{k.tile_m}⌉ "
                     f"a multiple of {c})", cdiv(s[lw.m], k.tile_m) % c == 0,
                     detail=f"⌈#{lw.m}/{k.tile_m}⌉ is not a multiple of {c}: a cluster's last block would "
                            "have no tile")


def tma_store_obligations(name: str, lw: ContractionLowering, ctx: Context, layout) -> Iterator[Obligation]:
    """The output leaves through shared memory as TMA boxes of 64 rows by one 128-byte swizzle span."""
    from habu.prove.rules import R  # rules.py imports this module

    out, t, s = lw.out, ctx.target, ctx.ext
    e = ctx.dtype_bytes(out)
    yield Obligation(R["target-feature"], name, out.tensor, f"TMA stores exist on {t.name}", t.tma,
                     detail=f"{t.name} has no TMA")
    yield Obligation(R["tma-base-align"], name, out.tensor, f"{out.tensor}'s base address is 16-byte aligned",
                     True, status="runtime-check", how="checked by the runtime before every launch")
    dims_ok = z3.And(*[z3.And(size_of(x, s) >= 1, size_of(x, s) <= 2**32) for x in out.extents])
    yield Obligation(R["tma-dims"], name, out.tensor, "every global dim is 1..2^32", dims_ok,
                     detail="a dimension exceeds 2^32")
    outer = [i for i in range(len(out.positions) - 1)]  # m's stride and a batched output's batch strides
    plain = len([p for p in out.positions if not _batch(p)]) == 2
    stride = out.stride(len(out.positions) - 2, s) * e if plain else 0
    batch_ok = [out.stride(i, s) * e % 16 == 0 for i in outer if _batch(out.positions[i])]
    yield Obligation(R["tma-stride-16B"], name, out.tensor,
                     f"row stride of {out.tensor} ({_fmt(out, len(out.positions) - 1, ctx)} bytes) is a multiple "
                     "of 16 and below 2^40", z3.And(stride % 16 == 0, stride < 2**40, *batch_ok) if plain else False,
                     detail=f"the row stride of {out.tensor} is {_fmt(out, len(out.positions) - 1, ctx)} bytes, "
                            "not a multiple of 16")
    width = 128 // e
    order = [p.axis if p.kind == "axis" else p.kind for p in out.positions if not _batch(p)]
    yield Obligation(R["tma-box"], name, out.tensor,
                     f"the store box holds {out.tensor}[m, n] rows of contiguous n", order == ["m", "n"],
                     detail=f"{out.tensor} is stored at [{', '.join(order)}]")
    yield Obligation(R["tma-box"], name, out.tensor,
                     f"store box {width}x64, {lw.bn // width} per tile of {lw.bn}: inner 128 bytes",
                     lw.bn % width == 0, detail=f"{lw.bn} columns are not a multiple of {width}")
    for b in layout.buffers:
        if b.name.startswith("E"):
            yield Obligation(R["tma-smem-align"], name, out.tensor,
                             f"shared box {b.name} at byte {b.offset} is 1024-byte aligned", b.offset % 1024 == 0,
                             detail=f"{b.name} starts at byte {b.offset}")


def movement_obligations(name: str, side: str, acc: Access, move: str, vec: int, lw: ContractionLowering, ctx: Context,
              layout) -> Iterator[Obligation]:
    from habu.prove.rules import R  # rules.py imports this module

    k = lw.kernel
    t = ctx.target
    s = ctx.ext
    e = ctx.dtype_bytes(acc)
    move = main_loop_move(str(k.mma), move, vec, e)  # a staged operand: how its buffer is read
    k_pos = next((i for i, p in enumerate(acc.positions) if p.kind == "axis" and p.axis == "k"), None)
    if k_pos is None:  # gathered on k and not staged: refused by `supported-path` (`_k_gather_refusals`)
        return
    k_contiguous = k_pos == len(acc.positions) - 1
    _row_stride_bytes(acc, ctx, k_pos if k_contiguous else len(acc.positions) - 1)
    gathered = any(p.kind == "gather" for p in acc.positions)
    feature = {"ldg": True, "cp.async": t.cp_async, "tma": t.tma, "tma-gather4": t.tma_gather4}[move]
    yield Obligation(R["target-feature"], name, acc.tensor, f"{move} exists on {t.name}", feature,
                     detail=f"{t.name} has no {move}")
    if move in ("ldg", "cp.async"):
        size = vec * e
        if move == "cp.async":
            yield Obligation(R["cp.async-size"], name, acc.tensor, f"cp.async of {size} bytes is 4, 8 or 16 bytes",
                             size in (4, 8, 16), detail=f"{vec} × {e} = {size} bytes")
        if vec > 1:
            rule = R["cp.async-size"] if move == "cp.async" else R["vector-align"]
            last = acc.positions[-1]
            tile_along = {"m": k.tile_m, "n": k.tile_n, "k": k.tile_k}.get(last.axis, 0)
            contiguous = last.kind == "axis" and len([p for p in acc.positions if not _batch(p)]) == 2
            stride_bytes = _row_stride_bytes(acc, ctx, len(acc.positions) - 1)
            # every vector starts at a multiple of its size: rows (and batches) start aligned, tiles step by vectors
            batch_strides = [acc.stride(i, s) * e % size == 0 for i, p in enumerate(acc.positions) if _batch(p)]
            aligned = z3.And(stride_bytes % size == 0, tile_along % vec == 0, *batch_strides) if contiguous else False
            yield Obligation(rule, name, acc.tensor,
                             f"{size}-byte vectors of {acc.tensor} along {last.axis} are {size}-byte aligned "
                             f"(row stride {_fmt(acc, len(acc.positions) - 1, ctx)} bytes)", aligned,
                             detail=f"row stride of {acc.tensor} is {_fmt(acc, len(acc.positions) - 1, ctx)} bytes, "
                                    f"not a multiple of {size}" if contiguous else
                                    f"{acc.tensor}'s innermost index is not a plain axis")
            if contiguous:  # a vector's mask is its first element's: none reaches past what memory holds there,
                # the access's bound, or for a staged buffer the padded row its pass writes (zeros past #K)
                stage = next((st for st in lw.pre if st.dst.tensor == acc.tensor and last.axis == "k"), None)
                bound = stage.padded if stage is not None else acc.bounded_extents()[-1]
                yield Obligation(rule, name, acc.tensor,
                                 f"{vec}-element vectors of {acc.tensor} end at its bound #{bound}",
                                 size_of(bound, s) % vec == 0,
                                 detail=f"#{bound} is not a multiple of the {vec}-element vectors of {acc.tensor}")
        return
    # TMA
    yield Obligation(R["tma-rank"], name, acc.tensor, f"rank {len(acc.extents)} descriptor",
                     1 <= len(acc.extents) <= 5, detail=f"rank {len(acc.extents)}")
    yield Obligation(R["tma-base-align"], name, acc.tensor, f"{acc.tensor}'s base address is 16-byte aligned",
                     True, status="runtime-check", how="checked by the runtime before every launch")
    dims_ok = z3.And(*[z3.And(size_of(x, s) >= 1, size_of(x, s) <= 2**32) for x in acc.extents])
    yield Obligation(R["tma-dims"], name, acc.tensor, "every global dim is 1..2^32", dims_ok,
                     detail="a dimension exceeds 2^32")
    strides = [acc.stride(i, s) * e for i in range(len(acc.positions) - 1)]
    stride_ok = z3.And(*[z3.And(x % 16 == 0, x < 2**40) for x in strides]) if strides else True
    yield Obligation(R["tma-stride-16B"], name, acc.tensor,
                     f"row stride of {acc.tensor} ({_fmt(acc, len(acc.positions) - 1, ctx)} bytes) is a multiple "
                     "of 16 and below 2^40", stride_ok,
                     detail=f"the row stride of {acc.tensor} is {_fmt(acc, len(acc.positions) - 1, ctx)} bytes, "
                            "not a multiple of 16")
    rows = k.tile_m if side == "A" else k.tile_n
    # a tile contiguous along its rows (an N-major B) is loaded as boxes one swizzle span wide
    inner = k.tile_k if k_contiguous else (min(rows, k.swizzle // e) if k.swizzle else rows)
    if k_contiguous and str(k.mma) == "wgmma" and k.swizzle and inner * e > k.swizzle:
        inner = k.swizzle // e  # a wgmma k tile of several spans is loaded as boxes one span long
    if side == "B" and k.cluster_m > 1 and k_contiguous:
        rows //= k.cluster_m  # each block of the cluster loads its part of B's rows
    outer = (1 if move == "tma-gather4" else rows) if k_contiguous else k.tile_k
    box_ok = 1 <= inner <= 256 and 1 <= outer <= 256 and (inner * e) % 16 == 0 and (k_contiguous or rows % inner == 0)
    boxes = "" if k_contiguous else f", {rows // max(inner, 1)} per tile of {rows}"
    yield Obligation(R["tma-box"], name, acc.tensor,
                     f"box {inner}x{outer}{boxes}: dims 1..256, inner {inner * e} bytes a multiple of 16", box_ok,
                     detail=f"box {inner}x{outer} of {e}-byte elements" + ("" if k_contiguous or rows % inner == 0
                                                                           else f"; {rows} is not a multiple of {inner}"))
    if k.swizzle:
        yield Obligation(R["tma-swizzle"], name, acc.tensor,
                         f"{k.swizzle}-byte swizzle covers the {inner * e}-byte inner box", inner * e <= k.swizzle,
                         detail=f"inner box {inner * e} bytes > swizzle {k.swizzle}")
    for b in layout.buffers:
        if b.name.startswith(side):
            need = 1024 if k.swizzle == 128 else 128
            yield Obligation(R["tma-smem-align"], name, acc.tensor,
                             f"shared tile {b.name} at byte {b.offset} is {need}-byte aligned", b.offset % need == 0,
                             detail=f"{b.name} starts at byte {b.offset}")
    if gathered and move == "tma":
        yield Obligation(R["tma-gather"], name, acc.tensor,
                         f"{acc.tensor}'s rows are gathered; plain TMA loads boxes, not gathered rows", False,
                         detail=f"{acc.tensor} is gathered; {t.name} "
                                + ("needs tma-gather4" if t.tma_gather4 else "has no TMA gather (sm_100+ only)"))
    if move == "tma-gather4":
        idx = next(ctx.model.tensor(p.table) for p in acc.positions if p.kind == "gather") if gathered else None
        ok = (gathered and t.tma_gather4 and len(acc.extents) == 2 and k_contiguous and rows % 4 == 0
              and (k.tile_k * e * 8) >= 256 and idx is not None and idx.dtype is not None
              and idx.dtype.name in ("i16", "i32"))
        yield Obligation(R["tma-gather"], name, acc.tensor,
                         "gather4: sm_100+, 2-D, one-row boxes, rows in fours, ≥256-bit rows, i16/i32 indices", ok,
                         detail=f"{acc.tensor} on {t.name}, rank {len(acc.extents)}")


def _fmt(acc: Access, inner_pos: int, ctx: Context) -> str:
    val = _row_stride_bytes(acc, ctx, inner_pos)
    if isinstance(val, int):
        return str(val)
    simp = z3.simplify(val)
    return str(simp.as_long()) if z3.is_int_value(simp) else str(simp)
