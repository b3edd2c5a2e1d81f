"""The SIMT contraction: one thread computes a small block of outputs with FMAs.

It exists for every element type and every target, so it is the fallback of every checked set.
Each k tile is loaded cooperatively (predicated global loads, converted to f32) into shared
memory transposed to [k][row], then every thread accumulates its TM × TN outputs.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c, cmin
from habu.emit_cuda.common import (
    CTYPE,
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
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
from habu.lower.access import Access
from habu.lower.conditions import condition_names
from habu.lower.contraction import ACC, ContractionLowering, fma_thread_grid
from habu.lower.layouts import FmaOperands
from habu.lower.support import lowering_smem
from habu.spec.ir import Expr, Load, Model


def tile_setup(lw: ContractionLowering, sizes, it: str, indent: str = "    ") -> str:
    """The C that turns `lin` into the tile, split and k range: the lowering's own formulas."""
    lines: list[str] = []

    def let(name: str, value):
        if isinstance(value, int):
            return value
        lines.append(f"const long long {name} = {c(value)};")
        return CExpr(name)

    batch, tm, tn, split = lw.decode(CExpr("lin"), sizes, let)
    begin, end = lw.tile_k_range(CExpr("split"), sizes, CExpr("tm"), CExpr("tn"))  # (narrowed by the lowering's window)
    # a batched kernel's batch coordinates, named by their axes (the accesses read them by name)
    lines += [f"const {it} {axis} = ({it})({c(value)});" for axis, value in batch.items()]
    m0, n0 = lw.tile_origin(CExpr("tm"), CExpr("tn"))
    lines += [f"const long long tm = {c(tm)};", f"const long long tn = {c(tn)};",
              f"const {it} m0 = ({it}){_parenthesized(c(m0))};", f"const {it} n0 = ({it}){_parenthesized(c(n0))};",
              f"const long long kt_begin = {c(begin)};", f"const long long kt_end = {c(end)};"]
    if "const long long split" not in "".join(lines):
        lines.insert(0, f"const long long split = {c(split)};")
    return "".join(indent + ln + "\n" for ln in lines)


def _parenthesized(text: str) -> str:
    return text if text.startswith("(") and text.endswith(")") else f"({text})"


def table_reader(sig: Signature, model: Model, it: str) -> TableReader:
    return TableReader(sig, model, it)


def epilogue_code(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, m: str, n: str,
                  acc: str) -> str:
    """`value = epilogue(acc)` for output element (m, n), then the masked store (or atomic add)."""
    coord = {"m": m, "n": n}
    table = table_reader(sig, model, it)
    at = condition_names(m, n, lw.batch_axes)  # a mask's coordinates (habu/lower/conditions.py)

    def leaf(ld: Load) -> str:
        if ld.tensor == ACC:
            return acc
        access = next(a for x, a in lw.epi_loads if x == ld)
        p = sig.pointer(access.tensor, access.dtype)
        value = load_value(access.dtype, p, access_offset(access, coord, sizes, lw.index_width, table))
        if access.checks:  # a gathered epilogue operand: a bad index reads zero (the store's mask has no check)
            return f"(({access_mask(access, coord, sizes, table)}) ? {value} : 0.0f)"
        return value

    extras = ""
    for expr, access in lw.extra_outs:  # the chain's other outputs, each written with its own access
        p = sig.pointer(access.tensor, access.dtype, writes=True)
        store = store_value(access.dtype, p, access_offset(access, coord, sizes, lw.index_width, table),
                            float_expr(expr, leaf, sizes, names=at))
        extras += f"\nif ({access_mask(access, coord, sizes, table)}) {{ {store} }}"
    value = float_expr(lw.epilogue, leaf, sizes, names=at)
    out = lw.out
    p = sig.pointer(out.tensor, out.dtype, writes=True)
    off = access_offset(out, coord, sizes, lw.index_width, table)
    if lw.atomic_store:  # split-K's partial sums, or a scatter-add (rows whose index repeats accumulate)
        store = f"habu::atomic_add_f({p} + ({off}), {value});"
    else:
        store = store_value(out.dtype, p, off, value)
    return f"if ({access_mask(out, coord, sizes, table)}) {{ {store} }}{extras}"


