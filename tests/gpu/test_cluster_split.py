"""Cluster split-K on the GPU (issue 20 §2, habu/lower/split_cluster.py): the split blocks of a tile, one
thread-block cluster, add their partial tiles through distributed shared memory and apply the epilogue
once. Bit-exact on GGEMM (every element, red zones), ragged shapes and two consumer warpgroups included;
float64 golden on FFN-SKIP and RMSNorm+Linear, whose epilogues (bias, GELU, residual, bf16) an atomic
split cannot take."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import golden_run  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"


def _pins(tile: str, stages: int, split: int, warps: int = 8) -> dict[str, str]:
    return {"tile": tile, "stages": str(stages), "warps": str(warps), "split_k": str(split), "split_reduce": "cluster"}


@pytest.mark.parametrize("sizes,pins", [
    ({"M": 100, "N": 300, "K": 1000}, _pins("64x128x64", 4, 4)),
    ({"M": 64, "N": 4096, "K": 4096}, _pins("64x256x64", 4, 8)),
    ({"M": 130, "N": 200, "K": 520}, _pins("128x64x64", 4, 2, warps=12)),
])
def test_cluster_split_ggemm_is_bit_exact(sizes, pins):
    built = build(str(EX / "ggemm.habu"), "GGEMM", sizes, pins, check_indices=False)
    (kernel,) = built.plan.kernels
    assert kernel.split_reduce == "cluster" and kernel.split_k == int(pins["split_k"])
    result = ExactChecker(built.model, sizes).check(built.compiled, kept_types(built.plan), timeout_s=30.0)
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("example,model,sizes,pins", [
    ("ffn_skip.habu", "FFN-SKIP", {"B": 17}, _pins("64x128x64", 8, 4)),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}, _pins("64x64x64", 13, 2)),
])
def test_cluster_split_layers_match_the_float64_reference(example, model, sizes, pins):
    built = build(str(EX / example), model, sizes, pins, check_indices=False)
    assert any(getattr(k, "split_reduce", None) == "cluster" and k.split_k > 1 for k in built.plan.kernels)
    golden = golden_run(built.model, built.sizes, built.compiled, dict(built.plan.storage), 3)
    assert golden.ok, (built.plan.kernels, golden)
