"""Derived backward models on the GPU (run through the device tool) where their default plans are new this
session: RMSNorm's backward in its widest runtime-width bucket (dX's row uncached: a cached row would not
fit shared memory), and the MoE FFN backward at small sizes (scatter-adds into dX and the expert weights'
gradients by the general family), each against the float64 reference."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.compile import compile_model, kernel_set  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.gpu_info import current_arch  # noqa: E402
from habu.paths.emit import emit  # noqa: E402
from habu.spec.grad_program import with_backward  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.target import target_named  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def _built(path, name: str, shape: dict[str, int]):
    tgt = target_named(current_arch())
    program = with_backward(load_program(path), name)
    compiled = compile_model(program, name, shape, tgt, {}, trials=1)
    members = [emit(p, tgt) for p in compiled.proofs]
    return compiled, CompiledModel(compiled.model, kernel_set(compiled, members), arch=tgt.name)


def test_rmsnorm_backward_widest_bucket_matches_the_float64_reference():
    compiled, built = _built(ROOT / "examples" / "rmsnorm.habu", "RMSNORM-EQ-GRAD", {"R": 64})
    for d in (33024, 65536):  # the widest bucket's edges
        sizes = {"R": 64, "D": d}
        model = compiled.model.with_sizes(sizes)
        inputs = make_inputs(model, sizes, seed=d)
        got = built(**inputs, **poisoned_outputs(model, sizes))
        torch.cuda.synchronize()
        plan = compiled.plans[built.kernel_set.index(sizes)]
        g = compare(got, reference(model, inputs, sizes)["dX"], tolerance(model, dict(plan.storage)))
        assert g.unwritten == 0 and g.ok, (d, g)


def test_moe_ffn_backward_matches_the_float64_reference_at_small_sizes():
    compiled, built = _built(ROOT / "tests" / "data" / "moe_small.habu", "MOE-FFN-GRAD", {})
    model = compiled.model.with_sizes({"T": 9, "R": 18})
    sizes = {e.name: e.size for e in model.extents}  # the static extents too (the harness shapes every tensor)
    inputs = make_inputs(model, sizes, seed=3)
    want = reference(model, inputs, sizes)
    outs = poisoned_outputs(model, sizes)
    got = built(**{k: v.clone() for k, v in inputs.items()}, **outs)
    torch.cuda.synchronize()
    for name in ("dX", "dW1", "dW3", "dW2", "dP"):
        g = compare(got[name], want[name], tolerance(model, dict(compiled.plans[0].storage)))  # bf16 storage
        assert g.unwritten == 0 and g.ok, (name, g)


def test_decode_attention_backward_with_its_length_mask_matches_the_float64_reference():
    """The backward reads LEN in its conditions (j < LEN[b]): keys past a sequence's length get no gradient."""
    compiled, built = _built(ROOT / "examples" / "decode_attention.habu", "DECODE-ATTENTION-GRAD", {})
    model = compiled.model
    sizes = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, sizes, seed=5)
    inputs["LEN"] = torch.tensor([0, 1, 100, sizes["J"]], dtype=inputs["LEN"].dtype, device="cuda")
    inputs["R2"] = inputs["R2"].abs() + 1  # a softmax's sum (the saved forward value) is positive
    want = reference(model, inputs, sizes)
    got = built(**{k: v.clone() for k, v in inputs.items()}, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    plan = compiled.plans[0]
    for name in ("dQ", "dK", "dV"):
        g = compare(got[name], want[name], tolerance(model, dict(plan.storage)))
        assert g.unwritten == 0 and g.ok, (name, g)
    assert not got["dK"][1, :, 1:].float().abs().sum() and not got["dV"][0].float().abs().sum()


@pytest.mark.parametrize(("name", "shape", "grads"), [("RMSNORM-BSD-GRAD", {"B": 2, "S": 100, "D": 4096}, ("dX", "dW")),
                                                     ("SOFTMAX-ZHIJ-GRAD", {"Z": 2, "H": 3, "I": 50, "J": 512}, ("dS",))])
def test_rows_nd_backward_with_f32_statistics_matches_the_float64_reference(name, shape, grads):
    """N-D rows' backwards (rows_nd.habu) read their saved statistics in f32 since session 62 (bf16 before)."""
    compiled, built = _built(ROOT / "examples" / "rows_nd.habu", name, shape)
    model = compiled.model.with_sizes(shape)
    sizes = {e.name: e.size for e in model.extents} | shape
    inputs = make_inputs(model, sizes, seed=11)
    for t in model.inputs:
        if t.name.startswith("R"):
            assert t.dtype.name == "f32"
            inputs[t.name] = inputs[t.name].abs() + 1  # an rstd, a maximum's exp sum: positive
    want = reference(model, inputs, sizes)
    got = built(**{k: v.clone() for k, v in inputs.items()}, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    got = got if isinstance(got, dict) else {grads[0]: got}
    for g_name in grads:
        g = compare(got[g_name], want[g_name], tolerance(model, dict(compiled.plans[0].storage)))
        assert g.unwritten == 0 and g.ok, (g_name, g)


def test_attentions_factored_backward_matches_the_float64_reference():
    """Attention's backward in FlashAttention-2's form (session 62, habu.spec.grad_factor): one dS node that dQ and
    dK contract, the scores made once; causal GQA at the example's sizes."""
    compiled, built = _built(ROOT / "examples" / "attention.habu", "ATTENTION-GQA-GRAD", {})
    model = compiled.model
    sizes = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, sizes, seed=7)
    inputs["R2"] = inputs["R2"].abs() + 1  # a softmax's sum (the saved forward value) is positive
    want = reference(model, inputs, sizes)
    got = built(**{k: v.clone() for k, v in inputs.items()}, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    for name in ("dQ", "dK", "dV"):
        g = compare(got[name], want[name], tolerance(model, dict(compiled.plans[0].storage)))
        assert g.unwritten == 0 and g.ok, (name, g)


@pytest.mark.parametrize("path,name,shape,pins", [
    ("rmsnorm.habu", "RMSNORM-ROWS-GRAD", {"R": 64, "D": 4096}, {}),  # dY and X in registers
    # the default at 16384 columns: 256 threads, launch bounds for two blocks an SM (128 registers a thread)
    ("softmax.habu", "SOFTMAX-ROWS-GRAD", {"R": 64, "C": 16384}, {}),
    ("rmsnorm.habu", "RMSNORM-ROWS-GRAD", {"R": 300, "D": 16384}, {}),
    # 512 threads bounded to two blocks an SM (ptxas caps the registers at 64; the rows stay in registers)
    ("softmax.habu", "SOFTMAX-ROWS-GRAD", {"R": 300, "C": 16384}, {"threads": "512", "blocks_per_sm": "2"}),
    ("rmsnorm.habu", "RMSNORM-ROWS-GRAD", {"R": 300, "D": 16384}, {"threads": "512", "blocks_per_sm": "2"}),
    # persistent blocks copying the next row's dY and X while they compute this one (each block walks rows)
    ("softmax.habu", "SOFTMAX-ROWS-GRAD", {"R": 300, "C": 16384}, {"row_prefetch": "true", "threads": "512"}),
    ("rmsnorm.habu", "RMSNORM-ROWS-GRAD", {"R": 300, "D": 16384},
     {"row_prefetch": "true", "threads": "512", "blocks_per_sm": "2"}),
    ("softmax.habu", "SOFTMAX-ROWS-GRAD", {"R": 64, "C": 4000}, {"threads": "128"}),  # both in shared memory
    ("rmsnorm.habu", "RMSNORM-ROWS-GRAD", {"R": 64, "D": 4096}, {"threads": "32"}),  # 4 warp rows a block, in smem
])
def test_row_backward_keeping_dy_and_x_on_chip_matches_the_float64_reference(path, name, shape, pins):
    tgt = target_named(current_arch())
    program = with_backward(load_program(ROOT / "examples" / path), name)
    compiled = compile_model(program, name, shape, tgt, pins, trials=1)
    members = [emit(p, tgt) for p in compiled.proofs]
    assert "rows of dY, X kept in" in members[0].kernels[0].source
    built = CompiledModel(compiled.model, kernel_set(compiled, members), arch=tgt.name)
    model = compiled.model.with_sizes(shape)
    inputs = make_inputs(model, shape, seed=5)
    got = built(**inputs, **poisoned_outputs(model, shape))
    torch.cuda.synchronize()
    got = got["dX"] if isinstance(got, dict) else got
    g = compare(got, reference(model, inputs, shape)["dX"], tolerance(model, dict(compiled.plans[0].storage)))
    assert g.unwritten == 0 and g.ok, (shape, pins, g)


def test_ffn_skip_backward_with_the_gelu_input_in_the_epilogue_matches_the_float64_reference():
    """The default backward of FFN-SKIP computes T2 = S1 + B1 inside the GELU-derivative epilogue of
    dT3 = Σ d dT6·W2 (`epilogue:%2`; it was a kernel writing B×H values) and reads the saved GELU output
    S3 (AUTO saves a contraction operand; it was recomputed by two kernels): every gradient against the
    float64 reference of the backward model as written."""
    shape = {"B": 128, "D": 256, "H": 512}
    compiled, built = _built(ROOT / "examples" / "ffn_skip.habu", "FFN-SKIP-GRAD", shape)
    plan = compiled.plans[0]
    assert "epilogue:%2" in plan.rewrites and ("%d3", "%d2", "%rdB1", "dB1") in [k.nodes for k in plan.kernels]
    assert "S3" in {t.name for t in compiled.model.inputs}
    assert_ffn_gradients_match(compiled, built, shape, seed=7)


def assert_ffn_gradients_match(compiled, built, shape: dict[str, int], seed: int) -> None:
    """Every FFN-SKIP gradient the built backward computes against the float64 reference, each element written."""
    plan = compiled.plans[0]
    model = compiled.model.with_sizes(shape)
    sizes = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, sizes, seed=seed)
    want = reference(model, inputs, sizes)
    got = built(**inputs, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    for name in ("dX", "dW1", "dB1", "dW2", "dB2"):
        g = compare(got[name], want[name], tolerance(model, dict(plan.storage)))
        assert g.unwritten == 0 and g.ok, (name, g)


@pytest.mark.parametrize("path,name", [
    ("max_abs_all.habu", "AMAX-GRAD"),  # a scalar maximum (a column reduction) read by the later kernels
    ("rows_tiny_sum.habu", "TINY-ROWS-GRAD"),  # dX[b i] = dO[b]: a row broadcast, no input along the row
    ("two_reductions.habu", "TWO-RED-GRAD"),
])
def test_corpus_backward_found_by_the_odd_size_sweep_matches_the_float64_reference(path, name):
    """Session 45's sweep: these backward plans did not compile before (tests/test_backward_plans.py)."""
    compiled, built = _built(ROOT / "tests" / "data" / "general_corpus" / path, name, {})
    model = compiled.model
    sizes = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, sizes, seed=9)
    want = reference(model, inputs, sizes)
    got = built(**{k: v.clone() for k, v in inputs.items()}, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    got = got if isinstance(got, dict) else {model.outputs[0].name: got}
    for out, value in got.items():
        g = compare(value, want[out], tolerance(model, dict(compiled.plans[0].storage)))
        assert g.unwritten == 0 and g.ok, (out, g)
