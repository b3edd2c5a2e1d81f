"""Batched contractions: batch indices (free indices both operands and the output read plainly) are a
grid dimension of the contraction paths — the lowering decodes them from the block index, every access
reads them, the TMA maps keep them as outer dimensions — proven by the rules and the finite-field check."""

from __future__ import annotations

import numpy as np
import pytest

from habu.lower import lower_plan
from habu.lower.contraction import ContractionLowering
from habu.paths.emit import emit_plan
from habu.plan.patterns import as_contraction, default_regions
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]

SCORES = """{B} EXTENT: #B  {I} EXTENT: #I  {J} EXTENT: #J  {D} EXTENT: #D
bf16 TENSOR: Q ( #B #I #D )  bf16 TENSOR: K ( #B #J #D )  {out} TENSOR: S ( #B #I #J )
MODEL: SCORES  S[b i j] = Σ d Q[b i d] · K[b j d] ;
"""
VALUES = """{B} EXTENT: #B  {I} EXTENT: #I  {J} EXTENT: #J  {D} EXTENT: #D
bf16 TENSOR: P ( #B #I #J )  bf16 TENSOR: V ( #B #J #D )  bf16 TENSOR: O ( #B #I #D )
MODEL: VALUES  O[b i d] = Σ j P[b i j] · V[b j d] ;
"""


def model_of(text: str, **sizes):
    (model,) = parse_text(text.format(**sizes), "batched.habu").models.values()
    return model


def proven(model, pins=None):
    plan = default_plan(model, TARGET, {}, pins or {})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.obligations if not o.ok] or proof.certificate
    assert proof.certificate is not None and proof.certificate.passed, proof.certificate.failure
    return plan, proof


def test_the_pattern_recognises_batch_indices():
    model = model_of(SCORES, B=4, I=128, J=128, D=64, out="f32")
    c = as_contraction(model.nodes[0])
    assert c is not None and [v.name for v in c.batch] == ["b"] and (c.m.name, c.n.name, c.k.name) == ("i", "j", "d")
    assert [r.kind for r in default_regions(model)] == ["contraction"]


def test_two_batch_indices_and_a_gemm_without_batch():
    text = ("2 EXTENT: #B  3 EXTENT: #H  40 EXTENT: #I  24 EXTENT: #J  32 EXTENT: #D\n"
            "bf16 TENSOR: Q ( #B #H #I #D )  bf16 TENSOR: K ( #B #H #J #D )  f32 TENSOR: S ( #B #H #I #J )\n"
            "MODEL: HEADS  S[b h i j] = Σ d Q[b h i d] · K[b h j d] ;\n")
    (model,) = parse_text(text, "heads.habu").models.values()
    c = as_contraction(model.nodes[0])
    assert c is not None and [v.name for v in c.batch] == ["b", "h"]
    proven(model, {"mma": "mma.sync"})
    gemm = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    assert as_contraction(gemm.nodes[0]).batch == ()  # type: ignore[union-attr]


def test_bmm_scores_default_runs_on_wgmma_with_three_dimensional_tensor_maps():
    model = load_program(ROOT / "examples" / "bmm.habu").models["SCORES"]
    plan, _proof = proven(model)
    (k,) = plan.kernels
    assert (k.kind, k.mma, k.a_move, k.b_move) == ("contraction", "wgmma", "tma", "tma")
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    src = kernel.source
    # the batch decode printed from the lowering, and the batch coordinate of each TMA box
    assert "const long long batch = (lin / " in src and "const int batch0 = (int)(batch);" in src
    assert "habu::tma_load_3d(a_stage, &tm_Q, full, " in src and ", (int)m0, (int)batch0);" in src
    maps = {p.tensor: p.tma for p in kernel.params if p.kind == "tensormap"}
    assert maps["Q"].dims == ("D", "I", "B") and maps["Q"].box == (64, k.tile_m, 1)
    assert maps["K"].box == (64, k.tile_n, 1)
    # S leaves by TMA stores into a 3-D map, a box of 1 along the batch
    assert k.store == "tma" and "habu::tma_store_3d(&tm_S, buf, " in src and "(int)(batch0));" in src
    assert maps["S"].dims == ("J", "I", "B") and maps["S"].box == (32, 64, 1)
    direct = default_plan(model, TARGET, {}, {"store": "direct"})
    (kernel,) = emit_plan(model, direct, TARGET).kernels
    assert "(int)(batch0) * (int)(16384)" in kernel.source  # S's batch stride #I·#J in the epilogue's offset


