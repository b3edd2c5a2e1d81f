"""A column sum in a product's epilogue on the GPU (habu/lower/column_epilogue.py): tests/data/column_epilogue.habu
bit for bit (exact check: small-integer inputs, red zones) with its padding rows and ragged last column tile, and
FFN-SKIP's backward at 128 tokens, whose dB1 is summed beside dT2, against the float64 reference."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.compile import compile_model, kernel_set  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.gpu_info import current_arch  # noqa: E402
from habu.paths.emit import emit  # noqa: E402
from habu.spec.grad_program import with_backward  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.target import target_named  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.gpu.test_backward_gpu import assert_ffn_gradients_match  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "column_epilogue.habu")


@pytest.mark.parametrize("model,sizes,pins", [
    ("BIASED-COLSUM", {}, {}), ("BIASED-COLSUM", {"M": 128, "N": 1000, "K": 520}, {"tile": "128x128x64"}),
    ("BIASED-COLSUM", {"M": 190, "N": 256, "K": 64}, {"tile": "192x128x64", "warps": "16"}),
    ("BIASED-COLTWICE", {}, {}),
    # several tiles of m: each block's sums in the launch's workspace, the column tile's last block finishing (twice:
    # the counters the first call leaves must be zero for the second)
    ("BIASED-COLSUM", {"M": 300}, {}), ("BIASED-COLSUM", {"M": 1000, "N": 1000, "K": 256}, {"persistent": "true"}),
    # one consumer warpgroup finishing a 256-column tile: two columns a thread, in turn
    ("BIASED-COLSUM", {"M": 300, "N": 1000}, {"tile": "64x256x64"})],
    ids=["one-consumer", "two-consumers", "three-consumers", "scaled-bf16", "tile-rows", "tile-rows-persistent",
         "two-rounds"])
def test_a_column_sum_in_the_epilogue_passes_the_exact_check(model, sizes, pins):
    built = build(DATA, model, sizes, pins)
    assert len(built.plan.kernels) == 1 and built.plan.kernels[0].nodes[-1] in ("G", "GH")
    for seed in (3, 4):  # a second call on the same compiled plan: its kept counters start from zero again
        result = ExactChecker(built.model, built.sizes, seed=seed).check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("more", [{}, {"lag": "2", "epilogue_prefetch": "true"}, {"epilogue_early": "true"}],
                         ids=["default", "lag-prefetch", "early"])
def test_the_128_token_ffn_backward_with_db1_in_the_dt2_epilogue_matches_the_float64_reference(more):
    """(`lag-prefetch`: its products' consumers staggered, `consumer_lag`, and the saved S1's tile prefetched
    into the L2 for the GELU derivative, `epilogue_prefetch`; `early`: S1 and B1 read into registers at each
    tile's start, `epilogue_early`.)"""
    shape = {"B": 128, "D": 512, "H": 1024}
    tgt = target_named(current_arch())
    program = with_backward(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP-GRAD")
    compiled = compile_model(program, "FFN-SKIP-GRAD", shape, tgt, {"tile": "128x128x64", **more}, trials=1)
    plan = compiled.plans[0]
    assert ("%d3", "%d2", "%rdB1", "dB1") in [k.nodes for k in plan.kernels]
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(p, tgt) for p in compiled.proofs]), arch=tgt.name)
    assert_ffn_gradients_match(compiled, built, shape, seed=9)
