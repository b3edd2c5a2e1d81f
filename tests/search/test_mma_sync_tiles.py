"""The mma.sync path's default tile for small products (session 73, docs/experiments/mma_sync_tiles.py on an
H100): a short product (K ≤ `SHORT_K`) whose 128 × 128 tiles fill under half the SMs takes 64 × 64 tiles, which
are proven and compile; long or large products keep 128 × 128 with the split-K rule."""

from __future__ import annotations

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.paths.emit import emit_plan
from habu.paths.mma_sync import SHORT_K
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

GEMM = parse_text("""4096 EXTENT: #M  4096 EXTENT: #N  4096 EXTENT: #K
    bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  f32 TENSOR: O ( #M #N )
    MODEL: GEMM  O[m n] = Σ k A[m k] · B[n k] ;""").models["GEMM"]  # f32 out: split-K allowed, as measured
H100 = TARGETS["sm_90a"]  # 132 SMs; the mma.sync path pinned, as the experiment ran it
A100 = TARGETS["sm_80"]  # 108 SMs; mma.sync is its default path


def _schedule(target, side: int, k: int) -> tuple[int, int, int, int, int, int]:
    model = GEMM.with_sizes({"M": side, "N": side, "K": k})
    (kern,) = default_plan(model, target, {}, {"mma": "mma.sync"}).kernels
    return kern.tile_m, kern.tile_n, kern.tile_k, kern.warps, kern.stages, kern.split_k


def test_regression_the_mma_sync_default_left_most_sms_idle_on_small_short_products():
    """Its 128 × 128 tile gave 512² × 511 16 blocks (2 with split-K) on 132 SMs: 22.3 µs, against 17.7 for 64 × 64
    tiles split in two (H100). The measured winners are now the default; 2048² (256 tiles of 128 × 128) and a
    long K (split-K fills the SMs: 512² × 4096, 27.7 µs against 40.6 for 64 × 64) keep the wide tile."""
    assert _schedule(H100, 256, 511) == (64, 64, 32, 4, 4, 2)
    assert _schedule(H100, 512, 511) == (64, 64, 32, 4, 4, 2)
    assert _schedule(H100, 1024, 511) == (64, 64, 32, 4, 4, 1)
    assert _schedule(H100, 2048, 511)[:3] == (128, 128, 32)
    assert _schedule(H100, 512, 4096) == (128, 128, 32, 8, 3, 8)
    assert _schedule(H100, 1024, SHORT_K)[:2] == (64, 64) and _schedule(H100, 1024, SHORT_K + 1)[:2] == (128, 128)
    # half of the A100's 108 SMs is 54: 64 tiles of 128 × 128 at 1024² are enough there
    assert _schedule(A100, 512, 511)[:2] == (64, 64) and _schedule(A100, 1024, 511)[:2] == (128, 128)


@pytest.mark.parametrize("side, k", [(256, 511), (384, 1000)])
def test_the_narrow_default_is_proven_and_compiles(side, k):
    model = GEMM.with_sizes({"M": side, "N": side, "K": k})
    plan = default_plan(model, A100, {}, {})
    assert (plan.kernels[0].tile_m, plan.kernels[0].tile_n) == (64, 64)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate
    for kernel in emit_plan(model, plan, A100).kernels:
        compile_cuda(kernel.source, kernel.name, "sm_80")