def test_bmm_values_reads_v_n_major_on_tensor_cores():
    model = model_of(VALUES, B=3, I=72, J=136, D=128)
    plan, _ = proven(model)
    (k,) = plan.kernels
    assert (k.mma, k.b_move) == ("wgmma", "tma")
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    maps = {p.tensor: p.tma for p in kernel.params if p.kind == "tensormap"}
    assert maps["V"].dims == ("D", "J", "B") and maps["V"].box == (64, 64, 1)  # 64-column boxes, k rows


@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}, {"mma": "wgmma", "persistent": "true"},
                                  {"mma": "fma", "split_k": "2"}, {"B": "cp.async"}],
                         ids=["default", "mma.sync", "fma", "wgmma-persistent", "fma-split-k", "wgmma-cp.async"])
@pytest.mark.parametrize("batch", [1, 3])
def test_odd_sizes_have_tails_in_every_dimension(pins, batch):
    """#I, #J and #D fill no tile (#D = 72: a ragged k tile of 64); batches of 1 and 3."""
    model = model_of(SCORES, B=batch, I=70, J=90, D=72, out="f32")
    _plan, proof = proven(model, pins)
    assert proof.certificate is not None and proof.certificate.passed


def test_unaligned_rows_of_a_batched_operand_fall_back_from_tma_without_staging():
    """#D = 33: rows of 66 bytes are no TMA descriptor's, and a k of 33 no wgmma loop's: the mma.sync default reads
    so small a product's rows in place (`STAGE_MIN_PRODUCTS`: its one launch; larger ones are staged)."""
    model = model_of(SCORES, B=3, I=17, J=19, D=33, out="f32")
    plan, _ = proven(model)
    assert "staged" not in (plan.kernels[0].a_move, plan.kernels[0].b_move)


def test_pv_with_odd_sizes_on_every_path():
    model = model_of(VALUES, B=3, I=40, J=72, D=64)
    for pins in ({}, {"mma": "mma.sync"}, {"mma": "fma"}):
        proven(model, pins)


def test_the_lowering_decodes_every_block_to_one_tile_of_one_batch():
    model = model_of(SCORES, B=3, I=200, J=130, D=64, out="f32")
    plan = default_plan(model, TARGET, {}, {"split_k": "2", "mma": "fma"})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering) and lw.batch == ("B",)
    sizes = {"B": 3, "I": 200, "J": 130, "D": 64}
    ids = np.arange(int(lw.tiles(sizes)))
    batch, tm, tn, split = lw.decode(ids, sizes)
    seen = set(zip(batch["batch0"].tolist(), tm.tolist(), tn.tolist(), split.tolist(), strict=True))
    assert len(seen) == len(ids) == 3 * int(lw.tiles_m(sizes)) * int(lw.tiles_n(sizes)) * 2


def test_int32_rule_counts_the_batch_stride():
    """Each batch of 2^16 x 2^12 fits 32-bit offsets; 1024 of them (2^38 elements) do not: the default
    widens the index, and a plan forced to 32 bits breaks int32-offsets."""
    from dataclasses import replace

    from habu.prove.rules import failures, obligations

    model = model_of(SCORES, B=1024, I=65536, J=64, D=64, out="f32")
    plan = default_plan(model, TARGET, {}, {})
    assert plan.kernels[0].index_width == 64
    narrow = replace(plan, kernels=(replace(plan.kernels[0], index_width=32),))
    assert any(o.rule.name == "int32-offsets" for o in failures(obligations(model, narrow)))


GATHERED = """3 EXTENT: #B  100 EXTENT: #R  72 EXTENT: #I  80 EXTENT: #J  64 EXTENT: #D
bf16 TENSOR: Q ( #B #R #D )  bf16 TENSOR: K ( #B #J #D )  ITENSOR: IX ( #I #R )  f32 TENSOR: S ( #B #I #J )
MODEL: BG  S[b i j] = Σ d Q[b IX[i] d] · K[b j d] ;
"""