def epilogue_load(lw: ContractionLowering, sig: Signature, sizes, table: TableReader, coord: dict[str, str],
                   access: Access) -> str:
    """One of the epilogue's own loads (its access) at `coord`, zero outside its tensor."""
    p = sig.pointer(access.tensor, access.dtype)
    inside = access_mask(access, coord, sizes, table)
    return f"(({inside}) ? {load_value(access.dtype, p, access_offset(access, coord, sizes, lw.index_width, table))} : 0.0f)"


def epilogue_value(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, m: str, n: str,
                   acc: str, names: dict[Load, str] | None = None, expr: Expr | None = None) -> str:
    """The C float expression of the epilogue (or of `expr`, an extra output's value) at output (m, n),
    the accumulator being `acc`; the epilogue's own loads read zero outside their tensors, or are the
    variables `names` gives them (`habu.emit_cuda.emit_epilogue_pairs.pair_operands` declares those)."""
    table = table_reader(sig, model, it)
    coord = {"m": m, "n": n}

    def leaf(ld: Load) -> str:
        if ld.tensor == ACC:
            return acc
        if names is not None:
            return names[ld]
        return epilogue_load(lw, sig, sizes, table, coord, next(a for x, a in lw.epi_loads if x == ld))

    return float_expr(lw.epilogue if expr is None else expr, leaf, sizes, names=condition_names(m, n, lw.batch_axes))


def second_of(lw: ContractionLowering, m: str, n: str) -> tuple[str, str]:
    """The printed (m, n) of the second element of the epilogue's pair whose first is (m, n): a fragment's
    column pair, or a cluster split's reduced pair as its lowering says (`ClusterSplitReduction.second`)."""
    if lw.reduction is None:
        return m, f"({n} + 1)"
    row, col = lw.reduction.second(CExpr(m), CExpr(n))
    return c(row), c(col)


def epilogue_pair_code(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, m: str, n: str,
                       acc0: str, acc1: str) -> str:
    """The epilogue for the adjacent outputs (m, n) and its pair's second element (`second_of`: (m, n+1), or
    (m+1, n) where a cluster split's pairs run along m): one 8-byte (f32) or 4-byte (16-bit) store when both
    are inside and the pair is aligned, the element-wise store otherwise."""
    out = lw.out
    m1, n1 = second_of(lw, m, n)
    if not lw.epilogue_pairs:
        return (epilogue_code(lw, sig, model, sizes, it, m, n, acc0) + "\n" +
                epilogue_code(lw, sig, model, sizes, it, m1, n1, acc1))
    table = table_reader(sig, model, it)

    def value(row: str, col: str, acc: str) -> str:
        return epilogue_value(lw, sig, model, sizes, it, row, col, acc)

    extras = "".join("\n            " + extra_pair_store(lw, sig, model, sizes, it, m, n, acc0, acc1, expr, access)
                     for expr, access in lw.extra_outs)
    p = sig.pointer(out.tensor, out.dtype, writes=True)
    off = access_offset(out, {"m": m, "n": n}, sizes, lw.index_width, table)
    both = access_mask(out, {"m": m1, "n": n1}, sizes, table)
    if lw.atomic_store:  # a scatter-add: the pair as one vector reduction, or element by element
        vstore = f"habu::atomic_add_f2({p} + off, v0, v1);"
    elif out.dtype == "f32":
        vstore = f"*reinterpret_cast<float2*>({p} + off) = make_float2(v0, v1);"
    else:
        pack = "habu::pack_bf16x2" if out.dtype == "bf16" else "habu::pack_f16x2"
        vstore = f"*reinterpret_cast<habu::u32*>({p} + off) = {pack}(v0, v1);"
    single0, single1 = ((f"habu::atomic_add_f({p} + off, v0);", f"habu::atomic_add_f({p} + off + 1, v1);")
                        if lw.atomic_store else (store_value(out.dtype, p, "off", "v0"), store_value(out.dtype, p, "off + 1", "v1")))
    first = access_mask(out, {"m": m, "n": n}, sizes, table)
    if out.checks:  # a scatter's row is read from its index tensor only where the row is inside
        off = f"({first}) ? ({off}) : ({it})0"
    return f"""{{
              const {it} off = {off};
              const float v0 = {value(m, n, acc0)};
              const float v1 = {value(m1, n1, acc1)};
              if (({both}) && (off & 1) == 0) {{ {vstore} }}
              else {{
                if ({first}) {{ {single0} }}
                if ({both}) {{ {single1} }}
              }}
            }}{extras}"""


