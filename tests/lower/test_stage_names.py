"""Two kernels of a plan staging one tensor in two layouts (habu/lower/stage_names.py): each layout is a buffer of
its own, `@K` and `@K_k<i>`; the same layout again shares its buffer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.cli_grad import backward_program
from habu.errors import UsageError
from habu.lower import lower_whole
from habu.lower.contraction import ContractionLowering
from habu.paths.emit import emit_lowered
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
# the fuzz's attention seed 7221 (tests/random_models.py, `random_attention`): K[j b e h] and V[j d h b], their
# innermost index a batch axis, staged by the backward's scores (rows along j) and by dQ = Σ j dS·K (rows along e)
ATTENTION = """2 EXTENT: #B 16 EXTENT: #D 128 EXTENT: #E 3 EXTENT: #H 200 EXTENT: #I 1 EXTENT: #J
bf16 TENSOR: Q ( #B #H #I #E )
bf16 TENSOR: K ( #J #B #E #H )
bf16 TENSOR: V ( #J #D #H #B )
bf16 TENSOR: O ( #B #I #H #D )
MODEL: FZ  O[b i h d] = Σ j softmax_j(where(j ≥ i, Σ e Q[b h i e] · K[j b e h] · rsqrt(#E), −∞)) · V[j d h b] ;
"""


def _backward():
    program, name = backward_program(parse_text(ATTENTION, "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    return model, default_plan(model, TARGET, {}, {})


def test_regression_two_kernels_staging_one_tensor_in_two_layouts_shared_one_buffer():
    """The backward's scores and dQ both staged K, in two layouts, into one buffer `@K`: the field check's memory
    took the first pass's 768 elements and the second pass's writes ran past them (an IndexError, a traceback from
    `habu compile`), and the runtime allocated one of the two sizes for both passes."""
    model, plan = _backward()
    lowered = lower_whole(model, plan)
    layouts: dict[str, tuple] = {}
    for lw in lowered.kernels:
        for stage in lw.pre if isinstance(lw, ContractionLowering) else ():
            layout = (stage.dst.extents, stage.dst.positions)
            assert layouts.setdefault(stage.dst.tensor, layout) == layout, stage.dst.tensor
    staged_k = sorted(n for n in layouts if n.startswith("@K"))
    assert len(staged_k) == 2 and staged_k[0] == "@K" and staged_k[1].startswith("@K_k"), staged_k
    emitted = emit_lowered(lowered, plan, TARGET)
    buffers = [(n, e) for n, _d, e in emitted.intermediates if n.startswith("@")]
    assert len({n for n, _e in buffers}) == len({(n, e) for n, e in buffers}), buffers  # one size per name
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, proof.certificate


def _chain_backward():
    program, name = backward_program(load_program(ROOT / "tests" / "data" / "staged_twice.habu"), "CHAIN", None,
                                     "auto")
    return program.models[name]


def test_the_same_tensor_staged_in_two_layouts_by_pins_takes_two_buffers():
    model = _chain_backward()
    plan = default_plan(model, TARGET, {}, {"K": "staged", "storage": "bf16"})
    stages = [(s.dst.tensor, s.dst.extents) for lw in lower_whole(model, plan).kernels
              if isinstance(lw, ContractionLowering) for s in lw.pre if s.src.tensor == "K"]
    (k1, e1), (k2, e2) = stages
    assert (k1, e1) == ("@K", ("E", "J^8")) and k2.startswith("@K_k") and e2 == ("J", "E^8"), stages
    # the kernel's other staged operand, Q, staged once, keeps its name
    assert [s.dst.tensor for lw in lower_whole(model, plan).kernels if isinstance(lw, ContractionLowering)
            for s in lw.pre if s.src.tensor == "Q"] == ["@Q"]
    assert prove(model, plan, {}, trials=1).ok


def test_regression_a_movement_pin_failed_on_a_plan_whose_other_contraction_does_not_read_the_tensor():
    """`--pin K=staged` on a backward of six products raised "K is not an operand of a contraction in this model" at
    the first product that does not read K. Each contraction now takes the pins of its own operands; the error is for
    a tensor no contraction of the plan reads."""
    model = _chain_backward()
    plan = default_plan(model, TARGET, {}, {"K": "staged"})
    assert any(getattr(k, "a_move", None) == "staged" or getattr(k, "b_move", None) == "staged" for k in plan.kernels)
    with pytest.raises(UsageError, match="dQ is not an operand of a contraction"):
        default_plan(model, TARGET, {}, {"dQ": "staged"})


def test_regression_the_field_check_crashed_on_one_buffer_in_two_layouts(monkeypatch):
    """With the two layouts in one buffer (the lowering before `with_stage_buffers_apart`), the field check raised
    an IndexError; it now refuses the plan, naming the buffer and both layouts' sizes."""
    import habu.lower

    monkeypatch.setattr(habu.lower, "with_stage_buffers_apart", tuple)
    model, plan = _backward()
    proof = prove(model, plan, {}, trials=1)
    assert not proof.ok and proof.certificate is not None
    assert "writes @K as 6144 elements" in proof.certificate.failure
    assert "one buffer in two layouts" in proof.certificate.failure


def test_a_layout_staged_again_is_one_buffer_and_one_name_in_two_layouts_is_refused_before_the_runtime(monkeypatch):
    """`emit_lowered` lists each staged buffer once (a pass staging the same layout again writes the same buffer:
    the runtime allocated it once per pass), and refuses one name in two layouts (the runtime would allocate one of
    the two sizes for both passes)."""
    import habu.lower

    model = load_program(ROOT / "tests" / "data" / "batched_staged.habu").models["BATCHED-K511"]
    plan = default_plan(model, TARGET, {}, {})
    lowered = lower_whole(model, plan)
    twice = replace(lowered, plan=replace(plan, kernels=plan.kernels * 2), kernels=lowered.kernels * 2)
    names = [n for n, _d, _e in emit_lowered(twice, twice.plan, TARGET).intermediates if n.startswith("@")]
    assert sorted(names) == ["@A", "@W"], names

    monkeypatch.setattr(habu.lower, "with_stage_buffers_apart", tuple)
    model, plan = _backward()
    with pytest.raises(ValueError, match="stages @K as"):
        emit_lowered(lower_whole(model, plan), plan, TARGET)
