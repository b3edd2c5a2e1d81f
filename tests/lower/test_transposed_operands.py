"""Transposed operands on the mma.sync path without a copy (issue 19): an A stored [k m] is staged as
stored ([BK][BM+8]) and read by ldmatrix.x4.trans. Every plan the GPU test runs
(tests/gpu/test_ldmatrix_trans.py) is proven here (rules and the finite-field check, which runs the
lane map through the PTX ldmatrix table) and printed with the transposed read; one compiles with NVRTC."""

from __future__ import annotations

from functools import cache

import pytest

from habu.lower import lower_plan
from habu.paths.emit import emit
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.gpu.test_ldmatrix_trans import CASES

TARGET = TARGETS["sm_80"]


@cache
def proven(case: str):
    text, name, pins = CASES[case]
    model = parse_text(text, f"{case}.habu").models[name]
    plan = default_plan(model, TARGET, {}, pins)
    proof = prove(model, plan, {}, trials=1, witness=True)  # the reduced shape the search checks
    assert proof.ok, [o.describe() + ": " + o.detail for o in proof.violations] or proof.certificate.failure
    return model, plan, proof


# the GPU test's other cases differ from these in the tile or split alone (CI time: the GPU run proves them)
CPU_CASES = ("at-bt-k72", "at-b-f16", "at-bt-a-ldg", "pv-transposed-batched", "odd-m-batched")


@pytest.mark.parametrize("case", CPU_CASES)
def test_an_m_major_a_on_mma_sync_is_proven_and_printed_with_ldmatrix_trans(case):
    model, plan, proof = proven(case)
    (lw,) = lower_plan(model, plan)
    assert lw.kernel.mma == "mma.sync" and lw.pre == () and not lw.a_kmajor  # no staging pass, no copy
    (kernel,) = emit(proof, TARGET).kernels
    assert "habu::ldmatrix_x4_trans(af[mi]" in kernel.source
    assert "A by " + str(lw.kernel.a_move) + " (m-contiguous)" in kernel.source
    if lw.b_kmajor:
        assert "habu::ldmatrix_x2(bf[ni]" in kernel.source
    else:
        assert "habu::ldmatrix_x2_trans(bf[ni]" in kernel.source


def test_a_transposed_batched_values_plan_compiles_with_nvrtc():
    from habu.emit_cuda.cache import compile_cached

    _, _, proof = proven("pv-transposed-batched")
    (kernel,) = emit(proof, TARGET).kernels
    cubin, _hit = compile_cached(kernel.source, kernel.name, TARGET.name)
    assert cubin.cubin


TRANSPOSED_CORPUS = ("bmm_pv_transposed", "bmm_transposed_a_kn", "transposed_a_odd_rows")


@pytest.mark.parametrize("stem", TRANSPOSED_CORPUS)
def test_transposed_corpus_models_compile_on_sm_80_with_mma_sync(stem):
    """Issue 19's corpus on the target where mma.sync is the tensor-core path: each model with an A
    stored [k m] compiles (rules, finite-field check, CUDA printed) with mma.sync pinned, A read by
    ldmatrix.x4.trans."""
    from habu.compile import compile_model
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    program = load_program(ROOT / "tests" / "data" / "general_corpus" / f"{stem}.habu")
    (name,) = program.models
    compiled = compile_model(program, name, {}, TARGET, {"mma": "mma.sync"}, trials=1)
    (proof,) = compiled.proofs
    assert proof.ok and proof.certificate.passed
    (kernel,) = emit(proof, TARGET).kernels
    assert "habu::ldmatrix_x4_trans(af[mi]" in kernel.source


def test_regression_an_m_major_a_on_sm_80_takes_mma_sync_not_the_simt_path():
    """`O[b i d] = Σ j P[b j i] · V[b j d]` on sm_80: the default left an A stored [k m] to the SIMT path
    (f32 FMAs, no tensor cores); it now takes mma.sync with A read by ldmatrix.x4.trans (its GPU exact
    run: tests/gpu/test_ldmatrix_trans.py). A gathered along its contiguous axis stays on the SIMT path."""
    model = parse_text(CASES["pv-transposed-batched"][0], "pv.habu").models["PV-T"]
    (kernel,) = default_plan(model, TARGET, {}, {}).kernels
    assert kernel.mma == "mma.sync"
    gathered = parse_text("72 EXTENT: #M  80 EXTENT: #N  96 EXTENT: #K  200 EXTENT: #R\n"
                          "bf16 TENSOR: A ( #K #R )  ITENSOR: IX ( #M #R )  bf16 TENSOR: B ( #N #K )\n"
                          "f32 TENSOR: C ( #M #N )  MODEL: GM  C[m n] = Σ k A[k IX[m]] · B[n k] ;\n",
                          "gm.habu").models["GM"]
    (kernel,) = default_plan(gathered, TARGET, {}, {}).kernels
    assert kernel.mma == "fma"


def test_the_issue_values_contraction_on_sm_80_reads_v_by_ldmatrix_trans_without_a_copy():
    """Issue 19's `O[b i d] = Σ j P[b i j] · V[b j d]` on sm_80: mma.sync, V (n-contiguous) staged as stored
    and read by ldmatrix.x2.trans, no staging pass."""
    model = parse_text("3 EXTENT: #B  130 EXTENT: #I  136 EXTENT: #J  128 EXTENT: #D\n"
                       "bf16 TENSOR: P ( #B #I #J )  bf16 TENSOR: V ( #B #J #D )  f32 TENSOR: O ( #B #I #D )\n"
                       "MODEL: VALUES  O[b i d] = Σ j P[b i j] · V[b j d] ;\n", "values.habu").models["VALUES"]
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert lw.kernel.mma == "mma.sync" and lw.pre == () and lw.a_kmajor and not lw.b_kmajor
    assert lw.operands.b_read.trans and not lw.operands.a_read.trans
