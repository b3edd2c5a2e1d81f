"""The fused attention kernel's wgmma main loop on the GPU (issue 22, `--pin family=attention --pin
main_loop=wgmma`, habu/lower/attention_wgmma.py): causal GQA prefill at odd sizes (sequence 17 and 1000, head
width 64 and 128, queries ≠ keys, fully masked rows), the model without a mask, one consumer warpgroup (bm 64),
KV tiles of 64 keys in 3 stages, 128 keys in 3 stages (with and without the two consumers' ping-pong), 64 keys in 4,
persistent blocks (`--pin persistent=1`, also on grids of 1 to 7 blocks); each against the float64 model with outputs poisoned by NaN first, and against
the mma.sync kernel on the same inputs. Each case proves its plan (build: the rules and a trial over
Z_q × GF(p)) before it runs.

Run: python -m pytest -q tests/gpu/test_attention_wgmma.py (on the device machine)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.attention_speed import full_attention_source  # noqa: E402
from habu.bench.run import build  # noqa: E402
from habu.plan.plan import AttentionKernel  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"
WGMMA = {"family": "attention", "main_loop": "wgmma"}


def run_golden(path: str, model: str, sizes: dict[str, int], pins: dict[str, str] | None, seed: int = 0):
    """`pins` on the wgmma loop's (None: the model's default plan, no pin)."""
    built = build(path, model, sizes, {} if pins is None else {**WGMMA, **pins})
    kernel = built.plan.kernels[0]
    assert isinstance(kernel, AttentionKernel) and kernel.main_loop == "wgmma" and len(built.plan.kernels) == 1
    inputs = make_inputs(built.model, built.sizes, seed)
    outs = poisoned_outputs(built.model, built.sizes)
    ref = reference(built.model, inputs, built.sizes)["O"]
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    got = outs["O"].detach().to("cpu").double().numpy()
    tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
    g = compare(outs["O"], ref, tol)
    assert g.unwritten == 0, f"O: {g.unwritten} elements never written (or NaN) ({kernel})"
    assert g.ok, f"O: relative error {g.rel_error:.2e} > {tol:.0e} ({kernel})"
    return got, ref


GQA = {"B": 2, "G": 2, "R": 2}  # 2 KV heads of 2 query heads each, 2 sequences
ONE = {"B": 1, "G": 1, "R": 2}  # the long sequences: the float64 reference and the proof's stay small


@pytest.mark.parametrize(("heads", "n_i", "n_j", "width", "pins"), [
    pytest.param(GQA, 17, 17, 64, {}, id="gqa17d64"), pytest.param(GQA, 17, 17, 128, {}, id="gqa17d128"),
    pytest.param(ONE, 1000, 1000, 128, {}, id="seq1000d128"), pytest.param(GQA, 100, 333, 64, {}, id="gqa100x333d64"),
    pytest.param(ONE, 200, 1000, 128, {"bm": "64", "bn": "64", "stages": "3"}, id="bm64bn64s3"),
    pytest.param(ONE, 700, 1000, 128, {"pingpong": "1"}, id="pingpong"),
    pytest.param(ONE, 700, 1000, 128, {"stages": "3"}, id="stages3"),
    pytest.param(ONE, 700, 1000, 128, {"stages": "3", "pingpong": "1"}, id="pingpong3"),
    pytest.param(ONE, 500, 1000, 128, {"bn": "64", "stages": "4"}, id="bn64s4"),
    pytest.param(GQA, 300, 500, 64, {"head_major": "1"}, id="headmajor"),
    pytest.param(ONE, 700, 1000, 128, {"pingpong": "1", "late_wait": "1"}, id="latewait"),
    # a share of the exponentials on the FMA pipes (habu::exp2_fma); masked scores still 0 (−∞ clamped to −127)
    pytest.param(GQA, 100, 333, 64, {"exp_fma": "2"}, id="expfma2d64"),
    pytest.param(ONE, 700, 1000, 128, {"exp_fma": "4"}, id="expfma4"),
    # KV tiles of 192 keys (12 k steps of P·V; S a 64 × 192 accumulator)
    pytest.param(GQA, 100, 333, 64, {"bn": "192", "stages": "2"}, id="bn192d64"),
    pytest.param(ONE, 700, 1000, 64, {"bn": "192", "persistent": "1"}, id="bn192persistent"),
    # three consumer warpgroups (192 query rows), KV tiles of 96 and 64 keys
    pytest.param(GQA, 100, 333, 64, {"bm": "192", "bn": "96"}, id="bm192bn96"),
    pytest.param(ONE, 700, 1000, 64, {"bm": "192", "bn": "64", "persistent": "1"}, id="bm192persistent"),
    # the softmax's float code (session 67): O rescaled on every tile, the sums and maxima in chains
    pytest.param(GQA, 100, 333, 64, {"rescale_always": "1"}, id="rescalealways"),
    pytest.param(GQA, 100, 333, 64, {"sum_chains": "2", "max_chains": "4"}, id="chains"),
    pytest.param(ONE, 700, 1000, 128, {"sum_chains": "4", "max_chains": "1", "persistent": "1"}, id="chains4"),
])
def test_wgmma_causal_gqa_prefill_at_odd_sizes(heads, n_i, n_j, width, pins):
    """Queries at the end of the KV sequence (query i at position i + #J − #I), tiles past the diagonal skipped,
    sequences no multiple of the tiles (TMA's zero fill past #I and #J)."""
    run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", {**heads, "E": width, "D": width, "I": n_i, "J": n_j},
               pins, seed=n_i + n_j)


@pytest.mark.parametrize(("width", "n_i", "pins"), [
    pytest.param(128, 77, {}, id="d128"),
    # three consumer warpgroups over 128-key tiles (session 41: a full prefill's default at head width 64)
    pytest.param(64, 100, {"bm": "192", "bn": "128", "pingpong": "0"}, id="bm192bn128"),
    pytest.param(64, 700, {"bm": "192", "bn": "128", "pingpong": "0", "stages": "4"}, id="bm192bn128s4"),
])
def test_wgmma_without_mask(tmp_path, width, n_i, pins):
    path = tmp_path / "full.habu"
    path.write_text(full_attention_source())
    run_golden(str(path), "ATTENTION-FULL", {**ONE, "E": width, "D": width, "I": n_i, "J": 1000}, pins, seed=7)


def test_the_default_of_a_short_full_prefill_at_head_width_64_rescales_every_tile(tmp_path):
    """No pin, no mask, head width 64, 1000 keys: the default rescales O on every KV tile (`short_d64_pins`,
    session 68) and matches the float64 model."""
    path = tmp_path / "full.habu"
    path.write_text(full_attention_source())
    sizes = {**ONE, "E": 64, "D": 64, "I": 700, "J": 1000}
    assert build(str(path), "ATTENTION-FULL", sizes, {}).plan.kernels[0].rescale_always
    run_golden(str(path), "ATTENTION-FULL", sizes, None, seed=8)


@pytest.mark.parametrize(("heads", "n_i"), [(ONE, 700), (GQA, 300)], ids=["one700", "gqa300"])
def test_the_default_of_a_short_causal_prefill_at_head_width_64_does_not_ping_pong(heads, n_i):
    """No pin, the causal mask, head width 64, 1000 keys: the default's two consumers do not take turns
    (`short_d64_pins`, session 68) and match the float64 model."""
    sizes = {**heads, "E": 64, "D": 64, "I": n_i, "J": 1000}
    assert not build(str(EX / "attention.habu"), "ATTENTION-GQA", sizes, {}).plan.kernels[0].pingpong
    run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", sizes, None, seed=9)


@pytest.mark.parametrize("pins", [{}, {"exp_fma": "4"}], ids=["sfu", "expfma4"])
def test_wgmma_fully_masked_rows_give_zeros(pins):
    """More queries than keys: the first #I − #J queries see no key; their rows are 0, not NaN (with exponentials
    on the FMA pipes too: 2^−∞ there is exactly +0, so a row's sum stays 0)."""
    got, ref = run_golden(str(EX / "attention.habu"), "ATTENTION-GQA",
                          {"B": 1, "G": 2, "R": 2, "E": 64, "D": 64, "I": 17, "J": 5}, pins, seed=3)
    assert np.all(got[..., :12, :] == 0) and np.all(ref[..., :12, :] == 0)


def test_wgmma_matches_the_mma_sync_kernel():
    sizes = {**ONE, "E": 128, "D": 128, "I": 300, "J": 700}
    wg = build(str(EX / "attention.habu"), "ATTENTION-GQA", sizes, WGMMA)
    ms = build(str(EX / "attention.habu"), "ATTENTION-GQA", sizes, {"family": "attention"})
    inputs = make_inputs(wg.model, wg.sizes, 11)
    a, b = poisoned_outputs(wg.model, wg.sizes), poisoned_outputs(wg.model, wg.sizes)
    wg.compiled(**inputs, **a)
    ms.compiled(**inputs, **b)
    torch.cuda.synchronize()
    diff = ((a["O"] - b["O"]).abs().max() / b["O"].abs().max()).item()
    assert diff < 2e-2, f"wgmma and mma.sync kernels differ by {diff} (of max |O|)"


def test_the_default_plan_of_a_long_prefill_is_the_wgmma_kernel():
    """No pin: a prefill of 1024 queries on sm_90a takes the fused kernel on the wgmma loop (`AttentionPath.
    default_pins`), and it matches the float64 model."""
    run_golden(str(EX / "attention.habu"), "ATTENTION-GQA", {**ONE, "E": 64, "D": 64, "I": 1024, "J": 1024}, None,
               seed=5)


# the persistent kernel (`--pin persistent=1`): one block an SM walking the work tiles, the ring and Q's single
# buffer handed on across them. At these sizes an H200's 132 SMs give each block one tile or two, so each case also
# launches grids of a few blocks (`resident_blocks` patched: every block then walks many tiles), one build a case
PERSIST = {"persistent": "1"}


def golden_on_grids(monkeypatch, path: str, model: str, sizes: dict[str, int], pins: dict[str, str],
                    grids: tuple[int | None, ...], seed: int) -> None:
    """The persistent plan (`pins` on the wgmma loop's) against the float64 model, launched on each grid of `grids`
    (None: the device's SMs), outputs poisoned by NaN before each launch."""
    from habu.emit_cuda import driver

    built = build(path, model, sizes, {**WGMMA, **pins, **PERSIST})
    kernel = built.plan.kernels[0]
    assert isinstance(kernel, AttentionKernel) and kernel.main_loop == "wgmma" and kernel.persistent
    slots: list[int | None] = [None]
    monkeypatch.setattr("habu.emit_cuda.runtime.resident_blocks",
                        lambda *a, **k: driver.resident_blocks(*a, **k) if slots[0] is None else slots[0])
    inputs = make_inputs(built.model, built.sizes, seed)
    ref = reference(built.model, inputs, built.sizes)["O"]
    tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
    for grid in grids:
        slots[0] = grid
        built.compiled.release_prepared()  # the grid is packed with a call's launches
        outs = poisoned_outputs(built.model, built.sizes)
        built.compiled(**inputs, **outs)
        torch.cuda.synchronize()
        g = compare(outs["O"], ref, tol)
        assert g.unwritten == 0, f"grid {grid}: {g.unwritten} elements of O never written (or NaN)"
        assert g.ok, f"grid {grid}: relative error {g.rel_error:.2e} > {tol:.0e}"


@pytest.mark.parametrize(("heads", "n_i", "n_j", "width", "pins", "grids"), [
    pytest.param(GQA, 150, 260, 64, {}, (None, 3), id="gqa150x260d64"),  # 2 query tiles × 8 heads
    pytest.param(ONE, 400, 600, 128, {"stages": "3", "pingpong": "1"}, (None, 3), id="pingpong3"),
    pytest.param(GQA, 300, 100, 128, {"bn": "64", "stages": "4"}, (7,), id="fewkeys-bn64s4"),  # tiles with no key
    pytest.param(GQA, 17, 5, 64, {"bm": "64"}, (2,), id="masked-rows-bm64"),  # rows of zeros
    # session 36: head-major order (a batch element's query tiles one after another; not yet run on the H200)
    pytest.param(GQA, 300, 520, 128, {"pingpong": "1", "head_major": "1"}, (None, 3), id="head-major"),
])
def test_persistent_causal_gqa_prefill_at_odd_sizes(monkeypatch, heads, n_i, n_j, width, pins, grids):
    golden_on_grids(monkeypatch, str(EX / "attention.habu"), "ATTENTION-GQA",
                    {**heads, "E": width, "D": width, "I": n_i, "J": n_j}, pins, grids, seed=n_i + n_j)


@pytest.mark.parametrize(("width", "pins"), [
    pytest.param(128, {}, id="d128"),
    # the three-consumer tile of a full prefill at head width 64 (session 41's default there), head-major
    pytest.param(64, {"bm": "192", "bn": "128", "pingpong": "0", "head_major": "1"}, id="bm192-head-major"),
])
def test_persistent_without_mask(monkeypatch, tmp_path, width, pins):
    full = tmp_path / "full.habu"
    full.write_text(full_attention_source())
    golden_on_grids(monkeypatch, str(full), "ATTENTION-FULL", {**ONE, "E": width, "D": width, "I": 300, "J": 700},
                    pins, (None, 2), seed=9)


def test_persistent_is_bitwise_the_one_tile_a_block_kernel(monkeypatch):
    """Each work tile's arithmetic is the non-persistent kernel's, in the same order: the outputs are equal bit for
    bit, whatever the grid (one block walking every tile, a few, one an SM)."""
    sizes = {**GQA, "E": 64, "D": 64, "I": 300, "J": 520}
    path = str(EX / "attention.habu")
    one = build(path, "ATTENTION-GQA", sizes, {**WGMMA, "pingpong": "1"})
    per = build(path, "ATTENTION-GQA", sizes, {**WGMMA, "pingpong": "1", **PERSIST})
    assert per.plan.kernels[0].persistent and not one.plan.kernels[0].persistent
    inputs = make_inputs(one.model, one.sizes, 13)
    a = poisoned_outputs(one.model, one.sizes)
    one.compiled(**inputs, **a)
    for slots in (1, 4, 132):
        monkeypatch.setattr("habu.emit_cuda.runtime.resident_blocks", lambda *a, slots=slots, **k: slots)
        per.compiled.release_prepared()  # the grid is packed with a call's launches
        b = poisoned_outputs(one.model, one.sizes)
        per.compiled(**inputs, **b)
        torch.cuda.synchronize()
        assert not torch.isnan(b["O"]).any(), f"grid of {slots}: the persistent kernel left elements unwritten"
        assert torch.equal(a["O"], b["O"]), \
            f"grid of {slots}: persistent differs, max |Δ| {(a['O'] - b['O']).abs().max().item()}"
