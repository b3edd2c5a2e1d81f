"""Scatter stores and accumulates through the general family: the lowering adds with f32 atomicAdd,
the rule `scatter-accumulates` and the finite-field check (with duplicate indices drawn) both reject
a plan that overwrites where it must add, the runtime contract checks the scatter's indices, and the
exact check's bound and the torch baseline account for duplicates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.bench.mutants import MUTANTS, run_mutant
from habu.emit_cuda.checks import contract_of
from habu.lower import GeneralLowering, lower_plan
from habu.lower.general import Store
from habu.paths.emit import emit, emit_plan
from habu.prove import prove
from habu.prove.obligation import context
from habu.prove.rules_general import general_obligations
from habu.prove.verify import verify_plan, virtual_inputs
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from habu.timing.exact import applicability
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
SMALL = {"R": 64, "T": 16, "N": 8}


def unpermute():
    return load_program(ROOT / "examples" / "scatter_add.habu").models["UNPERMUTE"].with_sizes(SMALL)


def test_the_scatter_is_one_general_kernel_adding_with_atomic_add():
    model = unpermute()
    plan = default_plan(model, TARGET, SMALL, {})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, GeneralLowering) and lw.scatters and lw.store is Store.ATOMIC_ADD
    assert lw.extents == ("R", "N")  # one thread per point of the domain
    assert [p.kind for p in lw.out.positions] == ["gather", "axis"] and lw.out.positions[0].table == "IX"
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "atomicAdd(p_Y + ((int)((int)p_IX[e0]) * (int)(8) + (int)(e1))" in kernel.source


def test_an_accumulate_reads_its_output_and_stores_without_atomics():
    """`C += Σ k A·B`: C = C + Σ ..., its contraction split off (`split:C`) and `+ C` its epilogue: C is
    read where it is written, and stored plainly (no split-K, no atomics)."""
    model = load_program(ROOT / "examples" / "accumulate.habu").models["GEMM-ACC"]
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert plan.rewrites == ("split:C",)
    assert lw.split_mode == "none" and [ld.tensor for ld, _ in lw.epi_loads] == ["C"]
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "atomicAdd" not in kernel.source and "atomic_add" not in kernel.source and "p_C" in kernel.source


def test_the_proof_holds_the_scatter_rule_and_checks_its_indices_at_run_time():
    model = unpermute()
    proof = prove(model, default_plan(model, TARGET, SMALL, {}), SMALL, trials=2)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]
    (rule,) = [o for o in proof.obligations if o.rule.name == "scatter-accumulates"]
    assert rule.status == "proved"
    assert any(o.rule.name == "index-range" and o.tensor == "IX" and o.status == "runtime-check"
               for o in proof.obligations)
    contract = contract_of(model, emit(proof, TARGET))
    ix = contract.tensor("IX")
    assert ix is not None and ix.index_range == "T"  # the runtime checks IX before every launch
    assert {t.role for t in contract.tensors if t.name == "Y"} == {"input", "output"}


def test_the_field_check_draws_duplicate_scatter_indices():
    model = unpermute()
    ix = virtual_inputs(model, SMALL, PrimeField(), seed=5)["IX"].materialize()
    assert len(np.unique(ix)) < len(ix)  # 64 rows into 16 tokens: duplicates, always
    assert (ix == 0).sum() > 1  # and the ends of the range are drawn often


def test_a_plain_store_where_the_scatter_must_add_breaks_the_rule():
    model = unpermute()
    plan = default_plan(model, TARGET, SMALL, {})
    (lw,) = lower_plan(model, plan)
    wrong = replace(lw, store=Store.WRITE)
    (rule,) = [o for o in general_obligations("k0", wrong, context(model, plan, SMALL))
               if o.rule.name == "scatter-accumulates"]
    assert rule.formula is False and "overwrite" in rule.detail


def test_the_plain_store_mutant_is_killed_by_the_field_check():
    (m,) = [m for m in MUTANTS if m.name == "scatter-plain-store"]
    outcome = run_mutant(m, trials=1)
    assert outcome.killed
    assert "times (a race" in outcome.message or "differs" in outcome.message


def test_a_scatter_without_duplicates_still_needs_the_prior_contents():
    """IX a permutation-sized domain (R = T): an overwriting store still loses Y's prior value."""
    text = ("6 EXTENT: #T  4 EXTENT: #N\nf32 TENSOR: X ( #T #N )  f32 TENSOR: Y ( #T #N )\n"
            "ITENSOR: IX ( #T #T )\nMODEL: P  Y[IX[t] n] += X[t n] ;\n")
    model = parse_text(text, "p.habu").models["P"]
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert verify_plan(model, plan, trials=1).passed
    cert = verify_plan(model, plan, trials=1, lowerings=[replace(lw, store=Store.WRITE)])
    assert not cert.passed


