"""The exact differential check's pure parts on the CPU: which models are integer-exact, inputs
whose sums stay exact, the exact reference, bit comparison naming the first wrong element, red-zone
bookkeeping, the bounded wait and the shapes a kernel set is checked at. The device side runs in
tests/gpu/test_exact.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from habu.spec.parser import load_program
from habu.timing.exact import (
    F32_EXACT,
    GUARD_BYTES,
    GUARD_PATTERN,
    POISON_BITS,
    VALUE_RANGES,
    ExactResult,
    GuardedLayout,
    applicability,
    compare_outputs,
    exact_reference,
    first_mismatch,
    from_bits,
    integer_inputs,
    kept_types,
    tensor_bounds,
    to_bits,
    wait_for,
    witness_sizes,
)
from tests.conftest import ROOT, parse


def gemm(k: int, dtype: str = "bf16", out: str = "f32", m: int = 2, n: int = 3) -> tuple:
    text = (f"{m} EXTENT: #M\n{n} EXTENT: #N\n{k} EXTENT: #K\n{dtype} TENSOR: A ( #M #K )\n"
            f"{dtype} TENSOR: B ( #N #K )\n{out} TENSOR: C ( #M #N )\n"
            "MODEL: G  C[m n] = Σ k A[m k] · B[n k] ;\n")
    model = parse(text).models["G"]
    return model, {e.name: e.size for e in model.extents}


# ----------------------------------------------------------------------------- inputs keep sums exact


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 2**22), dtype=st.sampled_from(["bf16", "f16", "f32"]))
def test_the_chosen_range_keeps_every_k_long_sum_exact_in_f32(k, dtype):
    model, sizes = gemm(k, dtype)
    found = applicability(model, sizes)
    if not found.exact:
        assert k > F32_EXACT // (min(VALUE_RANGES) ** 2)  # even ±1 would overflow 2^24
        assert "2^24" in found.reason
        return
    r = found.value_range
    assert r * r * k <= F32_EXACT  # the worst-case partial sum, in any order, is a float32 integer
    assert found.peak == r * r * k
    assert r == max(VALUE_RANGES) or (r + 1) ** 2 * k > F32_EXACT  # the widest range that fits


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 3000), dtype=st.sampled_from(["bf16", "f16", "f32"]), seed=st.integers(0, 2**16))
def test_inputs_are_nonzero_small_integers_and_the_reference_is_exact(k, dtype, seed):
    model, sizes = gemm(k, dtype)
    found = applicability(model, sizes)
    inputs = integer_inputs(model, sizes, found.value_range, seed)
    for name in ("A", "B"):
        v = inputs[name]
        assert np.all(v == np.round(v)) and np.all(v != 0) and np.all(np.abs(v) <= found.value_range)
        assert np.array_equal(v.astype(np.float64), from_bits(to_bits(v.astype(np.float64), dtype), dtype))
    ref = exact_reference(model, sizes, inputs)
    exact = inputs["A"].astype(np.int64) @ inputs["B"].astype(np.int64).T
    assert np.array_equal(ref["C"], exact.astype(np.float64))


def test_regression_a_scalar_outputs_exact_reference_has_its_declared_shape():
    """The evaluator holds a scalar as shape (1,); the device buffer is shape (): the exact check compared
    the two and raised "d: shape () != (1,)" on the H200 for every scalar reduction."""
    text = "5 EXTENT: #N\nf32 TENSOR: x ( #N )\nf32 TENSOR: d ( )\nMODEL: DOT  d = Σ n x[n] ;\n"
    model = parse(text).models["DOT"]
    sizes = {"N": 5}
    inputs = integer_inputs(model, sizes, applicability(model, sizes).value_range, 1)
    ref = exact_reference(model, sizes, inputs)
    assert ref["d"].shape == () and ref["d"] == inputs["x"].astype(np.float64).sum()
    got = to_bits(ref["d"], "f32")
    assert compare_outputs({"d": got}, {"d": got.copy()}, {"d": "f32"}) is None


def test_index_tensors_are_in_range_with_duplicates():
    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    sizes = {"M": 50, "N": 8, "K": 16}
    ix = integer_inputs(model.with_sizes(sizes), sizes, 3, seed=1)["IX"]
    assert ix.shape == (50,) and ix.min() >= 0 and ix.max() < 50
    assert len(np.unique(ix)) < len(ix)  # at least one duplicate


# ----------------------------------------------------------------------------- which models are exact

EXPECTED = {
    ("accumulate.habu", "GEMM-ACC"): None,
    ("attention.habu", "ATTENTION-GQA"): "uses div0, exp, rsqrt",
    ("bias_grad.habu", "BIAS-GRAD"): None,
    ("bmm.habu", "SCORES"): None,
    ("column_reductions.habu", "BIAS-GRAD-3D"): None,
    ("decode_attention.habu", "DECODE-ATTENTION"): "uses div0, exp, rsqrt",
    ("column_reductions.habu", "COL-MAX"): None,
    ("column_reductions.habu", "BIAS-GRAD-UNSCALED"): "uses the constant 0.000976562",
    ("families.habu", "GGEMM"): None,
    ("families.habu", "RMSNORM"): "uses rsqrt",
    ("families.habu", "SOFTMAX"): "uses exp",
    ("families.habu", "SOFTMAX-NODES"): "uses exp",
    ("families.habu", "BIAS-GRAD"): None,
    ("families.habu", "SWIGLU"): "uses sigmoid",
    ("ffn_skip.habu", "FFN-SKIP"): "uses erf, rsqrt",
    ("fused.habu", "AXPY-RELU"): None,
    ("gemm.habu", "GEMM"): None,
    ("ggemm.habu", "GGEMM"): None,
    ("moe_gather.habu", "MOE-UP"): None,
    ("moe_deepseek_v3.habu", "MOE-FFN"): "uses sigmoid",
    ("moe_mixtral.habu", "MOE-FFN"): "uses sigmoid",
    ("moe_qwen3_30b_a3b.habu", "MOE-FFN"): "uses sigmoid",
    ("rmsnorm.habu", "RMSNORM-ROWS"): "uses rsqrt",
    ("rmsnorm.habu", "RMSNORM-EQ"): "uses rsqrt",
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR"): "uses rsqrt",
    ("rows_nd.habu", "RMSNORM-BSD"): "uses rsqrt",
    ("rows_nd.habu", "SOFTMAX-ZHIJ"): "uses exp",
    ("scatter_add.habu", "UNPERMUTE"): None,
    ("weighted_scores.habu", "SCORES"): None,
    ("softmax.habu", "SOFTMAX-ROWS"): "uses exp",
}


def test_every_example_model_is_classified():
    found = {(p.name, m) for p in sorted((ROOT / "examples").glob("*.habu"))
             for m in load_program(p).models}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("example, model", list(EXPECTED), ids=lambda x: str(x))
def test_applicability_of_the_example_models(example, model):
    m = load_program(ROOT / "examples" / example).models[model]
    sizes = {e.name: e.size or e.lo for e in m.extents}
    found = applicability(m, sizes)
    why = EXPECTED[(example, model)]
    if why is None:
        assert found.exact and found.describe().startswith("exact: inputs in ±1..±")
    else:
        assert not found.exact and found.describe() == f"exact: not applicable ({why})"


def test_gemm_with_a_bf16_output_is_compared_after_one_rounding():
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    found = applicability(m, {"M": 8192, "N": 8192, "K": 8192})
    assert found.exact and found.rounded == ("C",) and found.peak == 9 * 8192
    small = applicability(m.with_sizes({"K": 16}), {"M": 8192, "N": 8192, "K": 16})
    assert small.exact and small.rounded == ()  # 9 · 16 = 144 is a bf16 integer


def test_max_relu_and_a_residual_add_stay_exact():
    text = ("4 EXTENT: #M\n4 EXTENT: #N\n64 EXTENT: #K\nbf16 TENSOR: A ( #M #K )\nbf16 TENSOR: B ( #N #K )\n"
            "bf16 TENSOR: R ( #M #N )\nf32 TENSOR: C ( #M #N )\n"
            "MODEL: G  C[m n] = max( Σ k A[m k] · B[n k] + R[m n] , 0 ) ;\n"
            "MODEL: H  C[m n] = max k' A[m k'] · R[m n] ;\n")
    program = parse(text)
    for name, peak in (("G", 9 * 64 + 3), ("H", 9)):
        m = program.models[name]
        found = applicability(m, {e.name: e.size for e in m.extents})
        assert found.exact and found.peak == peak, found


def test_a_16_bit_intermediate_must_hold_its_integers():
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    sizes = {"M": 64, "N": 64, "K": 300}
    assert applicability(m.with_sizes(sizes), sizes, {"C": "f32"}).exact
    found = applicability(m.with_sizes(sizes), sizes, {"C": "bf16"})
    assert not found.exact
    assert found.reason == "the intermediate C is stored in bf16, exact only up to 256, and reaches 300 even with inputs in ±1"
    assert applicability(m.with_sizes({"K": 64}), {"M": 64, "N": 64, "K": 64}, {"C": "bf16"}).value_range == 2
    tiny = {"M": 64, "N": 64, "K": 28}  # 9 · 28 = 252: ±3 fits a bf16 intermediate
    assert applicability(m.with_sizes(tiny), tiny, {"C": "bf16"}).value_range == 3


def test_accumulators_are_f32_so_they_keep_every_partial_sum():
    """kept_types names a kernel's accumulator when it is narrower than f32; the plan's field table now
    allows only f32 accumulators (a 16-bit one is refused when the kernel is built), so it never does."""
    from dataclasses import replace

    from habu.plan.fields import FieldError
    from habu.search.space import default_plan
    from habu.target import TARGETS

    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    sizes = {"M": 256, "N": 256, "K": 512}
    plan = default_plan(m.with_sizes(sizes), TARGETS["sm_90a"], sizes, {})
    assert kept_types(plan) == dict(plan.storage)  # f32 accumulators keep every partial sum
    with pytest.raises(FieldError, match="accumulator must be one of f32"):
        replace(plan.kernels[0], accumulator="f16")


def test_regression_a_gathered_copy_is_bounded_by_its_source_not_the_models_peak():
    """Session 30's `gather:dB` plan (A's rows copied into a bf16 intermediate dB.g, then the contraction)
    "failed" its GPU exact check at 1100 × 136 × 1032: the check never ran. dB.g is an intermediate of the
    rewritten graph, not of the model, so its bound fell back to the model's peak (the sum over 1100 rows)
    and a bf16 intermediate past 256 made the plan "not applicable". Its bound is A's: ±3."""
    from habu.search.space import default_plan
    from habu.target import TARGETS

    sizes = {"M": 300, "N": 16, "K": 24}  # more than 256 rows summed: the old bound refused even ±1
    model = load_program(ROOT / "tests" / "data" / "ggemm_backward.habu").models["GGEMM-DB"].with_sizes(sizes)
    plan = default_plan(model, TARGETS["sm_90a"], sizes, {"rewrite": "gather:dB"})
    kept = kept_types(plan)
    found = applicability(model, sizes, kept)
    assert found.exact and found.value_range == 3 and found.peak == 9 * 300, found
    assert dict(kept) == {"dB.g": "bf16"} and kept.rewrites == ("gather:dB",)
    # a plain mapping names no rewrite: an intermediate the model lacks may hold any value (the peak)
    assert not applicability(model, sizes, dict(kept)).exact


