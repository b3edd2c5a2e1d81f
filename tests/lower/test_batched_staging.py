"""A batched contraction's staging passes (session 70): an operand TMA cannot read in place (rows not 16-byte
aligned, or its innermost index a batch axis) is copied k-major into a buffer of aligned rows whose outer dimensions
are the batch axes the operand reads, one slab of blocks per batch (grid.z); the product reads it by TMA."""

from __future__ import annotations

import pytest

from habu.emit_cuda.geometry import geometry_for
from habu.lower import lower_plan
from habu.lower.contraction import ContractionLowering
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "batched_staged.habu")


def _lowered(name: str, sizes: dict[str, int] | None = None, pins: dict[str, str] | None = None):
    model = PROGRAM.models[name].with_sizes(sizes or {})
    plan = default_plan(model, TARGET, sizes or {}, pins or {})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering)
    return model, plan, lw


@pytest.mark.parametrize("name", ["BATCHED-K511", "SHARED-K511", "BATCH-INNERMOST", "TWO-BATCHES-RUNTIME"])
def test_each_default_stages_its_operands_and_is_proven(name):
    sizes = {"H": 3} if name == "TWO-BATCHES-RUNTIME" else {}
    model, plan, _lw = _lowered(name, sizes)
    (k,) = plan.kernels
    assert (k.mma, k.a_move, k.b_move) == ("wgmma", "staged", "staged"), k
    proof = prove(model, plan, sizes, trials=1)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate


def test_regression_a_batched_product_at_k_511_was_read_an_element_at_a_time():
    """Triton #10927's K = 511, batched: rows of 1022 bytes are no TMA descriptor's, and a batched contraction had no
    staging pass, so the default read both operands on wgmma by ldg one element at a time (vector 1). Now both are
    staged into [#B #M #K^8] buffers and read by 3-D tensor maps."""
    _model, _plan, lw = _lowered("BATCHED-K511")
    assert [(st.batch, st.dst.extents) for st in lw.pre] == [((("batch0", "B"),), ("B", "M", "K^8")),
                                                             ((("batch0", "B"),), ("B", "N", "K^8"))]
    assert lw.a.tensor == "@A" and lw.b.tensor == "@W"


def test_a_weight_shared_by_every_batch_is_copied_once():
    """V[n k] beside A[b m k]: V's buffer has no batch axis, its pass no grid.z beyond 1."""
    _model, _plan, lw = _lowered("SHARED-K511")
    a_stage, v_stage = lw.pre
    assert a_stage.batch == (("batch0", "B"),) and v_stage.batch == () and v_stage.dst.extents == ("N", "K^8")
    sizes = PROGRAM.models["SHARED-K511"].sizes
    assert geometry_for(a_stage).blocks(a_stage, sizes, 0) == (2, 200, 3)
    assert geometry_for(v_stage).blocks(v_stage, sizes, 0) == (2, 136, 1)


def test_two_batch_axes_over_a_runtime_extent_decode_grid_z_in_the_pass():
    """#G static, #H a runtime extent (planned at #H = 5): the pass's grid.z is #G·#H, decoded as the contraction
    decodes its batch index (the last axis fastest), printed from the lowering."""
    model = PROGRAM.models["TWO-BATCHES-RUNTIME"]
    plan = default_plan(model, TARGET, {"H": 5}, {})
    (lw,) = lower_plan(model.with_sizes({"H": 5}), plan)
    stage = lw.pre[0]
    assert stage.batch == (("batch0", "G"), ("batch1", "H"))
    assert stage.batch_coordinates(7, {"G": 2, "H": 5}) == {"batch0": 1, "batch1": 2}
    emitted = emit_plan(model, plan, TARGET)
    text = emitted.kernels[0].source
    assert "const long long batch = (long long)blockIdx.z;" in text and "batch1_rest = (batch / 5)" in text


def test_the_rules_refuse_a_pass_of_more_batches_than_grid_z_holds():
    text = ("70000 EXTENT: #B  16 EXTENT: #M  16 EXTENT: #N  72 EXTENT: #K  bf16 TENSOR: A ( #B #M #K )  "
            "bf16 TENSOR: W ( #B #N #K )  f32 TENSOR: Y ( #B #M #N )  MODEL: MANY  Y[b m n] = Σ k A[b m k] · W[b n k] ;")
    (model,) = parse_text(text, "many.habu").models.values()
    plan = default_plan(model, TARGET, {}, {"A": "staged"})
    bad = failures(obligations(model, plan, {}))
    assert any(o.rule.name == "grid-dims" and "grid.z" in o.detail for o in bad), bad
    assert default_plan(model, TARGET, {}, {}).kernels[0].a_move != "staged"  # the default reads it in place


