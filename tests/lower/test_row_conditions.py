"""Row kernels that compute conditions on indices (session 64: habu/plan/conditions.py `row_conditions`,
habu/lower/rows.py `conditions_on_columns`). A masked row reduction was a general kernel, one thread a row reading
its row down a column of threads: the forward that saves attention's statistics computed R2 so, and the unfused
attention plan its row sum. tests/data/masked_rows.habu's models take the row family, pass the rules and the
finite-field check and compile; each printed condition reads its element's row and column; a lowering that
compares the wrong axis fails the field check; a condition that reads an index tensor stays general."""

from __future__ import annotations

import re

import pytest

import habu.lower.rows as rows_module
from habu.emit_cuda.nvrtc import compile_cuda
from habu.paths.emit import emit
from habu.plan.plan import RowKernel
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.grad import derive
from habu.spec.ir import Compare, IndexVar
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "masked_rows.habu")


@pytest.mark.parametrize("name", ["MASKED-MAX", "MASKED-SUM", "MASKED-SOFTMAX"])
def test_a_masked_row_reduction_is_a_proven_row_kernel(name):
    model = PROGRAM.models[name]
    plan = default_plan(model, TARGET, None, {})
    (kernel,) = plan.kernels
    assert isinstance(kernel, RowKernel), plan.kernels
    proof = prove(model, plan, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else proof.violations
    (k,) = emit(proof, TARGET).kernels
    conditions = [ln for ln in k.source.splitlines() if "<=" in ln]
    assert conditions and all(re.search(r"\(long long\)col\b", ln) and re.search(r"\(long long\)r\b", ln)
                              for ln in conditions), conditions
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills


def test_mutant_a_condition_on_the_wrong_axis_fails_the_field_check(monkeypatch: pytest.MonkeyPatch):
    """A lowering whose condition reads the row where the column is meant (`j ≤ i + #J − #I` as `i ≤ i + …`,
    true everywhere) keeps the masked columns: the finite-field check sees another row sum."""
    real = rows_module.conditions_on_columns

    def swapped(e, rows, column):
        (row,) = rows
        out = real(e, rows, column)

        def leaf(x):
            if isinstance(x, Compare):
                return x.map_indices(lambda ix: row if isinstance(ix, IndexVar) and ix == column else ix)
            return x

        from habu.spec.ir import Reduce, map_ops

        def deep(x):
            if isinstance(x, Reduce):
                return Reduce(x.op, x.vars, map_ops(x.body, lambda y: deep(y) if isinstance(y, Reduce) else leaf(y)))
            return leaf(x)

        return map_ops(out, deep)

    monkeypatch.setattr(rows_module, "conditions_on_columns", swapped)
    model = PROGRAM.models["MASKED-SUM"]
    proof = prove(model, default_plan(model, TARGET, None, {}), trials=1)
    assert not proof.ok


def test_a_condition_that_reads_an_index_tensor_stays_general():
    model = PROGRAM.models["LENGTH-SUM"]
    (kernel,) = default_plan(model, TARGET, None, {}).kernels
    assert kernel.kind == "general"


def test_attentions_saved_statistics_and_weights_are_one_row_kernel():
    """The forward that saves R1 and R2 (`Backward.forward`; its default at 256 queries is the fused kernel storing
    them since session 65, so its unfused plan is pinned) and the unfused plan (`rewrite=attention:O`): the
    scores' product, one row kernel for the row's maximum, sum and weights, the value product."""
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    sizes = {"B": 1, "G": 2, "I": 256, "J": 256}
    forward = derive(model).forward.with_sizes(sizes)
    for m, pins in ((forward, {"rewrite": "split:%f2"}), (model.with_sizes(sizes), {"rewrite": "attention:O"})):
        plan = default_plan(m, TARGET, sizes, pins)
        assert [k.kind for k in plan.kernels] == ["contraction", "rows", "contraction"], plan.kernels
        assert len(plan.kernels[1].nodes) == 3
        assert prove(m, plan, sizes, trials=1).ok


def test_regression_every_row_maximum_starts_at_minus_infinity():
    """A fully masked row's maximum is the model's empty maximum, −∞ (as the general family stored it before
    session 64); since session 65 an unmasked row maximum starts there too (it started at −FLT_MAX, so that a row
    of −∞ elements, attention's unfused saved R1 of a row with no visible key, read −3.4e38)."""
    model = PROGRAM.models["MASKED-MAX"]
    plan = default_plan(model, TARGET, None, {})
    (k,) = emit(prove(model, plan, trials=1), TARGET).kernels
    assert "float part = (-__int_as_float(0x7f800000));" in k.source
    softmax = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    sources = [k.source for k in emit(prove(softmax, default_plan(softmax, TARGET, None, {}), trials=1),
                                      TARGET).kernels]
    assert any("float part = (-__int_as_float(0x7f800000));" in s for s in sources)
    assert not any("3.402823466e38" in s for s in sources)
