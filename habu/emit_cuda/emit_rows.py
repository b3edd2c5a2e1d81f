"""Row kernels (RMSNorm, softmax, layer norm and their elementwise neighbours) and map kernels.

Row kernel: one block per row. The region's nodes are inlined into one expression per column; each
reduction over the row is a pass over the columns (in chunks of threads·vector, the ragged chunk
masked) whose partials are combined across the block; the last pass computes and stores the output.
With `cache_row`, a row that is read by several passes is loaded once into shared memory.

Map kernel: each lane computes `vector` consecutive elements of the output.
"""

from __future__ import annotations

from fractions import Fraction

from habu.emit_cuda.cexpr import c
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
from habu.emit_cuda.kernel import CudaKernel
from habu.lower import MapLowering, RowLowering
from habu.lower.rows import (
    RowLoads,
    canonical_reduction,
    inline_region,
    reduction_passes,
    registers_per_thread,
    row_registers,
)
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Const, Expr, IndexVar, Load, Model, Op, Reduce, Size, walk

# registers a row kernel may spend keeping a pass's per-column values for the final pass
HELD_REGISTER_CAP = 160


def _row_only(e: Expr) -> bool:
    """`e` has one value per row: constants, sizes and reductions over the row, no column's load."""
    if isinstance(e, (Const, Size, Reduce)):
        return True
    return isinstance(e, Op) and all(_row_only(a) for a in e.args)


class _RowConstants:
    """Row constants hoisted out of the column loops: each distinct one is computed once per row,
    after the reductions it reads, and a division by one becomes a product with its reciprocal
    (RMSNorm's rsqrt of the mean square, softmax's 1 / sum). A float rounding choice, like `__expf`:
    the finite-field proof is about the values, the golden check about their rounding."""

    def __init__(self, render) -> None:
        self._render = render
        self._names: dict[str, str] = {}
        self._pending: list[str] = []

    def hoist(self, e: Expr) -> Expr:
        if not isinstance(e, Op):
            return e
        if e.fn == "div" and _row_only(e.args[1]) and not _row_only(e.args[0]):
            return Op("mul", (self.hoist(e.args[0]), self._constant(Op("div", (Const(Fraction(1)), e.args[1])))))
        if _row_only(e):
            return self._constant(e)
        return Op(e.fn, tuple(self.hoist(a) for a in e.args))

    def _constant(self, e: Expr) -> Load:
        text = self._render(e)
        if text not in self._names:
            self._names[text] = f"rc{len(self._names)}"
            self._pending.append(f"  const float {self._names[text]} = {text};  // once per row")
        return Load(ROW_CONSTANT + self._names[text], ())

    def take(self) -> str:
        """The declarations of the constants hoisted since the last call."""
        out, self._pending = self._pending, []
        return "".join(line + "\n" for line in out)


ROW_CONSTANT = "@row:"  # a marker load: a hoisted row constant
HELD = "@held:"  # a marker load: a value an earlier pass kept in registers for this column


def _reuse_held(e: Expr, render, bodies: dict[str, int], used: set[int], room: int) -> Expr:
    """`e` with the subexpressions an earlier pass computed per column (the same C) replaced by its
    kept values, while `room` more are allowed."""
    if not isinstance(e, Op):
        return e
    i = bodies.get(render(e))
    if i is not None and (i in used or len(used) < room):
        used.add(i)
        return Load(f"{HELD}{i}", ())
    return Op(e.fn, tuple(_reuse_held(a, render, bodies, used, room) for a in e.args))