def test_a_rewritten_graphs_intermediate_still_bounds_the_plan():
    """The rewritten graph's bound counts where it is larger: dA.mm (the split product of scatter:dA)
    in bf16 would round its sums past 256 (a plan that stored it so is not exact)."""
    from habu.timing.exact import KeptTypes

    sizes = {"M": 8, "N": 300, "K": 8}
    model = load_program(ROOT / "tests" / "data" / "ggemm_backward.habu").models["GGEMM-DA"].with_sizes(sizes)
    assert applicability(model, sizes, KeptTypes((("dA.mm", "f32"),), ("scatter:dA",))).value_range == 3
    found = applicability(model, sizes, KeptTypes((("dA.mm", "bf16"),), ("scatter:dA",)))
    assert not found.exact and "dA.mm is stored in bf16" in found.reason and "reaches 300" in found.reason


def test_bounds_of_a_fused_axpy_relu():
    m = load_program(ROOT / "examples" / "fused.habu").models["AXPY-RELU"]
    bounds = tensor_bounds(m, {"N": 16}, 3)
    assert bounds["%1"] == 9 and bounds["%2"] == 12 and bounds["y"] == 12


# ----------------------------------------------------------------------------- bits and comparison


def test_bf16_rounding_is_round_to_nearest_even():
    values = np.array([1.0, 257.0, 259.0, -259.0, 73727.0, 0.0, -3.0])
    assert list(from_bits(to_bits(values, "bf16"), "bf16")) == [1.0, 256.0, 260.0, -260.0, 73728.0, 0.0, -3.0]
    assert to_bits(np.array(1.0), "bf16") == 0x3F80 and to_bits(np.array(1.0), "bf16").shape == ()
    assert list(from_bits(to_bits(np.array([2049.0, 2051.0]), "f16"), "f16")) == [2048.0, 2052.0]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64"])
