"""Split-KV decode (flash-decoding, issue 22, `--pin kv_split=N`) on the GPU: examples/decode_attention.habu
at KV 1, 17 and 1000 (one split, a ragged one, 16 splits), lengths with an empty sequence (zeros), a full
one and lengths ending inside a split and exactly at a split's end, against the float64 model (golden;
outputs poisoned with NaN first); the split plan against the unsplit fused plan on the same inputs; and a
long cache (4096 keys, 16 sequences) whose many splits fill the GPU. Each case proves its plan (build: the
rules and a trial over Z_q × GF(p)) before it runs.

Run: python -m pytest -q tests/gpu/test_attention_decode_split.py (on the device machine)."""

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

DECODE = str(ROOT / "examples" / "decode_attention.habu")
HEADS = {"G": 2, "R": 2, "E": 128, "D": 128}


def run(sizes: dict[str, int], pins: dict[str, str], lens: list[int], seed: int, golden: bool = True):
    built = build(DECODE, "DECODE-ATTENTION", sizes, {"family": "attention", "bm": "16", "main_loop": "mma.sync",
                                                      **pins})
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, AttentionKernel) and kernel.kv_split == int(pins.get("kv_split", 0))
    inputs = make_inputs(built.model, built.sizes, seed)
    inputs["LEN"].copy_(torch.tensor(lens, dtype=inputs["LEN"].dtype))
    outs = poisoned_outputs(built.model, built.sizes)
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    if golden:
        ref = reference(built.model, inputs, built.sizes)["O"]
        tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
        g = compare(outs["O"], ref, tol)
        assert g.unwritten == 0, f"O: {g.unwritten} elements never written (or NaN) ({kernel})"
        assert g.ok, f"O: relative error {g.rel_error:.2e} > {tol:.0e} ({kernel})"
    return outs["O"].detach().to("cpu").double().numpy(), inputs


@pytest.mark.parametrize(("n_j", "pins"), [
    (1, {"kv_split": "64", "bn": "32"}), (17, {"kv_split": "64", "bn": "32"}), (1000, {"kv_split": "64", "bn": "32"}),
    (1000, {"kv_split": "256", "bn": "64"}),
], ids=lambda x: str(x))
def test_split_decode_golden_at_odd_sizes(n_j, pins):
    """Sequence 1 empty (zeros), sequence 2 full; the others end inside a split and at a split's end."""
    split = int(pins["kv_split"])
    lens = [min(n_j, 9), 0, n_j, min(n_j, split)]
    got, _ = run({"B": 4, **HEADS, "J": n_j, "L": n_j + 1}, pins, lens, seed=n_j)
    assert np.all(got[1] == 0)


def test_split_decode_matches_the_unsplit_fused_plan():
    sizes = {"B": 3, **HEADS, "J": 777, "L": 778}
    lens = [777, 300, 1]
    split, inputs = run(sizes, {"kv_split": "128", "bn": "64"}, lens, seed=4, golden=False)
    built = build(DECODE, "DECODE-ATTENTION", sizes, {"family": "attention", "bm": "16", "kv_split": "0"})
    outs = poisoned_outputs(built.model, built.sizes)
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    whole = outs["O"].detach().to("cpu").double().numpy()
    diff = np.abs(split - whole).max() / np.abs(whole).max()
    assert diff < 2e-2, f"split and unsplit differ by {diff} (of max |O|)"


def test_split_decode_long_cache_many_splits():
    """16 sequences of up to 4096 keys in splits of 512: 8 splits a query tile, 256 blocks."""
    lens = [4096, 4095, 1, 0, 513, 512, 511, 2048] * 2
    run({"B": 16, **HEADS, "J": 4096, "L": 4097}, {"kv_split": "512", "bn": "64"}, lens, seed=9)


def test_the_fused_decodes_default_split_on_a_long_cache():
    """`--pin family=attention` alone gives this plan for one sequence of 4096 keys (kv_split 128, KV tiles of
    32: tests/prove/test_attention_decode_split.py)."""
    run({"B": 1, **HEADS, "J": 4096, "L": 4097}, {"kv_split": "128", "bn": "32"}, [4000], seed=2)


