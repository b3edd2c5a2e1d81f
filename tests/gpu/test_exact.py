"""The exact differential check on the GPU (run through the device tool): every example's default plan
and the emitter paths compared bit for bit on small-integer inputs in red-zoned buffers; a wrong
element, an unwritten element, a red-zone write and a hang are each caught and named."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

import habu  # noqa: E402
from habu.bench.run import build  # noqa: E402
from habu.bench.sanitize_paths import CASES, example_path, run_case  # noqa: E402
from habu.timing.exact import ExactCheckError, ExactTimeout, kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker, check_built  # noqa: E402
from habu.timing.worker import GpuTimer  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"

DEFAULTS = {  # every example model, at a shape that keeps the test short
    "ggemm": ("ggemm.habu", "GGEMM", {"M": 1000, "N": 777, "K": 511}, True),
    "gemm": ("gemm.habu", "GEMM", {"M": 1024, "N": 768, "K": 2048}, True),
    "moe": ("moe_gather.habu", "MOE-UP", {"T": 4096, "R": 1000, "N": 1536, "K": 4096}, True),
    "fused": ("fused.habu", "AXPY-RELU", {"N": 100003}, True),
    "softmax": ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 1000}, False),
    "rmsnorm": ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 64, "D": 4096}, False),
    "rmsnorm-eq": ("rmsnorm.habu", "RMSNORM-EQ", {"R": 64, "D": 4096}, False),
    "rmsnorm-linear": ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 256, "D": 512, "N": 384}, False),
    "ffn-skip": ("ffn_skip.habu", "FFN-SKIP", {"B": 40, "D": 256, "H": 320}, False),
    "scatter-add": ("scatter_add.habu", "UNPERMUTE", {}, True),  # f32 atomicAdd: exact in any order
    "accumulate": ("accumulate.habu", "GEMM-ACC", {}, True),
}


@pytest.mark.parametrize("case", list(DEFAULTS))
def test_every_example_default_plan_passes_the_exact_check(case):
    path, model, sizes, exact = DEFAULTS[case]
    built = build(str(EX / path), model, sizes)
    result = ExactChecker(built.model, built.sizes, seed=3).check(built.compiled, kept_types(built.plan))
    assert result.ok, result.reason()
    assert result.applicable == exact, result.summary
    if not exact:
        assert result.summary.startswith("exact: not applicable (uses ")


PINNED = {  # the emitter paths, pinned, on ggemm at ragged and aligned shapes
    "wgmma": {},
    "wgmma-a-ldg": {"A": "ldg"},
    "wgmma-b-cp.async": {"B": "cp.async"},
    "wgmma-staged": {"A": "staged", "B": "staged"},
    "wgmma-split2": {"split_k": "2", "tile": "128x128x64"},
    "wgmma-persistent": {"persistent": "true", "tile": "128x128x64", "stages": "5"},
    "wgmma-store-tma": {"store": "tma"},
    "wgmma-two-blocks": {"tile": "128x128x64", "warps": "8", "stages": "3", "store": "direct", "blocks_per_sm": "2"},
    "wgmma-two-blocks-persistent": {"tile": "128x128x64", "warps": "8", "stages": "2", "store": "tma",
                                    "blocks_per_sm": "2", "persistent": "true"},
    "mma.sync": {"mma": "mma.sync"},
    "mma.sync-staged": {"mma": "mma.sync", "A": "staged"},  # its buffer by ldg at K = 511, cp.async at 512
    "fma": {"mma": "fma"},
    "fma-staged": {"mma": "fma", "A": "staged"},  # its buffer read an element at a time
    "fma-split3": {"mma": "fma", "split_k": "3"},
}


@pytest.mark.parametrize("k", [511, 512])
@pytest.mark.parametrize("path", list(PINNED))
def test_pinned_paths_pass_the_exact_check(path, k):
    try:
        built = build(str(EX / "ggemm.habu"), "GGEMM", {"M": 1000, "N": 776, "K": k}, PINNED[path])
    except AssertionError as err:
        if "plan not proven" in str(err):
            pytest.skip(f"the rules reject {path} at K={k}: {err}")
        raise
    result = ExactChecker(built.model, built.sizes, seed=k).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model, pins", [("GRAM", {}), ("GRAM", {"tile": "64x256x64"}), ("SQUARE", {}),
                                         ("SQUARE", {"tile": "128x64x64"}), ("SQUARE", {"A": "staged", "B": "staged"})])
def test_one_tensor_as_both_operands_passes_the_exact_check(model, pins):
    """Regression (session 58): S·S was proven and printed with B's loads through A's tensor map; (session 60, the
    fuzz's shared product 412) both operands staged into one buffer `@S`."""
    built = build(str(ROOT / "tests" / "data" / "one_operand_twice.habu"), model, {"M": 1000, "K": 520}, pins)
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model, pins", [("BATCH-N", {}), ("BATCH-M", {}), ("BATCH-N", {"mma": "mma.sync"})])
def test_a_batch_over_a_tile_extent_passes_the_exact_check(model, pins):
    """Regression (session 59): the field check refused these right plans (its box took the batch dim for n's)."""
    built = build(str(ROOT / "tests" / "data" / "batch_over_a_tile_extent.habu"), model, {}, pins)
    result = ExactChecker(built.model, built.sizes, seed=6).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["INNER-A", "INNER-B", "ONE-UNALIGNED", "ONE-SKINNY"])
