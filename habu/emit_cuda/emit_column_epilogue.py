"""The column sum in the wgmma TMA-store epilogue (habu/lower/column_epilogue.py): each consumer thread's sums of
its columns, kept beside the stores, then combined across lanes, warps and warpgroups and stored. Every number
(the shuffles' masks, the writers, the partials' slots, the finishing threads' columns) is printed from the
lowering's `EpilogueColumnSum`, which the finite-field check runs."""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import Signature, access_mask, access_offset, float_expr, store_value
from habu.emit_cuda.emit_fma import table_reader
from habu.lower.column_epilogue import COLUMN_SUM
from habu.lower.contraction import ContractionLowering
from habu.spec.ir import Load, Model

# a named barrier the consumer warpgroups share (0 is __syncthreads, 1 + cw each warpgroup's own)
_BARRIER_BASE = 1


def column_sum_declaration(lw: ContractionLowering) -> str:
    """The thread's running sums of its columns for this tile (`EpilogueColumnSum.register`)."""
    cs = lw.column_sum
    if cs is None:
        return ""
    count = cs.registers(lw.bn // lw.fragment.col_step)
    return (f"      float colsum[{count}];  // this thread's sums of its columns of {cs.nodes[0]} over the tile's rows\n"
            f"#pragma unroll\n      for (int i = 0; i < {count}; ++i) colsum[i] = 0.0f;\n")


def column_sum_accumulate(lw: ContractionLowering, sizes, v0: str, v1: str, indent: str) -> str:
    """Adds the pair (v0, v1) at row m, columns of group j, to the running sums (rows past #M masked)."""
    cs = lw.column_sum
    if cs is None:
        return ""
    mask = f"m < {sizes[lw.m]}" if cs.mask_rows else "true"
    r0, r1 = (c(cs.register(CExpr("j"), q)) for q in (0, 1))  # the pair's two columns
    return (f"{indent}if ({mask}) {{ colsum[{r0}] += {v0}; colsum[{r1}] += {v1}; }}"
            "  // the column sum (rows past the edge add nothing)\n")


def column_sum_finish(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str) -> str:
    """After the tile's last box: the lanes' shuffles, the writers' partials in the warpgroup's TMA-store buffers
    (once its stores have read them), a barrier of every consumer, and each finishing thread's column."""
    cs, frag = lw.column_sum, lw.fragment
    if cs is None:
        return ""
    count = cs.registers(lw.bn // frag.col_step)
    shuffles = "".join(f" v += __shfl_xor_sync(0xffffffffu, v, {x});" for x in cs.shuffles)
    slot = c(cs.slot(CExpr("cw"), CExpr("warp"), CExpr(f"({frag.col('j')} + q)")))
    column = c(cs.finisher_column(CExpr("t"), CExpr("i")))
    rounds = cs.finisher_rounds
    reads = "".join(f" sum += *reinterpret_cast<const float*>(smem + {c(cs.slot(w_cw, w, CExpr('col')))});"
                    for w_cw in range(cs.consumers) for w in range(cs.warps))
    table = table_reader(sig, model, it)
    p = sig.pointer(cs.out.tensor, cs.out.dtype, writes=True)
    offset = access_offset(cs.out, {"n": "n"}, sizes, lw.index_width, table)
    mask = access_mask(cs.out, {"n": "n"}, sizes, table)
    value = float_expr(cs.finish, lambda ld: "sum" if ld == Load(COLUMN_SUM, ()) else _unread(ld), sizes)
    together = _BARRIER_BASE + cs.consumers  # after the warpgroups' own barriers
    threads = 128 * cs.consumers
    store = f"if ({mask}) {{ const {it} off = {offset}; {store_value(cs.out.dtype, p, 'off', f'({value})')} }}"
    last = ""
    if cs.combine:  # the tile rows' sums meet in the launch's workspace; the column tile's last block finishes
        parts = sig.pointer(cs.partials_tensor, "f32", writes=True)
        counters = sig.pointer(cs.counters_tensor, "i32", writes=True)
        at = c(cs.partial_offset(CExpr("tm"), CExpr("n"), sizes))
        every = c(cs.partial_offset(CExpr("r"), CExpr("n"), sizes))
        arrivals = c(cs.arrivals(sizes))
        counter = c(cs.counter_slot(CExpr("tn")))
        store = f"if ({mask}) {parts}[{at}] = sum;  // this tile row's sums of its columns"
        last = f"""        if (habu::last_block_done_among({counters} + ({counter}), (int)({arrivals}), {together}, {threads}, 128)) {{
          for (int i = 0; i < {rounds}; ++i) {{  // every tile row is in: their sums, finished
            const int col = {column};
            const {it} n = n0 + ({it})col;
            if (col < {lw.bn} && ({mask})) {{
              float sum = 0.0f;
              for (long long r = 0; r < {arrivals}; ++r) sum += *(volatile const float*)({parts} + ({every}));
              const {it} off = {offset}; {store_value(cs.out.dtype, p, "off", f"({value})")}
            }}
          }}
          if (t == 0) {counters}[{counter}] = {cs.counter_after()};  // left for the next launch
        }}
"""
    return f"""      {{  // {cs.out.tensor}: the column sum over the tile's rows, lanes by shuffles, warps through the buffers
        if (threadIdx.x % 128 == 0) habu::bulk_wait_group_read<0>();  // this warpgroup's boxes have left its buffers
        habu::named_barrier_sync(1 + cw, 128);
#pragma unroll
        for (int i = 0; i < {count}; ++i) {{ float v = colsum[i];{shuffles} colsum[i] = v; }}
        if (lane < {cs.writers}) {{  // these lanes hold their warp's sums of their columns
#pragma unroll
          for (int j = 0; j < {lw.bn // frag.col_step}; ++j)
#pragma unroll
            for (int q = 0; q < {frag.pair}; ++q)
              *reinterpret_cast<float*>(smem + {slot}) = colsum[{c(cs.register(CExpr("j"), CExpr("q")))}];
        }}
        habu::named_barrier_sync({together}, {threads});  // every consumer warp's partials are in
        const int t = cw * 128 + (int)(threadIdx.x % 128);
        for (int i = 0; i < {rounds}; ++i) {{  // thread t's columns
          const int col = {column};
          if (col < {lw.bn}) {{
            float sum = 0.0f;{reads}
            const {it} n = n0 + ({it})col;
            {store}
          }}
        }}
{last}        habu::named_barrier_sync({together}, {threads});  // the partials are read before the buffers fill again
      }}
"""


def _unread(ld: Load) -> str:
    raise ValueError(f"a column sum's finish reads {ld.tensor}: only the sum and constants")


def column_sum_workspaces(lw: ContractionLowering) -> dict:
    """The `CudaKernel` fields of a combining column sum's workspaces: the tile rows' sums, and the counters the
    runtime zero-fills once (each finishing block leaves its counter at 0)."""
    cs = lw.column_sum
    if cs is None or not cs.combine:
        return {}
    counters = cs.counters_tensor
    return {"workspace": ((cs.partials_tensor, "f32", (cs.m_tile, cs.n)), (counters, "i32", (f"{cs.n}/{lw.bn}",))),
            "zero": (counters,), "zero_once": (counters,)}


__all__ = ["column_sum_accumulate", "column_sum_declaration", "column_sum_finish", "column_sum_workspaces"]
