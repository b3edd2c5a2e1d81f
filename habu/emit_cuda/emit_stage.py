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
    table = table_reader(sig, model, it)
    src = sig.pointer(stage.src.tensor, stage.src.dtype)
    dst = sig.pointer(stage.dst.tensor, stage.dst.dtype, writes=True)
    setup = _origin(stage, sizes, it)
    body = _tiled(stage, sizes, it, width, table, src, dst) if stage.tile else _rows(stage, sizes, it, width, table,
                                                                                        src, dst)
    rows = "batch..., row, k" if stage.batch else "row, k"
    src_text = header(f"{name}: staging pass for {stage.src.tensor}",
                      [f"{stage.dst.tensor}[{rows}] = {stage.src.tensor} as the contraction reads it, rows padded "
                       "to 16 bytes"])
    src_text += f"""extern "C" __global__ void __launch_bounds__({stage.threads}) {name}({sig.declaration()}) {{
{GRID_LAUNCH}{GRID_WAIT}{setup}{body}}}
"""
    return CudaKernel(name, src_text, tuple(sig.params), stage.threads, 0, stage)


# the C names of the pass's coordinates: the buffer's row axis and k (the batch axes are read at their own names)
def _names(stage: StageLowering) -> dict[str, str]:
    return {stage.row_axis: "row", "k": "kk", **{a: a for a, _e in stage.batch}}


def _origin(stage: StageLowering, sizes, it: str) -> str:
    """The block's first element (`StageLowering.origin`): `row_0`, `kk_0` and each batch axis's `<axis>_0`,
    grid.z decoded into the batch axes (the lowering's `batch_coordinates`)."""
    lines: list[str] = []

    def let(name: str, value):
        lines.append(f"const long long {name} = {c(value)};")
        return CExpr(name)

    z = let("batch", CExpr("(long long)blockIdx.z")) if stage.batch else CExpr("0")
    origin = stage.origin(CExpr(f"({it})blockIdx.x"), CExpr(f"({it})blockIdx.y"), z, sizes, let)
    lines += [f"const {it} {_names(stage)[axis]}_0 = ({it})({c(value)});" for axis, value in origin.items()]
    slabs = f", z over the batches ({', '.join(stage.batch_slabs())})" if stage.batch else ""
    head = f"  // grid: x over k in blocks of {stage.step_k}, y over the rows in blocks of {stage.step_rows}{slabs}\n"
    return head + "".join(f"  {ln}\n" for ln in lines)


def _element(stage: StageLowering, it: str, c_off, k_off) -> str:
    """The declarations of an element's coordinates (`StageLowering.element`) from the block's origin."""
    names = _names(stage)
    at = stage.element({axis: CExpr(f"{n}_0") for axis, n in names.items()}, c_off, k_off)
    return " ".join(f"const {it} {names[axis]} = {c(value)};" for axis, value in at.items())


def _tiled(stage: StageLowering, sizes, it: str, width: int, table, src: str, dst: str) -> str:
    """A tile through shared memory (`StageTile`): the loads run along the tile's axis (src's contiguous
    dimension), the stores along k; each element's mask and offsets are the lowering's (a padding element, k ≥ #K,
    is a zero)."""
    tile = stage.tile
    assert tile is not None and tile.steps(stage.threads) * stage.threads == tile.elements, (tile, stage.threads)
    coord = _names(stage)
    stored = access_mask(stage.dst, coord, sizes, table)
    e = CExpr("e")
    index = tile.element_index(CExpr("j"), CExpr("(int)threadIdx.x"), stage.threads)
    lc, lk = tile.load_lane(e)
    sc, sk = tile.store_lane(e)
    return f"""  __shared__ {CTYPE[stage.src.dtype]} tile[{tile.slots}];  // [{tile.along_k}][{tile.across} + 1] along k, then {tile.axis}
  #pragma unroll
  for (int j = 0; j < {tile.steps(stage.threads)}; ++j) {{  // loads: along {tile.axis}
    const int e = {c(index)};
    {_element(stage, it, lc, lk)}
    if ({stored}) tile[{c(tile.slot(lc, lk))}] = {_masked_read(stage, coord, sizes, width, table, src, stored)};
  }}
  __syncthreads();
  #pragma unroll
  for (int j = 0; j < {tile.steps(stage.threads)}; ++j) {{  // stores: along k
    const int e = {c(index)};
    {_element(stage, it, sc, sk)}
    if ({stored}) {dst}[{access_offset(stage.dst, coord, sizes, width, table)}] = tile[{c(tile.slot(sc, sk))}];
  }}
"""


def _masked_read(stage: StageLowering, coord: dict[str, str], sizes, width: int, table, src: str, stored: str) -> str:
    """The source element the pass copies, a zero where the source's mask is false (the padding past #K); the
    bare read where that mask is the store's own, which the read already sits under."""
    mask = access_mask(stage.src, coord, sizes, table)
    value = f"{src}[{access_offset(stage.src, coord, sizes, width, table)}]"
    return value if mask == stored else f"({mask}) ? {value} : ({CTYPE[stage.src.dtype]})0.0f"


def _rows(stage: StageLowering, sizes, it: str, width: int, table, src: str, dst: str) -> str:
    coord = _names(stage)
    stored = access_mask(stage.dst, coord, sizes, table)
    return f"""  {_element(stage, it, 0, CExpr("(int)threadIdx.x"))}
  if ({stored}) {{  // the padding past #K: zeros
    {dst}[{access_offset(stage.dst, coord, sizes, width, table)}] = {_masked_read(stage, coord, sizes, width, table, src, stored)};
  }}
"""


def _blocks(stage: StageLowering, sizes, slots: int) -> tuple[int, int, int]:
    x, y = stage.grid(sizes)
    return max(1, int(x)), max(1, int(y)), max(1, int(stage.batches(sizes)))


def _formula(stage: StageLowering, s, slots: CExpr) -> Grid:
    x, y = stage.grid(s)
    return cmax(1, x), cmax(1, y), cmax(1, stage.batches(s))


# blocks along k × along the rows × the batches (habu/lower/staging.py)
STAGE_GRID = LaunchGeometry(blocks=_blocks, formula=_formula)
register_geometry(StageLowering, STAGE_GRID)