def test_the_batch_axes_fuzz_findings_pass_the_exact_check(model):
    """Regression (session 68's fuzz): these defaults broke their own rules or proof (an operand read by TMA or in
    vectors along its innermost batch axis; a batch axis of extent 1 staged, or its skinny product transposed and
    split); session 69 read each such operand in place, an element at a time; session 70 stages it (a pass copies it
    k-major, the batch axes outermost)."""
    built = build(str(ROOT / "tests" / "data" / "batch_innermost.habu"), model, {}, {})
    result = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("case", list(CASES))
def test_the_sanitizer_cases_pass_outside_the_sanitizer(case):
    assert run_case(case).startswith(case)


def test_the_row_and_map_paths_are_checked_exactly():
    for case in ("rows-sum", "rows-max", "map"):
        path, model, sizes, pins = CASES[case]
        built = build(example_path(path), model, sizes, pins)
        result = ExactChecker(built.model, built.sizes).check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, (case, result.summary)


# ----------------------------------------------------------------------------- wrong kernels are caught


def _ggemm():
    return build(str(EX / "ggemm.habu"), "GGEMM", {"M": 300, "N": 200, "K": 512})


def test_a_corrupted_element_fails_with_the_element_named():
    built = _ggemm()

    def wrong(**tensors):
        out = built.compiled(**tensors)
        out[7, 11] += 1.0  # on the device, after the launch, before the check reads it
        return out

    result = ExactChecker(built.model, built.sizes).check(wrong, {})
    assert not result.ok and result.mismatch is not None
    assert result.mismatch.output == "O" and result.mismatch.index == (7, 11)
    assert result.mismatch.got == result.mismatch.want + 1.0 and result.mismatch.differing == 1
    assert result.reason().startswith("exact check: O[7, 11]: got ")


def test_an_unwritten_element_fails():
    built = _ggemm()

    def partial(**tensors):
        out = built.compiled(**tensors)
        out[299, 199] = float("nan")  # as if the last tile's corner were never stored
        return out

    result = ExactChecker(built.model, built.sizes).check(partial, {})
    assert not result.ok and result.mismatch.index == (299, 199)
    assert "never written" in result.reason()


def test_a_write_into_the_red_zone_is_caught():
    built = _ggemm()

    def overruns(**tensors):
        out = built.compiled(**tensors)
        flat = out.reshape(-1)
        torch.as_strided(flat, (flat.numel() + 3,), (1,))[-1] = 1.0  # 8 bytes past the last element
        a = tensors["A"].reshape(-1)
        torch.as_strided(a, (1,), (1,), a.storage_offset() - 1)[0] = 2.0  # just before A's first element
        return out

    result = ExactChecker(built.model, built.sizes).check(overruns, {})
    assert not result.ok and result.mismatch is None
    assert "O: 4 guard bytes overwritten after the buffer (first 8 bytes past its end)" in result.damage
    assert "A: 2 guard bytes overwritten before the buffer (nearest 1 bytes before element 0)" in result.damage


