"""Map kernels: each lane computes `vector` consecutive elements of the output, in row-major order.

The lane's first element is printed from the lowering's lane map (`MapLowering.lanes`,
habu/lower/lanes.py), which the finite-field interpreter runs lane by lane; its guard is every
access's mask.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
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
from habu.emit_cuda.geometry import FLAT_GRID, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower import MapLowering
from habu.lower.rows import inline_region
from habu.spec.ir import Load, Model


def emit_map(name: str, model: Model, lw: MapLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    loads = dict(lw.loads)
    defs = {eq.target: eq for eq in lw.nodes[:-1]}
    final = lw.nodes[-1]
    expr = inline_region(final.rhs, defs)
    # the flat index's decode, a line a step (the lowering's `decode`, which the interpreter executes)
    coord_lines = [f"const {it} {target} = {source};" if op == "=" else
                   f"const {it} {target} = {source} {op} ({it}){c(sizes[extent])};"
                   for target, source, op, extent in lw.decode()]
    coord = {f"e{i}": f"e{i}" for i in range(len(lw.extents))}

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
    lanes = lw.lanes
    body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  const {it} first = {c(lanes.first(CExpr(f"({it})blockIdx.x"), CExpr("threadIdx.x")))};
#pragma unroll
  for (int v_ = 0; v_ < {lanes.vector}; ++v_) {{
    const {it} e = {c(lanes.element(CExpr("first"), CExpr("v_")))};
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


__all__ = ["emit_map"]


register_geometry(MapLowering, FLAT_GRID)
