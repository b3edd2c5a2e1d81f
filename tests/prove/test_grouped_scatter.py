"""The MoE combine as a grouped kernel (habu/lower/grouped.py's epilogue forms): `Y[IX[r] n] += P[r] · Σ k
A[r k] · W[E[r] n k]` with the row factor read per row, the scatter added with f32 atomicAdd and an f32 A
staged as bf16 parts. Reachable by `--pin family=grouped` and the search only; the default plan keeps the
general kernel. Its blocks run over GF(p) with repeated tokens, its rules, its proof and NVRTC."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.errors import UsageError
from habu.lower import GroupedLowering, lower, lower_plan
from habu.lower.general import Store
from habu.plan.grouped_pattern import as_grouped_gemm
from habu.plan.patterns import default_regions
from habu.plan.plan import GroupedKernel
from habu.prove import prove
from habu.prove.interp import Memory
from habu.prove.interp_grouped import run_grouped
from habu.prove.verify import virtual_inputs
from habu.search.space import default_plan, enumerate_plans
from habu.spec.field import PrimeField
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.prove.test_grouped import GROUPINGS, FixedGrouping

TARGET = TARGETS["sm_90a"]
SC = """37 EXTENT: #R  20 EXTENT: #T  4 EXTENT: #G  40 EXTENT: #N  40 EXTENT: #K
f32 TENSOR: A ( #R #K )  bf16 TENSOR: W ( #G #N #K )  f32 TENSOR: P ( #R )  f32 TENSOR: Y ( #T #N )
ITENSOR: IX ( #R #T )  GROUPS: E ( #R #G )
MODEL: SC
   Y[IX[r] n] += P[r] · Σ k A[r k] · W[E[r] n k] · 2 ;
"""
SIZES = {"R": 37, "T": 20, "G": 4, "N": 40, "K": 40}
KERNEL = GroupedKernel(nodes=("Y",), bm=16, bn=32, bk=32, warps_m=1, warps_n=2)  # each thread a chunk of A
GROUPED = {"family": "grouped"}


def _sc():
    return parse_text(SC).models["SC"]


def _moe():
    return load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]


def test_the_combine_is_a_grouped_gemm_with_its_epilogue_and_the_grouped_default_takes_it():
    m = _moe()
    gg = as_grouped_gemm(m, next(e for e in m.nodes if e.target == "Y"))
    assert gg is not None and not gg.by_default
    # act is bf16 (an input the model also writes, Y, does not decide the activation type): a bf16 A
    assert gg.row_scale is not None and gg.row_scale.tensor == "P" and gg.scatter is not None and gg.a_dtype == "bf16"
    assert [r.kind for r in default_regions(m)] == ["grouped", "grouped", "rows", "general"]
    # the region stays general (the pattern's by_default), the MoE default plan builds it grouped (issue 20 §1)
    assert [k.kind for k in default_plan(m, TARGET, {}, {}).kernels] == ["grouped", "grouped"]
    lw = lower_plan(m, default_plan(m, TARGET, {}, GROUPED))[3]
    assert isinstance(lw, GroupedLowering)
    assert lw.store is Store.ATOMIC_ADD and lw.row_scale is not None and lw.a_parts == 1
    assert [p.kind for p in lw.out.positions] == ["gather", "axis"] and lw.out.positions[0].table == "IX"


def test_the_search_space_of_the_combine_holds_grouped_kernels_and_the_general_default():
    m = _moe()
    kinds = [p.kernels[-1].kind for p in enumerate_plans(m, TARGET, {"T": 16, "R": 32})]
    assert kinds[0] == "general" and "grouped" in kinds  # the default first, the grouped variants searched


def test_family_pins_that_do_not_apply_are_usage_errors():
    with pytest.raises(UsageError, match="expected one of grouped, general"):
        default_plan(_moe(), TARGET, {}, {"family": "tiles"})
    plain = parse_text("8 EXTENT: #R  8 EXTENT: #N\nf32 TENSOR: X ( #R #N )  f32 TENSOR: Y ( #R #N )\n"
                       "MODEL: M\n  Y[r n] = X[r n] · 2 ;\n")
    with pytest.raises(UsageError, match="no region of M can be computed by the grouped family"):
        default_plan(plain.models["M"], TARGET, {}, GROUPED)
    general = default_plan(_moe(), TARGET, {}, {"family": "general"})
    assert [k.kind for k in general.kernels] == ["general", "general", "rows", "general"]


@pytest.mark.parametrize("name", ["inner-empty", "every-group-several-tiles"])
def test_the_scatter_adds_every_routed_row_into_its_token_onto_the_prior_contents(name):
    """IX draws 37 rows into 20 tokens: tokens repeat, and their rows must accumulate."""
    model = _sc()
    lw = lower(model, KERNEL)
    assert isinstance(lw, GroupedLowering)
    field = PrimeField(seed=5)
    inputs = virtual_inputs(model, SIZES, field, 5)
    values = GROUPINGS[name]
    inputs["E"] = FixedGrouping(values, SIZES["G"])
    mem = Memory(inputs, field, SIZES)
    gx, gy = (int(x) for x in lw.grid(SIZES))
    run_grouped("k0", lw, SIZES, mem, [(mt, nt) for nt in range(gy) for mt in range(gx)])
    assert not mem.faults, mem.faults
    R, T, N, K, p = SIZES["R"], SIZES["T"], SIZES["N"], SIZES["K"], field.p
    ix = np.asarray(inputs["IX"].at(np.arange(R)), dtype=np.int64)
    assert len(set(ix.tolist())) < R  # some token has several rows
    a = inputs["A"][np.arange(R)[:, None], np.arange(K)[None, :]].astype(object)
    w = inputs["W"][np.asarray(values)[:, None, None], np.arange(N)[None, :, None], np.arange(K)[None, None, :]]
    rows = np.einsum("rk,rnk->rn", a, w.astype(object)) * 2 * inputs["P"].at(np.arange(R)).astype(object)[:, None]
    ref = inputs["Y"][np.arange(T)[:, None], np.arange(N)[None, :]].astype(object)
    for r in range(R):
        ref[ix[r]] += rows[r]
    got, found = mem.written["Y"].read(np.arange(T * N))
    assert found.all()
    np.testing.assert_array_equal(got.reshape(T, N), (ref % p).astype(np.int64))


def test_the_rules_prove_the_scatter_epilogue_and_refuse_a_plain_store():
    m = _sc()
    plan = default_plan(m, TARGET, {}, GROUPED)
    assert plan.kernels[0].kind == "grouped"
    proof = prove(m, plan, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]
    from habu.prove.obligation import context
    from habu.prove.rules_grouped import grouped_obligations

    lw = lower_plan(m, plan)[0]
    assert isinstance(lw, GroupedLowering)
    for store, holds in ((Store.ATOMIC_ADD, True), (Store.WRITE, False)):
        rule = [o for o in grouped_obligations("k0", replace(lw, store=store), context(m, plan))
                if o.rule.name == "scatter-accumulates"]
        assert len(rule) == 1 and rule[0].formula is holds, store


def test_the_pinned_moe_combine_compiles_with_nvrtc_for_sm_90a_and_sm_80():
    from habu.emit_cuda.nvrtc import INCLUDE_DIR, CompilerUnavailable, compile_cuda
    from habu.paths.emit import emit_plan

    m = _moe()
    plan = default_plan(m, TARGET, {}, GROUPED)
    assert [k.kind for k in plan.kernels] == ["grouped", "grouped", "rows", "grouped"]
    # (its proof: the combine mutants' unmutated plan, tests/bench/test_mutants.py)
    for arch in ("sm_90a", "sm_80"):
        target = TARGETS[arch]
        k = emit_plan(m, default_plan(m, target, {}, GROUPED), target).kernels[3]
        assert "atomicAdd(p_Y + (" in k.source and "p_row *" in k.source  # bf16 act: no split (COMBINE-F32 has it)
        try:
            cubin = compile_cuda(k.source, k.name, arch, [INCLUDE_DIR])
        except CompilerUnavailable:
            pytest.skip("no NVRTC or nvcc on this machine")
        assert cubin.resources.spill_stores == 0, arch