def test_a_modified_input_is_caught():
    built = _ggemm()

    def clobbers(**tensors):
        out = built.compiled(**tensors)
        tensors["B"][0, 0] = 0.0
        return out

    result = ExactChecker(built.model, built.sizes).check(clobbers, {})
    assert not result.ok and "B: the input was modified" in result.damage


def test_a_launch_that_does_not_finish_times_out():
    built = _ggemm()

    def hangs(**tensors):
        out = built.compiled(**tensors)  # (GGEMM's launch checks its indices on the host: it synchronises)
        torch.cuda._sleep(int(5 * 2.0e9))  # then ~5 s of GPU cycles before the check's event
        return out

    with pytest.raises(ExactTimeout, match=r"did not finish within 0\.5 s"):
        ExactChecker(built.model, built.sizes).check(hangs, {}, timeout_s=0.5)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- habu.build and the worker


def test_habu_build_runs_the_exact_check():
    model = habu.build(EX / "ggemm.habu", trials=1, M=300, N=200, K=511)
    assert model.kernel_set.members
    a = torch.ones((300, 511), dtype=torch.bfloat16, device="cuda")
    b = torch.ones((200, 511), dtype=torch.bfloat16, device="cuda")
    ix = torch.arange(300, dtype=torch.int32, device="cuda")
    assert float(model(A=a, B=b, IX=ix)[5, 6]) == 511.0


def test_check_built_raises_naming_the_element(monkeypatch):
    model = habu.build(EX / "fused.habu", trials=1, check=False, N=4100)
    real = model.__call__

    class Wrong:
        kernel_set = model.kernel_set

        def __call__(self, **tensors):
            out = real(**tensors)
            out[17] = -1.0
            return out

        def release_prepared(self):
            model.release_prepared()

    with pytest.raises(ExactCheckError, match=r"fails the exact check at N=4100: exact check: y\[17\]"):
        check_built(Wrong(), model.model, [{}] * len(model.kernel_set.members))


def test_the_timing_worker_reports_the_exact_check():
    path = EX / "ggemm.habu"
    sizes = {"M": 512, "N": 256, "K": 511}
    built = build(str(path), "GGEMM", sizes)
    timer = GpuTimer(str(path), "GGEMM", sizes)
    try:
        assert timer.start() is not None, timer.unavailable
        m = timer.measure(built.plan.to_json())
        assert m.ok, m.reason
        assert m.exact and m.exact["ok"] and m.exact["applicable"]
        assert "exact" in (m.seconds or {})
    finally:
        timer.close()


def test_regression_the_search_worker_golden_checks_every_plan_of_an_in_place_model():
    """A scatter's (or `+=`'s) target is an input the run updates in place. The worker computed its
    reference once from input set 0, and every plan's golden run, timing loop and the torch baseline
    added into that set: every plan after the first was judged against stale prior contents. The
    worker now restores the drawn contents before each golden run."""
    path = EX / "scatter_add.habu"
    built = build(str(path), "UNPERMUTE", {})
    timer = GpuTimer(str(path), "UNPERMUTE", {})
    try:
        assert timer.start() is not None, timer.unavailable
        for _ in range(3):  # the same plan three times: each golden run must start from the drawn Y
            m = timer.measure(built.plan.to_json())
            assert m.ok, m.reason
    finally:
        timer.close()


def test_an_m_major_a_over_a_runtime_m_runs_both_members_exactly():
    """Regression (session 68's fuzz): the guarded wgmma member (M a multiple of 8) and the unguarded mma.sync member
    that replaced a refused fallback; `habu.build` checks each member exactly, then each runs where its guard sends
    it, against float64."""
    cm = habu.build(str(ROOT / "tests" / "data" / "m_major_runtime.habu"), "M-MAJOR-RUNTIME")
    for m in (104, 100, 1):
        _against_float64(cm, {"M": m, "N": 128, "K": 64}, "Y", seed=m)


