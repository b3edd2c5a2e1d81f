"""Row kernels (RMSNorm, softmax, layer norm and their elementwise neighbours) and map kernels.

Row kernel: one block per row. The region's nodes are inlined into one expression per column; each
reduction over the row is a pass over the columns (in chunks of threads·vector, the ragged chunk
masked) whose partials are combined across the block; the last pass computes and stores the output.
With `cache_row`, a row that is read by several passes is loaded once into shared memory.

Map kernel: each lane computes `vector` consecutive elements of the output.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import c
from habu.emit_cuda.common import (
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
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Equation, Expr, IndexVar, Load, Model, Op, Reduce, walk


def _inline(expr: Expr, defs: dict[str, Equation]) -> Expr:
    """Replace loads of region-internal tensors by their definitions (they are elementwise in c)."""
    if isinstance(expr, Load) and expr.tensor in defs:
        eq = defs[expr.tensor]
        mapping = dict(zip(eq.lhs, expr.indices, strict=True))
        return _inline(_subst_vars(eq.rhs, mapping), defs)
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(_inline(a, defs) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, _inline(expr.body, defs))
    return expr


def _subst_vars(expr: Expr, mapping: dict) -> Expr:
    if isinstance(expr, Load):
        return Load(expr.tensor, tuple(mapping.get(i, i) for i in expr.indices))
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(_subst_vars(a, mapping) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, _subst_vars(expr.body, mapping))
    return expr


def _reductions(expr: Expr) -> list[Reduce]:
    """Reductions, innermost first, each once."""
    out: list[Reduce] = []
    for x in reversed(list(walk(expr))):
        if isinstance(x, Reduce) and x not in out:
            out.append(x)
    return out


def emit_rows(name: str, model: Model, lw: RowLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    if k.rows_per_block != 1:
        raise ValueError("the row emitter handles one row per block")
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    threads, vec = k.threads, k.vector
    defs = {eq.target: eq for eq in lw.nodes[:-1]}
    final = lw.nodes[-1]
    expr = _inline(final.rhs, defs)
    loads = dict(lw.loads)
    reds = _reductions(expr)
    C = sizes[lw.c]
    # a row read by several passes: keep it in shared memory as f32 (one read of global memory)
    row_loads = [x for x in walk(expr) if isinstance(x, Load) and x in loads
                 and [p.kind for p in loads[x].positions] == ["axis", "axis"]]
    cached_tensor = row_loads[0].tensor if (k.cache_row and row_loads and len(reds) >= 1
                                           and len({x.tensor for x in row_loads}) == 1) else None

    def leaf_at(col: str):
        def leaf(ld: Load) -> str:
            acc = loads[ld]
            if cached_tensor is not None and ld.tensor == cached_tensor and \
                    [p.kind for p in acc.positions] == ["axis", "axis"]:
                return f"row_cache[{col}]"
            coord = {"r": "r", "c": col}
            p = sig.pointer(acc.tensor, acc.dtype)
            off = access_offset(acc, coord, sizes, lw.index_width, lambda t, x: "0")
            mask = access_mask(acc, coord, sizes)
            return f"(({mask}) ? {load_value(acc.dtype, p, off)} : 0.0f)"
        return leaf

    red_names = {r: f"red{i}" for i, r in enumerate(reds)}

    def render(e: Expr, col: str) -> str:
        return float_expr(e, leaf_at(col), sizes, lambda r: red_names[r])

    passes = []
    if cached_tensor is not None:
        acc = next(loads[x] for x in row_loads)
        p = sig.pointer(acc.tensor, acc.dtype)
        off = access_offset(acc, {"r": "r", "c": "col"}, sizes, lw.index_width, lambda t, x: "0")
        vec_bytes = vec * DTYPES[acc.dtype].bytes
        if vec_bytes == 16 and acc.dtype in ("bf16", "f16", "f32"):
            # one 16-byte load per lane (the rules proved #C a multiple of the vector, rows aligned)
            unpack = {"bf16": "habu::bf16_to_float(h[q])", "f16": "habu::f16_to_float(h[q])",
                      "f32": "__uint_as_float(w[q])"}[acc.dtype]
            elems = "const unsigned short* h = reinterpret_cast<const unsigned short*>(&raw);" \
                if acc.dtype != "f32" else "const unsigned int* w = reinterpret_cast<const unsigned int*>(&raw);"
            passes.append(f"""  for ({it} col = ({it})tid * {vec}; col < {c(C)}; col += {threads * vec}) {{
    const uint4 raw = habu::load16_or_zero({p} + ({off}), true);
    {elems}
#pragma unroll
    for (int q = 0; q < {vec}; ++q) row_cache[col + q] = {unpack};
  }}
  __syncthreads();""")
        else:
            passes.append(f"""  for ({it} col = tid; col < {c(C)}; col += {threads}) row_cache[col] = {load_value(acc.dtype, p, off)};
  __syncthreads();""")
    for r in reds:
        init = "0.0f" if r.op == "sum" else "-3.402823466e38f"
        combine = "+" if r.op == "sum" else "max"
        body = render(r.body, "col")
        update = "part += v;" if r.op == "sum" else "part = fmaxf(part, v);"
        block_reduce = "habu::warp_sum" if r.op == "sum" else "habu::warp_max"
        passes.append(f"""  {{  // {combine}-reduction over the row
    float part = {init};
    for ({it} base = ({it})tid * {vec}; base < {c(C)}; base += {threads * vec}) {{
#pragma unroll
      for (int v_ = 0; v_ < {vec}; ++v_) {{
        const {it} col = base + v_;
        if ({f"col < {c(C)}" if lw.reduce_mask else "true"}) {{ const float v = {body}; {update} }}
      }}
    }}
    part = {block_reduce}(part);
    if (lane == 0) scratch[warp] = part;
    __syncthreads();
    if (warp == 0) {{
      float w = lane < {threads // 32} ? scratch[lane] : {init};
      w = {block_reduce}(w);
      if (lane == 0) scratch[32] = w;
    }}
    __syncthreads();
    {red_names[r]} = scratch[32];
    __syncthreads();
  }}""")
    out = lw.out
    p_out = sig.pointer(out.tensor, out.dtype, writes=True)
    out_off = access_offset(out, {"r": "r", "c": "col"}, sizes, lw.index_width, lambda t, x: "0")
    final_value = render(expr, "col")
    out_vec_bytes = vec * DTYPES[out.dtype].bytes
    if out_vec_bytes == 16 and out.dtype in ("bf16", "f16") and cached_tensor is not None:
        pack = "habu::pack_bf16x2" if out.dtype == "bf16" else "habu::pack_f16x2"
        base_off = access_offset(out, {"r": "r", "c": "base"}, sizes, lw.index_width, lambda t, x: "0")
        final_loop = f"""  for ({it} base = ({it})tid * {vec}; base < {c(C)}; base += {threads * vec}) {{
    float y[{vec}];
#pragma unroll
    for (int v_ = 0; v_ < {vec}; ++v_) {{ const {it} col = base + v_; y[v_] = {final_value}; }}
    uint4 packed;
    packed.x = {pack}(y[0], y[1]); packed.y = {pack}(y[2], y[3]);
    packed.z = {pack}(y[4], y[5]); packed.w = {pack}(y[6], y[7]);
    *reinterpret_cast<uint4*>({p_out} + ({base_off})) = packed;
  }}"""
    else:
        final_loop = f"""  for ({it} base = ({it})tid * {vec}; base < {c(C)}; base += {threads * vec}) {{
#pragma unroll
    for (int v_ = 0; v_ < {vec}; ++v_) {{
      const {it} col = base + v_;
      if (col < {c(C)}) {store_value(out.dtype, p_out, out_off, final_value)}
    }}
  }}"""
    red_decl = "\n".join(f"  float {n} = 0.0f;" for n in red_names.values())
    body = f"""extern "C" __global__ void __launch_bounds__({threads}) {name}(SIGNATURE) {{
  extern __shared__ __align__(16) float row_cache[];
  __shared__ float scratch[33];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const {it} r = ({it})blockIdx.x;
  if (!(r < {c(sizes[lw.r])})) return;
{red_decl}
{chr(10).join(passes)}
{final_loop}
}}
"""
    src = header(f"{name}: row kernel, {threads} threads per row, {vec} elements per access",
                 [f"computes {', '.join(k.nodes)}: {len(reds)} reduction pass(es)"
                  + (f", row of {cached_tensor} cached in shared memory" if cached_tensor else "")])
    src += body.replace("SIGNATURE", sig.declaration())
    if not cached_tensor:
        return CudaKernel(name, src, tuple(sig.params), threads, 0, lw)
    if lw.c in static:
        return CudaKernel(name, src, tuple(sig.params), threads, 4 * static[lw.c], lw)
    return CudaKernel(name, src, tuple(sig.params), threads, 0, lw, smem_per=(lw.c, 4))


def emit_map(name: str, model: Model, lw: MapLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    loads = dict(lw.loads)
    defs = {eq.target: eq for eq in lw.nodes[:-1]}
    final = lw.nodes[-1]
    expr = _inline(final.rhs, defs)
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
    numel = 1
    for d in dims:
        numel = numel * d
    body = f"""extern "C" __global__ void __launch_bounds__({k.threads}) {name}(SIGNATURE) {{
  const {it} first = (({it})blockIdx.x * {k.threads} + threadIdx.x) * {k.vector};
#pragma unroll
  for (int v_ = 0; v_ < {k.vector}; ++v_) {{
    const {it} e = first + v_;
    if (!(e < ({it}){c(numel)})) break;
    {chr(10).join('    ' + ln for ln in coord_lines).strip()}
    {store_value(out.dtype, p_out, out_off, value)}
  }}
}}
"""
    src = header(f"{name}: elementwise, {k.threads} threads, {k.vector} elements per lane",
                 [f"computes {', '.join(k.nodes)}"])
    src += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), k.threads, 0, lw)


__all__ = ["IndexVar", "emit_map", "emit_rows"]