@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}])
def test_a_batched_contraction_with_gathered_rows(pins):
    """Q's rows through an index tensor in each batch: the producer's cp.async row offsets carry the batch
    term (hoisted per tile with the gathered row)."""
    model = model_of(GATHERED)
    plan, _ = proven(model, pins)
    if not pins:
        assert (plan.kernels[0].mma, plan.kernels[0].a_move) == ("wgmma", "cp.async")
        (kernel,) = emit_plan(model, plan, TARGET).kernels
        (line,) = [t for t in kernel.source.splitlines() if "a_row_off[j] =" in t]
        # the bound, the gather's index check (masked on the device), then the batch term of the offset
        assert "a_row_off[j] = ((r) < 72 && habu::index_ok((long long)p_IX[r]" in line
        assert "? ((int)(batch0) * (int)(6400) + " in line


@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}])
def test_regression_two_batch_indices_declared_a_batch_coordinate_twice_and_nvrtc_refused_it(pins):
    """The decode named the inner batch coordinate by its axis (`batch1`), and the emitter then declared
    `const int batch1 = (int)(batch1);`: proven on the CPU, refused by NVRTC on the H200."""
    from habu.emit_cuda.nvrtc import CompilerUnavailable, compile_cuda

    text = ("2 EXTENT: #B  3 EXTENT: #H  40 EXTENT: #I  24 EXTENT: #J  32 EXTENT: #D\n"
            "bf16 TENSOR: Q ( #B #H #I #D )  bf16 TENSOR: K ( #B #H #J #D )  f32 TENSOR: S ( #B #H #I #J )\n"
            "MODEL: HEADS  S[b h i j] = Σ d Q[b h i d] · K[b h j d] ;\n")
    (model,) = parse_text(text, "heads.habu").models.values()
    plan, _proof = proven(model, pins)
    for kernel in emit_plan(model, plan, TARGET).kernels:
        assert kernel.source.count("batch1 =") == 1
        try:
            compile_cuda(kernel.source, kernel.name, TARGET.name)
        except CompilerUnavailable:
            pytest.skip("no NVRTC here")


def test_short_k_loops_over_many_tiles_default_to_persistent_blocks():
    """Measured on the H200 (habu.bench.bmm_speed, 2026-12-01): scores at B·H = 32, 2048², d 128 took
    144.9 µs one block a tile and 94.7 µs persistent (torch.bmm 89.7); P·V (32 k tiles) 122 against 127 µs.
    Long k loops over four waves or more with both operands by TMA are persistent too (2026-12-02: the FFN's
    4096 × 14336 × 4096 product 601.5 against 618.8 µs)."""
    def default(text, **sizes):
        model = model_of(text, **sizes)
        (k,) = default_plan(model, TARGET).kernels
        return k

    assert default(SCORES, B=32, I=2048, J=2048, D=128, out="bf16").persistent
    assert default(SCORES, B=32, I=2048, J=2048, D=2048, out="bf16").persistent  # a long k loop, 4096 tiles
    assert not default(SCORES, B=1, I=256, J=256, D=128, out="bf16").persistent  # fewer tiles than 4 waves


def test_a_persistent_default_keeps_one_stage_past_its_k_loop():
    """H200, 2026-12-02 (same run): the scores above, 2 k tiles, 128x256 persistent: 88.0 µs with 3 stages,
    93.5-96.2 µs with 4 (torch.bmm 88.4 µs): the ring runs on across tiles, one stage past the k loop is enough."""
    (k,) = default_plan(model_of(SCORES, B=32, I=2048, J=2048, D=128, out="bf16"), TARGET).kernels
    assert k.persistent and k.stages == 3
    (k,) = default_plan(model_of(SCORES, B=32, I=2048, J=2048, D=256, out="bf16"), TARGET).kernels
    assert k.persistent and k.stages == 4  # 4 k tiles: the path's own depth already fits