def _against_float64(cm, sizes: dict[str, int], out: str, seed: int) -> None:
    """Run a built kernel set at `sizes` (its guards pick the member) on fresh inputs into poisoned outputs, and
    compare `out` with the float64 model."""
    import numpy as np

    from habu.timing.harness import make_inputs, poisoned_outputs, reference

    model = cm.model.with_sizes(sizes)
    inputs = make_inputs(model, sizes, seed)
    outs = poisoned_outputs(model, sizes)
    cm(**inputs, **outs)
    torch.cuda.synchronize()
    got = outs[out].detach().to("cpu").double().numpy()
    assert np.allclose(got, reference(model, inputs, sizes)[out], rtol=1e-3, atol=1e-3), sizes


def test_a_product_gathered_on_its_reduction_over_a_runtime_n_runs_both_members_exactly():
    """Regression (session 68's fuzz, fixed in session 69): the guarded wgmma member (A staged, DY by TMA where N is a
    multiple of 8) and the unguarded mma.sync member reading the staged A's buffer; `habu.build` checks each member
    exactly, then each runs where its guard sends it, against float64."""
    cm = habu.build(str(ROOT / "tests" / "data" / "k_gathered_runtime.habu"), "K-GATHERED-RUNTIME")
    for n in (64, 13, 1):
        _against_float64(cm, {"M": 190, "N": n, "K": 72, "T": 300}, "DW", seed=n)


def test_a_staged_product_over_a_runtime_n_runs_both_members_exactly():
    """Regression (session 69): the guarded member (both operands staged, the output stored by TMA where N·4 bytes is
    a multiple of 16) and the unguarded one, the same wgmma kernel storing from its registers; each exact through
    `habu.build`, then N = 200, 13 and 1 against float64."""
    cm = habu.build(str(ROOT / "tests" / "data" / "staged_runtime_n.habu"), "STAGED-RUNTIME-N")
    for n in (200, 13, 1):
        _against_float64(cm, {"M": 300, "N": n, "K": 511, "T": 500}, "O", seed=n)


@pytest.mark.parametrize(("model", "pins"), [("BATCHED-K511", {}), ("SHARED-K511", {}), ("BATCH-INNERMOST", {}),
                                             ("BATCH-INNERMOST", {"mma": "mma.sync"}),
                                             ("BATCH-INNERMOST", {"mma": "fma", "A": "staged", "B": "staged"}),
                                             ("BATCHED-K511", {"mma": "mma.sync", "A": "staged", "B": "staged"})])
def test_a_batched_products_staging_passes_are_exact(model, pins):
    """Session 70: a batched contraction's staging passes (grid.z over the batches, the buffer's batch axes outermost;
    a weight shared by every batch copied once), read by TMA on wgmma, by cp.async or ldg on mma.sync and SIMT."""
    built = build(str(ROOT / "tests" / "data" / "batched_staged.habu"), model, {}, pins)
    assert "staged" in (built.plan.kernels[0].a_move, built.plan.kernels[0].b_move)
    result = ExactChecker(built.model, built.sizes, seed=8).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("batches", [8, 13, 16])
@pytest.mark.parametrize("mma", ["wgmma", "mma.sync"])
def test_a_batch_tile_staging_pass_is_exact_over_one_and_two_slabs(batches, mma):
    """Session 71: an operand whose innermost index is the batch axis is staged in (8 batches × 128 k) tiles
    through shared memory: #S = 8 one whole slab, 13 a ragged second one (batches 13..15 masked), 16 two whole."""
    built = build(str(ROOT / "tests" / "data" / "batched_staged.habu"), "BATCH-INNERMOST", {"S": batches},
                  {"mma": mma})
    stages = [k.lowering for k in built.compiled.kernel_set.members[0][1].kernels if "stage" in k.name]
    assert len(stages) == 2 and all(st.tile is not None and st.tile.axis == "batch0" for st in stages)
    result = ExactChecker(built.model, built.sizes, seed=batches).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def test_a_batched_staging_pass_over_a_runtime_batch_extent_runs_exactly():
    """Two batch axes, #H a runtime extent: the pass decodes grid.z = #G·#H at each size; `habu.build` checks the
    kernel set exactly, then #H = 1, 3 and 8 against float64."""
    cm = habu.build(str(ROOT / "tests" / "data" / "batched_staged.habu"), "TWO-BATCHES-RUNTIME")
    for h in (1, 3, 8):
        _against_float64(cm, {"G": 2, "H": h, "M": 200, "N": 136, "K": 511}, "R", seed=h)


