"""Transposed operands on the mma.sync path, on the GPU: an A stored [k m] (m-contiguous) is staged as
stored and read by ldmatrix.x4.trans (habu/lower/layouts.py `ldmatrix_read`), beside a B stored [k n]
(ldmatrix.x2.trans) or [n k] (plain), batched and not, moved by cp.async or ldg, with tails in every
dimension. Each plan passes the exact differential check (habu.timing.exact_gpu: small-integer
inputs, red-zoned buffers, every element bit for bit). `CASES` is also what the CPU test
(tests/lower/test_transposed_operands.py) proves and prints."""

from __future__ import annotations

import pytest

AT_BT = """200 EXTENT: #M  136 EXTENT: #N  {K} EXTENT: #K
bf16 TENSOR: A ( #K #M )  bf16 TENSOR: B ( #K #N )  f32 TENSOR: O ( #M #N )
MODEL: AT  O[m n] = Σ k A[k m] · B[k n] ;
"""
AT_B = """200 EXTENT: #M  136 EXTENT: #N  72 EXTENT: #K
f16 TENSOR: A ( #K #M )  f16 TENSOR: B ( #N #K )  f32 TENSOR: O ( #M #N )
MODEL: AT  O[m n] = Σ k A[k m] · B[n k] ;
"""
PV_T = """3 EXTENT: #B  130 EXTENT: #I  128 EXTENT: #D  136 EXTENT: #J
bf16 TENSOR: P ( #B #J #I )  bf16 TENSOR: V ( #B #J #D )  bf16 TENSOR: O ( #B #I #D )
MODEL: PV-T  O[b i d] = Σ j P[b j i] · V[b j d] ;
"""
ODD_M = """2 EXTENT: #B  203 EXTENT: #M  72 EXTENT: #N  40 EXTENT: #K
bf16 TENSOR: A ( #B #K #M )  bf16 TENSOR: B ( #B #N #K )  f32 TENSOR: O ( #B #M #N )
MODEL: AT  O[b m n] = Σ k A[b k m] · B[b n k] ;
"""
MMA = {"mma": "mma.sync"}

# name: (model text, model name, pins)
CASES: dict[str, tuple[str, str, dict[str, str]]] = {
    "at-bt-k72": (AT_BT.format(K=72), "AT", MMA),
    "at-bt-k512-64x128x64": (AT_BT.format(K=512), "AT", {**MMA, "tile": "64x128x64", "split_k": "1"}),
    "at-b-f16": (AT_B, "AT", MMA),
    "at-bt-a-ldg": (AT_BT.format(K=72), "AT", {**MMA, "A": "ldg"}),
    "pv-transposed-batched": (PV_T, "PV-T", MMA),
    "odd-m-batched": (ODD_M, "AT", MMA),  # 203 rows: A's rows not 16-byte multiples, copied one element at a time
    "at-bt-split2": (AT_BT.format(K=512), "AT", {**MMA, "split_k": "2"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_an_m_major_a_on_mma_sync_passes_the_exact_check(tmp_path, case):
    torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
    if not torch.cuda.is_available():  # pragma: no cover - CPU machines
        pytest.skip("no CUDA device: GPU tests run on the device machine")
    from habu.bench.run import build
    from habu.timing.exact import kept_types
    from habu.timing.exact_gpu import ExactChecker

    text, name, pins = CASES[case]
    path = tmp_path / "transposed.habu"
    path.write_text(text)
    built = build(str(path), name, {}, pins)
    (kernel,) = built.plan.kernels
    assert kernel.mma == "mma.sync", built.plan.kernels
    sources = [k.source for _, emitted in built.compiled.kernel_set.members for k in emitted.kernels]
    assert any("ldmatrix_x4_trans" in s for s in sources), "A is not read transposed"
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