SHARED_WEIGHT = """{B} EXTENT: #B  {I} EXTENT: #I  {N} EXTENT: #N  {D} EXTENT: #D
bf16 TENSOR: X ( #B #I #D )  bf16 TENSOR: W ( #N #D )  f32 TENSOR: Y ( #B #I #N )
MODEL: LIN  Y[b i n] = {body} ;
"""


@pytest.mark.parametrize("body", ["Σ d X[b i d] · W[n d]", "Σ d W[n d] · X[b i d]"])
@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}, {"persistent": "true"}])
def test_regression_a_weight_shared_by_every_batch_fell_to_the_general_family(body, pins):
    """A Linear over 3-D activations (the batch read by one operand) was a thread per output element."""
    from habu.emit_cuda.nvrtc import CompilerUnavailable, compile_cuda

    model = model_of(SHARED_WEIGHT, B=3, I=72, N=80, D=64, body=body)
    c = as_contraction(model.nodes[0])
    assert c is not None and [v.name for v in c.batch] == ["b"]
    assert [r.kind for r in default_regions(model)] == ["contraction"]
    plan, _proof = proven(model, pins)
    for kernel in emit_plan(model, plan, TARGET).kernels:
        try:
            compile_cuda(kernel.source, kernel.name, TARGET.name)
        except CompilerUnavailable:
            pytest.skip("no NVRTC here")


def test_regression_a_pinned_staged_operand_of_a_batched_contraction_is_refused_not_a_traceback():
    """`habu compile examples/bmm.habu --pin B=staged` raised KeyError 'batch0' in the rules (the staging pass's
    obligations had no batch axes); then `supported-path` refused it. Since session 70 the pass keeps the batch
    axes as its buffer's outer dimensions (grid.z over the batches), and the plan is proven."""
    model = model_of(SCORES, B=3, I=72, J=80, D=64, out="f32")
    plan, _proof = proven(model, {"B": "staged"})
    lw = lower_plan(model, plan)[0]
    assert isinstance(lw, ContractionLowering) and plan.kernels[0].b_move == "staged"
    (stage,) = lw.pre
    assert stage.batch == (("batch0", "B"),) and stage.dst.extents == ("B", "J", "D^8")


# session 68's fuzz of `random_batched_product` (46 of seeds 0-299 refused by their own default plan): an operand
# whose innermost index is the batch axis
BATCH_INNERMOST = """128 EXTENT: #K  192 EXTENT: #M  64 EXTENT: #S
bf16 TENSOR: A ( #M #K #S )  bf16 TENSOR: B ( #S #K #S )  f32 TENSOR: Y ( #S #S #M )
MODEL: FZ  Y[s s2 m] = exp(Σ k A[m k s] · B[s2 k s]) ;
"""
VECTORS_ALONG_BATCH = """16 EXTENT: #K  64 EXTENT: #S
bf16 TENSOR: A ( #S #K #S )  bf16 TENSOR: B ( #S #K #S )  bf16 TENSOR: Y ( #S #S #S )
MODEL: FZ  Y[s3 s s2] = erf(Σ k A[s2 k s] · B[s k s3]) ;
"""


def test_regression_an_operand_whose_innermost_index_is_a_batch_axis_is_not_read_transposed_by_tma():
    """A[m k s] with s batched: its innermost index is neither k nor m, so no TMA box reads it m-major (the facts
    counted its indices only and the wgmma default broke `supported-path`); the default is proven."""
    (model,) = parse_text(BATCH_INNERMOST, "fuzz.habu").models.values()
    plan, _ = proven(model)
    (k,) = plan.kernels
    assert k.a_move == "staged", k  # (session 70: copied k-major by a staging pass, then read by TMA)


def test_regression_vectors_do_not_run_along_an_operands_batch_axis():
    """A[s2 k s] (B of the product, n = s2) with s batched: the default read it in 8-element cp.async vectors along
    s (breaking `cp.async-size`); an operand whose innermost index is a batch axis is staged k-major (session 70:
    before, read an element at a time), its buffer read in vectors along k."""
    (model,) = parse_text(VECTORS_ALONG_BATCH, "fuzz.habu").models.values()
    plan, _ = proven(model)
    (k,) = plan.kernels
    assert (k.mma, k.a_move, k.b_move, k.a_vector, k.b_vector) == ("mma.sync", "cp.async", "staged", 8, 8), k


