"""The wgmma contraction's epilogue through shared memory: the fused epilogue's values written into
swizzled buffers, each box stored by TMA while the warpgroup fills the next (every number from the
lowering's `ContractionLowering.tma_store`, habu/lower/tma_store.py)."""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import Signature, references
from habu.emit_cuda.emit_column_epilogue import (
    column_sum_accumulate,
    column_sum_declaration,
    column_sum_finish,
)
from habu.emit_cuda.emit_epilogue_early import early_values
from habu.emit_cuda.emit_epilogue_pairs import pair_operands
from habu.emit_cuda.emit_fma import epilogue_value, extra_pair_store
from habu.emit_cuda.kernel import TmaSpec
from habu.lower.contraction import ContractionLowering, tma_box, tma_coordinates
from habu.spec.ir import Model


def tma_store_epilogue(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str) -> str:
    """C for one consumer warpgroup's epilogue through shared memory: per 64-row slab, per box of one
    128-byte swizzle span of columns, the threads write their values (the fused epilogue applied)
    into one of two swizzled buffers, and one thread stores the box with TMA. The store runs while
    the warpgroup fills the other buffer, and the last ones while it starts its next tile; the
    tensor map's bounds clip the rows and columns past the output's edges. Every number is the
    lowering's (`ContractionLowering.tma_store`, habu/lower/tma_store.py)."""
    out, st = lw.out, lw.tma_store
    if st is None:
        raise ValueError(f"no TMA-store epilogue for a {lw.bm}x{lw.bn} tile of {out.dtype} (boxes of 128 bytes, "
                         "buffers evenly spaced in shared memory)")
    box, e, width = st.box, st.box.elem_bytes, st.box_cols
    out_map = sig.tensormap(TmaSpec(out.tensor, out.dtype, tuple(reversed(out.bounded_extents())),
                                    tma_box(out, "m", box.rows, 0, width), box.swizzle))  # a batched output: box 1 per batch
    if out.dtype == "f32":
        put = "*reinterpret_cast<float2*>(dst) = make_float2(v0, v1);"
    else:
        pack = "habu::pack_bf16x2" if out.dtype == "bf16" else "habu::pack_f16x2"
        put = f"*reinterpret_cast<habu::u32*>(dst) = {pack}(v0, v1);"
    slab_row = f"(cw * {st.slabs} + s) * {box.rows}"
    n = st.rounds  # the buffers of box round boxes_stored, in turn
    turn = f"boxes_stored & {n - 1}" if n & (n - 1) == 0 else f"boxes_stored % {n}"
    # the box's coordinates, innermost first, in the order of the output's positions (the rules
    # require [m, n]: the box holds rows of m, each a run of contiguous n); a batched output's map has
    # its batch dimensions too (box 1 each): the box sits at the block's batch coordinates
    axis_origin = {"n": f"n0 + b * {width}", "m": f"m0 + {slab_row}", **{a: a for a in lw.batch_axes}}
    box_origin = ", ".join(f"(int)({x})" for x in tma_coordinates(out, axis_origin))
    frag = lw.fragment
    # (the loads read at the tile's start, `epilogue_early`, from their registers)
    # each epilogue load read once a pair, as one load of both where the lowering pairs it (`paired_loads`)
    decls, names0, names1 = pair_operands(lw, sig, model, sizes, it, (early_values(lw, False), early_values(lw, True)))
    v0 = epilogue_value(lw, sig, model, sizes, it, "m", "n", f"acc[s][{frag.register(0)}]", names0)
    v1 = epilogue_value(lw, sig, model, sizes, it, "m", "(n + 1)", f"acc[s][{frag.register(1)}]", names1)
    operands = "".join(f"              {d}\n" for d in decls)
    # the chain's other outputs (`extra_outs`: the saved S1 beside GELU(S1 + B1)) are staged beside it where they
    # have its layout (`staged_extras`, `_staged_rounds`); the others leave directly from the registers, each pair
    # under its own masks, with no staging buffer of their own
    staged_extras = lw.staged_extras
    extras = "".join(f"              {extra_pair_store(lw, sig, model, sizes, it, 'm', 'n', f'acc[s][{frag.register(0)}]', f'acc[s][{frag.register(1)}]', expr, access, (names0, names1))}\n"
                     for expr, access in lw.extra_outs if not staged_extras)
    staged_values = "".join(epilogue_value(lw, sig, model, sizes, it, "m", "n", "acc", names0, expr)
                            for expr, _ in staged_extras)
    summand = lw.column_sum.summand if lw.column_sum is not None else None  # the chain's end, or one of its loads
    colsum = column_sum_accumulate(lw, sizes, *(("v0", "v1") if summand is None else (names0[summand], names1[summand])),
                                   "              ")
    coordinates = "".join(  # the element's coordinates, where its epilogue reads them (a bias, a mask)
        f"              const {it} {x} = {x}0 + ({it})({at});\n" for x, at in (("m", f"{slab_row} + row"), ("n", frag.col()))
        if references(operands + v0 + v1 + extras + staged_values + colsum, x))
    before, after = column_sum_declaration(lw), column_sum_finish(lw, sig, model, sizes, it)
    if box.swizzle == 128 and width * e == 128:  # the device header's spelling of the same XOR
        staged = "habu::swizzle128((habu::u32)row, byte >> 4) + (byte & 15u)"
    else:
        staged = f"(habu::u32)({c(box.byte_offset(CExpr('row'), CExpr(f'(byte / {e})')))})"
    if staged_extras:
        return before + _staged_rounds(lw, sig, model, sizes, it, out_map, box_origin, axis_origin, put, staged,
                                       operands, coordinates, (names0, names1), v0, v1, colsum) + after
    return before + f"""#pragma unroll
      for (int s = 0; s < {st.slabs}; ++s)
#pragma unroll
        for (int b = 0; b < {st.boxes}; ++b) {{  // boxes of {width} columns
          const habu::u32 buf = smem_base + {st.base}u + (habu::u32)cw * {st.warpgroup_stride}u + (habu::u32)({turn}) * {st.buffer_stride}u;
          if (boxes_stored >= {st.buffers} && threadIdx.x % 128 == 0) habu::bulk_wait_group_read<{st.buffers - 1}>();  // buf's last store has read it
          habu::named_barrier_sync(1 + cw, 128);
#pragma unroll
          for (int jj = 0; jj < {st.groups}; ++jj)
#pragma unroll
            for (int h = 0; h < {frag.halves}; ++h) {{  // each thread holds pairs of adjacent columns
              const int j = b * {st.groups} + jj;
              const int row = {frag.row_in_warpgroup()};
{coordinates}{operands}{extras}              const float v0 = {v0};
              const float v1 = {v1};
{colsum}              const habu::u32 byte = (habu::u32)(({frag.col("jj")}) * {e});
              unsigned char* dst = smem + (buf - smem_base) + {staged};
              {put}
            }}
          habu::fence_proxy_async();  // the threads' writes, visible to the TMA store
          habu::named_barrier_sync(1 + cw, 128);
          if (threadIdx.x % 128 == 0) {{
            habu::tma_store_{len(out.positions)}d(&{out_map}, buf, {box_origin});
            habu::bulk_commit_group();
          }}
          ++boxes_stored;
        }}
""" + after


