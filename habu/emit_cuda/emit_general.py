"""General kernels: one thread per output element of one equation node, each reduction a loop.

Everything index-shaped is printed from the `GeneralLowering`: the thread's element (`thread_map`),
its coordinates (`coordinates`), its guard (`lane_guard`, the output's mask), the loops' bounds
(`loop_end`) and every access's offset and mask (`Access.offset`/`Access.mask` through `CIndex`); a
load whose mask fails reads 0, as the finite-field interpreter's does. Reductions accumulate in f32.
"""

from __future__ import annotations

import re

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    CIndex,
    Signature,
    access_mask,
    access_offset,
    float_expr,
    header,
    index_type,
    load_value,
    store_value,
)
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.geometry import FLAT_GRID, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.access import Access
from habu.lower.general import GeneralLowering, Store
from habu.spec.ir import Load, Model, Reduce, walk

MAX_INIT = "(-__int_as_float(0x7f800000))"  # -infinity: the identity of max


def emit_general(name: str, model: Model, lw: GeneralLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    coord = {a: a for a in (f"e{i}" for i in range(len(lw.extents)))} | {a: a for a, _ in lw.loops}
    coord_lines = [f"  const {it} {a} = ({it})({c(v) if isinstance(v, CExpr | int) else v});"
                   for a, v in sorted(lw.coordinates(CExpr("e"), sizes).items())]
    guard = lw.lane_guard(coord, "e", sizes, CIndex(lw.index_width, table))
    body: list[str] = []
    counter = [0]

    def leaf(ld: Load) -> str:
        acc = lw.access(ld)
        p = sig.pointer(acc.tensor, acc.dtype)
        value = load_value(acc.dtype, p, access_offset(acc, coord, sizes, lw.index_width, table))
        inside = access_mask(acc, coord, sizes, table)
        return value if inside == "true" else f"(({inside}) ? {value} : 0.0f)"

    def reduce(r: Reduce, lines: list[str], depth: int) -> str:
        acc = f"acc{counter[0]}"
        counter[0] += 1
        pad = "  " * depth
        lines.append(f"{pad}float {acc} = {'0.0f' if r.op == 'sum' else MAX_INIT};")
        axes = lw.loop_axes(r)
        for j, axis in enumerate(axes):
            lines.append(f"{pad}{'  ' * j}for ({it} {axis} = 0; {axis} < {c(lw.loop_end(axis, sizes))}; ++{axis}) {{")
        inner_depth = depth + len(axes)
        inner: list[str] = []
        value = float_expr(r.body, leaf, sizes, lambda x: reduce(x, inner, inner_depth), table)
        lines.extend(inner)
        ipad = "  " * inner_depth
        lines.append(f"{ipad}{acc} += {value};" if r.op == "sum" else f"{ipad}{acc} = fmaxf({acc}, {value});")
        for j in reversed(range(len(axes))):
            lines.append(f"{pad}{'  ' * j}}}")
        return acc

    if lw.vector > 1:
        return _emit_vector(name, model, lw, sig, sizes, it, table, coord, coord_lines, guard)
    value = float_expr(lw.node.rhs, leaf, sizes, lambda r: reduce(r, body, 2), table)
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    out_off = access_offset(out, coord, sizes, lw.index_width, table)
    if lw.store is Store.ATOMIC_ADD:  # a scatter: threads whose indices repeat add into one element
        assert out.dtype == "f32", "the scatter-accumulates rule allows f32 targets only"
        store = f"atomicAdd({p_out} + ({out_off}), {value});"
    else:
        store = store_value(out.dtype, p_out, out_off, value)
    loops = ", ".join(f"{a} < #{e}" for a, e in lw.loops) or "none"
    n = lw.thread_map.per_thread
    element = _sum_of_product(lw.thread_map.element(_piece(lw, it), CExpr("threadIdx.x"), CExpr("v")))
    if n == 1:
        src_body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  const {it} e = {element};  // this thread's output element
{chr(10).join(coord_lines)}
  if (!({guard})) return;  // the output's mask: threads past the last element compute nothing
  {{
{chr(10).join(body)}
    {store}
  }}
}}
"""
    else:  # several elements, a coalesced sweep of the block each (their loads in flight together once unrolled)
        src_body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}#pragma unroll
  for (int v = 0; v < {n}; ++v) {{
  const {it} e = {element};  // this thread's output element v
{chr(10).join(coord_lines)}
  if (!({guard})) continue;  // the output's mask: elements past the last one compute nothing
  {{
{chr(10).join(body)}
    {store}
  }}
  }}
}}
"""
    each = "one output element each" if n == 1 else f"{n} output elements each, {k.threads} apart"
    src = header(f"{name}: general, {k.threads} threads, {each}",
                 [f"computes {', '.join(k.nodes)}", f"reduction loops: {loops}"] +
                 ([f"scatter: adds into {out.tensor} with atomicAdd (its prior contents are kept)"]
                  if lw.store is Store.ATOMIC_ADD else []))
    src += src_body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), k.threads, 0, lw)