def test_the_exact_bound_counts_every_duplicate():
    model = unpermute()
    app = applicability(model, SMALL)
    # |Y| <= 3 (prior) + 64 rows · 3 · 3 (all rows on one token)
    assert app.exact and app.peak == 3 + 64 * 9


def test_the_torch_baseline_scatters_with_accumulation():
    torch = pytest.importorskip("torch")
    from habu.spec.reference import evaluate
    from habu.timing.torch_eager import TorchEager

    model = unpermute()
    g = torch.Generator().manual_seed(0)
    inputs = {"X": torch.randn(64, 8, generator=g).bfloat16(), "W": torch.randn(64, generator=g),
              "Y": torch.randn(16, 8, generator=g), "IX": torch.randint(0, 16, (64,), generator=g).int()}
    host = {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in inputs.items()}
    want = evaluate(model, host)["Y"]
    got = TorchEager(model, SMALL)({k: v.clone() for k, v in inputs.items()})["Y"]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)


def test_regression_a_row_statistic_output_crashed_the_field_check():
    """`S[r] = max c X[r c]` is a row kernel whose output has one dimension; the check's output box
    had two (rows × columns) and the reference's broadcast raised a numpy ValueError."""
    text = "6 EXTENT: #R  19 EXTENT: #C\nf32 TENSOR: X ( #R #C )  f32 TENSOR: S ( #R )\nMODEL: RMAX  S[r] = max c X[r c] ;\n"
    model = parse_text(text, "r.habu").models["RMAX"]
    plan = default_plan(model, TARGET, {}, {})
    assert [k.kind for k in plan.kernels] == ["rows"]
    cert = verify_plan(model, plan, trials=1)
    assert cert.passed, cert.failure


def test_regression_a_scatter_epilogue_whose_index_map_changes_extent_crashed_the_field_check():
    """`habu compile examples/moe_gather.habu --model MOE-UP --backward --shape T=1,R=130,N=1,K=130` ended in a
    traceback (StopIteration in the contraction's output box): dX[IX[r] k] += Σ n dH[r n] · W1[n k] stores
    through IX, which maps #R to #T, and the box took dX's #T for a batch dimension. GGEMM's IX maps #M to #M,
    so its scatter epilogue never showed it."""
    from habu.cli_grad import backward_program
    from habu.compile import compile_model
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    program = load_program(ROOT / "examples" / "moe_gather.habu")
    for shape in ({"T": 1, "R": 130, "N": 1, "K": 130}, {"T": 130, "R": 3, "N": 130, "K": 3}):
        grad, name = backward_program(program, "MOE-UP", None, "auto")
        compiled = compile_model(grad, name, shape, TARGETS["sm_90a"], parse_pins([]), 1)
        assert all(p.ok for p in compiled.proofs)
        # the scatter-add in the contraction's epilogue (the path that crashed)
        assert ("contraction", ("dX",)) in [(k.kind, k.nodes) for p in compiled.plans for k in p.kernels]
