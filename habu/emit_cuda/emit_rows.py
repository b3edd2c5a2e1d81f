"""Row kernels (RMSNorm, softmax, layer norm and their elementwise neighbours).

One block (or a warp) per row. The region's nodes are inlined into one expression per column; each
reduction over the row is a pass over the columns whose partials are combined across the block
(`habu::block_reduce`) and, for a row shared by a cluster, across its blocks (`habu::cluster_combine`);
the last pass computes and stores the output, and a stored row statistic (`RowLowering.stats`: RMSNorm's
saved rstd) is stored by the one thread the lowering names, once the reductions are combined. With
`cache_row`, a row read by several passes is loaded once, into registers or shared memory.

Every index the kernel computes is printed from the lowering (`RowLowering`, habu/lower/rows.py and
habu/lower/lanes.py), which the finite-field interpreter executes thread by thread: the lane and row
of a thread (`thread_map`), its column loop (`chunk_loop`: chunks, their stride, the tail predicate,
the columns of a chunk), where the kept row sits in shared memory (`cache`), the passes and the warps
a block reduction combines, and every access's offset and mask. The source is composed by what it does:
the prologue (`_prologue`), the row's load (`_load_row`, `_copy_row`), the reduction passes
(`_reduction_pass`), the epilogue's store (`_store`), assembled by `_assemble`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from habu.emit_cuda.cexpr import CExpr, c, cmin
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    CIndex,
    Signature,
    SizeView,
    TableReader,
    access_mask,
    access_offset,
    float_expr,
    header,
    index_type,
    load_value,
    store_value,
)
from habu.emit_cuda.geometry import LaunchGeometry, cmax, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.emit_cuda.row_values import HELD, MAX_INIT, ROW_CONSTANT, RowConstants, reuse_held
from habu.lower import RowLowering
from habu.lower.access import Access
from habu.lower.lanes import ChunkLoop, RowCache
from habu.lower.rows import RowLoads, canonical_reduction, registers_per_thread, row_registers
from habu.lower.support import ROWS
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Expr, Load, Model, Op, Reduce, walk

# registers a row kernel may spend keeping a pass's per-column values for the final pass
HELD_REGISTER_CAP = 160

# the element type a kept row is stored in on chip (16-bit floats as their raw bits)
CACHE_WORD = {"bf16": "unsigned short", "f16": "unsigned short"}


@dataclass
class _Row:
    """One row kernel being printed: the lowering at the kernel's sizes, and the names its parts share."""

    lw: RowLowering
    sig: Signature
    sizes: SizeView
    loop: ChunkLoop  # the column loop every pass runs
    cache: RowCache | None  # the kept row's place in shared memory (None: in registers, or not kept)
    kept: Access | None  # the load whose row is kept on chip (the first, where several are)
    red_names: dict[Expr, str] = field(default_factory=dict)

    @property
    def kept_rows(self) -> tuple[Access, ...]:
        """Every kept row, in the lowering's order (kept row k: `regs{k}` in registers, its cache slots)."""
        return self.lw.kept_rows()

    @property
    def it(self) -> str:
        return index_type(self.lw.index_width)

    @property
    def share(self) -> int:
        """Blocks sharing the row: block `rank` visits columns [rank·CL, (rank+1)·CL)."""
        return self.lw.kernel.cluster

    @property
    def cb(self) -> str:
        """A column's offset: this block's first column (in a cluster), then its own."""
        return "cbase + " if self.share > 1 else ""

    @property
    def warp_rows(self) -> bool:
        """A warp per row, `rows_per_block` rows a block: reductions by shuffles alone."""
        return self.lw.thread_map.threads == 32

    @property
    def word(self) -> str:
        return CACHE_WORD.get(self.kept.dtype if self.kept else "f32", "float")

    def column(self, g: str, q: str | int) -> str:
        """The C of the column (in the row) of element q of chunk g."""
        return self.cb + c(self.loop.column(CExpr(g), CExpr(q) if isinstance(q, str) else q))

    def slot(self, g: str, q: str | int, k: int = 0) -> str:
        """The cache slot of element q of chunk g of kept row k."""
        assert self.cache is not None
        lane = CExpr(f"({self.it}){q}") if isinstance(q, str) else q
        return c(self.cache.place(k, CExpr(g), lane, self.loop))

    def cached(self, k: int) -> str:
        """Kept row k's element at the column loop's `slot` (row 0's slot; row k's start after it)."""
        assert self.cache is not None
        return "row_cache[slot]" if k == 0 else f"row_cache[{c(self.cache.row_base(k, self.loop))} + slot]"

    def next_slot(self, k: int, chunk: CExpr) -> CExpr:
        """Where kept row k's chunk `chunk` sits in the next-row buffer of a prefetching block."""
        layout = self.lw.prefetch_layout
        assert layout is not None
        return layout.slot(k, chunk, layout.chunks_per_row(self.lw, self.sizes))

    @property
    def table(self) -> TableReader:  # a row read through an index tensor (`dY[IX[r] d]`)
        return TableReader(self.sig, self.sig.model, self.it)

    def offset(self, acc: Access, coord: dict[str, str]) -> str:
        return access_offset(acc, coord, self.sizes, self.lw.index_width, self.table)

    def mask(self, acc: Access, coord: dict[str, str]) -> str:  # index checks included (`habu::index_ok`)
        return access_mask(acc, coord, self.sizes, self.table)

    def at(self, r: str, col: str | None = None) -> dict[str, str]:
        """The axis coordinates (C) of column `col` of row `r`: the lowering's row index → leading
        coordinates map (`r` itself for a 2-D row; `r / #S`, `r % #S` for X[b s d])."""
        rows = {a: c(x) for a, x in self.lw.row_coordinates(CExpr(r), self.sizes).items()}
        return rows if col is None else {**rows, "c": col}


