"""The default's fusion cuts (habu/search/cuts.py) and the arithmetic they are priced with
(habu/search/arithmetic.py): a heavy epilogue leaves its contraction for a kernel of its own at large
sizes, a light one stays, and the elementwise kernel that takes it moves vectors and is proven."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from habu.compile import bind_shape
from habu.lower import GeneralLowering, lower_plan
from habu.lower.general import chain_node
from habu.plan.plan import ContractionKernel, GeneralKernel
from habu.prove import prove
from habu.search.arithmetic import element_instructions
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.ir import Const, Load, Op, walk
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
FFN = {"D": 4096, "H": 14336, "ONE": 1}


def ffn_plans(tokens: int):
    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    bw = derive_model(program, "FFN-SKIP")
    sizes = {"B": tokens, **FFN}
    return [default_plan(bind_shape(m, sizes), TARGET, sizes, {}) for m in (bw.forward, bw.model)]


def test_element_instructions_count_a_repeated_subexpression_once():
    x = Op("add", (Load("S", ()), Load("B", ())))
    once = element_instructions(Op("erf", (x,)))
    assert once == 22 + 1 + 2 * 2  # erf, the add, two loads
    assert element_instructions(Op("mul", (Op("erf", (x,)), x))) == once + 1  # x again costs nothing
    assert element_instructions(Op("mul", (Load("%acc", ()), Const(Fraction(1, 2)))), free=frozenset({"%acc"})) == 1


def test_regression_the_gelu_derivative_leaves_the_4096_token_product_for_a_vector_kernel():
    """H200 (2026-12-02): dT3's GELU derivative fused after the main loop 786 µs, the product 627 and the
    derivative alone 108 µs; the forward's GELU likewise. The product's residual add (light) stays fused."""
    forward, backward = ffn_plans(4096)
    nodes = [k.nodes for k in backward.kernels]
    assert ("%d3",) in nodes and ("%d2",) in nodes
    # a residual add stays in its product's epilogue (with dB2, the column sum of the dT6 it reads)
    assert ("%rdX", "dX", "%rdB2", "dB2") in nodes
    d2 = next(k for k in backward.kernels if k.nodes == ("%d2",))
    assert isinstance(d2, GeneralKernel) and d2.vector == 8
    gelu = next(k for k in forward.kernels if k.nodes == ("%2", "S3"))
    assert isinstance(gelu, GeneralKernel) and gelu.vector == 8
    assert any(isinstance(k, ContractionKernel) and k.nodes == ("S1",) for k in forward.kernels)


def test_a_short_batch_keeps_its_epilogue_fused():
    forward, backward = ffn_plans(128)
    assert ("S1", "%2", "S3") in [k.nodes for k in forward.kernels]
    # (its bias gradient summed in the same epilogue: each 128 × 128 tile holds every token, habu/plan/column_epilogue.py)
    assert ("%d3", "%d2", "%rdB1", "dB1") in [k.nodes for k in backward.kernels]


MODEL = """\
4096 EXTENT: #B  1 EXTENT: #ONE  14336 EXTENT: #H  4096 EXTENT: #D
bf16 TENSOR: X ( #B #D )  bf16 TENSOR: W ( #D #H )  bf16 TENSOR: B1 ( #ONE #H )  bf16 TENSOR: Y ( #B #H )
MODEL: LIN-GELU ( x w b1 -- y )  LINEAR GELU ;
"""


def test_a_chain_of_elementwise_nodes_is_one_general_kernel_and_is_proven():
    program = parse_text(MODEL, Path("lin_gelu.habu"))
    model = program.models["LIN-GELU"]
    plan = default_plan(model, TARGET, {}, {})
    assert isinstance(plan.kernels[0], ContractionKernel) and len(plan.kernels) == 2
    tail = plan.kernels[-1]
    assert isinstance(tail, GeneralKernel) and len(tail.nodes) == 2 and tail.vector == 8
    node = chain_node(model, tail.nodes)
    assert node.target == tail.nodes[-1]
    assert not any(isinstance(x, Load) and x.tensor in tail.nodes[:-1] for x in walk(node.rhs))
    assert isinstance(lower_plan(model, plan)[-1], GeneralLowering)
    proof = prove(model, plan, {}, trials=1, witness=True)
    assert proof.ok, proof


def test_a_general_chain_with_a_node_inlined_wrong_fails_the_finite_field_check():
    """A planted mutant in the inlining (`chain_node`): the bias add dropped from the printed node. The
    emitter prints the lowering's node, so the field check, which executes the same node, must refuse it."""
    from dataclasses import replace

    from habu.lower import lower_whole
    from habu.prove.verify import verify_plan

    model = parse_text(MODEL, Path("lin_gelu.habu")).models["LIN-GELU"]
    plan = default_plan(model, TARGET, {}, {})
    lowered = list(lower_whole(model, plan).kernels)
    lw = lowered[-1]
    assert isinstance(lw, GeneralLowering)

    def drop_bias(e):  # (S1 + B1) -> S1 wherever the chain inlined it
        if isinstance(e, Op) and e.fn == "add" and any(isinstance(a, Load) and a.tensor == "B1" for a in e.args):
            return next(a for a in e.args if not (isinstance(a, Load) and a.tensor == "B1"))
        return Op(e.fn, tuple(drop_bias(a) for a in e.args)) if isinstance(e, Op) else e

    mutant = replace(lw, node=replace(lw.node, rhs=drop_bias(lw.node.rhs)))
    assert mutant.node != lw.node
    good = verify_plan(model, plan, {}, trials=1, witness=True, lowerings=lowered)
    bad = verify_plan(model, plan, {}, trials=1, witness=True, lowerings=[*lowered[:-1], mutant])
    assert good.passed and not bad.passed, (good, bad)


def test_a_general_kernel_refuses_to_inline_a_node_another_kernel_reads():
    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    model = bind_shape(derive_model(program, "FFN-SKIP").forward, {"B": 4096, **FFN})
    with pytest.raises(ValueError, match="stores one node"):
        chain_node(model, ("%6", "Y"))  # RMSNorm's statistic R1 reads %6 too
    with pytest.raises(ValueError, match="only elementwise"):
        chain_node(model, ("S1", "%2", "S3"))


def test_regression_a_scalar_operand_no_longer_breaks_a_vector_general_kernel():
    """`GeneralLowering.contiguous` unpacked a 0-d tensor's (empty) positions: the elementwise row region of
    `Y[b h] = X[b h] · a` raised ValueError where the default asked for its vector kernel."""
    text = ("4096 EXTENT: #B  1024 EXTENT: #H\nbf16 TENSOR: X ( #B #H )  TENSOR: a ( )  bf16 TENSOR: Y ( #B #H )\n"
            "MODEL: SCALED  Y[b h] = X[b h] · a[] ;\n")
    model = parse_text(text, Path("scaled.habu")).models["SCALED"]
    (kernel,) = default_plan(model, TARGET, {}, {}).kernels
    assert isinstance(kernel, GeneralKernel) and kernel.vector == 8


def test_regression_a_cut_epilogue_with_a_condition_went_to_the_map_family():
    """Attention's derived backward at 16 × 1k (session 64): the default cut dS (then `where(j ≤ i + #J − #I, …)`
    in dP's epilogue) from its product into a piece of the map family, which computes no conditions: `habu
    compile` failed its finite-field check ("a reduction inside a pointwise expression: Compare(…)"). A cut piece
    with a condition is the general family's: each contraction region's epilogue with one (P's mask, since dS
    reads P) cut off goes there, and the default plan puts no such node in a map or row kernel."""
    from habu.plan.conditions import has_condition
    from habu.plan.partitions import piece_kind
    from habu.plan.patterns import default_regions
    from habu.plan.rewrite import apply_rewrites

    bw = derive_model(load_program(ROOT / "examples" / "attention.habu"), "ATTENTION-GQA").model
    sizes = {"B": 1, "G": 8, "I": 1024, "J": 1024}
    model = bind_shape(bw, sizes)
    plan = default_plan(model, TARGET, sizes, {})
    graph = apply_rewrites(model, plan.rewrites)
    by_name = {e.target: e for e in graph.nodes}
    tails = [r.nodes[1:] for r in default_regions(graph) if r.kind == "contraction"
             and any(has_condition(by_name[t]) for t in r.nodes[1:])]
    assert tails
    assert all(piece_kind(graph, tail) == "general" for tail in tails)
    assert not any(has_condition(by_name[t]) for k in plan.kernels if k.kind in ("map", "rows") for t in k.nodes)