def test_regression_the_sm_80_default_at_k_511_read_its_operands_two_bytes_at_a_time():
    """Triton #10927's GGEMM at K = 511 on sm_80 (the mma.sync path): rows of 1022 bytes take no 4-byte vector, so
    the default loaded A and B one bf16 at a time (H100, session 70: 333.4 µs at 4096² × 511 against 113.4 staged).
    Large products now stage both (the pass gathers A's rows) and read the buffers in 16-byte cp.async vectors, the
    last one reaching into the zero padding; a small one keeps its single launch."""
    ggemm = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    sm80 = TARGETS["sm_80"]
    (k,) = default_plan(ggemm.with_sizes({"K": 511}), sm80, {}, {}).kernels
    assert (k.mma, k.a_move, k.b_move, k.a_vector, k.b_vector) == ("mma.sync", "staged", "staged", 8, 8), k
    small = ggemm.with_sizes({"K": 511, "M": 32, "N": 32, "T": 32})
    (k,) = default_plan(small, sm80, {}, {}).kernels
    assert (k.a_move, k.b_move) == ("ldg", "ldg"), k
    proof = prove(ggemm.with_sizes({"K": 511, "M": 300, "N": 200}), default_plan(
        ggemm.with_sizes({"K": 511, "M": 300, "N": 200}), sm80, {}, {"A": "staged", "B": "staged"}), {}, trials=1)
    assert proof.ok, proof.certificate


def test_regression_the_mma_sync_default_read_products_under_2_28_two_bytes_at_a_time():
    """Session 70 staged unaligned rows on mma.sync only from 2^28 multiply-adds. Session 71 measured both plans from
    64² × 511 up (H100, docs/experiments/stage_threshold.py): staged was faster at every size, 13.2 µs against 42.5
    at 64², 37.5 against 111.1 at 2048². Products from 2^20 now stage; a smaller one keeps its one launch, and a
    skinny product streaming a large weight (decode: 16 × 4096 × 511) stays in place (unmeasured: staging copies the
    weight every call)."""
    gemm = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    sm80 = TARGETS["sm_80"]

    def moves(m: int, n: int) -> tuple[str, str]:
        (k,) = default_plan(gemm.with_sizes({"M": m, "N": n, "K": 511}), sm80, {}, {}).kernels
        return str(k.a_move), str(k.b_move)

    assert moves(64, 64) == moves(512, 512) == ("staged", "staged")
    assert moves(32, 32) == ("ldg", "ldg")  # 2^19 multiply-adds
    assert moves(16, 4096) == ("ldg", "ldg")  # a weight of 2^21 elements streamed by 16 rows
    assert moves(16, 1024) == ("staged", "staged")  # the weight of 2^19 elements


def test_the_staging_pass_prints_its_padding_from_the_lowering():
    """The pass writes the padded row (k < #K^8) and reads the source under its own bound (zeros past #K), both
    printed from the lowering's accesses (`StageLowering.dst`, `src`): at K = 511 the store's condition is k < 512
    and the source's k < 511; a pass printed with the source's bound would leave the padding unwritten (the GPU
    test `test_a_planted_staging_pass_that_leaves_its_padding_unwritten_fails_the_exact_check`)."""
    ggemm = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"].with_sizes({"K": 511, "M": 300, "N": 200})
    plan = default_plan(ggemm, TARGET, {}, {"mma": "mma.sync", "A": "staged", "B": "staged"})
    stage = emit_plan(ggemm, plan, TARGET).kernels[1].source  # B's pass (A's gathers)
    (store,) = [line for line in stage.splitlines() if "padding past #K" in line]
    assert "(kk) < 512" in store and "(kk) < 511" not in store, store
    (copy,) = [line for line in stage.splitlines() if "p_staged_B[" in line]
    assert "(kk) < 511) ? p_B[" in copy and copy.endswith(": (habu::bf16)0.0f;"), copy
