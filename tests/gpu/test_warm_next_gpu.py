"""`warm_next` on the GPU: FFN-SKIP's forward (its products warming W2 for the down projection) and derived
backward (GELU's derivative product warming W1 for dX), at ragged sizes, each with the next kernel's boxes
prefetched through its own tensor map: the outputs are bit for bit those of the same plan without it (a prefetch
changes no value), on NaN-poisoned outputs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.timing.harness import make_inputs, poisoned_outputs  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def _built(backward: bool, sizes: dict[str, int], pins: dict[str, str]):
    from habu.compile import compile_model, kernel_set
    from habu.emit_cuda.runtime import CompiledModel
    from habu.gpu_info import current_arch
    from habu.paths.emit import emit
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program
    from habu.target import target_named

    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    bw = derive_model(program, "FFN-SKIP")
    name = "FFN-SKIP-BWD" if backward else "FFN-SKIP-FWD"
    program.models[name] = bw.model if backward else bw.forward
    program.model_spans[name] = program.model_spans["FFN-SKIP"]
    tgt = target_named(current_arch())
    compiled = compile_model(program, name, sizes, tgt, pins, trials=1)
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(p, tgt) for p in compiled.proofs]), arch=tgt.name)
    return compiled, built


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("tokens", [128, 200])
def test_warming_the_next_kernels_weights_changes_no_output_bit(backward, tokens):
    sizes = {"B": tokens, "D": 1024, "H": 2048}
    compiled, warm = _built(backward, sizes, {"warm_next": "8"})
    assert any(getattr(k, "warm_next", 0) for k in compiled.plans[0].kernels)
    assert any("tma_prefetch_2d" in k.source for k in warm.kernel_set.members[0][1].kernels)
    _, plain = _built(backward, sizes, {})
    assert_same_outputs(compiled.model.with_sizes(sizes), warm, plain, seed=tokens)


def assert_same_outputs(model, built, reference, seed: int) -> None:
    """`built` and `reference` (two plans of `model`) give every output bit for bit alike on the same random
    inputs, each into NaN-poisoned outputs that the reference fills."""
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=seed)
    got = built(**inputs, **poisoned_outputs(model, full))
    want = reference(**inputs, **poisoned_outputs(model, full))
    torch.cuda.synchronize()
    got, want = (g if isinstance(g, dict) else {"out": g} for g in (got, want))
    for name in want:
        assert not torch.isnan(want[name].float()).any(), name
        assert torch.equal(got[name], want[name]), name
