"""A contraction epilogue that stores two outputs of its chain (`ContractionLowering.extra_outs`) on the GPU:
the product S1 and the activation S3 of tests/data/two_outputs.habu bit for bit (exact check, small-integer
inputs, red zones) on every contraction path, and against the float64 reference with GELU; FFN-SKIP's
forward with its saved values (S1 and S3 from one kernel) against the reference at 4096 tokens' widths."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "two_outputs.habu")
PATHS = {  # every contraction epilogue that stores the extra output
    "wgmma-tma": {},  # the TMA-store epilogue, S1 staged beside S3 and stored by TMA too
    "wgmma-tma-early": {"epilogue_early": "true"},  # b1 read into registers at each tile's start
    "wgmma-direct": {"store": "direct"},
    "wgmma-cluster-split": {"split_k": "2", "reduce": "cluster"},
    "mma.sync": {"mma": "mma.sync"},
    "fma": {"mma": "fma"},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("sizes", [{"B": 128, "D": 256, "H": 512}, {"B": 200, "D": 256, "H": 520}])
def test_two_outputs_of_one_chain_pass_the_exact_check(path, sizes):
    built = build(DATA, "LINEAR-RELU-SAVED", sizes, PATHS[path])
    assert len(built.plan.kernels) == 1
    result = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["LINEAR-GELU-SAVED", "LINEAR-GELU-SAVED-KMAJOR"])
def test_two_outputs_with_gelu_match_the_float64_reference(model):
    built = build(DATA, model, {})
    sizes = {e.name: e.size for e in built.model.extents}
    inputs = make_inputs(built.model, sizes, seed=5)
    got = built.compiled(**inputs, **poisoned_outputs(built.model, sizes))
    torch.cuda.synchronize()
    want = reference(built.model, inputs, sizes)
    for name in [t.name for t in built.model.outputs]:
        g = compare(got[name], want[name], tolerance(built.model, dict(built.plan.storage)))
        assert g.unwritten == 0 and g.ok, (name, g)


def test_ffn_skip_saved_forward_stores_s1_and_s3_from_one_kernel_and_matches_the_reference():
    from habu.compile import compile_model, kernel_set
    from habu.emit_cuda.runtime import CompiledModel
    from habu.gpu_info import current_arch
    from habu.paths.emit import emit
    from habu.spec.grad_program import derive_model
    from habu.spec.grad_save import SaveMode, SavePolicy
    from habu.spec.parser import load_program
    from habu.target import target_named

    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    fwd = derive_model(program, "FFN-SKIP", None, SavePolicy(SaveMode.AUTO)).forward
    sizes = {"B": 200, "D": 1024, "H": 2048}  # 200 tokens: the last row tile ragged
    program.models["FFN-SKIP-FWD"] = fwd
    program.model_spans["FFN-SKIP-FWD"] = program.model_spans["FFN-SKIP"]
    tgt = target_named(current_arch())
    compiled = compile_model(program, "FFN-SKIP-FWD", sizes, tgt, {}, trials=1)
    assert compiled.plans[0].kernels[0].nodes == ("S1", "%2", "S3")
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(p, tgt) for p in compiled.proofs]), arch=tgt.name)
    model = compiled.model.with_sizes(sizes)
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=11)
    got = built(**inputs, **poisoned_outputs(model, full))
    torch.cuda.synchronize()
    want = reference(model, inputs, full)
    for name in ("S1", "S3", "S4", "R1", "Y"):
        g = compare(got[name], want[name], tolerance(model, dict(compiled.plans[0].storage)))
        assert g.unwritten == 0 and g.ok, (name, g)