def emit_rows(name: str, model: Model, lw: RowLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    warp_rows = k.threads == 32  # a warp per row, `rows_per_block` rows per block: shuffles only
    if k.rows_per_block != 1 and not warp_rows:
        raise ValueError("several rows per block need a warp (32 threads) per row")
    rows_per = k.rows_per_block
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    threads, vec = k.threads, k.vector
    expr = lw.expression()
    loads = RowLoads(lw)
    reds = reduction_passes(expr)
    C = sizes[lw.c]
    share = k.cluster  # blocks sharing the row: block `rank` visits columns [rank·CL, (rank+1)·CL)
    if share > 1 and (warp_rows or not isinstance(C, int) or C % (share * vec)):
        raise ValueError(f"a cluster of {share} shares a static row of whole vectors, one row per block")
    CL = C // share if share > 1 else C  # the columns this block visits
    cb = "cbase + " if share > 1 else ""  # a column's offset: this block's first column, then its own
    # a row read by several passes is kept on chip in its own element type
    cache_acc = lw.kept_row()
    cached = cache_acc.tensor if cache_acc else None
    cache_dt = cache_acc.dtype if cache_acc else "f32"
    e_in = DTYPES[cache_dt].bytes
    # vector mode: 16-byte loads and stores, the cache permuted so lane q of chunk g sits at q·G + g
    # (consecutive threads touch consecutive words: no bank conflicts)
    vector_mode = lw.vector_row()
    G = CL / vec if not isinstance(CL, int) else CL // vec  # chunks per row (vector mode: #C is a multiple)
    # register mode: a static row that splits evenly into at most 16 chunks per thread stays in
    # registers (all its loads in flight at once, no shared memory)
    per_thread = lw.register_chunks(sizes)
    in_regs = per_thread > 0
    word = "unsigned short" if e_in == 2 else "float"
    # persistent blocks copy their next row to shared memory while they compute this one in registers
    prefetch = k.prefetch
    if prefetch and not (in_regs and rows_per == 1):
        raise ValueError("prefetching the next row needs the row kept in registers, one row per block")

    def leaf_at(col: str, slot: str):
        def leaf(ld: Load) -> str:
            if ld.tensor.startswith(ROW_CONSTANT):
                return ld.tensor[len(ROW_CONSTANT):]
            if ld.tensor.startswith(HELD):
                return f"held{ld.tensor[len(HELD):]}[i][q]"
            acc = loads[ld]
            if cached is not None and ld.tensor == cached and [p.kind for p in acc.positions] == ["axis", "axis"]:
                raw = f"(reinterpret_cast<const {word}*>(&regs[i]))[q]" if in_regs else f"row_cache[{slot}]"
                return {"bf16": f"habu::bf16_to_float({raw})", "f16": f"habu::f16_to_float({raw})"}.get(cache_dt, raw)
            coord = {"r": "r", "c": col}
            p = sig.pointer(acc.tensor, acc.dtype)
            off = access_offset(acc, coord, sizes, lw.index_width, lambda t, x: "0")
            return f"(({access_mask(acc, coord, sizes)}) ? {load_value(acc.dtype, p, off)} : 0.0f)"
        return leaf

    red_names = {canonical_reduction(r): f"red{i}" for i, r in enumerate(reds)}

    def render(e: Expr, col: str, slot: str) -> str:
        return float_expr(e, leaf_at(col, slot), sizes, lambda r: red_names[canonical_reduction(r)])

    def column_loop(body: str) -> str:
        """`body` for every column of the row; `col` is the column, `slot` its place in the cache."""
        if in_regs:
            return f"""#pragma unroll
  for (int i = 0; i < {per_thread}; ++i) {{
    const {it} g = tid + {threads} * i;
#pragma unroll
    for (int q = 0; q < {vec}; ++q) {{
      const {it} col = {cb}g * {vec} + q;
      {body}
    }}
  }}"""
        if vector_mode:
            return f"""  for ({it} g = tid; g < {c(G)}; g += {threads}) {{
#pragma unroll
    for (int q = 0; q < {vec}; ++q) {{
      const {it} col = {cb}g * {vec} + q;
      const {it} slot = ({it})q * {c(G)} + g;
      {body}
    }}
  }}"""
        return f"""  for ({it} slot = tid; slot < {c(CL)}; slot += {threads}) {{
    const {it} col = {cb}slot;
    {body}
  }}"""

    def render_here(e: Expr) -> str:
        return render(e, "col", "slot")

    consts = _RowConstants(render_here)
    bodies = []  # each reduction's body with its row constants hoisted, and their declarations
    for r in reds:
        body = consts.hoist(r.body)
        bodies.append((body, consts.take()))
    final_expr = consts.hoist(expr)
    final_consts = consts.take()
    # a pass's per-column value that the final pass needs again (softmax's exp(x - max)) is kept in
    # registers when the row is, instead of computed twice
    held: set[int] = set()
    if in_regs and not lw.per_row:
        room = (min(registers_per_thread(threads, rows_per), HELD_REGISTER_CAP) - row_registers(per_thread)) \
            // (per_thread * vec)
        computed = {render_here(b): i for i, (b, _) in enumerate(bodies) if isinstance(b, Op)}
        final_expr = _reuse_held(final_expr, render_here, computed, held, max(0, room))

    def combine(r: Reduce, name: str, index: int, init: str) -> str:
        """The row's value `name` of a reduction from each block's partial (each pass has its own
        scratch words: no third barrier); a cluster's blocks read each other's through distributed
        shared memory, all in rank order, so every block has the same value."""
        if share == 1:
            return f"    {name} = scratch[{33 * index + 32}];\n"
        op = "w += v;" if r.op == "sum" else "w = fmaxf(w, v);"
        return f"""    habu::cluster_sync();  // every block of the row's cluster has its partial in its scratch
    {{
      float w = {init};
#pragma unroll
      for (int j = 0; j < {share}; ++j) {{
        const float v = habu::ld_shared_cluster_f32(habu::smem_addr(&scratch[{33 * index + 32}]), (habu::u32)j);
        {op}
      }}
      {name} = w;
    }}
"""

    passes = []
    sync = "__syncwarp();" if warp_rows else "__syncthreads();"
    if cached is not None:
        acc = cache_acc
        assert acc is not None
        p = sig.pointer(acc.tensor, acc.dtype)
        if prefetch:
            passes.append(f"""  habu::cp_async_wait<0>();  // this row's copy, issued while the block computed its previous row
  uint4 regs[{per_thread}];  // this thread's chunks of the row: the ones it copied itself
#pragma unroll
  for (int i = 0; i < {per_thread}; ++i) regs[i] = next_row[tid + {threads} * i];""")
        elif in_regs:
            off = access_offset(acc, {"r": "r", "c": f"{cb}g * {vec}"}, sizes, lw.index_width, lambda t, x: "0")
            chunk_mask = access_mask(acc, {"r": "r", "c": f"{cb}g * {vec}"}, sizes)  # whole chunks: #C is a multiple
            passes.append(f"""  uint4 regs[{per_thread}];  // this thread's chunks of the row, loaded together
#pragma unroll
  for (int i = 0; i < {per_thread}; ++i) {{
    const {it} g = tid + {threads} * i;
    regs[i] = habu::load16_or_zero({p} + ({off}), {chunk_mask});
  }}""")
        elif vector_mode:
            off = access_offset(acc, {"r": "r", "c": f"{cb}g * {vec}"}, sizes, lw.index_width, lambda t, x: "0")
            chunk_mask = access_mask(acc, {"r": "r", "c": f"{cb}g * {vec}"}, sizes)
            passes.append(f"""  for ({it} g = tid; g < {c(G)}; g += {threads}) {{
    const uint4 raw = habu::load16_or_zero({p} + ({off}), {chunk_mask});
    const {word}* w = reinterpret_cast<const {word}*>(&raw);
#pragma unroll
    for (int q = 0; q < {vec}; ++q) row_cache[({it})q * {c(G)} + g] = w[q];
  }}
  {sync}""")
        else:
            off = access_offset(acc, {"r": "r", "c": f"({cb}slot)"}, sizes, lw.index_width, lambda t, x: "0")
            passes.append(f"""  for ({it} slot = tid; slot < {c(CL)}; slot += {threads}) row_cache[slot] = {p}[{off}];
  {sync}""")
    def copy_row(row: str) -> str:
        """This thread's chunks of row `row` copied into shared memory (cp.async), one group."""
        acc = cache_acc
        assert acc is not None
        p = sig.pointer(acc.tensor, acc.dtype)
        off = access_offset(acc, {"r": row, "c": f"{cb}g * {vec}"}, sizes, lw.index_width, lambda t, x: "0")
        return f"""#pragma unroll
    for (int i = 0; i < {per_thread}; ++i) {{
      const {it} g = tid + {threads} * i;
      habu::cp_async<16>(habu::smem_addr(&next_row[g]), {p} + ({off}), {access_mask(acc, {"r": row, "c": f"{cb}g * {vec}"}, sizes)});
    }}
    habu::cp_async_commit();
"""

    issue_next = ""
    if prefetch:
        issue_next = f"""    if (r + row_step < {c(sizes[lw.r])}) {{  // the block's next row: its copy lands while this one is computed
      const {it} r_next = r + row_step;
    {copy_row("r_next")}    }}
"""
    # the copy overwrites the chunks this thread read: issued once the first pass has used every one
    # of them (its values are in registers), or after the last pass
    first_reads_row = bool(bodies) and any(isinstance(x, Load) and x in loads and x.tensor == cached
                                           for x in walk(bodies[0][0]))
    for index, (r, (body, declarations)) in enumerate(zip(reds, bodies, strict=True)):
        if declarations:
            passes.append(declarations.rstrip("\n"))
        keep = ""
        if index in held:
            passes.append(f"  float held{index}[{per_thread}][{vec}];  // this pass's values, for the last pass")
            keep = f" held{index}[i][q] = v;"
        red = red_names[canonical_reduction(r)]
        init = "0.0f" if r.op == "sum" else "-3.402823466e38f"
        update = "part += v;" if r.op == "sum" else "part = fmaxf(part, v);"
        reduce_fn = "habu::warp_sum" if r.op == "sum" else "habu::warp_max"
        guard = f"col < {c(C)}" if lw.reduce_mask else "true"
        loop = column_loop(f"if ({guard}) {{ const float v = {render(body, 'col', 'slot')};{keep} {update} }}")
        if index == 0 and first_reads_row and issue_next:
            loop += "\n" + issue_next.rstrip("\n")
            issue_next = ""
        if warp_rows:
            passes.append(f"""  {{  // {r.op}-reduction over the row: {red} (this warp's row)
    float part = {init};
{loop}
    {red} = {reduce_fn}(part);
  }}""")
            continue
        passes.append(f"""  {{  // {r.op}-reduction over the row: {red}
    float part = {init};
{loop}
    habu::block_reduce<{"true" if r.op == "max" else "false"}>(part, scratch + {33 * index}, {lw.combined_warps}, {init});
{combine(r, red, index, init)}  }}""")
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    if lw.per_row:  # a row statistic: the row's first thread stores its one value
        out_off = access_offset(out, {"r": "r"}, sizes, lw.index_width, lambda t, x: "0")
        final_loop = f"""  if (tid == 0) {{
    const {it} col = 0;
    const {it} slot = 0;
    (void)col; (void)slot;
    {store_value(out.dtype, p_out, out_off, render(final_expr, 'col', 'slot'))}
  }}"""
    elif lw.vector_store():
        pack = "habu::pack_bf16x2" if out.dtype == "bf16" else "habu::pack_f16x2"
        base_off = access_offset(out, {"r": "r", "c": f"{cb}g * {vec}"}, sizes, lw.index_width, lambda t, x: "0")
        value = render(final_expr, "col", "slot")
        loop_head = (f"#pragma unroll\n  for (int i = 0; i < {per_thread}; ++i) {{\n    const {it} g = tid + {threads} * i;"
                     if in_regs else f"  for ({it} g = tid; g < {c(G)}; g += {threads}) {{")
        final_loop = f"""{loop_head}
    float y[{vec}];
#pragma unroll
    for (int q = 0; q < {vec}; ++q) {{
      const {it} col = {cb}g * {vec} + q;
      {"" if in_regs else f"const {it} slot = ({it})q * {c(G)} + g;"}
      y[q] = {value};
    }}
    uint4 packed;
    packed.x = {pack}(y[0], y[1]); packed.y = {pack}(y[2], y[3]);
    packed.z = {pack}(y[4], y[5]); packed.w = {pack}(y[6], y[7]);
    *reinterpret_cast<uint4*>({p_out} + ({base_off})) = packed;
  }}"""
    else:
        out_off = access_offset(out, {"r": "r", "c": "col"}, sizes, lw.index_width, lambda t, x: "0")
        final_loop = column_loop(f"if (col < {c(C)}) "
                                 f"{store_value(out.dtype, p_out, out_off, render(final_expr, 'col', 'slot'))}")
    red_decl = "\n".join(f"  float {n} = 0.0f;" for n in red_names.values())
    cache_type = {"bf16": "unsigned short", "f16": "unsigned short"}.get(cache_dt, "float")
    cache_len = c(CL)
    block_decls = "" if warp_rows else (f"  __shared__ float scratch[{33 * max(1, len(reds))}];  "
                                        "// block reductions (habu::block_reduce): one partial per warp, per pass\n")
    attrs = f"__cluster_dims__({share}, 1, 1) " if share > 1 else ""
    row_of = f"({it})(blockIdx.x / {share})" if share > 1 else f"({it})blockIdx.x * {rows_per} + row_slot"
    cluster_decl = (f"  const {it} cbase = ({it})habu::cluster_ctarank() * {CL};  // this block's first column\n"
                    if share > 1 else "")
    # no block of the cluster leaves while a peer may still read its scratch
    cluster_end = "  habu::cluster_sync();\n" if share > 1 else ""
    head = f"""extern "C" __global__ void {attrs}__launch_bounds__({threads * rows_per}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  extern __shared__ __align__(16) {cache_type} row_cache_all[];
{block_decls}  const int tid = threadIdx.x % {threads};  // this thread's lane within its row
  const int row_slot = threadIdx.x / {threads};
"""
    if prefetch:
        first = f"  {{  // the first row's copy\n  {copy_row('r')}  }}\n"
        body = f"""{head}  uint4* next_row = reinterpret_cast<uint4*>(row_cache_all);  // the row in flight
  const {it} row_step = ({it})(gridDim.x / {share});  // persistent: the block walks rows r, r + step, ...
  {it} r = {row_of};
  if (!(r < {c(sizes[lw.r])})) return;  // (the blocks of a cluster share r: they leave together)
{cluster_decl}{first}  for (; r < {c(sizes[lw.r])}; r += row_step) {{
{red_decl}
{chr(10).join(passes)}
{final_consts}{final_loop}
{issue_next}{cluster_end}  }}
}}
"""
    else:
        body = f"""{head}  {cache_type}* row_cache = row_cache_all + ({it})row_slot * {cache_len};
  const {it} r = {row_of};
  if (!(r < {c(sizes[lw.r])})) return;  // (the blocks of a cluster share r: they leave together)
{cluster_decl}{red_decl}
{chr(10).join(passes)}
{final_consts}{final_loop}
{cluster_end}}}
"""
    src = header(f"{name}: row kernel, {threads} threads per row"
                 + (f" in each of a cluster of {share} blocks" if share > 1 else "") + f", {vec} elements per access",
                 [f"computes {', '.join(k.nodes)}: {len(reds)} reduction pass(es)"
                  + (f", row of {cached} kept in {'registers' if in_regs else 'shared memory'} as {cache_dt}"
                     if cached else "")])
    src += body.replace("SIGNATURE", sig.declaration())
    block = threads * rows_per
    if prefetch:  # the next row's part, in flight
        return CudaKernel(name, src, tuple(sig.params), block, e_in * CL, lw, cluster=share)
    if not cached or in_regs:
        return CudaKernel(name, src, tuple(sig.params), block, 0, lw, cluster=share)
    if lw.c in static:
        return CudaKernel(name, src, tuple(sig.params), block, e_in * (static[lw.c] // share) * rows_per, lw,
                          cluster=share)
    return CudaKernel(name, src, tuple(sig.params), block, 0, lw, smem_per=(lw.c, e_in * rows_per))


def emit_map(name: str, model: Model, lw: MapLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    loads = dict(lw.loads)
    defs = {eq.target: eq for eq in lw.nodes[:-1]}
    final = lw.nodes[-1]
    expr = inline_region(final.rhs, defs)
    dims = [sizes[e] for e in lw.extents]
    coord_lines = []
    rest = "e"
    coord: dict[str, str] = {}
    for i in reversed(range(len(dims))):
        name_i = f"e{i}"
        if i > 0:
            coord_lines.append(f"const {it} {name_i} = {rest} % ({it}){c(dims[i])};")
            coord_lines.append(f"const {it} q{i} = {rest} / ({it}){c(dims[i])};")
            rest = f"q{i}"
        else:
            coord_lines.append(f"const {it} {name_i} = {rest};")
        coord[name_i] = name_i

    def leaf(ld: Load) -> str:
        acc = loads[ld]
        p = sig.pointer(acc.tensor, acc.dtype)
        off = access_offset(acc, coord, sizes, lw.index_width, lambda t, x: "0")
        return load_value(acc.dtype, p, off)

    value = float_expr(expr, leaf, sizes)
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    out_off = access_offset(out, coord, sizes, lw.index_width, lambda t, x: "0")
    # the lowering's masks of every access, printed as the lane's guard: lanes run over consecutive
    # elements, so only the outermost coordinate can pass its extent, and once one lane does, the rest do
    guards: list[str] = []
    for acc in (out, *(a for _, a in lw.loads)):
        m = access_mask(acc, coord, sizes)
        if m != "true" and m not in guards:
            guards.append(m)
    guard = " && ".join(f"({g})" for g in guards) or "true"
    body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  const {it} first = (({it})blockIdx.x * {k.threads} + threadIdx.x) * {k.vector};
#pragma unroll
  for (int v_ = 0; v_ < {k.vector}; ++v_) {{
    const {it} e = first + v_;
    {chr(10).join('    ' + ln for ln in coord_lines).strip()}
    if (!({guard})) break;  // every access's mask (lanes past the last element: the rest are too)
    {store_value(out.dtype, p_out, out_off, value)}
  }}
}}
"""
    src = header(f"{name}: elementwise, {k.threads} threads, {k.vector} elements per lane",
                 [f"computes {', '.join(k.nodes)}"])
    src += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), k.threads, 0, lw)


__all__ = ["IndexVar", "emit_map", "emit_rows"]