def _setup(model: Model, lw: RowLowering, static: dict[str, int]) -> _Row:
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    # what a row kernel cannot print is refused by the rules (`supported-path`) from the same list
    reasons = [*ROWS.refusals(lw), *ROWS.sized_refusals(lw, sizes)]
    if reasons:
        raise ValueError("; ".join(reasons))
    row = _Row(lw, sig, sizes, lw.chunk_loop(sizes), lw.row_cache(sizes), lw.kept_row())
    row.red_names = {r: f"red{i}" for i, r in enumerate(lw.passes)}
    return row


# ----------------------------------------------------------------------------- loops and values


def _chunk_head(row: _Row, var: str = "g") -> str:
    """The head of a thread's loop over its chunks, `var` the chunk (a row in registers: `i` its
    index among the thread's chunks, fully unrolled)."""
    loop, it = row.loop, row.it
    if loop.unrolled:
        return (f"#pragma unroll\n  for (int i = 0; i < {loop.unrolled}; ++i) {{\n"
                f"    const {it} {var} = {c(loop.chunk(CExpr('tid'), CExpr('i')))};")
    inside = loop.inside(CExpr(var), CIndex(row.lw.index_width))
    return f"  for ({it} {var} = {c(loop.first(CExpr('tid')))}; {inside}; {var} += {loop.step}) {{"


def _declared_if_read(name: str, body: str, declaration: str) -> str:
    """`declaration` where `body` reads `name`, else nothing (NVRTC warns of a variable never referenced,
    and a kernel that compiles without warnings keeps the warnings that matter visible)."""
    return declaration if re.search(rf"\b{name}\b", body) else ""


def _column_loop(row: _Row, body: str) -> str:
    """`body` for every column this thread visits; `col` is the column, `slot` its place in the cache."""
    it = row.it

    def slot(q: str | int, indent: str) -> str:
        return f"\n{indent}const {it} slot = {row.slot('g', q)};" if row.cache is not None else ""

    if row.loop.vector == 1:
        col = _declared_if_read("col", body, f"\n    const {it} col = {row.column('g', 0)};")
        return f"""{_chunk_head(row)}{col}{slot(0, '    ')}
    {body}
  }}"""
    col = _declared_if_read("col", body, f"\n      const {it} col = {row.column('g', 'q')};")
    return f"""{_chunk_head(row)}
#pragma unroll
    for (int q = 0; q < {row.loop.vector}; ++q) {{{col}{slot('q', '      ')}
      {body}
    }}
  }}"""


