"""General kernels whose reduction loops run once for a vector of consecutive output elements (session 64): GQA
attention's backward sums its query heads' dK and dV (`Σ r dK.in[r b g j e]`) in general kernels that moved one
element a thread (19–20 µs each at 16 × 1k on an H100). tests/data/vector_loops.habu's models take vectors by
default, pass the rules and the finite-field check, compile, and print each load that reads a loop axis inside
that loop; a reduction inside another still moves one element."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.lower import GeneralLowering, lower_plan
from habu.paths.emit import emit
from habu.plan.plan import GeneralKernel
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "vector_loops.habu")


@pytest.mark.parametrize("name", sorted(PROGRAM.models))
def test_a_reduction_loop_runs_once_for_a_vector_proven_and_compiled(name):
    model = PROGRAM.models[name]
    plan = default_plan(model, TARGET, None, {})
    (kernel,) = plan.kernels
    assert isinstance(kernel, GeneralKernel) and kernel.vector == 4, plan.kernels
    proof = prove(model, plan, trials=1)
    assert proof.ok, proof.summary() if hasattr(proof, "summary") else proof
    (k,) = emit(proof, TARGET).kernels
    lines = k.source.splitlines()
    loops = [i for i, ln in enumerate(lines) if re.search(r"for \(int k\d+ = 0;", ln)]
    assert loops
    for i, ln in enumerate(lines):  # a vector load that reads a loop axis sits inside that loop
        if "habu::load_vec" in ln:
            reads = set(re.findall(r"\(k(\d+)\)", ln.split(",")[0]))
            opened = {re.search(r"for \(int k(\d+)", lines[j])[1] for j in loops if j < i}  # type: ignore[index]
            assert reads <= opened, ln
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills


def test_the_default_keeps_one_element_where_vectors_would_empty_the_grid():
    """A vector a thread only where the grid keeps LOOPLESS_WAVES blocks an SM (8 × 32 × 128 elements: 128
    blocks of 256 threads with vectors of 4, fewer than 4 × 132)."""
    small = PROGRAM.models["HEAD-SUM"].with_sizes({"J": 32})
    (kernel,) = default_plan(small, TARGET, None, {}).kernels
    assert isinstance(kernel, GeneralKernel) and kernel.vector == 1


NESTED = """8 EXTENT: #R 64 EXTENT: #J 64 EXTENT: #E
f32 TENSOR: X ( #R #J #E ) f32 TENSOR: Y ( #J #E )
MODEL: NESTED  Y[j e] = Σ r X[r j e] · (Σ r' X[r' j e]) ;
"""


def test_a_reduction_inside_another_moves_one_element():
    model = parse_text(NESTED).models["NESTED"]
    plan = default_plan(model, TARGET, None, {})
    (kernel,) = plan.kernels
    assert isinstance(kernel, GeneralKernel)
    (lw,) = lower_plan(model, replace(plan, kernels=(replace(kernel, vector=4),)))
    assert isinstance(lw, GeneralLowering) and "a reduction inside another" in (lw.vector_refusal() or "")


def test_each_elements_condition_inside_the_loop_reads_its_own_column():
    """The masked sum `Σ r where(e ≤ j, X·W, 0)` accumulates element q of the vector under the condition at that
    element's coordinates (the lowering's `lane_coordinates`: the last axis + q), inside the loop as after it; an
    emitter that printed the first element's condition for all (planted, session 64) is caught here, where the
    field check, which runs the lowering, cannot see it."""
    model = PROGRAM.models["MASKED-SUM"]
    (k,) = emit(prove(model, default_plan(model, TARGET, None, {}), trials=1), TARGET).kernels
    lines = [ln for ln in k.source.splitlines() if re.search(r"acc0\[\d\] \+=", ln)]
    assert len(lines) == 4
    assert "(long long)e2 + 0LL" in lines[0]
    for q in range(1, 4):
        assert f"(long long)(e2 + {q})" in lines[q] and f"x0[{q}]" in lines[q], lines[q]