def test_a_planted_staging_pass_that_leaves_its_padding_unwritten_fails_the_exact_check(monkeypatch):
    """An emitter plant (session 70): the staging pass printed with the source's bound (k < #K) instead of its own
    (the padded row, zeros past #K), the lowering and its proof unchanged. The mma.sync main loop's 16-byte vectors
    from k = 504 read the padding; the exact check fills the intermediates a call allocates with 0xFF first
    (`poisoned_intermediates`), so those elements are NaNs, not a stale zero, and the outputs differ."""
    from dataclasses import replace

    import habu.emit_cuda.emit_stage as emit_stage

    real = emit_stage._rows

    def unpadded(stage, *args):
        k_bound = tuple(b for b in stage.src.masks if b.axis == "k")  # k < #K: the padding left unwritten
        masks = tuple(b for b in stage.dst.masks if b.axis != "k") + k_bound
        return real(replace(stage, dst=replace(stage.dst, masks=masks)), *args)

    pins = {"mma": "mma.sync", "A": "staged", "B": "staged"}
    shape = {"M": 300, "N": 200, "K": 511}
    built = build(str(ROOT / "examples" / "ggemm.habu"), "GGEMM", shape, pins)
    assert ExactChecker(built.model, built.sizes, seed=9).check(built.compiled, kept_types(built.plan)).ok
    monkeypatch.setattr(emit_stage, "_rows", unpadded)
    planted = build(str(ROOT / "examples" / "ggemm.habu"), "GGEMM", shape, pins)
    assert "(kk) < 511) {" in planted.compiled.kernel_set.members[0][1].kernels[0].source
    result = ExactChecker(planted.model, planted.sizes, seed=9).check(planted.compiled, kept_types(planted.plan))
    assert not result.ok, "the unwritten padding went unseen"


def test_an_unguarded_member_that_keeps_its_tma_operands_runs_exactly():
    """Session 70: tests/data/output_guard_runtime_n.habu's unguarded member keeps A and B by TMA and stores Y from
    its registers (its guarded member stores by TMA where N·4 bytes is a multiple of 16); each exact through
    `habu.build`, then N = 1001, 64 and 7 against float64."""
    cm = habu.build(str(ROOT / "tests" / "data" / "output_guard_runtime_n.habu"), "OUTPUT-GUARD")
    for n in (1001, 64, 7):
        _against_float64(cm, {"M": 300, "N": n, "K": 512}, "Y", seed=n)


def test_one_tensor_staged_in_two_layouts_by_two_kernels_is_exact():
    """Session 72: the chain's backward with K pinned staged copies K in two layouts (rows along e for h1, along j
    for h3) into two buffers, `@K` and `@K_k<i>` (habu/lower/stage_names.py); they shared one buffer before."""
    from habu.bench.run import build_model
    from habu.cli_grad import backward_program
    from habu.spec.parser import load_program

    program, name = backward_program(load_program(ROOT / "tests" / "data" / "staged_twice.habu"), "CHAIN", None,
                                     "auto")
    built = build_model(program.models[name], pins={"K": "staged", "storage": "bf16"})
    buffers = {n for n, _d, _e in built.compiled.kernel_set.members[0][1].intermediates if n.startswith("@K")}
    assert len(buffers) == 2, buffers
    result = ExactChecker(built.model, built.sizes, seed=72).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("sizes", [{"M": 300, "N": 260, "K": 511}, {"M": 1000, "N": 776, "K": 1000}])
def test_the_mma_sync_default_of_a_short_small_product_takes_64_by_64_tiles_and_is_exact(sizes):
    """Session 73: a short product (K ≤ 1024) whose 128 × 128 tiles fill under half the SMs takes 64 × 64 tiles on
    mma.sync (split in two at 300 × 260 × 511)."""
    built = build(str(EX / "ggemm.habu"), "GGEMM", sizes, {"mma": "mma.sync"})
    (kern,) = [k for k in built.plan.kernels if getattr(k, "mma", None) == "mma.sync"]
    assert (kern.tile_m, kern.tile_n) == (64, 64)
    result = ExactChecker(built.model, built.sizes, seed=73).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
