"""The tensor-core probe's source: it compiles for sm_90a and keeps its accumulators in registers."""

from __future__ import annotations

from habu.bench.mma_ceiling import STAGE_BYTES, STAGES, probe_source, shared_bytes, tile_count
from habu.emit_cuda.nvrtc import compile_cuda


def test_the_probe_compiles_without_local_memory():
    """Regression: reading the accumulator at a thread-dependent index put all 128 of them on the
    stack (512 bytes), and wgmma's operands would have been copied through local memory."""
    cubin = compile_cuda(probe_source(), "habu_mma_ceiling", "sm_90a")
    assert cubin.resources.registers > 128 and not cubin.resources.spills
    assert cubin.resources.stack == 0


def test_the_probe_walks_the_tiles_of_the_gemm_it_stands_for():
    assert tile_count(4096, 4096) == 512 and tile_count(4097, 4096) == 528
    assert shared_bytes() == STAGES * STAGE_BYTES + 1024 <= 227 * 1024