def _leaf(row: _Row):
    loads = RowLoads(row.lw)

    def leaf(ld: Load) -> str:
        if ld.tensor.startswith(ROW_CONSTANT):
            return ld.tensor[len(ROW_CONSTANT):]
        if ld.tensor.startswith(HELD):
            return f"held{ld.tensor[len(HELD):]}[i][q]"
        acc = loads[ld]
        k = row.lw.kept_index(acc)
        if k is not None:
            raw = f"habu::chunk_element<{row.word}>({_regs(k)}[i], q)" if row.loop.unrolled else row.cached(k)
            return {"bf16": f"habu::bf16_to_float({raw})", "f16": f"habu::f16_to_float({raw})"}.get(acc.dtype, raw)
        coord = row.at("r", "col")
        p = row.sig.pointer(acc.tensor, acc.dtype)
        return f"(({row.mask(acc, coord)}) ? {load_value(acc.dtype, p, row.offset(acc, coord))} : 0.0f)"
    return leaf


def _render(row: _Row, e: Expr) -> str:  # a condition on indices reads the row's coordinates and `col`
    return float_expr(e, _leaf(row), row.sizes, lambda r: row.red_names[canonical_reduction(r)], names=row.at("r", "col"))


# ----------------------------------------------------------------------------- the row's load


def _regs(k: int) -> str:
    """The register array of kept row k's chunks."""
    return "regs" if k == 0 else f"regs{k}"


def _load_row(row: _Row, which: tuple[int, ...] = (0,)) -> str:
    """The kept rows `which` loaded on chip, together: their chunks into registers (or read back from
    the prefetched copy), or into the shared-memory cache at the lowering's slots; empty when nothing is
    kept."""
    k, it = row.lw.kernel, row.it
    if row.kept is None or not which:
        return ""
    n = row.loop.unrolled
    if k.prefetch:
        chunk = row.loop.chunk(CExpr('tid'), CExpr('i'))
        if len(row.kept_rows) == 1:
            return f"""  habu::cp_async_wait<0>();  // this row's copy, issued while the block computed its previous row
  uint4 regs[{n}];  // this thread's chunks of the row: the ones it copied itself
#pragma unroll
  for (int i = 0; i < {n}; ++i) regs[i] = next_row[{c(row.next_slot(0, chunk))}];"""
        decl = "".join(f"  uint4 {_regs(j)}[{n}];  // this thread's chunks of {row.kept_rows[j].tensor}'s row: the "
                       "ones it copied itself\n" for j in which)
        body = "\n".join(f"    {_regs(j)}[i] = next_row[{c(row.next_slot(j, chunk))}];" for j in which)
        return f"""  habu::cp_async_wait<0>();  // this row's copy, issued while the block computed its previous row
{decl}#pragma unroll
  for (int i = 0; i < {n}; ++i) {{
{body}
  }}"""

    def load(j: int) -> str:
        acc = row.kept_rows[j]
        p = row.sig.pointer(acc.tensor, acc.dtype)
        at = row.at("r", row.column("g", 0))
        return f"habu::load16_or_zero({p} + ({row.offset(acc, at)}), {row.mask(acc, at)})"

    several = len(row.kept_rows) > 1
    if n:
        decl = "".join(f"  uint4 {_regs(j)}[{n}];  // this thread's chunks of "
                       + (f"{row.kept_rows[j].tensor}'s row" if several else "the row") + ", loaded together\n"
                       for j in which)
        body = "\n".join(f"    {_regs(j)}[i] = {load(j)};" for j in which)
        return f"""{decl}{_chunk_head(row)}
{body}
  }}"""
    sync = "__syncwarp();" if row.warp_rows else "__syncthreads();"
    if row.loop.vector > 1:
        raw = [f"raw{j}" if several else "raw" for j in range(len(row.kept_rows))]
        body = "\n".join(f"    const uint4 {raw[j]} = {load(j)};" for j in which)
        stores = "\n".join(f"#pragma unroll\n    for (int q = 0; q < {row.loop.vector}; ++q) "
                           f"row_cache[{row.slot('g', 'q', j)}] = habu::chunk_element<{row.word}>({raw[j]}, q);"
                           for j in which)
        return f"""{_chunk_head(row)}
{body}
{stores}
  }}
  {sync}"""
    at = row.at("r", "col")

    def element(j: int) -> str:
        acc = row.kept_rows[j]
        p = row.sig.pointer(acc.tensor, acc.dtype)
        return (f"    row_cache[{row.slot('g', 0, j)}] = ({row.mask(acc, at)}) ? "
                f"{p}[{row.offset(acc, at)}] : ({row.word})0;")
    body = "\n".join(element(j) for j in which)
    col = _declared_if_read("col", body, f"\n    const {it} col = {row.column('g', 0)};")
    return f"""{_chunk_head(row)}{col}
{body}
  }}
  {sync}"""


