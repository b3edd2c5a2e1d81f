"""The witness shape the search checks keeps several blocks along every grid dimension that has several
at full size: a block stride, a tile origin or a batch decode planted wrong shows only between blocks.

Each kind declares what its blocks stride over (`tiled_axes`, habu/prove/kinds.py) or keeps the extents
at full size (`frozen_extents`): contraction (m, n, k tiles; batch extents keep ≥ 3 values, the witness's
least reduced size), rows (the leading extents by rows per block), columns (column tiles; the leading
extents, which the row splits stride over, frozen), map (every extent frozen), general (every output
extent by the thread map's block stride) and grouped (column tiles and k; its row tiles follow the drawn
grouping, not #R's classes: tests/prove/test_grouped.py checks groupings of one, several and no tiles).
A contraction's grid is flat over its (batch, m, n) tiles, so this test sees their product; each axis's
classes are the coverage proof's (`prove_coverage`)."""

from __future__ import annotations

import pytest

from habu.emit_cuda.geometry import geometry_for
from habu.lower import GeneralLowering, lower_plan
from habu.plan.rewrite import planned_model
from habu.prove.witness import Q, prove_coverage, tiled_axes, witness_sizes
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import EXAMPLES, ROOT

SLOTS = 1 << 30  # a persistent grid then launches one block per tile, as a plain one does


def _witness(model, sizes=None):
    plan = default_plan(model, TARGETS["sm_90a"], sizes)
    lws = lower_plan(model, plan)
    full = dict(plan.shape) | (sizes or {})
    names = [f"k{i}" for i in range(len(lws))]
    return names, lws, full, witness_sizes(planned_model(model, plan), names, lws, full)


def test_the_witness_keeps_two_blocks_along_every_grid_dimension_that_has_two():
    lacking = []
    for path in EXAMPLES:
        for model in load_program(path).models.values():
            _, lws, full, w = _witness(model, {e.name: 4096 for e in model.extents if not e.is_static} or None)
            for i, lw in enumerate(lws):
                g = geometry_for(lw)
                at_full, at_witness = g.blocks(lw, full, SLOTS), g.blocks(lw, w, SLOTS)
                for axis, (f, n) in enumerate(zip(at_full, at_witness, strict=True)):
                    if n < min(f, 2):
                        lacking.append(f"{path.name}:{model.name} kernel {i}: grid {'xyz'[axis]} has {f} blocks "
                                       f"at full size, {n} at the witness {w}")
    assert not lacking, "\n".join(lacking)


def test_regression_a_general_kernels_output_spans_several_blocks_at_the_witness():
    """A general kernel declared no tiling: at the witness (every extent reduced to a few elements) its
    output fit in one block, so a wrong block stride in its thread map passed the check the search runs
    (the `general-block-stride-doubled` mutant, habu/bench/mutants.py) and showed only at full size."""
    model = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    names, lws, full, w = _witness(model.with_sizes({"B": 3, "I": 17, "J": 1300, "D": 33}))
    (lw,) = lws
    assert isinstance(lw, GeneralLowering)
    stride = lw.thread_map.threads
    numel = w["B"] * w["I"] * w["J"]
    assert w["J"] < full["J"] and -(-numel // stride) >= Q, w
    assert numel % stride != 0 and (full["B"] * full["I"] * full["J"]) % stride != 0  # both last blocks ragged
    lines = prove_coverage(tiled_axes(names, lws), full, w)
    assert any(f"blocks of {stride} flat elements" in ln and "unsat" in ln for ln in lines), lines
    with pytest.raises(AssertionError, match="class the witness lacks"):  # 2 blocks: no interior one
        prove_coverage(tiled_axes(names, lws), full, w | {"J": 5})


def test_regression_an_axis_grown_later_keeps_an_earlier_axis_last_block_whole():
    """`habu compile examples/attention.habu --backward --shape D=1` ended in a traceback ("kernel 2 (dK): tile 143
    along blocks of 256 flat elements (#E) has a class the witness lacks"): the flat axes were grown once each, in
    order; dK's (B·G·J·E, whole last block at full size) was satisfied at a small #J, then dV's (B·G·J·D) grew #J
    to 65 and dK's last block went ragged. The axes are now gone over until none lacks a class."""
    from unittest import mock

    import habu.spec.grad as grad
    from habu.cli_grad import backward_program
    from habu.prove import prove

    with mock.patch.object(grad, "HOIST_INVARIANTS", False):  # the backward as derived then (no loop invariant
        # hoisted: since session 60 the scores are a node over (b g r i j), and the witness is the full shape)
        program, name = backward_program(load_program(ROOT / "examples" / "attention.habu"), "ATTENTION-GQA",
                                          None, "auto")
    model = program.model(name)
    sizes = {e.name: e.size for e in model.extents} | {"D": 1}
    model = model.with_sizes(sizes)
    names, lws, full, w = _witness(model, sizes)
    assert w != full
    assert all("unsat" in line for line in prove_coverage(tiled_axes(names, lws), full, w))
    plan = default_plan(model, TARGETS["sm_90a"], sizes)
    assert prove(model, plan, sizes, trials=1).ok


def test_regression_fuzz_8322_a_vectorised_general_kernel_reads_outside_its_producers_box():
    """The fuzz's model 8322 (`Y = max q2 Σ q3 max p4 X0[IX0[p4] q2]`), derived backward: the plans whose `%h1[p q]`
    general kernel moves 2 or 4 elements a lane were refused by the field check with "kernel (%h1) reads %h6[3],
    which no earlier kernel wrote" (with 8, or dX0's scatter with 8, with wrong values), while the same plan with
    one element a lane passed; also at 595bc51, before session 62's factoring. A lane computes its whole vector,
    so the demand on its inputs is now widened to whole vectors (`demand`'s `whole_vectors`). Every plan of the
    backward passes."""
    from habu.cli_grad import backward_program
    from habu.prove.rules import failures, obligations
    from habu.prove.verify import verify_plan
    from habu.search.space import enumerate_plans
    from habu.spec.parser import parse_text
    from habu.target import TARGETS
    from tests.random_models import random_model

    program, name = backward_program(parse_text(random_model(8322), "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    plans = list(enumerate_plans(model, TARGETS["sm_90a"], {}))
    vectorised = [p for p in plans if any(k.kind == "general" and k.vector > 1 for k in p.kernels)
                  and not failures(obligations(model, p))]  # (vectors of 8 over #Q = 100: the vector-align rule)
    assert len(vectorised) >= 4
    assert all(verify_plan(model, p, None, 1).passed for p in vectorised)
