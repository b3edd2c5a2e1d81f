"""Gate, up and SwiGLU in one grouped kernel with two accumulators (habu/plan/grouped_pair.py,
`PairEpilogue` in habu/lower/grouped.py): reachable by `--pin pair=fused` and the search only (the default
keeps three kernels); which node triples form a pair, its proof over GF(p), the printed second accumulator
and epilogue, and NVRTC for sm_90a and sm_80."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.lower import GroupedLowering, lower_plan
from habu.plan.grouped_pair import as_grouped_pair, pair_positions
from habu.plan.patterns import default_regions
from habu.prove import prove
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
FUSED = {"pair": "fused"}


def _moe():
    return load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]


def test_gate_up_and_swiglu_are_a_pair_fused_by_default_on_sm_90a_and_apart_on_sm_80():
    m = _moe()
    assert pair_positions(m, default_regions(m)) == [0]
    assert [k.nodes for k in default_plan(m, TARGET, {}, {}).kernels] == [("gate", "up", "act"), ("Y",)]
    assert [k.kind for k in default_plan(m, TARGETS["sm_80"], {}, {}).kernels] == ["grouped", "grouped", "rows",
                                                                                  "grouped"]
    plan = default_plan(m, TARGET, {}, FUSED)
    assert [k.nodes for k in plan.kernels] == [("gate", "up", "act"), ("Y",)]
    assert dict(plan.storage) == {"act": "bf16"}  # gate and up stay in registers; act is bf16 (the activation type)
    lw = lower_plan(m, plan)[0]
    assert isinstance(lw, GroupedLowering) and lw.pair is not None
    assert (lw.w.tensor, lw.pair.w.tensor, lw.out.tensor) == ("W1", "W3", "act")
    fused = [p for p in enumerate_plans(m, TARGET, {"T": 16, "R": 32}) if len(p.kernels) == 2]
    assert len(fused) > 5  # the search walks the fused kernel's tiles


@pytest.mark.parametrize("change", [
    ("act[r h]  = gate[r h] · sigmoid(gate[r h]) · up[r h]", "act[r h]  = gate[r h] · up[r h] · P[r]"),  # reads P
    ("Y[IX[r] d] += P[r] · Σ h act[r h]", "Y[IX[r] d] += P[r] · Σ h up[r h] · act[r h]"),  # up read twice
])
def test_what_is_not_a_pair(change):
    text = (ROOT / "tests" / "data" / "moe_small.habu").read_text().replace(*change)
    m = parse_text(text).models["MOE-FFN"]
    assert as_grouped_pair(m, ("gate", "up", "act")) is None
    with pytest.raises(UsageError, match="pair=fused"):
        default_plan(m, TARGET, {}, FUSED)


def test_the_moe_in_two_grouped_kernels_proves():
    m = _moe()
    plan = default_plan(m, TARGET, {}, {**FUSED, "family": "grouped"})
    assert [k.kind for k in plan.kernels] == ["grouped", "grouped"]
    proof = prove(m, plan, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]


def test_the_fused_pair_prints_the_node_of_both_from_two_accumulators_and_compiles_for_sm_90a_and_sm_80():
    from habu.emit_cuda.nvrtc import INCLUDE_DIR, CompilerUnavailable, compile_cuda
    from habu.paths.emit import emit_plan

    m = _moe()
    for arch in ("sm_90a", "sm_80"):
        target = TARGETS[arch]
        k = emit_plan(m, default_plan(m, target, {}, FUSED), target).kernels[0]
        assert "habu::mma_bf16_16816(acc2[i][j], a, b2[j])" in k.source
        assert "((acc[i][j][q] * habu::f_sigmoid(acc[i][j][q])) * acc2[i][j][q])" in k.source
        try:
            cubin = compile_cuda(k.source, k.name, arch, [INCLUDE_DIR])
        except CompilerUnavailable:
            pytest.skip("no NVRTC or nvcc on this machine")
        assert cubin.resources.spill_stores == 0, arch
