"""Column kernels: `T[c] = op r body(r, c)` over a grid of column tiles × row splits.

Everything index-shaped is printed from the `ColumnLowering`: the block's tile and split (`block`), the
thread's first column (`thread_column`), its split's rows (`row_begin`, `row_end`, `row_live`) and its row
loop (`row`, `steps`), the shared-memory partials (`partial_slot`, `combined_slot`), the combining loop
(`combine_start`, `combine_step`), the stored column (`tile_column`), the tile's counter in the launch's
workspace (`counter_tensor`, `counter_slot`, `arrivals`) and its last split's pass over the tile
(`final_start`, `final_step`), and every access's offset and mask (`Access.offset` / `Access.mask`
through `CIndex`). A row-column load the lowering packs (`vectorized`) is one 4-, 8- or
16-byte load of `vector` adjacent columns, `unroll` rows of it issued before any is added; a masked load
reads 0, as the finite-field interpreter's does. Sums and maxima accumulate in f32.
"""

from __future__ import annotations

import re

from habu.emit_cuda.cexpr import CExpr, bare, c
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    float_expr,
    header,
    index_type,
    load_value,
    store_value,
)
from habu.emit_cuda.geometry import GRID_2D, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.columns import ColumnLowering
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Load, Model

MAX_INIT = "(-__int_as_float(0x7f800000))"  # -infinity: the identity of max


def _operand(x: CExpr) -> str:
    """`x` as the operand of a cast: a name as it is, anything else in parentheses."""
    text = c(x)
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _no_table(name: str, coordinate: str) -> str:
    raise ValueError(f"a column kernel reads no index tensor ({name})")