def test_the_poison_byte_is_a_nan_in_every_output_dtype(dtype):
    assert np.isnan(from_bits(np.array([POISON_BITS[dtype]]), dtype)[0])
    assert POISON_BITS[dtype] == int("FF" * (len(hex(POISON_BITS[dtype])) // 2 - 1), 16)


def test_the_first_wrong_element_is_named():
    want = np.arange(12, dtype=np.float64).reshape(3, 4)
    got = to_bits(want, "f32").copy()
    assert first_mismatch("O", got, to_bits(want, "f32"), "f32", POISON_BITS["f32"]) is None
    got[1, 2] = to_bits(np.array(5.0), "f32")
    got[2, 3] = POISON_BITS["f32"]
    found = first_mismatch("O", got, to_bits(want, "f32"), "f32", POISON_BITS["f32"])
    assert found is not None and found.index == (1, 2) and found.got == 5.0 and found.want == 6.0
    assert found.describe() == "O[1, 2]: got 5, want 6; 2 elements differ, 1 never written"
    assert found.as_dict()["index"] == [1, 2]


def test_an_unwritten_element_says_so():
    want = np.full((2, 2), 7.0)
    got = to_bits(want, "bf16").copy()
    got[0, 1] = POISON_BITS["bf16"]
    found = compare_outputs({"Y": to_bits(want, "bf16")}, {"Y": got}, {"Y": "bf16"})
    assert found is not None
    assert found.describe() == "Y[0, 1]: never written (still the NaN poison), want 7; 1 elements differ, 1 never written"
    result = ExactResult(False, True, "", found)
    assert result.reason().startswith("exact check: Y[0, 1]: never written")
    assert result.as_dict()["mismatch"]["got"] == "nan"


def test_outputs_are_compared_in_order_and_a_correct_one_passes():
    a, b = np.ones((2, 3)), np.arange(4.0)
    bits = {"A": to_bits(a, "bf16"), "B": to_bits(b, "f32")}
    want = {"A": to_bits(a, "bf16"), "B": to_bits(b, "f32")}
    assert compare_outputs(want, bits, {"A": "bf16", "B": "f32"}) is None
    bits["B"] = bits["B"].copy()
    bits["B"][3] ^= 1  # one ulp off
    found = compare_outputs(want, bits, {"A": "bf16", "B": "f32"})
    assert found is not None and found.output == "B" and found.index == (3,)


# ----------------------------------------------------------------------------- red zones


def _buffer(layout: GuardedLayout) -> np.ndarray:
    """Host memory standing in for a guarded device allocation."""
    buf = np.full(layout.total, GUARD_PATTERN, dtype=np.uint8)
    buf[layout.inner] = 0xFF
    return buf


def test_untouched_guards_report_nothing_and_data_writes_are_inside():
    layout = GuardedLayout("O", 12 * 4)
    assert layout.guard == GUARD_BYTES and GUARD_BYTES % 16 == 0  # the data keeps TMA's 16-byte alignment
    buf = _buffer(layout)
    buf[layout.inner].view(np.float32)[:] = np.arange(12)  # every element written, nothing else
    assert layout.damage(*layout.guards(buf)) == []


def test_a_write_past_the_end_is_caught():
    layout = GuardedLayout("O", 10 * 2)  # 20 bytes: an out-of-bounds store may land in padding
    buf = _buffer(layout)
    buf[layout.guard + layout.nbytes + 2: layout.guard + layout.nbytes + 4] = 0
    assert layout.damage(*layout.guards(buf)) == [
        "O: 2 guard bytes overwritten after the buffer (first 2 bytes past its end)"]


def test_a_write_before_the_start_is_caught():
    layout = GuardedLayout("A", 64)
    buf = _buffer(layout)
    buf[layout.guard - 4: layout.guard] = 1  # element -1 of an f32 tensor
    buf[0] = 7
    assert layout.damage(*layout.guards(buf)) == [
        "A: 5 guard bytes overwritten before the buffer (nearest 1 bytes before element 0)"]


# ----------------------------------------------------------------------------- the bounded wait


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_launch_that_never_finishes_times_out():
    clock = FakeClock()
    assert not wait_for(lambda: False, 2.0, clock, clock.sleep)
    assert 2.0 <= clock.now < 2.1


def test_a_launch_that_finishes_returns_at_once():
    clock = FakeClock()
    polls = iter([False, False, True])
    assert wait_for(lambda: next(polls), 2.0, clock, clock.sleep)
    assert clock.now < 0.01


# ----------------------------------------------------------------------------- shapes a kernel set is checked at


def test_every_member_of_a_runtime_set_gets_a_shape_it_runs_at():
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    model = parse(src).models["GGEMM"]
    found = witness_sizes(model, lambda s: 0 if s["K"] % 8 == 0 else 1, 2)
    assert found[0] == {"M": 4096, "N": 4096, "K": 512}
    assert found[1]["K"] % 8 and found[1]["M"] == 4096
    static = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    assert witness_sizes(static, lambda s: 0, 1) == {0: {"M": 8192, "N": 8192, "K": 8192}}


def test_a_member_no_size_selects_is_left_out():
    src = (ROOT / "examples" / "rmsnorm.habu").read_text()
    model = parse(src).models["RMSNORM-ROWS"]
    found = witness_sizes(model, lambda s: 0 if s["D"] <= 4096 else 2, 3)
    assert set(found) == {0, 2} and found[0]["D"] == 512 and found[2]["D"] > 4096


# ----------------------------------------------------------------------------- the claim, simulated


def _round_to_bf16(v: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to 8 significant bits, computed arithmetically (independent of to_bits)."""
    out = np.zeros_like(v, dtype=np.float64)
    nz = v != 0
    e = np.floor(np.log2(np.abs(v[nz])))
    ulp = 2.0 ** (e - 7)
    out[nz] = np.round(v[nz] / ulp) * ulp  # numpy rounds halves to even
    return out


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 6000), out=st.sampled_from(["bf16", "f32"]), split=st.integers(1, 7), seed=st.integers(0, 999))
def test_a_float32_kernel_matches_bit_for_bit_in_any_summation_order(k, out, split, seed):
    """A stand-in kernel: float32 partial sums over a shuffled split of K, added in float32, rounded
    once to the output type. The exact check must pass it whatever the order."""
    model, sizes = gemm(k, "bf16", out, m=3, n=4)
    found = applicability(model, sizes)
    inputs = integer_inputs(model, sizes, found.value_range, seed)
    want = {"C": to_bits(exact_reference(model, sizes, inputs)["C"], out)}
    order = np.random.default_rng(seed).permutation(k)
    acc = np.zeros((3, 4), dtype=np.float32)
    for chunk in np.array_split(order, split):
        acc += inputs["A"][:, chunk].astype(np.float32) @ inputs["B"][:, chunk].astype(np.float32).T
    stored = _round_to_bf16(acc.astype(np.float64)) if out == "bf16" else acc
    got = {"C": to_bits(np.asarray(stored, dtype=np.float64), out)}
    assert compare_outputs(want, got, {"C": out}) is None
    got["C"][2, 1] ^= 1 << 3  # one flipped bit in one element is named
    assert compare_outputs(want, got, {"C": out}).index == (2, 1)


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_a_4096_row_scatter_was_not_applicable_for_its_worst_case_duplicates():
    """GGEMM's backward dA (`dA[IX[m] k] += Σ n dO·B`) at 4096³ was timed with "exact: not applicable": the
    bound let all 4096 rows land on one row (4096 · 4096 ≥ 2^24). The check's own index tensor puts a
    handful of rows on one row: counted on it, the plan is exact with inputs in ±3."""
    from habu.timing.exact import index_inputs
    from habu.timing.multiplicity import scatter_multiplicity

    sizes = {"M": 4096, "N": 4096, "K": 4096}
    model = load_program(ROOT / "tests" / "data" / "ggemm_backward.habu").models["GGEMM-DA"].with_sizes(sizes)
    assert not applicability(model, sizes).exact  # the worst case: every row a duplicate
    ix = index_inputs(model, sizes, seed=0)
    most = int(np.bincount(ix["IX"]).max())
    assert 2 <= most <= 16
    assert scatter_multiplicity(model.nodes[0], sizes, ix) == most
    found = applicability(model, sizes, None, ix)
    assert found.exact and found.value_range == 3
    assert found.peak == 3 + 9 * 4096 * most  # the prior ±3, plus `most` sums of 4096 products of ±3
    # the witness's index tensors are the ones counted, whatever the range the check then picks
    for r in (1, 2, 3):
        assert np.array_equal(integer_inputs(model, sizes, r, seed=0)["IX"], ix["IX"])


def test_a_scatter_through_a_two_axis_gather_counts_equal_target_elements():
    """The count is over the stored element (every scatter axis that depends on the gathered variables):
    Y[IX[r] c] += X[r c] with IX = [0, 0, 1, 0] puts three rows on row 0."""
    from habu.spec.ir import Gather, IndexVar
    from habu.timing.multiplicity import gathered_vars, scatter_multiplicity

    class Eq:  # the one field scatter_multiplicity reads
        scatter = (Gather("IX", (IndexVar("r", "R"),)), IndexVar("c", "C"))

    eq = Eq()
    assert [v.name for v in gathered_vars(eq)] == ["r"]  # type: ignore[arg-type]
    assert scatter_multiplicity(eq, {"R": 4, "C": 5}, {"IX": np.array([0, 0, 1, 0])}) == 3  # type: ignore[arg-type]
    assert scatter_multiplicity(eq, {"R": 4, "C": 5}, None) == 4  # type: ignore[arg-type]
    # a 2-D index map over (r, s): the stored element is IX[r, s]
    eq.scatter = (Gather("IX", (IndexVar("r", "R"), IndexVar("s", "S"))),)
    ix2 = np.array([[0, 1], [1, 1], [2, 1]])
    assert scatter_multiplicity(eq, {"R": 3, "S": 2}, {"IX": ix2}) == 4  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64"])
def test_regression_a_zero_whose_sign_differs_is_the_same_value(dtype):
    """A row factor P[r] < 0 applied after its sum (the grouped wgmma epilogue) stores −0 where the float64
    reference, P inside the sum, adds to +0: the equation's values are reals, with one zero. Any other
    difference, a sign included, is still one."""
    want = to_bits(np.array([0.0, 0.0, 1.5, -2.0]), dtype)
    got = to_bits(np.array([-0.0, 0.0, 1.5, -2.0]), dtype)
    assert first_mismatch("Y", got, want, dtype, POISON_BITS[dtype]) is None
    wrong = to_bits(np.array([-0.0, 0.0, 1.5, 2.0]), dtype)
    found = first_mismatch("Y", wrong, want, dtype, POISON_BITS[dtype])
    assert found is not None and found.index == (3,) and found.differing == 1
    tiny = to_bits(np.array([0.0, 0.0, 1.5, -2.0]), dtype)
    tiny[0] = 1  # the smallest subnormal is not a zero
    assert first_mismatch("Y", tiny, want, dtype, POISON_BITS[dtype]) is not None


def test_a_selection_by_an_index_condition_is_exact_and_minus_infinity_only_where_stored():
    """Session 63: the masked products (a contraction epilogue's condition) are checked exactly: `where(c, x, y)`
    with c on indices selects an exact value, and −∞ may be stored (a masked score) but not computed with."""
    program = parse("""4 EXTENT: #M 5 EXTENT: #N 8 EXTENT: #K
bf16 TENSOR: A ( #M #K ) bf16 TENSOR: B ( #N #K ) f32 TENSOR: C ( #M #N ) f32 TENSOR: D ( #M #N )
MODEL: MASK     C[m n] = where(n ≤ m + 1, Σ k A[m k] · B[n k], 0) · 3 ;
MODEL: STORED   C[m n] = where(n ≤ m, Σ k A[m k] · B[n k], −∞) ;
MODEL: INSIDE   C[m n] = where(n ≤ m, Σ k A[m k] · B[n k], −∞) + 1 ;
""")
    sizes = {"M": 4, "N": 5, "K": 8}
    mask = applicability(program.models["MASK"], sizes)
    assert mask.exact and mask.peak == 3 * 8 * 9
    assert applicability(program.models["STORED"], sizes).exact
    assert applicability(program.models["INSIDE"], sizes).describe() == "exact: not applicable (computes with −∞)"
    reference = exact_reference(program.models["STORED"], sizes, integer_inputs(program.models["STORED"], sizes, 3))
    assert np.isneginf(reference["C"][0, 1]) and np.isfinite(reference["C"][1, 0])