def _staged_rounds(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, out_map: str, box_origin: str,
                   axis_origin: dict[str, str], put: str, staged: str, operands: str, coordinates: str,
                   names: tuple[dict, dict], v0: str, v1: str, colsum: str = "") -> str:
    """The epilogue where each box's round stages the chain's extra outputs beside its end (`staged_extras`: the
    saved S1 beside GELU(S1 + B1)), output o in buffer o of the round (`TmaStoreEpilogue.buffer`), then stores
    them all by TMA, each at the same origin through its own tensor map, as one bulk group."""
    st, frag, e = lw.tma_store, lw.fragment, lw.tma_store.box.elem_bytes  # type: ignore[union-attr]
    assert st is not None
    rounds = st.rounds
    # each output's buffer of this round, printed from the lowering's map (`TmaStoreEpilogue.buffer`)
    bufs = "".join(f"          const habu::u32 buf{o} = smem_base + (habu::u32)"
                   f"({c(st.buffer(CExpr('cw'), CExpr('boxes_stored'), o))});  // output {o}'s buffer of this round\n"
                   for o in range(st.outputs))
    width = st.box_cols
    stages, stores = [], []
    for o, (expr, access) in enumerate((*lw.staged_extras, (None, lw.out))):
        if expr is None:
            x0, x1 = v0, v1
            the_map = out_map
            add = colsum.replace("              ", "                ", 1)  # the end's column sum
        else:
            add = ""
            x0 = epilogue_value(lw, sig, model, sizes, it, "m", "n", f"acc[s][{frag.register(0)}]", names[0], expr)
            x1 = epilogue_value(lw, sig, model, sizes, it, "m", "(n + 1)", f"acc[s][{frag.register(1)}]", names[1],
                                expr)
            the_map = sig.tensormap(TmaSpec(access.tensor, access.dtype, tuple(reversed(access.bounded_extents())),
                                            tma_box(access, "m", st.box.rows, 0, width), st.box.swizzle))
        stages.append(f"""              {{  // {access.tensor}{", an extra output of the chain" if expr is not None else ""}
                const float v0 = {x0};
                const float v1 = {x1};
{add}                unsigned char* dst = smem + (buf{o} - smem_base) + {staged};
                {put}
              }}
""")
        origin = box_origin if expr is None else ", ".join(f"(int)({x})" for x in tma_coordinates(access, axis_origin))
        stores.append(f"            habu::tma_store_{len(access.positions)}d(&{the_map}, buf{o}, {origin});\n")
    return f"""#pragma unroll
      for (int s = 0; s < {st.slabs}; ++s)
#pragma unroll
        for (int b = 0; b < {st.boxes}; ++b) {{  // boxes of {width} columns, {st.outputs} outputs each
{bufs}          if (boxes_stored >= {rounds} && threadIdx.x % 128 == 0) habu::bulk_wait_group_read<{rounds - 1}>();  // the buffers' last stores have read them
          habu::named_barrier_sync(1 + cw, 128);
#pragma unroll
          for (int jj = 0; jj < {st.groups}; ++jj)
#pragma unroll
            for (int h = 0; h < {frag.halves}; ++h) {{  // each thread holds pairs of adjacent columns
              const int j = b * {st.groups} + jj;
              const int row = {frag.row_in_warpgroup()};
{coordinates}{operands}              const habu::u32 byte = (habu::u32)(({frag.col("jj")}) * {e});
{"".join(stages)}            }}
          habu::fence_proxy_async();  // the threads' writes, visible to the TMA stores
          habu::named_barrier_sync(1 + cw, 128);
          if (threadIdx.x % 128 == 0) {{
{"".join(stores)}            habu::bulk_commit_group();
          }}
          ++boxes_stored;
        }}
"""
