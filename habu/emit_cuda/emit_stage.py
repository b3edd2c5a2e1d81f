"""Staging passes: copy an operand's rows (gathered, when the model gathers them) into a buffer
whose rows start 16 bytes apart, so the contraction can load it with TMA whatever #K is."""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import (
    CTYPE,
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    header,
    index_type,
)
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.geometry import Grid, LaunchGeometry, cmax, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.staging import StageLowering
from habu.spec.ir import Model


def emit_stage(name: str, model: Model, stage: StageLowering, width: int, static: dict[str, int]) -> CudaKernel:
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(width)
    axis = stage.row_axis
    coord = {axis: "row", "k": "kk"}
    table = table_reader(sig, model, it)
    src = sig.pointer(stage.src.tensor, stage.src.dtype)
    dst = sig.pointer(stage.dst.tensor, stage.dst.dtype, writes=True)
    if stage.tile:
        body = _tiled(name, stage, sizes, it, width, table, src, dst, coord)
    else:
        body = _rows(name, stage, sizes, it, width, table, src, dst, coord)
    body = body.replace("BATCH\n", _batch_setup(stage, sizes, it))
    rows = "batch..., row, k" if stage.batch else "row, k"
    src_text = header(f"{name}: staging pass for {stage.src.tensor}",
                      [f"{stage.dst.tensor}[{rows}] = {stage.src.tensor} as the contraction reads it, rows padded "
                       "to 16 bytes"])
    src_text += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src_text, tuple(sig.params), stage.threads, 0, stage)


def _tiled(name: str, stage: StageLowering, sizes, it: str, width: int, table, src: str, dst: str, coord) -> str:
    """A T x T tile through shared memory: the loads run along the rows (src's contiguous
    dimension), the stores along k; each element's mask and offsets are the lowering's (a padding
    element, k ≥ #K, is a zero)."""
    t = stage.tile
    step = stage.threads // t
    stored = access_mask(stage.dst, coord, sizes, table)
    zero = f"({CTYPE[stage.src.dtype]})0.0f"
    return f"""extern "C" __global__ void __launch_bounds__({stage.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  // grid: x over k in tiles of {t}, y over rows in tiles of {t}; a padded tile avoids bank conflicts
BATCH
  __shared__ {CTYPE[stage.src.dtype]} tile[{t}][{t + 1}];
  const int tx = threadIdx.x % {t}, ty = threadIdx.x / {t};
  const {it} k0 = ({it})blockIdx.x * {t}, r0 = ({it})blockIdx.y * {t};
  #pragma unroll
  for (int j = 0; j < {t}; j += {step}) {{
    const {it} row = r0 + tx, kk = k0 + ty + j;
    if ({stored}) tile[ty + j][tx] = ({access_mask(stage.src, coord, sizes, table)}) ? {src}[{access_offset(stage.src, coord, sizes, width, table)}] : {zero};
  }}
  __syncthreads();
  #pragma unroll
  for (int j = 0; j < {t}; j += {step}) {{
    const {it} row = r0 + ty + j, kk = k0 + tx;
    if ({stored}) {dst}[{access_offset(stage.dst, coord, sizes, width, table)}] = tile[tx][ty + j];
  }}
}}
"""


def _rows(name: str, stage: StageLowering, sizes, it: str, width: int, table, src: str, dst: str, coord) -> str:
    zero = f"({CTYPE[stage.src.dtype]})0.0f"
    return f"""extern "C" __global__ void __launch_bounds__({stage.threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  // grid: x over k in blocks of {stage.threads} (the padded row), y over rows
BATCH
  const {it} row = ({it})blockIdx.y;
  const {it} kk = ({it})blockIdx.x * {stage.threads} + threadIdx.x;
  if ({access_mask(stage.dst, coord, sizes, table)}) {{  // the padding past #K: zeros
    {dst}[{access_offset(stage.dst, coord, sizes, width, table)}] = ({access_mask(stage.src, coord, sizes, table)}) ? {src}[{access_offset(stage.src, coord, sizes, width, table)}] : {zero};
  }}
}}
"""


def _batch_setup(stage: StageLowering, sizes, it: str) -> str:
    """A batched pass's batch coordinates from blockIdx.z, named by their axes (the accesses read them by name):
    the lowering's `batch_coordinates`."""
    if not stage.batch:
        return ""
    lines: list[str] = []

    def let(name: str, value):
        lines.append(f"const long long {name} = {c(value)};")
        return CExpr(name)

    coords = stage.batch_coordinates(let("batch", CExpr("(long long)blockIdx.z")), sizes, let)
    lines += [f"const {it} {axis} = ({it})({c(value)});" for axis, value in coords.items()]
    head = f"  // grid.z over the batches ({', '.join(a for a, _ in stage.batch)})\n"
    return head + "".join(f"  {ln}\n" for ln in lines)


def _blocks(stage: StageLowering, sizes, slots: int) -> tuple[int, int, int]:
    x, y = stage.grid(sizes)
    return max(1, int(x)), max(1, int(y)), max(1, int(stage.batches(sizes)))


def _formula(stage: StageLowering, s, slots: CExpr) -> Grid:
    x, y = stage.grid(s)
    return cmax(1, x), cmax(1, y), cmax(1, stage.batches(s))


# blocks along k × along the rows × the batches (habu/lower/staging.py)
STAGE_GRID = LaunchGeometry(blocks=_blocks, formula=_formula)
register_geometry(StageLowering, STAGE_GRID)