@pytest.mark.parametrize(("n_j", "pins"), [
    pytest.param(1000, {"kv_split": "256", "bn": "64", "kv_warps": "4"}, id="kv1000-w4-split256"),
    pytest.param(17, {"kv_split": "64", "bn": "32", "kv_warps": "2"}, id="kv17-w2-split64"),
    pytest.param(1000, {"kv_split": "0", "bn": "64", "kv_warps": "4"}, id="kv1000-w4-whole"),
    pytest.param(1, {"kv_split": "0", "bn": "128", "kv_warps": "8"}, id="kv1-w8-whole"),
    pytest.param(1000, {"kv_split": "512", "bn": "64", "kv_warps": "4", "stages": "3"}, id="kv1000-w4-split512-s3"),
    pytest.param(1000, {"kv_split": "0", "bn": "32", "kv_warps": "2", "stages": "4"}, id="kv1000-w2-whole-s4"),
    pytest.param(5000, {"kv_split": "2048", "bn": "64", "kv_warps": "4", "stages": "3"}, id="kv5000-w4-split2048-s3"),
    pytest.param(5000, {"kv_split": "512", "bn": "64", "kv_warps": "4", "stages": "6"}, id="kv5000-w4-split512-s6"),
    # the first tiles copied before LEN is read (kv_ahead): masked splits copy tiles they never read
    pytest.param(1000, {"kv_split": "128", "bn": "64", "kv_warps": "4", "stages": "3", "kv_ahead": "true"},
                 id="kv1000-w4-split128-s3-ahead"),
    pytest.param(1000, {"kv_split": "0", "bn": "64", "kv_warps": "4", "stages": "3", "kv_ahead": "true"},
                 id="kv1000-w4-whole-s3-ahead"),
    pytest.param(17, {"kv_split": "64", "bn": "32", "kv_warps": "2", "stages": "2", "kv_ahead": "true"},
                 id="kv17-w2-split64-s2-ahead"),
])
def test_sliced_decode_golden_at_odd_sizes(n_j, pins):
    """A block's KV tiles sliced over 2-8 warps (`kv_warps`), their partials merged in shared memory, with and
    without split-KV, with 2-4 K/V buffers (`stages`): sequence 1 empty (zeros), sequence 2 full, the others ending inside a tile and at a
    split's end."""
    split = int(pins["kv_split"]) or n_j
    lens = [min(n_j, 9), 0, n_j, min(n_j, split)]
    got, _ = run({"B": 4, **HEADS, "J": n_j, "L": n_j + 1}, pins, lens, seed=n_j + 1)
    assert np.all(got[1] == 0)


WGMMA = {"main_loop": "wgmma", "bm": "64", "kv_warps": "1"}


@pytest.mark.parametrize("pins", [pytest.param({}, id="default"),
                                  pytest.param({"family": "attention", **WGMMA, "kv_split": "256", "bn": "64"},
                                               id="wgmma")])
def test_a_second_and_third_call_reuse_the_counters_the_first_left_zero(pins):
    """The split-KV counters are zero-filled once a stream (`CudaKernel.zero_once`) and reset by each launch's
    combining blocks (the wgmma loop's: its consumer warpgroups): calls after the first, on new inputs, must
    combine again (a counter left non-zero would never reach the split count: the output would keep its
    poison)."""
    sizes = {"B": 4, **HEADS, "J": 1000, "L": 1001}
    built = build(DECODE, "DECODE-ATTENTION", sizes, pins)
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, AttentionKernel) and kernel.kv_split and kernel.kv_warps == (1 if pins else 8)
    tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
    for seed, lens in ((1, [1000, 0, 513, 7]), (2, [999, 1000, 1, 128]), (3, [0, 0, 640, 1000])):
        inputs = make_inputs(built.model, built.sizes, seed)
        inputs["LEN"].copy_(torch.tensor(lens, dtype=inputs["LEN"].dtype))
        outs = poisoned_outputs(built.model, built.sizes)
        built.compiled(**inputs, **outs)
        torch.cuda.synchronize()
        g = compare(outs["O"], reference(built.model, inputs, built.sizes)["O"], tol)
        assert g.unwritten == 0 and g.ok, (seed, g.unwritten, g.rel_error)


