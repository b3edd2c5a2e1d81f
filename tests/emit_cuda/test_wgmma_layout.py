"""The wgmma emitter prints the shared-memory layout of the lowering (`lowering_smem`: B's layout as the
lowering reads it), not a layout of its own."""

from __future__ import annotations

from habu.bench.mutants import EXAMPLES, FF, FF_PINS
from habu.emit_cuda.emit_wgmma import emit_wgmma
from habu.lower import lower_plan
from habu.lower.support import lowering_smem
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS


def test_the_wgmma_kernel_lays_out_an_n_contiguous_b_as_the_lowering_does():
    """emit_wgmma computed its layout as if B were k-contiguous (`contraction_smem` without B's layout)
    while the rules and the operand maps used B's own (`b_kmajor`); the sizes agree today, so this
    checks that the printed offsets and the declared size are the lowering's."""
    model = load_program(EXAMPLES / "ffn_skip.habu").models["FFN-SKIP"].with_sizes(FF)
    plan = default_plan(model, TARGETS["sm_90a"], FF, FF_PINS)
    lw = next(x for x in lower_plan(model, plan) if getattr(x.kernel, "mma", None) == "wgmma" and not x.b_kmajor)
    layout = lowering_smem(lw)
    kernel = emit_wgmma("k", model, lw, dict(FF))
    assert kernel.smem == layout.total
    off = {b.name: b.offset for b in layout.buffers}
    stride = off["A1"] - off["A0"]
    assert (f"stage s: A at smem_base + {off['A0']} + s * {stride}, B at smem_base + {off['B0']} + s * {stride}"
            in kernel.source)
