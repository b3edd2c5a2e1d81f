"""Row kernels over rows read through an index tensor (`A[IX[r] d]`, tests/data/row_gather.habu): the MoE
backward's router gradient `dP[r] = Σ d dY[IX[r] d] · T[r d]` was a general kernel, a lane a row looping over
#D (11.7 ms for Mixtral at 4096 tokens, H200, session 47); the row family now reads a gathered row, its index
checked on the device (`habu::index_ok`) and in the field check."""

from __future__ import annotations

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.lower import RowLowering, lower_plan
from habu.paths.emit import emit
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]


def model(name: str, **sizes: int):
    m = load_program(ROOT / "tests" / "data" / "row_gather.habu").models[name]
    return m.with_sizes(sizes) if sizes else m


@pytest.mark.parametrize("name", ["ROW-DOT", "GATHERED-RMSNORM"])
@pytest.mark.parametrize("width", [1000, 4096])
def test_regression_a_row_read_through_an_index_tensor_is_a_proven_row_kernel(name, width):
    m = model(name, D=width)
    plan = default_plan(m, TARGET, {}, {})
    (kernel,) = plan.kernels
    assert kernel.kind == "rows", plan.kernels
    (lw,) = lower_plan(m, plan)
    assert isinstance(lw, RowLowering)
    gathered = [acc for _, acc in lw.loads if any(p.kind == "gather" for p in acc.positions)]
    assert gathered and all(acc.checks for acc in gathered)
    proof = prove(m, plan, {}, trials=1)
    assert proof.ok, ([o.detail for o in proof.violations], proof.certificate and proof.certificate.failure)
    (cuda,) = emit(proof, TARGET).kernels
    assert "habu::index_ok((long long)p_IX[r]" in cuda.source
    out = compile_cuda(cuda.source, cuda.name, "sm_90a")
    assert not out.resources.spills, out.resources.describe()


@pytest.mark.parametrize("name", ["ROW-DOT", "GATHERED-RMSNORM"])
@pytest.mark.parametrize("pins", [{}, {"row_prefetch": "true"}, {"row_cluster": "2", "threads": "256"}],
                         ids=["registers", "prefetch", "cluster"])
def test_a_gathered_row_is_kept_on_chip_like_a_plain_one(name, pins):
    """The row read through IX is the row a pass keeps (in registers, the next row's copy of a prefetching block,
    a cluster's shared row): read once a row, not once a pass."""
    m = model(name, D=4096, R=400)
    plan = default_plan(m, TARGET, {}, pins)
    (lw,) = lower_plan(m, plan)
    gathered = [acc.tensor for _, acc in lw.loads if acc.positions[0].kind == "gather"]
    assert set(gathered) <= {a.tensor for a in lw.kept_rows()}
    proof = prove(m, plan, {}, trials=2)
    assert proof.ok, ([o.detail for o in proof.violations], proof.certificate and proof.certificate.failure)
    (cuda,) = emit(proof, TARGET).kernels
    out = compile_cuda(cuda.source, cuda.name, "sm_90a")
    assert not out.resources.spills, out.resources.describe()


def test_a_gather_of_another_variable_is_no_row():
    """`A[IX[c] d]`-like reads (a gather of anything but the row variable) stay in the general family."""
    from habu.plan.patterns import row_local
    from habu.spec.ir import Equation, Gather, IndexVar, Load, Reduce

    r, d, t = IndexVar("r", "R"), IndexVar("d", "D"), IndexVar("t", "T")
    eq = Equation("Z", (r,), Reduce("sum", (d,), Load("A", (Gather("IX", (t,)), d))))
    assert row_local(eq) is None
    ok = Equation("Z", (r,), Reduce("sum", (d,), Load("A", (Gather("IX", (r,)), d))))
    assert row_local(ok) == (("R",), "D")