def _loaded_before(row: _Row, index: int) -> tuple[int, ...]:
    """The kept rows the lowering loads just before pass `index` (len(passes): before the store)."""
    return tuple(k for k, at in enumerate(row.lw.loaded_before) if at == index)


def _copy_row(row: _Row, r: str) -> str:
    """This thread's chunks of row `r` of every kept row copied into shared memory (cp.async) at the
    lowering's slots (`PrefetchLayout`), one group."""
    assert row.kept is not None
    at = row.at(r, row.column("g", 0))

    def copy(k: int) -> str:
        acc = row.kept_rows[k]
        p = row.sig.pointer(acc.tensor, acc.dtype)
        return (f"      habu::cp_async<16>(habu::smem_addr(&next_row[{c(row.next_slot(k, CExpr('g')))}]), "
                f"{p} + ({row.offset(acc, at)}), {row.mask(acc, at)});")
    copies = "\n".join(copy(k) for k in range(len(row.kept_rows)))
    return f"""{_chunk_head(row).replace(chr(10), chr(10) + '  ')}
{copies}
    }}
    habu::cp_async_commit();
"""


# ----------------------------------------------------------------------------- the reductions


def _combine(row: _Row, r: Reduce, index: int, init: str) -> str:
    """The row's value of a reduction from each block's partial (each pass has its own scratch words:
    no third barrier); a cluster's blocks read each other's (`habu::cluster_combine`)."""
    name = row.red_names[r]
    if row.share == 1:
        return f"    {name} = scratch[{33 * index + 32}];\n"
    is_max = "true" if r.op == "max" else "false"
    return f"    {name} = habu::cluster_combine<{is_max}, {row.share}>(&scratch[{33 * index + 32}], {init});\n"


def _reduction_pass(row: _Row, index: int, body: Expr, held: bool, after_loop: str) -> str:
    """Pass `index`: this thread's partial over its columns, then the row's value (`after_loop`: code
    that runs once the loop has read every chunk of the row, before the reduction's barriers)."""
    r = row.lw.passes[index]
    red = row.red_names[r]
    init = "0.0f" if r.op == "sum" else MAX_INIT
    update = "part += v;" if r.op == "sum" else "part = fmaxf(part, v);"
    keep = f" held{index}[i][q] = v;" if held else ""
    guard = f"col < {c(row.sizes[row.lw.c])}" if row.lw.reduce_mask else "true"
    loop = _column_loop(row, f"if ({guard}) {{ const float v = {_render(row, body)};{keep} {update} }}")
    loop += "\n" + after_loop.rstrip("\n") if after_loop else ""
    if row.warp_rows:
        reduce_fn = "habu::warp_sum" if r.op == "sum" else "habu::warp_max"
        return f"""  {{  // {r.op}-reduction over the row: {red} (this warp's row)
    float part = {init};
{loop}
    {red} = {reduce_fn}(part);
  }}"""
    return f"""  {{  // {r.op}-reduction over the row: {red}
    float part = {init};
{loop}
    habu::block_reduce<{"true" if r.op == "max" else "false"}>(part, scratch + {33 * index}, {row.lw.combined_warps}, {init});
{_combine(row, r, index, init)}  }}"""


@dataclass
class _Passes:
    """The passes' bodies with their row constants hoisted, the final expression, and which passes
    keep their per-column values in registers for the final pass (softmax's exp(x − max))."""

    bodies: list[tuple[Expr, str]]
    final: Expr
    final_consts: str
    held: set[int]
    stats: list[Expr]  # each stored statistic's value, its row constants hoisted with the final's