def emit_columns(name: str, model: Model, lw: ColumnLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    tm, pm = lw.thread_map, lw.partial_map  # the maps as data (habu/lower/column_maps.py)
    G, Tc, V, U = tm.row_groups, tm.column_threads, tm.vector, tm.unroll
    is_max = "true" if lw.op == "max" else "false"
    init = MAX_INIT if lw.op == "max" else "0.0f"
    width = lw.index_width

    def at(r: str | None, col: str) -> dict[str, str]:
        """The axis coordinates (C) of column `col` of row `r`, the leading ones through the lowering's
        row → coordinates map (`r` itself for one reduced axis)."""
        rows = {a: c(x) for a, x in lw.row_coordinates(CExpr(r), sizes).items()} if r is not None else {}
        return {"c": col} | rows

    def offset(acc, r: str | None, col: str) -> str:
        return access_offset(acc, at(r, col), sizes, width, _no_table)

    def mask(acc, r: str | None, col: str) -> str:
        return access_mask(acc, at(r, col), sizes)

    # element v of a thread's columns (a packed load reads them adjacent from c0: checked below)
    col_v = f"({it})({c(lw.thread_column(CExpr('tile'), CExpr('tc'), CExpr('v')))})"
    # the loads, by kind: before the loop (per column), issued per row (row-column, per row), then used
    names: dict[Load, str] = {}
    hoisted: list[str] = []
    declared: list[str] = []
    issued: list[str] = []
    for j, (ld, acc) in enumerate(lw.loads):
        p = sig.pointer(acc.tensor, acc.dtype)
        kind = lw.kind_of(acc)
        if kind == "column":
            names[ld] = f"col{j}[v]"
            hoisted.append(f"""  float col{j}[{V}];  // {acc.tensor}: one value per column, read once
#pragma unroll
  for (int v = 0; v < {V}; ++v) {{
    const {it} cv = {col_v};
    col{j}[v] = ({mask(acc, None, "cv")}) ? {load_value(acc.dtype, p, offset(acc, None, "cv"))} : 0.0f;
  }}""")
        elif kind == "row":
            names[ld] = f"row{j}[u]"
            declared.append(f"    float row{j}[{U}];  // {acc.tensor}: one value per row")
            issued.append(f"      row{j}[u] = (live && ({mask(acc, 'r', 'c0')})) ? "
                          f"{load_value(acc.dtype, p, offset(acc, 'r', 'c0'))} : 0.0f;")
        elif lw.vectorized(acc):
            if any(lw.thread_column(0, 0, v) != lw.thread_column(0, 0, 0) + v for v in range(V)):
                raise ValueError(f"{name}: a packed load reads {V} adjacent columns; the lowering's thread_column "
                                 "does not give them")
            nbytes = V * DTYPES[acc.dtype].bytes
            names[ld] = f"habu::packed_{acc.dtype}(raw{j}[u], v)"
            declared.append(f"    habu::packed<{nbytes}>::type raw{j}[{U}];  // {acc.tensor}: {V} adjacent columns a load")
            issued.append(f"      raw{j}[u] = habu::load_packed<{nbytes}>({p} + ({offset(acc, 'r', 'c0')}), "
                          f"live && ({mask(acc, 'r', 'c0')}));")
        else:
            names[ld] = f"el{j}[u][v]"
            declared.append(f"    float el{j}[{U}][{V}];  // {acc.tensor}: element by element")
            issued.append(f"""#pragma unroll
      for (int v = 0; v < {V}; ++v) {{
        const {it} cv = {col_v};
        el{j}[u][v] = (live && ({mask(acc, 'r', 'cv')})) ? {load_value(acc.dtype, p, offset(acc, 'r', 'cv'))} : 0.0f;
      }}""")

    value = float_expr(lw.body, lambda ld: names[ld], sizes)

    def epilogue(w: str) -> str:
        """The stored value of column `col` from its reduced value `w` (the epilogue, or `w`)."""
        if lw.epilogue is None:
            return w

        def leaf(ld: Load) -> str:
            if ld.tensor == lw.reduced:
                return w
            acc = lw.access(ld)
            p = sig.pointer(acc.tensor, acc.dtype)
            return f"(({mask(acc, None, 'col')}) ? {load_value(acc.dtype, p, offset(acc, None, 'col'))} : 0.0f)"
        return float_expr(lw.epilogue, leaf, sizes)
    tile, split = CExpr("tile"), CExpr("split")
    block = lw.block(CExpr("blockIdx.x"), CExpr("blockIdx.y"))  # (tile, split) of this block
    first_col = lw.thread_column(tile, CExpr("tc"), 0)
    row = lw.row(CExpr("row_begin"), CExpr("i"), CExpr("u"), CExpr("g"))
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    out_col = "col"
    out_off = offset(out, None, out_col)
    decode = ""
    if lw.final_pass:
        # the tile's last row split to finish (its arrival on the tile's counter, a slot of the launch's
        # zero-filled workspace, completes the count) finishes the tile's columns
        counters = sig.pointer(lw.counter_tensor, "i32", writes=True)
        slot = c(lw.counter_slot(tile))
        last = f"habu::last_block_done({counters} + ({slot}), (int)({c(lw.arrivals(sizes))}))"
        final = (f"for (int j = {c(lw.final_start(CExpr('tid')))}; j < {tm.tile_columns}; j += {lw.final_step})")
        column = f"const {it} {out_col} = ({it})({c(lw.tile_column(tile, CExpr('j')))});"
    if lw.combine == "atomic":
        store = f"habu::atomic_add_f({p_out} + ({out_off}), w);  // row splits add into the zeroed output"
        if lw.epilogue is not None:
            decode = f"""  if ({last}) {{  // every split of the tile is in: the epilogue, in place
    {final} {{
      {column}
      if ({mask(out, None, out_col)}) {{ const float w = {p_out}[{out_off}]; {p_out}[{out_off}] = {epilogue("w")}; }}
    }}
  }}
"""
    elif lw.combine == "atomic-max":
        store = (f"habu::atomic_max_ordered({p_out} + ({out_off}), w);  // row splits take the max of "
                 "order-preserving keys in the zeroed output")
        if lw.epilogue is None:
            decode = f"""  if ({last}) {{  // every split of the tile is in: each key back to its float
    {final} {{
      {column}
      if ({mask(out, None, out_col)}) habu::decode_ordered({p_out} + ({out_off}));
    }}
  }}
"""
        else:
            decode = f"""  if ({last}) {{  // every split of the tile is in: each key's float, then the epilogue
    {final} {{
      {column}
      if ({mask(out, None, out_col)}) {{
        habu::decode_ordered({p_out} + ({out_off}));
        const float w = *(volatile float*)({p_out} + ({out_off}));
        {p_out}[{out_off}] = {epilogue("w")};
      }}
    }}
  }}
"""
    else:
        store = store_value(out.dtype, p_out, out_off, epilogue("w")) + "  // one split owns the column"
    src_body = f"""extern "C" __global__ void __launch_bounds__({tm.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  __shared__ float partials[{pm.slots}];  // each row group's partial of each column of the tile
  const int tid = threadIdx.x;
  const int tc = tid % {Tc};  // column thread
  const int g = tid / {Tc};  // row group
  const {it} tile = ({it}){_operand(block[0])};  // column tile
  const {it} split = ({it}){_operand(block[1])};  // row split
  const {it} c0 = ({it})({c(first_col)});  // this thread's columns: c0 .. c0 + {V - 1}
  const {it} row_begin = ({it})({c(lw.row_begin(split))});
  const {it} row_end = ({it})({c(lw.row_end(split, sizes))});
  float acc[{V}];
#pragma unroll
  for (int v = 0; v < {V}; ++v) acc[v] = {init};
{chr(10).join(hoisted)}
  for (int i = 0; i < {lw.steps}; ++i) {{
    {it} rows[{U}];
{chr(10).join(declared)}
#pragma unroll
    for (int u = 0; u < {U}; ++u) {{  // issue every load of the iteration first: {U} rows in flight
      const {it} r = ({it})({c(row)});
      const bool live = {bare(lw.row_live(CExpr("r"), CExpr("row_end")))};
      rows[u] = r;
{chr(10).join(issued)}
    }}
#pragma unroll
    for (int u = 0; u < {U}; ++u) {{
      if ({bare(lw.row_live(CExpr("rows[u]"), CExpr("row_end")))}) {{
#pragma unroll
        for (int v = 0; v < {V}; ++v) habu::accumulate<{is_max}>(acc[v], {value});
      }}
    }}
  }}
#pragma unroll
  for (int v = 0; v < {V}; ++v) partials[{c(lw.partial_slot(CExpr("g"), CExpr("tc"), CExpr("v")))}] = acc[v];
  __syncthreads();
  for (int j = {c(lw.combine_start(CExpr("tid")))}; j < {tm.tile_columns}; j += {lw.combine_step}) {{
    float w = {init};
#pragma unroll
    for (int gg = 0; gg < {G}; ++gg) habu::accumulate<{is_max}>(w, partials[{c(lw.combined_slot(CExpr("gg"), CExpr("j")))}]);
    const {it} {out_col} = ({it})({c(lw.tile_column(tile, CExpr("j")))});
    if ({mask(out, None, out_col)}) {store}
  }}
{decode}}}
"""
    epi = [f"epilogue: {', '.join(k.nodes[k.nodes.index(lw.reduced) + 1:])}"] if lw.epilogue is not None else []
    src = header(f"{name}: column reduction ({lw.op} over #{lw.rows_name}), {tm.threads} threads = {Tc} columns × {G} row "
                 f"groups, {V} columns a thread, {tm.rows_per_split} rows a split, {U} rows in flight",
                 [f"computes {', '.join(k.nodes)}", f"row splits: {lw.combine}", *epi])
    src += src_body.replace("SIGNATURE", sig.declaration())
    zero = (out.tensor,) if lw.combine in ("atomic", "atomic-max") else ()
    workspace = ((lw.counter_tensor, "i32", lw.counter_extents),) if lw.final_pass else ()
    return CudaKernel(name, src, tuple(sig.params), tm.threads, 0, lw,
                      zero=zero + tuple(w[0] for w in workspace), workspace=workspace)


register_geometry(ColumnLowering, GRID_2D)  # column tiles × row splits
