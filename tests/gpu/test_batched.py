"""Batched contractions on the GPU: the exact differential check (habu.timing.exact_gpu: small-integer
inputs, red-zoned buffers, every element bit for bit) on bmm scores (Q·Kᵀ) and values (P·V, V n-major)
plans of every contraction path, at odd sizes with tails in every dimension and batches of 1 and 3."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402

SCORES = """{B} EXTENT: #B  {I} EXTENT: #I  {J} EXTENT: #J  {D} EXTENT: #D
bf16 TENSOR: Q ( #B #I #D )  bf16 TENSOR: K ( #B #J #D )  {out} TENSOR: S ( #B #I #J )
MODEL: SCORES  S[b i j] = Σ d Q[b i d] · K[b j d] ;
"""
VALUES = """{B} EXTENT: #B  {I} EXTENT: #I  {J} EXTENT: #J  {D} EXTENT: #D
bf16 TENSOR: P ( #B #I #J )  bf16 TENSOR: V ( #B #J #D )  bf16 TENSOR: O ( #B #I #D )
MODEL: VALUES  O[b i d] = Σ j P[b i j] · V[b j d] ;
"""
HEADS = """2 EXTENT: #B  3 EXTENT: #H  200 EXTENT: #I  136 EXTENT: #J  64 EXTENT: #D
bf16 TENSOR: Q ( #B #H #I #D )  bf16 TENSOR: K ( #B #H #J #D )  f32 TENSOR: S ( #B #H #I #J )
MODEL: HEADS  S[b h i j] = Σ d Q[b h i d] · K[b h j d] ;
"""

PATHS = {
    "default": {},
    "wgmma-persistent": {"persistent": "true", "tile": "128x128x64", "stages": "5"},
    "wgmma-b-cp.async": {"B": "cp.async"},
    "wgmma-store-direct": {"store": "direct"},
    "wgmma-a-ldg": {"A": "ldg"},
    "mma.sync": {"mma": "mma.sync"},
    "fma": {"mma": "fma"},
    "fma-split2": {"mma": "fma", "split_k": "2"},
}


def exact(tmp_path, text: str, name: str, pins: dict[str, str]) -> None:
    path = tmp_path / "batched.habu"
    path.write_text(text)
    try:
        built = build(str(path), name, {}, pins)
    except AssertionError as err:
        if "plan not proven" in str(err):
            pytest.skip(f"the rules reject {pins}: {err}")
        raise
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", list(PATHS))
def test_bmm_scores_pass_the_exact_check(tmp_path, path, batch):
    exact(tmp_path, SCORES.format(B=batch, I=200, J=136, D=72, out="f32"), "SCORES", PATHS[path])


@pytest.mark.parametrize("path", ["default", "mma.sync", "fma"])
def test_bmm_scores_in_bf16_pass_the_exact_check(tmp_path, path):
    exact(tmp_path, SCORES.format(B=3, I=130, J=264, D=128, out="bf16"), "SCORES", PATHS[path])


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", ["default", "wgmma-persistent", "wgmma-store-direct", "mma.sync", "fma"])
def test_bmm_values_pass_the_exact_check(tmp_path, path, batch):
    """V[b j d] is read n-major (d contiguous): TMA in 64-column boxes and wgmma's transpose bit."""
    exact(tmp_path, VALUES.format(B=batch, I=200, J=136, D=128), "VALUES", PATHS[path])


def test_two_batch_indices_pass_the_exact_check(tmp_path):
    """Q[b h i d]: a 4-D tensor map, the batch decoded into (b, h)."""
    exact(tmp_path, HEADS, "HEADS", {})


def test_the_bmm_example_passes_the_exact_check():
    from tests.conftest import ROOT

    built = build(str(ROOT / "examples" / "bmm.habu"), "SCORES")
    result = ExactChecker(built.model, built.sizes, seed=2).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


TRANSPOSED = """{B} EXTENT: #B  200 EXTENT: #M  136 EXTENT: #N  {K} EXTENT: #K
bf16 TENSOR: A ( #B #K #M )  bf16 TENSOR: B ( #B #K #N )  f32 TENSOR: O ( #B #M #N )
MODEL: AT  O[b m n] = Σ k A[b k m] · B[b k n] ;
"""
PLAIN_AT = """1000 EXTENT: #M  776 EXTENT: #N  {K} EXTENT: #K
bf16 TENSOR: A ( #K #M )  bf16 TENSOR: B ( #K #N )  f32 TENSOR: O ( #M #N )
MODEL: AT  O[m n] = Σ k A[k m] · B[k n] ;
"""


@pytest.mark.parametrize("k", [72, 512])
@pytest.mark.parametrize("path", ["default", "wgmma-persistent", "fma"])
def test_a_transposed_a_passes_the_exact_check(tmp_path, path, k):
    """A stored [k m]: wgmma reads it in 64-column TMA boxes with its transpose bit (both operands
    MN-major here)."""
    exact(tmp_path, PLAIN_AT.format(K=k), "AT", PATHS[path])


@pytest.mark.parametrize("batch", [1, 3])
def test_a_batched_transposed_a_passes_the_exact_check(tmp_path, batch):
    exact(tmp_path, TRANSPOSED.format(B=batch, K=136), "AT", {})


GATHERED = """3 EXTENT: #B  300 EXTENT: #R  200 EXTENT: #I  136 EXTENT: #J  64 EXTENT: #D
bf16 TENSOR: Q ( #B #R #D )  bf16 TENSOR: K ( #B #J #D )  ITENSOR: IX ( #I #R )  f32 TENSOR: S ( #B #I #J )
MODEL: BG  S[b i j] = Σ d Q[b IX[i] d] · K[b j d] ;
"""


@pytest.mark.parametrize("path", ["default", "mma.sync", "fma"])
def test_a_batched_gathered_contraction_passes_the_exact_check(tmp_path, path):
    exact(tmp_path, GATHERED, "BG", PATHS[path])


SHARED_WEIGHT = """3 EXTENT: #B  200 EXTENT: #I  136 EXTENT: #N  72 EXTENT: #D
bf16 TENSOR: X ( #B #I #D )  bf16 TENSOR: W ( #N #D )  f32 TENSOR: Y ( #B #I #N )
MODEL: LIN  Y[b i n] = Σ d X[b i d] · W[n d] ;
"""


@pytest.mark.parametrize("path", ["default", "wgmma-persistent", "wgmma-store-direct", "mma.sync", "fma"])
def test_a_weight_shared_by_every_batch_passes_the_exact_check(tmp_path, path):
    """`Y[b i n] = Σ d X[b i d] · W[n d]` (a Linear over 3-D activations): the batch read by one operand."""
    exact(tmp_path, SHARED_WEIGHT, "LIN", PATHS[path])
