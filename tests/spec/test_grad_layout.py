"""A hoisted elementwise node that transposes another takes that node's layout where only products read it
(habu/spec/grad_layout.py): attention's P for dV."""

from __future__ import annotations

from habu.spec.grad_layout import follow_producer_layout
from habu.spec.ir import Equation, IndexVar, Load, Op, Reduce

QI, KJ, VD = IndexVar("i", "I"), IndexVar("j", "J"), IndexVar("d", "D")


def _nodes(reader_is_product: bool) -> tuple[Equation, ...]:
    exp = Equation("%h1", (QI, KJ), Op("exp", (Load("S", (QI, KJ)),)))
    p = Equation("%h2", (KJ, QI), Op("mul", (Load("%h1", (QI, KJ)), Load("R", (QI,)))))  # transposes %h1
    body = Op("mul", (Load("dO", (QI, VD)), Load("%h2", (KJ, QI))))
    reader = Equation("dV", (KJ, VD), Reduce("sum", (QI,), body) if reader_is_product else Op("add", (Load("%h2", (KJ, QI)), Load("dO", (QI, VD)))))
    return exp, p, reader


def test_a_transposing_node_read_by_a_product_takes_its_producers_layout():
    nodes, moved = follow_producer_layout(_nodes(True), {"%h1", "%h2"})
    assert nodes[1].lhs == (QI, KJ) and moved == {"%h2": ("I", "J")}
    reader = nodes[2].rhs
    assert isinstance(reader, Reduce) and Load("%h2", (QI, KJ)) in reader.body.args  # the same element, permuted


def test_a_node_another_kernel_reads_elementwise_keeps_its_layout():
    nodes, moved = follow_producer_layout(_nodes(False), {"%h1", "%h2"})
    assert nodes == _nodes(False) and moved == {}