def _hoist(row: _Row) -> _Passes:
    lw = row.lw
    consts = RowConstants(lambda e: _render(row, e))
    bodies = [(consts.hoist(r.body), consts.take()) for r in lw.passes]
    final = consts.hoist(lw.expression())
    stats = [consts.hoist(st.value) for st in lw.stats]  # RMSNorm's R1 is the final's rsqrt: one constant
    final_consts = consts.take()
    held: set[int] = set()
    n, vec = row.loop.unrolled, row.loop.vector
    if n and not lw.per_row:
        room = (min(registers_per_thread(lw.thread_map.threads, lw.thread_map.rows, lw.kernel.blocks_per_sm),
                    HELD_REGISTER_CAP)
                - row_registers(n * len(lw.kept_rows()))) // (n * vec)
        computed = {_render(row, b): i for i, (b, _) in enumerate(bodies) if isinstance(b, Op)}
        final = reuse_held(final, lambda e: _render(row, e), computed, held, max(0, room))
    return _Passes(bodies, final, final_consts, held, stats)


def _passes(row: _Row, hoisted: _Passes) -> tuple[list[str], str]:
    """The load and every reduction pass, and the next row's copy if no pass issued it yet."""
    out: list[str] = []
    issue_next = _issue_next(row)
    # the copy overwrites the chunks this thread read: issued once the first pass has used every one
    # of them (its values are in registers), or after the last pass
    # (every kept row is read back from the copy before the first pass: the support's refusals)
    first_reads_row = bool(hoisted.bodies) and row.kept is not None and any(
        isinstance(x, Load) and x in RowLoads(row.lw) and RowLoads(row.lw)[x] == row.kept
        for x in walk(hoisted.bodies[0][0]))
    for index, (body, declarations) in enumerate(hoisted.bodies):
        load = _load_row(row, _loaded_before(row, index))
        out += [load] if load else []
        if declarations:
            out.append(declarations.rstrip("\n"))
        if index in hoisted.held:
            out.append(f"  float held{index}[{row.loop.unrolled}][{row.loop.vector}];  // this pass's values, "
                       "for the last pass")
        after = issue_next if index == 0 and first_reads_row else ""
        issue_next = "" if after else issue_next
        out.append(_reduction_pass(row, index, body, index in hoisted.held, after))
    load = _load_row(row, _loaded_before(row, len(hoisted.bodies)))
    out += [load] if load else []
    return out, issue_next


def _issue_next(row: _Row) -> str:
    if not row.lw.kernel.prefetch:
        return ""
    it = row.it
    rows = c(row.lw.rows(row.sizes))
    return f"""    if (r + row_step < {rows}) {{  // the block's next row: its copy lands while this one is computed
      const {it} r_next = r + row_step;
    {_copy_row(row, "r_next")}    }}
"""


# ----------------------------------------------------------------------------- the store


def _store(row: _Row, value: Expr) -> str:
    """The epilogue: the output's row (or the row's one value) computed from `value` and stored."""
    lw, it = row.lw, row.it
    out = lw.out
    p_out = row.sig.pointer(out.tensor, out.dtype, writes=True)
    text = _render(row, value)
    if lw.per_row:  # a row statistic: the row's first thread stores its one value
        return f"""  if (tid == 0) {{
    const {it} col = 0;
    const {it} slot = 0;
    (void)col; (void)slot;
    {store_value(out.dtype, p_out, row.offset(out, row.at("r")), text)}
  }}"""
    if lw.vector_store():
        return _store_chunks(row, p_out, text)
    at = row.at("r", "col")
    return _column_loop(row, f"if ({row.mask(out, at)}) "
                             f"{store_value(out.dtype, p_out, row.offset(out, at), text)}")


def _store_stats(row: _Row, values: list[Expr]) -> str:
    """Each stored statistic (its one value a row), by the thread the lowering names (`StatStore`)."""
    out = []
    for st, value in zip(row.lw.stats, values, strict=True):
        p = row.sig.pointer(st.out.tensor, st.out.dtype, writes=True)
        who = f"tid == {st.lane}" + (f" && habu::cluster_ctarank() == {st.rank}" if row.share > 1 else "")
        at = row.at("r")
        out.append(f"""  if ({who} && {row.mask(st.out, at)}) {{  // the row's {st.target}, stored once
    {store_value(st.out.dtype, p, row.offset(st.out, at), _render(row, value))}
  }}
""")
    return "".join(out)