@pytest.mark.parametrize(("n_j", "pins"), [
    pytest.param(1000, {**WGMMA, "kv_split": "256", "bn": "64", "stages": "3"}, id="wgmma-kv1000-split256"),
    pytest.param(17, {**WGMMA, "kv_split": "128", "bn": "64", "stages": "2"}, id="wgmma-kv17-split128"),
    pytest.param(5000, {**WGMMA, "kv_split": "1024", "bn": "128", "stages": "3"}, id="wgmma-kv5000-split1024"),
    pytest.param(1000, {**WGMMA, "kv_split": "0", "bn": "128", "stages": "3"}, id="wgmma-kv1000-whole"),
])
def test_wgmma_decode_golden_at_odd_sizes(n_j, pins):
    """The decode on the wgmma loop (the query heads of a KV head in a 64-row tile, K and V by TMA), split-KV
    with the partials written and combined by the consumer warpgroups: sequence 1 empty (zeros), sequence 2
    full, the others ending inside a tile and at a split's end."""
    split = int(pins["kv_split"]) or n_j
    lens = [min(n_j, 9), 0, n_j, min(n_j, split)]
    got, _ = run({"B": 4, **HEADS, "J": n_j, "L": n_j + 1}, pins, lens, seed=n_j + 2)
    assert np.all(got[1] == 0)


@pytest.mark.parametrize(("batch", "n_j", "loop", "split"),
                         [(16, 32768, "wgmma", 8192), (64, 2048, "wgmma", 0), (8, 4096, "mma.sync", 512),
                          (2, 4096, "mma.sync", 256), (1, 32768, "mma.sync", 512), (3, 1000, "mma.sync", 256),
                          (16, 4096, "mma.sync", 1024), (4, 32768, "mma.sync", 2048)],
                         ids=["b16-kv32768", "b64-kv2048", "b8-kv4096", "b2-kv4096", "b1-kv32768", "b3-kv1000",
                              "b16-kv4096", "b4-kv32768"])
def test_the_decode_default(batch, n_j, loop, split):
    """A decode's default (unpinned): the wide mma.sync block (8 warps over 128-key tiles, `decode_split_one_wave`)
    where its splits run in one wave: splits of 512 keys at 8 sequences of 4096 and at one of 32768, of 256 at 2
    sequences of 4096 and at 3 of 1000 (the last split ragged), of 1024 at 16 of 4096, of 2048 at 4 of 32768;
    else the wgmma loop (`wgmma_decode_split`): split over 8192 keys at 16 sequences of 32768, whole at 64.
    Lengths from empty to full; each plan called twice (the combine's counters reset)."""
    sizes = {"B": batch, **HEADS, "J": n_j, "L": n_j + 1}
    built = build(DECODE, "DECODE-ATTENTION", sizes, {})
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, AttentionKernel) and kernel.main_loop == loop and kernel.kv_split == split
    assert loop == "wgmma" or (kernel.kv_warps, kernel.bn, kernel.stages) == (8, 128, 3)
    tol = tolerance(built.model, dict(built.plan.storage), built.plan.kernels)
    lens = [(7919 * b) % (n_j + 1) for b in range(batch)]
    lens[:3] = [0, n_j, 1] if batch >= 3 else [n_j - 3, n_j][:batch]
    inputs = make_inputs(built.model, built.sizes, batch)
    inputs["LEN"].copy_(torch.tensor(lens, dtype=inputs["LEN"].dtype))
    for _ in range(2):  # a second call combines again (the counters reset)
        outs = poisoned_outputs(built.model, built.sizes)
        built.compiled(**inputs, **outs)
        torch.cuda.synchronize()
        g = compare(outs["O"], reference(built.model, inputs, built.sizes)["O"], tol)
        assert g.unwritten == 0 and g.ok, (g.unwritten, g.rel_error)
