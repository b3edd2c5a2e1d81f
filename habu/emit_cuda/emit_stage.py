"""Staging passes: copy an operand's rows (gathered, when the model gathers them) into a buffer
whose rows start 16 bytes apart, so the contraction can load it with TMA whatever #K is."""

from __future__ import annotations

from habu.emit_cuda.common import Signature, access_mask, access_offset, header, index_type
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.contraction import StageLowering
from habu.spec.ir import Model


def emit_stage(name: str, model: Model, stage: StageLowering, width: int, static: dict[str, int]) -> CudaKernel:
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(width)
    axis = stage.dst.positions[0].axis
    coord = {axis: "row", "k": "kk"}
    table = table_reader(sig, model, it)
    src = sig.pointer(stage.src.tensor, stage.src.dtype)
    dst = sig.pointer(stage.dst.tensor, stage.dst.dtype, writes=True)
    sizes[stage.k]
    body = f"""extern "C" __global__ void __launch_bounds__({stage.threads}) {name}(SIGNATURE) {{
  // grid: x over k in blocks of {stage.threads}, y over rows
  const {it} row = ({it})blockIdx.y;
  const {it} kk = ({it})blockIdx.x * {stage.threads} + threadIdx.x;
  if ({access_mask(stage.src, coord, sizes)} && {access_mask(stage.dst, coord, sizes)}) {{
    {dst}[{access_offset(stage.dst, coord, sizes, width, table)}] = {src}[{access_offset(stage.src, coord, sizes, width, table)}];
  }}
}}
"""
    src_text = header(f"{name}: staging pass for {stage.src.tensor}",
                      [f"{stage.dst.tensor}[row, k] = {stage.src.tensor} as the contraction reads it, rows padded "
                       "to 16 bytes"])
    src_text += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src_text, tuple(sig.params), stage.threads, 0, stage)
