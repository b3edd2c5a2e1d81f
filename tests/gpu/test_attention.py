"""Attention on the GPU (issue 22): the unfused plan of examples/attention.habu (causal GQA prefill)
and examples/decode_attention.habu (padded decode) against the float64 model at odd sizes, outputs
poisoned with NaN (an element never written fails), and fully masked rows: zeros, never NaN (the
model's definition; torch's SDPA returns NaN there). The models use exp, so there is no exact
small-integer check (habu.timing.exact: "uses exp"); each case proves its plan (build) first.

Run: python -m pytest -q tests/gpu/test_attention.py (on the device machine)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"
HEADS = {"G": 2, "R": 2, "E": 128, "D": 128}


PLANS = [pytest.param({}, id="default"), pytest.param({"rewrite": "attention:O"}, id="unfused")]


def run_golden(path: str, model: str, sizes: dict[str, int], lens: list[int] | None = None, seed: int = 0,
               pins: dict[str, str] | None = None):
    built = build(str(EX / path), model, sizes, pins)
    if pins:  # the unfused plan: scores, softmax rows, value contraction
        assert built.plan.rewrites[0] == "attention:O"
    full = built.sizes
    inputs = make_inputs(built.model, full, seed)
    if lens is not None:
        inputs["LEN"].copy_(torch.tensor(lens, dtype=inputs["LEN"].dtype))
    outs = poisoned_outputs(built.model, full)
    ref = reference(built.model, inputs, full)["O"]
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    got = outs["O"].detach().to("cpu").double().numpy()
    tol = plan_tolerance(built.model, built.plan)
    g = compare(outs["O"], ref, tol)
    assert g.unwritten == 0, f"O: {g.unwritten} elements never written (or NaN) ({built.plan.kernels})"
    assert g.ok, f"O: relative error {g.rel_error:.2e} > {tol:.0e} ({built.plan.kernels})"
    return got, ref


@pytest.mark.parametrize("pins", PLANS)
@pytest.mark.parametrize(("n_i", "n_j"), [(1, 1), (17, 17), (5, 17), (1, 1000), (7, 1000), (256, 256)],
                         ids=lambda x: str(x))
def test_causal_gqa_prefill_at_odd_sizes(n_i, n_j, pins):
    """Queries at the end of the KV sequence (query i at position i + #J − #I); the default plan (the fused
    kernel since session 31) and the unfused one. Regression: the test asserted that the default was the unfused
    plan, which stopped being true when the fused kernel became the default; it was not run on a GPU since.
    (256, 256): the unfused plan's mask kernels move 8 scores a thread, and printed each one's mask at the first
    one's column (session 37: 118× off against SDPA; tests/lower/test_general.py has the regression)."""
    run_golden("attention.habu", "ATTENTION-GQA", {"B": 2, **HEADS, "I": n_i, "J": n_j}, seed=n_i + n_j, pins=pins)


def test_causal_prefill_with_fully_masked_rows_gives_zeros():
    """More queries than keys: the first #I − #J queries see no key; their rows are 0, not NaN."""
    got, ref = run_golden("attention.habu", "ATTENTION-GQA", {"B": 1, **HEADS, "I": 17, "J": 5}, seed=3)
    assert np.all(got[..., :12, :] == 0) and np.all(ref[..., :12, :] == 0)


@pytest.mark.parametrize("pins", PLANS)
@pytest.mark.parametrize("n_j", [1, 17, 1000])
def test_decode_with_lengths_and_an_empty_sequence(n_j, pins):
    """One query per sequence; sequence 1 has no valid entry (zeros), sequence 2 all of them."""
    lens = [min(n_j, 9), 0, n_j, max(0, n_j - 1)]
    got, _ = run_golden("decode_attention.habu", "DECODE-ATTENTION",
                        {"B": 4, **HEADS, "J": n_j, "L": n_j + 1}, lens=lens, seed=n_j, pins=pins)
    assert np.all(got[1] == 0)
