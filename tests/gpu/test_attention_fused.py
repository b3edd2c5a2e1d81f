"""The fused attention kernel on the GPU (issue 22, `--pin family=attention`): examples/attention.habu (causal
GQA prefill, the causal skip), a non-causal model, head width 64 and 128, sequences that are no multiple of
the tiles, fully masked rows (zeros), and examples/decode_attention.habu (lengths, an empty sequence), each
against the float64 model (golden: the model uses exp, so no exact small-integer check), outputs poisoned
with NaN first; and the fused output against the unfused plan's on the same inputs. Each case proves its
plan (build: the rules and a trial over Z_q × GF(p)) before it runs.

Run: python -m pytest -q tests/gpu/test_attention_fused.py (on the device machine)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.plan.plan import AttentionKernel  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"
HEADS = {"G": 2, "R": 2, "E": 128, "D": 128}
FUSED = {"family": "attention"}


def full_attention(tmp_path) -> str:
    """examples/attention.habu without its mask (every query sees every key)."""
    text = (EX / "attention.habu").read_text().replace("MODEL: ATTENTION-GQA", "MODEL: ATTENTION-FULL").replace(
        "softmax_j(where(j ≤ i + #J − #I, Σ e Q[b g r i e] · K[b g j e] · rsqrt(#E), −∞))",
        "softmax_j(Σ e Q[b g r i e] · K[b g j e] · rsqrt(#E))")
    assert "where" not in text.split("MODEL:")[1]
    path = tmp_path / "full.habu"
    path.write_text(text)
    return str(path)


def run_golden(path: str, model: str, sizes: dict[str, int], pins: dict[str, str], lens: list[int] | None = None,
               seed: int = 0):
    built = build(path, model, sizes, {**FUSED, **pins})
    assert isinstance(built.plan.kernels[0], AttentionKernel) and len(built.plan.kernels) == 1
    full = built.sizes
    inputs = make_inputs(built.model, full, seed)
    if lens is not None:
        inputs["LEN"].copy_(torch.tensor(lens, dtype=inputs["LEN"].dtype))
    outs = poisoned_outputs(built.model, full)
    ref = reference(built.model, inputs, full)["O"]
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    got = outs["O"].detach().to("cpu").double().numpy()
    tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
    g = compare(outs["O"], ref, tol)
    assert g.unwritten == 0, f"O: {g.unwritten} elements never written (or NaN) ({built.plan.kernels})"
    assert g.ok, f"O: relative error {g.rel_error:.2e} > {tol:.0e} ({built.plan.kernels})"
    return got, ref, inputs


@pytest.mark.parametrize(("n_i", "n_j", "pins"), [
    (1, 1, {}), (17, 17, {}), (5, 17, {}), (100, 300, {"bn": "32"}), (200, 200, {"bm": "128"}), (7, 1000, {"bm": "16"}),
    (150, 333, {"bm": "128", "bn": "32", "warp_m": "2"}),
], ids=lambda x: str(x))
def test_fused_causal_gqa_prefill_at_odd_sizes(n_i, n_j, pins):
    """Queries at the end of the KV sequence (query i at position i + #J − #I); the tiles past the diagonal
    are skipped, sequences no multiple of the tiles."""
    run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", {"B": 2, **HEADS, "I": n_i, "J": n_j}, pins,
               seed=n_i + n_j)


def test_fused_causal_head_width_64():
    run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", {"B": 1, "G": 2, "R": 2, "E": 64, "D": 64, "I": 130,
                                                             "J": 130}, {}, seed=5)


@pytest.mark.parametrize("pins", [{}, {"warp_m": "2"}], ids=lambda p: str(p))
def test_fused_without_mask(tmp_path, pins):
    run_golden(full_attention(tmp_path), "ATTENTION-FULL", {"B": 2, **HEADS, "I": 77, "J": 150}, pins, seed=7)


def test_fused_causal_with_fully_masked_rows_gives_zeros():
    """More queries than keys: the first #I − #J queries see no key; their rows are 0, not NaN."""
    got, ref, _ = run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", {"B": 1, **HEADS, "I": 17, "J": 5}, {},
                             seed=3)
    assert np.all(got[..., :12, :] == 0) and np.all(ref[..., :12, :] == 0)


@pytest.mark.parametrize("n_j", [1, 17, 1000])
def test_fused_decode_with_lengths_and_an_empty_sequence(n_j):
    """One query row per sequence (the 2 query heads of a KV head are the rows of one 16-row tile); sequence 1
    has no valid entry (zeros), sequence 2 all of them; the KV tiles past LEN[b] are skipped."""
    lens = [min(n_j, 9), 0, n_j, max(0, n_j - 1)]
    got, _, _ = run_golden(str(EX / "decode_attention.habu"), "DECODE-ATTENTION",
                           {"B": 4, **HEADS, "J": n_j, "L": n_j + 1}, {"bm": "16", "kv_split": "0"}, lens=lens,
                           seed=n_j)  # the whole-cache kernel (split-KV: tests/gpu/test_attention_decode_split.py)
    assert np.all(got[1] == 0)


def test_fused_matches_the_unfused_plan():
    """The fused and the unfused plan of the same causal GQA model on the same inputs."""
    sizes = {"B": 1, **HEADS, "I": 96, "J": 160}
    fused = build(str(EX / "attention.habu"), "ATTENTION-GQA", sizes, FUSED)
    unfused = build(str(EX / "attention.habu"), "ATTENTION-GQA", sizes)
    assert unfused.plan.rewrites[:1] == ("attention:O",)
    inputs = make_inputs(fused.model, fused.sizes, 11)
    a, b = poisoned_outputs(fused.model, fused.sizes), poisoned_outputs(fused.model, fused.sizes)
    fused.compiled(**inputs, **a)
    unfused.compiled(**inputs, **b)
    torch.cuda.synchronize()
    diff = ((a["O"] - b["O"]).abs().max() / b["O"].abs().max()).item()
    assert diff < 2e-2, f"fused and unfused differ by {diff} (of max |O|)"