def test_regression_a_batch_of_one_reads_its_unaligned_rows_in_place():
    """A batch axis of extent 1 and k rows of 333 bf16 (666 bytes, not 16-byte aligned): the default staged them to
    aligned rows (its test was the batches' product, 1) and `supported-path` refused the plan (a batched contraction
    read its operands in place); session 68's fuzz of `random_attention` found it in an unfused attention's P·V.
    Since session 70 a batched contraction's staging pass keeps its batch axes: both operands staged, proven."""
    model = model_of(SCORES, B=1, I=128, J=128, D=333, out="f32")
    plan, _ = proven(model)
    assert (plan.kernels[0].a_move, plan.kernels[0].b_move) == ("staged", "staged")


def test_regression_a_skinny_product_over_a_batch_of_one_is_proven():
    """16 rows over a batch axis of extent 1: the default took the product as unbatched (the batches' product, 1)
    and transposed and split it (`swap_ab`, split-K), a plan its proof refused; it is batched, and proven."""
    text = ("1 EXTENT: #B 16 EXTENT: #M 4096 EXTENT: #N 4096 EXTENT: #K  bf16 TENSOR: X ( #B #M #K )  "
            "bf16 TENSOR: W ( #B #N #K )  f32 TENSOR: Y ( #B #M #N )  MODEL: S  Y[b m n] = Σ k X[b m k] · W[b n k] ;")
    (model,) = parse_text(text, "skinny.habu").models.values()
    plan, _ = proven(model)
    assert not plan.kernels[0].swap_ab


def test_an_operand_whose_innermost_index_is_a_batch_axis_is_multiplied_on_the_tensor_cores():
    """A[m k s] with s batched (session 68's fuzz sent it to the SIMT path: the mma.sync path read A only along k or
    m). Session 69: the mma.sync path copied such an A an element at a time (ldg). Session 70: a staging pass copies
    it k-major first (its buffer keeps the batch axis outermost), and the default takes the wgmma path, reading the
    buffer by TMA; with mma.sync pinned the buffer is read in 8-element cp.async vectors. An unstaged A is still read
    an element at a time (not in vectors along s)."""
    from habu.prove.rules import failures, obligations

    (model,) = parse_text(BATCH_INNERMOST, "fuzz.habu").models.values()
    plan, _ = proven(model)
    (k,) = plan.kernels
    assert (k.mma, k.a_move) == ("wgmma", "staged"), k
    plan, _ = proven(model, {"mma": "mma.sync"})
    (k,) = plan.kernels
    assert (k.mma, k.a_move, k.a_vector) == ("mma.sync", "staged", 8), k
    plan, _ = proven(model, {"mma": "mma.sync", "A": "ldg"})  # (A is the kernel's B: m is Y's last)
    assert (plan.kernels[0].b_move, plan.kernels[0].b_vector) == ("ldg", 1)  # (no vector along s: session 70)
    bad = failures(obligations(model, default_plan(model, TARGET, {}, {"mma": "mma.sync", "A": "cp.async"}), {}))
    assert any(o.rule.name in ("supported-path", "cp.async-size") for o in bad), bad  # not in vectors along s


def test_regression_a_pinned_in_place_move_of_a_batch_innermost_operand_kept_the_staged_vector():
    """`--pin A=ldg` on `A[m k s]` (s batched) kept the default's 8-element vector of its staged buffer, and
    `vector-align` refused the plan (vectors along s) unless `vector=1` was pinned too; a pinned in-place move of
    such an operand now reads it an element at a time, and a pinned staged one on mma.sync 16 bytes at a time."""
    (model,) = parse_text(BATCH_INNERMOST, "fuzz.habu").models.values()
    plan, _ = proven(model, {"mma": "mma.sync", "A": "ldg", "B": "staged"})
    (k,) = plan.kernels
    assert (k.a_move, k.a_vector, k.b_move, k.b_vector) == ("staged", 8, "ldg", 1), k  # (A is the kernel's B)