def _emit_vector(name: str, model: Model, lw: GeneralLowering, sig: Signature, sizes: dict, it: str, table,
                 coord: dict[str, str], coord_lines: list[str], guard: str) -> CudaKernel:
    """`vector` consecutive elements a thread each sweep (`vector_refusal`): each contiguous access one vector
    load or store at the offset and under the mask of the vector's first element (the `vector-align` rule: the
    vector stays in its row, so element j's is the first's + j); an access independent of the last axis read
    once; each reduction one loop for the whole vector into `vector` f32 accumulators, the accesses that read
    its loop axes inside it; the node's value for each element j; a scatter's adds one vector reduction
    (`habu::red_add_vec`)."""
    k, n = lw.kernel, lw.vector
    assert lw.vector_refusal() is None, lw.vector_refusal()
    lines: list[str] = []
    names: dict[Load, str] = {}
    loop_axes = {a for a, _ in lw.loops}

    def load_lines(picked: list[tuple[int, Load, Access]], pad: str) -> list[str]:
        out = []
        for i, ld, acc in picked:
            p = sig.pointer(acc.tensor, acc.dtype)
            off = access_offset(acc, coord, sizes, lw.index_width, table)
            inside = access_mask(acc, coord, sizes, table)
            names[ld] = f"x{i}"
            if lw.contiguous(acc):
                out.append(f"{pad}float x{i}[{n}];")
                out.append(f"{pad}habu::load_vec<{n}>({p} + ({off}), x{i}, {inside});")
            else:
                value = load_value(acc.dtype, p, off)
                out.append(f"{pad}const float x{i} = {value if inside == 'true' else f'(({inside}) ? {value} : 0.0f)'};")
        return out

    def looped(acc: Access) -> bool:
        return any(p.kind != "const" and p.axis in loop_axes for p in acc.positions)

    def leaf_at(j: int):
        def leaf(ld: Load) -> str:
            return f"{names[ld]}[{j}]" if lw.contiguous(lw.access(ld)) else names[ld]
        return leaf

    def lane(j: int) -> dict[str, str]:
        # element j's coordinates (the lowering's `lane_coordinates`): what a condition on the indices reads
        return {a: c(x) for a, x in lw.lane_coordinates({a: CExpr(a) for a in coord}, j).items()}

    indexed = [(i, ld, acc) for i, (ld, acc) in enumerate(lw.loads)]
    lines += load_lines([t for t in indexed if not looped(t[2])], "    ")
    accumulators: dict[Reduce, str] = {}
    for r_i, r in enumerate(lw.reductions()):
        accumulators[r] = acc = f"acc{r_i}"
        lines.append(f"    float {acc}[{n}];")
        lines.append(f"    for (int j = 0; j < {n}; ++j) {acc}[j] = {'0.0f' if r.op == 'sum' else MAX_INIT};")
        axes = lw.loop_axes(r)
        for d, axis in enumerate(axes):
            lines.append(f"    {'  ' * d}for ({it} {axis} = 0; {axis} < {c(lw.loop_end(axis, sizes))}; ++{axis}) {{")
        pad = "    " + "  " * len(axes)
        inner = {x for x in walk(r.body) if isinstance(x, Load)}
        lines += load_lines([t for t in indexed if looped(t[2]) and t[1] in inner], pad)
        for j in range(n):
            value = float_expr(r.body, leaf_at(j), sizes, _no_reduction, table, lane(j))
            lines.append(f"{pad}{acc}[{j}] += {value};" if r.op == "sum" else f"{pad}{acc}[{j}] = fmaxf({acc}[{j}], {value});")
        for d in reversed(range(len(axes))):
            lines.append(f"    {'  ' * d}}}")
    lines.append(f"    float y[{n}];")
    for j in range(n):
        def reduced(r: Reduce, j: int = j) -> str:
            return f"{accumulators[r]}[{j}]"
        lines.append(f"    y[{j}] = {float_expr(lw.node.rhs, leaf_at(j), sizes, reduced, table, lane(j))};")
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    out_off = access_offset(out, coord, sizes, lw.index_width, table)
    if lw.store is Store.ATOMIC_ADD:
        assert out.dtype == "f32", "the scatter-accumulates rule allows f32 targets only"
        lines.append(f"    habu::red_add_vec<{n}>({p_out} + ({out_off}), y);")
    else:
        lines.append(f"    habu::store_vec<{n}>({p_out} + ({out_off}), y);")
    element = c(lw.thread_map.element(_piece(lw, it), CExpr("threadIdx.x"), CExpr("v")))
    sweeps = lw.thread_map.per_thread
    src_body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}#pragma unroll
  for (int v = 0; v < {sweeps}; ++v) {{
  const {it} e = {element};  // the first of this thread's {n} consecutive output elements of sweep v
{chr(10).join(coord_lines)}
  if (!({guard})) continue;  // the output's mask at the first element (#{lw.extents[-1]} a multiple of {n})
  {{
{chr(10).join(lines)}
  }}
  }}
}}
"""
    loops = ", ".join(f"{a} < #{e}" for a, e in lw.loops) or "none"
    src = header(f"{name}: general, {k.threads} threads, {sweeps} sweep(s) of {n} consecutive output elements each",
                 [f"computes {', '.join(k.nodes)}", f"reduction loops: {loops}"] +
                 ([f"scatter: adds into {out.tensor} with vector reductions (its prior contents are kept)"]
                  if lw.store is Store.ATOMIC_ADD else []))
    src += src_body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), k.threads, 0, lw)


def _piece(lw: GeneralLowering, it: str) -> CExpr:
    """The piece of the output this block takes, from the thread map (`reverse`: from the last)."""
    return lw.thread_map.piece(CExpr(f"({it})blockIdx.x"), CExpr(f"({it})gridDim.x"))


def _no_reduction(r: Reduce) -> str:
    raise AssertionError("a general kernel moving vectors has no reduction inside another (vector_refusal)")


def _sum_of_product(x: CExpr) -> str:
    """`((a * b) + c)` printed as `a * b + c` (the precedence C gives it), as the kernel has always read;
    another expression as it is."""
    m = re.fullmatch(r"\(\((.+) \* (\w+)\) \+ ([\w.]+)\)", c(x))
    return c(x) if m is None else f"{m[1]} * {m[2]} + {m[3]}"


register_geometry(GeneralLowering, FLAT_GRID)