def _store_chunks(row: _Row, p_out: str, value: str) -> str:
    """The output row stored in 16-byte chunks of 16-bit floats, each under the output's mask."""
    out, it, vec = row.lw.out, row.it, row.loop.vector
    pack = "habu::pack_bf16x8" if out.dtype == "bf16" else "habu::pack_f16x8"
    at = row.at("r", row.column("g", 0))
    slot = "" if row.loop.unrolled else f"\n      const {it} slot = {row.slot('g', 'q')};"
    col = _declared_if_read("col", value, f"\n      const {it} col = {row.column('g', 'q')};")
    return f"""{_chunk_head(row)}
    float y[{vec}];
#pragma unroll
    for (int q = 0; q < {vec}; ++q) {{{col}{slot}
      y[q] = {value};
    }}
    habu::store16_if({p_out} + ({row.offset(out, at)}), {pack}(y), {row.mask(out, at)});
  }}"""


# ----------------------------------------------------------------------------- the kernel


def _cache_declaration(row: _Row) -> str:
    """The dynamic shared memory as `row_cache_all`, an array of the cached row's word. CUDA makes every
    `extern __shared__` array of one name in a source the same variable, so kernels of one source that cache
    different words (a float row and a bf16 row) must not both declare `row_cache_all`: a 16-bit cache
    declares its own array and points `row_cache_all` at it."""
    cache_type = CACHE_WORD.get(row.kept.dtype if row.kept else "f32", "float")
    if cache_type == "float":
        return "  extern __shared__ __align__(16) float row_cache_all[];"
    return (f"  extern __shared__ __align__(16) {cache_type} row_cache_words16[];\n"
            f"  {cache_type}* const row_cache_all = row_cache_words16;")


def _prologue(row: _Row, name: str, cache: bool = True) -> str:
    """The kernel's signature, shared memory (the row cache's only where `cache`), and this thread's lane,
    row slot and row."""
    lw, m = row.lw, row.lw.thread_map
    threads = m.threads * m.rows
    attrs = f"__cluster_dims__({row.share}, 1, 1) " if row.share > 1 else ""
    scratch = "" if row.warp_rows or not lw.passes else (
        f"  __shared__ float scratch[{33 * len(lw.passes)}];  "
        "// block reductions (habu::block_reduce): one partial per warp, per pass\n")
    # blocks_per_sm > 1: ptxas fits that many blocks on an SM (a row in registers may spill a little)
    bounds = f"{threads}, {lw.kernel.blocks_per_sm}" if lw.kernel.blocks_per_sm > 1 else f"{threads}"
    return f"""extern "C" __global__ void {attrs}__launch_bounds__({bounds}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}{_cache_declaration(row) + chr(10) if cache else ""}{scratch}  const int tid = {c(m.lane(CExpr('threadIdx.x')))};  // this thread's lane within its row
  const int row_slot = {c(m.row_slot(CExpr('threadIdx.x')))};
"""


def _row_start(row: _Row) -> str:
    """This block's row, the block leaving when it has none, and a cluster block's first column."""
    lw, it = row.lw, row.it
    if row.share > 1:
        r = f"({it})(blockIdx.x / {row.share})"
    else:
        r = c(lw.thread_map.row(CExpr(f"({it})blockIdx.x"), CExpr("row_slot")))
    # the output's row bound, as its mask says (the loads and stores are masked on it as well)
    r_mask = access_mask(replace(lw.out, masks=tuple(b for b in lw.out.masks if b.axis in lw.row_axes)), row.at("r"),
                         row.sizes)
    head = "" if lw.kernel.prefetch else "const "
    out = f"  {head}{it} r = {r};\n  if (!({r_mask})) return;  // (the blocks of a cluster share r: they leave together)\n"
    if row.share > 1:
        out += f"  const {it} cbase = ({it})habu::cluster_ctarank() * {c(lw.columns(row.sizes))};  // this block's first column\n"
    return out


