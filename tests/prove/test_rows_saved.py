"""One row kernel stores a row statistic and the row that reads it (issue 21: RMSNorm's forward with the
rstd its backward saves, as Liger's forward writes Y and rstd from one read of X). The forward-with-saved
plans of RMSNORM-ROWS, RMSNORM-EQ and RMSNORM-LINEAR take one row kernel fewer, are proven (the
finite-field check compares R1 as well as Y), print the statistic's store from the lowering and compile
without warnings or spills."""

from __future__ import annotations

import re

import pytest

from habu.bench.forward_saved_speed import split_plan
from habu.lower import RowLowering, lower_plan
from habu.plan.patterns import stored_nodes
from habu.prove import prove
from habu.search.cost import plan_cost
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

CASES = [
    ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 5, "D": 1000}),
    ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 3, "D": 4096}),
    ("rmsnorm.habu", "RMSNORM-EQ", {"R": 6, "D": 1000}),
    ("rmsnorm.habu", "RMSNORM-EQ", {"R": 3, "D": 4096}),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 5, "D": 1000, "N": 72}),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 3, "D": 4096, "N": 64}),
]


def forward(example: str, model: str, sizes: dict[str, int] | None = None):
    fwd = derive_model(load_program(ROOT / "examples" / example), model, None).forward
    return fwd.with_sizes(sizes) if sizes else fwd


@pytest.mark.parametrize("example,model,sizes", CASES, ids=lambda x: str(x))
def test_forward_with_saved_rstd_is_one_row_kernel_and_proven(example, model, sizes):
    m = forward(example, model, sizes)
    plan = default_plan(m, TARGETS["sm_90a"], sizes, {})
    rows = [k for k in plan.kernels if k.kind == "rows"]
    before = split_plan(m, TARGETS["sm_90a"], sizes)
    assert len(rows) == 1 and rows[0].nodes[0] == "R1", plan.kernels
    assert len([k for k in before.kernels if k.kind == "rows"]) == 2
    proof = prove(m, plan)
    assert not proof.violations and proof.certificate.passed, proof.certificate.failure
    assert proof.certificate.checked["R1"] == sizes.get("R", sizes.get("T"))  # the statistic is compared too
    lw = next(k for k in proof.lowered.kernels if isinstance(k, RowLowering))
    assert [st.target for st in lw.stats] == ["R1"] and lw.stats[0].lane == 0


@pytest.mark.parametrize("model", ["RMSNORM-ROWS", "RMSNORM-EQ"])
def test_the_default_at_4096_is_one_row_kernel_and_the_cost_model_agrees(model):
    """At the example's size (8192 x 4096) the fused kernel reads X once: the cost model prices it below
    the two kernels it replaces (X read twice, R1 written and read back, two launches)."""
    m = forward("rmsnorm.habu", model)
    sizes = {"D": 4096}
    target = TARGETS["sm_90a"]
    plan = default_plan(m.with_sizes(sizes), target, sizes, {})
    assert [k.nodes for k in plan.kernels] == [("R1", "Y")]
    fused = sum(c.seconds for c in plan_cost(m.with_sizes(sizes), plan, target, {"R": 8192, **sizes}))
    apart = sum(c.seconds for c in plan_cost(m.with_sizes(sizes), split_plan(m.with_sizes(sizes), target,
                                                                                   {"R": 8192, **sizes}),
                                             target, {"R": 8192, **sizes}))
    assert fused < 0.7 * apart, (fused, apart)


def test_rmsnorm_linear_forward_keeps_the_normalised_row_for_the_gemm():
    m = forward("rmsnorm_linear.habu", "RMSNORM-LINEAR")
    plan = default_plan(m, TARGETS["sm_90a"], None, {})
    assert [(k.kind, k.nodes) for k in plan.kernels] == [("rows", ("R1", "S1")), ("contraction", ("Y",))]
    assert stored_nodes(m, ("R1", "S1")) == ("R1", "S1")


def test_a_statistic_read_only_inside_the_kernel_is_not_stored():
    """SOFTMAX-NODES' max and sum stay on chip: four row kernels became two, storing only exp(x − max)
    (session 32), then one, exp(x − max) recomputed from the row on chip too (session 33:
    `habu.plan.row_fusion.row_then_statistic`)."""
    m = load_program(ROOT / "examples" / "families.habu").models["SOFTMAX-NODES"].with_sizes({"R": 5})
    plan = default_plan(m, TARGETS["sm_90a"], {"R": 5}, {})
    assert [k.nodes for k in plan.kernels] == [("%1", "%2", "%3", "Ps")]
    assert dict(plan.storage) == {}
    lowered = lower_plan(m, plan)
    assert all(not lw.stats for lw in lowered)
    proof = prove(m, plan)
    assert proof.certificate.passed, proof.certificate.failure


def test_a_row_read_outside_the_kernel_must_end_it():
    from habu.lower.rows import lower_rows
    from habu.plan.plan import RowKernel

    m = load_program(ROOT / "examples" / "families.habu").models["SOFTMAX-NODES"]  # Ps reads %2 = exp(x − max)
    with pytest.raises(ValueError, match="stores a row only as its last node; %2 is read outside it"):
        lower_rows(m, RowKernel(nodes=("%1", "%2", "%3"), rows_per_block=1, threads=128, vector=4, cache_row=True))


def emitted(example, model, sizes, arch):
    from habu.paths.emit import emit

    m = forward(example, model, sizes)
    proof = prove(m, default_plan(m, TARGETS[arch], sizes, {}))
    return emit(proof, TARGETS[arch])


def test_the_statistic_is_stored_by_the_rows_first_thread_as_the_lowering_says():
    src = emitted("rmsnorm.habu", "RMSNORM-ROWS", {"R": 5, "D": 1000}, "sm_90a").kernels[0].source
    store = re.search(r"if \(tid == 0 && \(r\) < 5\) \{  // the row's R1, stored once\n\s*habu::store_f\(p_R1 \+ "
                      r"\(\(int\)\(r\)\), (rc\d+)\);", src)
    assert store, src
    # the value stored is the row constant Y is scaled by: one rsqrt a row
    assert f"* {store.group(1)})" in src and src.count("habu::f_rsqrt") == 1


def test_a_cluster_shared_row_stores_the_statistic_from_its_first_block():
    """A row too long for one block is shared by a cluster: only block 0 of the cluster stores R1."""
    src = emitted("rmsnorm.habu", "RMSNORM-ROWS", {"R": 2, "D": 131072}, "sm_90a").kernels[0].source
    assert "__cluster_dims__" in src and "if (tid == 0 && habu::cluster_ctarank() == 0 && (r) < 2)" in src


WARNING = re.compile(r"warning #\d+-D: [^\n]*")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("example,model,sizes", [
    ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 8192, "D": 4096}),
    ("rmsnorm.habu", "RMSNORM-EQ", {"R": 8192, "D": 16384}),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", None),
], ids=lambda x: str(x))
def test_the_fused_kernel_compiles_without_warnings_or_spills(example, model, sizes, arch):
    from habu.emit_cuda.nvrtc import compile_cuda
    from habu.paths.emit import emit_plan

    m = forward(example, model, sizes)
    plan = default_plan(m, TARGETS[arch], sizes, {})
    for kernel in emit_plan(m, plan, TARGETS[arch]).kernels:
        if "R1" not in kernel.source:
            continue
        cubin = compile_cuda(kernel.source, kernel.name, arch)
        assert not WARNING.findall(cubin.log), cubin.log
        assert cubin.resources.registers > 0 and not cubin.resources.spills, cubin.resources.describe()