def emit_fma(name: str, model: Model, lw: ContractionLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    if fma_thread_grid(k) is None:
        raise ValueError(f"tile {k.tile_m}x{k.tile_n} does not divide over {32 * k.warps} threads")
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    layout = lowering_smem(lw)
    bm, bn, bk = lw.bm, lw.bn, lw.bk
    ops = lw.operands  # the stage tiles, copies, reads and thread grid: habu/lower/layouts.py
    assert isinstance(ops, FmaOperands), "the fma lowering holds its shared-memory operand maps"
    g = ops.grid
    threads = ops.threads  # the block: the copies stride by it, the thread grid spreads it
    tm_per, tn_per = g.per_thread_m, g.per_thread_n  # each thread's register tile

    def tile_load(side: str, row_axis: str) -> str:
        access = lw.a if side == "A" else lw.b
        copy = ops.a_copy if side == "A" else ops.b_copy  # the store map
        p = sig.pointer(access.tensor, access.dtype)
        coord = {row_axis: "r", "k": "kk"}
        # walk the tile so that consecutive threads touch consecutive addresses
        row, col = copy.element(*copy.along(CExpr("e")))
        value = load_value(access.dtype, p, access_offset(access, coord, sizes, lw.index_width, table))
        return f"""      for (int e = tid; e < {copy.count}; e += {threads}) {{
        const int i = {c(row)}; const int kx = {c(col)};
        const {it} r = {row_axis}0 + i;
        const {it} kk = k0 + kx;
        float v = 0.0f;
        if ({access_mask(access, coord, sizes, table)}) v = {value};
        s{side}[{c(copy.index(CExpr("i"), CExpr("kx")))}] = v;
      }}
"""

    def terms(values) -> str:
        return " + ".join(c(v) if isinstance(v, CExpr) else str(v) for v in values)

    loop = "for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x)"
    body = f"""extern "C" __global__ void __launch_bounds__({threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  extern __shared__ __align__(16) unsigned char smem[];
  float* sA = reinterpret_cast<float*>(smem + {ops.a_offset});  // [BK][BM+1]
  float* sB = reinterpret_cast<float*>(smem + {ops.b_offset});  // [BK][BN+1]
  const int tid = threadIdx.x;
  const int tx = {c(g.tx(CExpr("tid")))};
  const int ty = {c(g.ty(CExpr("tid")))};
  const long long tiles = {c(lw.tiles(sizes))};
  {loop} {{
{tile_setup(lw, sizes, it)}    float acc[{tm_per}][{tn_per}];
#pragma unroll
    for (int i = 0; i < {tm_per}; ++i)
#pragma unroll
      for (int j = 0; j < {tn_per}; ++j) acc[i][j] = 0.0f;
    for (long long kt = kt_begin; kt < kt_end; ++kt) {{
      const {it} k0 = ({it}){c(lw.k_origin(CExpr('kt_begin'), CExpr('(kt - kt_begin)')))};
{tile_load("A", "m")}{tile_load("B", "n")}      __syncthreads();
#pragma unroll 4
      for (int kx = 0; kx < {ops.bk}; ++kx) {{
        float a[{tm_per}], b[{tn_per}];
#pragma unroll
        for (int i = 0; i < {tm_per}; ++i) a[i] = sA[{c(ops.a_index(CExpr("kx"), CExpr("ty"), CExpr("i")))}];
#pragma unroll
        for (int j = 0; j < {tn_per}; ++j) b[j] = sB[{c(ops.b_index(CExpr("kx"), CExpr("tx"), CExpr("j")))}];
#pragma unroll
        for (int i = 0; i < {tm_per}; ++i)
#pragma unroll
          for (int j = 0; j < {tn_per}; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }}
      __syncthreads();
    }}
#pragma unroll
    for (int i = 0; i < {tm_per}; ++i)
#pragma unroll
      for (int j = 0; j < {tn_per}; ++j) {{
        const {it} m = m0 + {terms(g.row_terms(CExpr("ty"), CExpr("i")))};
        const {it} n = n0 + {terms(g.col_terms(CExpr("tx"), CExpr("j")))};
        {epilogue_code(lw, sig, model, sizes, it, "m", "n", "acc[i][j]")}
      }}
  }}
}}
"""
    # the A/B loaders may be emitted before the epilogue registers its pointers: declare last
    src = header(f"{name}: SIMT contraction {bm}x{bn}x{bk}, {threads} threads, {tm_per}x{tn_per} outputs each",
                 [f"computes {', '.join(k.nodes)}; split_k={k.split_k}, index width {lw.index_width}"])
    src += body.replace("SIGNATURE", sig.declaration())
    zero = (lw.out.tensor,) if lw.zeroed_output else ()  # a scatter-add keeps its prior contents
    return CudaKernel(name, src, tuple(sig.params), threads, layout.total, lw, zero)


def extra_pair_store(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, m: str, n: str,
                     acc0: str, acc1: str, expr: Expr, access: Access, names: tuple[dict[Load, str], dict[Load, str]]
                     | None = None) -> str:
    """An extra output's (`ContractionLowering.extra_outs`) adjacent elements (m, n) and (m, n+1), stored
    directly from the registers, its value `expr`: one vector where `pair_store` allows it, both inside
    and the pair's offset even, element by element otherwise (each under its own mask). The TMA-store
    epilogue stores its extra outputs this way too (`names`: the variables its loads are declared in)."""
    table = table_reader(sig, model, it)
    p = sig.pointer(access.tensor, access.dtype, writes=True)
    m1, n1 = second_of(lw, m, n)
    x0 = epilogue_value(lw, sig, model, sizes, it, m, n, acc0, names[0] if names else None, expr)
    x1 = epilogue_value(lw, sig, model, sizes, it, m1, n1, acc1, names[1] if names else None, expr)
    first = access_mask(access, {"m": m, "n": n}, sizes, table)
    both = access_mask(access, {"m": m1, "n": n1}, sizes, table)
    single0, single1 = store_value(access.dtype, p, "off", "x0"), store_value(access.dtype, p, "off + 1", "x1")
    if not lw.pair_store(access):
        off1 = access_offset(access, {"m": m1, "n": n1}, sizes, lw.index_width, table)
        single1 = store_value(access.dtype, p, off1, "x1")
        vector = ""
    elif access.dtype == "f32":
        vector = f"if (({both}) && (off & 1) == 0) {{ *reinterpret_cast<float2*>({p} + off) = make_float2(x0, x1); }}\n              else "
    else:
        pack = "habu::pack_bf16x2" if access.dtype == "bf16" else "habu::pack_f16x2"
        vector = (f"if (({both}) && (off & 1) == 0) {{ *reinterpret_cast<habu::u32*>({p} + off) = {pack}(x0, x1); }}"
                  "\n              else ")
    return f"""{{  // {access.tensor}, an extra output of the chain
              const {it} off = {access_offset(access, {"m": m, "n": n}, sizes, lw.index_width, table)};
              const float x0 = {x0};
              const float x1 = {x1};
              {vector}{{
                if ({first}) {{ {single0} }}
                if ({both}) {{ {single1} }}
              }}
            }}"""


__all__ = ["CTYPE", "emit_fma", "epilogue_code", "extra_pair_store", "tile_setup"]


# ----------------------------------------------------------------------------- the contraction kind's launch
# (shared by the fma, mma.sync and wgmma emitters)


def _contraction_formula(lw: ContractionLowering, s, slots) -> tuple[object, str, str]:
    tiles = lw.tiles(s)
    if lw.kernel.persistent:  # the blocks resident at once, whole clusters
        cl = lw.kernel.cluster_m
        return cmax(cl, cmin(tiles, slots) // cl * cl), "1", "1"
    return tiles, "1", "1"


def _contraction_slots(lw: ContractionLowering, cluster: int) -> str | None:
    if not lw.kernel.persistent:
        return None
    return "clusters" if cluster > 1 else "sm_count"  # cuOccupancyMaxActiveClusters x cluster size


register_geometry(ContractionLowering, LaunchGeometry(
    blocks=lambda lw, sizes, slots: (int(lw.grid(sizes, slots)), 1, 1),
    formula=_contraction_formula, slots=_contraction_slots))