def _assemble(row: _Row, name: str) -> str:
    lw, it = row.lw, row.it
    hoisted = _hoist(row)
    passes, issue_next = _passes(row, hoisted)
    red_decl = "\n".join(f"  float {n} = 0.0f;" for n in row.red_names.values())
    final_loop = _store_stats(row, hoisted.stats) + _store(row, hoisted.final)
    cluster_end = "  habu::cluster_sync();\n" if row.share > 1 else ""  # no block leaves while a peer may read
    rows = c(lw.rows(row.sizes))
    if lw.kernel.prefetch:
        first = f"  {{  // the first row's copy\n  {_copy_row(row, 'r')}  }}\n"
        return f"""{_prologue(row, name)}  uint4* next_row = reinterpret_cast<uint4*>(row_cache_all);  // the row in flight
  const {it} row_step = ({it})(gridDim.x / {row.share});  // persistent: the block walks rows r, r + step, ...
{_row_start(row)}{first}  for (; r < {rows}; r += row_step) {{
{red_decl}
{chr(10).join(passes)}
{hoisted.final_consts}{final_loop}
{issue_next}{cluster_end}  }}
}}
"""
    cache_len = c(lw.columns(row.sizes) * len(row.kept_rows)) if len(row.kept_rows) > 1 else c(lw.columns(row.sizes))
    body = f"""{_row_start(row)}{red_decl}
{chr(10).join(passes)}
{hoisted.final_consts}{final_loop}
{cluster_end}}}
"""
    cache = _declared_if_read("row_cache", body, f"  {row.word}* row_cache = row_cache_all + ({it})row_slot * {cache_len};\n")
    return f"""{_prologue(row, name, bool(cache))}{cache}{body}"""


def _kernel(name: str, row: _Row, src: str, static: dict[str, int]) -> CudaKernel:
    """The kernel with its launch: block size, and the dynamic shared memory of the kept row."""
    lw, share = row.lw, row.share
    params = tuple(row.sig.params)
    block = lw.thread_map.threads * lw.thread_map.rows
    e_in = DTYPES[row.kept.dtype].bytes * len(row.kept_rows) if row.kept is not None else 4
    if lw.kernel.prefetch:  # the next row's part, in flight
        return CudaKernel(name, src, params, block, e_in * lw.columns(row.sizes), lw, cluster=share)
    if row.cache is None:
        return CudaKernel(name, src, params, block, 0, lw, cluster=share)
    if lw.c in static:
        return CudaKernel(name, src, params, block, e_in * (static[lw.c] // share) * lw.thread_map.rows, lw,
                          cluster=share)
    return CudaKernel(name, src, params, block, 0, lw, smem_per=(lw.c, e_in * lw.thread_map.rows))


def emit_rows(name: str, model: Model, lw: RowLowering, static: dict[str, int]) -> CudaKernel:
    row = _setup(model, lw, static)
    k = lw.kernel
    kept = ""
    if row.kept is not None:
        names = ", ".join(a.tensor for a in row.kept_rows)
        kept = (f", row{'s' if len(row.kept_rows) > 1 else ''} of {names} kept in "
                f"{'shared memory' if row.cache else 'registers'} as {row.kept.dtype}")
    src = header(f"{name}: row kernel, {k.threads} threads per row"
                 + (f" in each of a cluster of {row.share} blocks" if row.share > 1 else "")
                 + f", {k.vector} elements per access",
                 [f"computes {', '.join(k.nodes)}: {len(lw.passes)} reduction pass(es){kept}"])
    src += _assemble(row, name).replace("SIGNATURE", row.sig.declaration())
    return _kernel(name, row, src, static)


__all__ = ["emit_rows"]


# ----------------------------------------------------------------------------- the row kind's launch


def _row_formula(lw: RowLowering, s, slots) -> tuple[object, str, str]:
    groups, n = lw.row_groups(s), lw.kernel.cluster
    if lw.kernel.prefetch:  # a block walks row groups: the clusters resident at once
        return cmax(1, cmin(groups, slots // n)) * n, "1", "1"
    return groups * n, "1", "1"


def _row_slots(lw: RowLowering, cluster: int) -> str | None:
    if not lw.kernel.prefetch:
        return None
    return "clusters" if cluster > 1 else "occupancy"  # blocks per SM x SMs


register_geometry(RowLowering, LaunchGeometry(
    blocks=lambda lw, sizes, slots: (int(lw.grid(sizes, slots)), 1, 1),
    formula=_row_formula, slots=_row_slots))
