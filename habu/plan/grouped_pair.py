"""Two grouped GEMMs over the same rows and one elementwise node of both: the MoE layer's gate and up
projections with SwiGLU (`gate = Σ d X[IX[r] d]·W1[E[r] h d]`, `up = … W3 …`, `act = gate·sigmoid(gate)·up`),
which one grouped kernel computes with two accumulators, storing only the elementwise node's result
(habu/lower/grouped.py's `PairEpilogue`). Not a default region: `--pin pair=fused` and the search build it."""

from __future__ import annotations

from dataclasses import dataclass

from habu.plan.grouped_pattern import GroupedGemm, as_grouped_gemm
from habu.plan.patterns import Region, consumers
from habu.spec.ir import Equation, Gather, Load, Model, Reduce, walk


@dataclass(frozen=True)
class GroupedPair:
    first: GroupedGemm  # gate
    second: GroupedGemm  # up
    epilogue: Equation  # act[r n] = f(gate[r n], up[r n])

    @property
    def nodes(self) -> tuple[str, str, str]:
        return (self.first.node.target, self.second.node.target, self.epilogue.target)


def _rows_read(gg: GroupedGemm) -> object:
    """How A's rows are read: plainly, or through which index tensor."""
    row = gg.a.indices[0]
    return row.tensor if isinstance(row, Gather) else None


def as_grouped_pair(model: Model, nodes: tuple[str, ...]) -> GroupedPair | None:
    """The pair `nodes` = (first GEMM, second GEMM, the node of both), or None: both plain grouped GEMMs
    (bf16 A, no row factor, no scatter) of the same A rows, extents and grouping; the third node
    elementwise over (r, n), reading both results only at its own element and nothing else; neither
    result a model output or read by another node."""
    if len(nodes) != 3:
        return None
    eqs = [next((e for e in model.nodes if e.target == t), None) for t in nodes]
    if any(e is None for e in eqs):
        return None
    first_eq, second_eq, epi = eqs
    assert first_eq is not None and second_eq is not None and epi is not None
    g1, g2 = as_grouped_gemm(model, first_eq), as_grouped_gemm(model, second_eq)
    if g1 is None or g2 is None:
        return None
    for g in (g1, g2):
        if g.row_scale is not None or g.scatter is not None or g.a_dtype != "bf16" or g.w_n_major:
            return None
    same = (g1.a.tensor == g2.a.tensor and _rows_read(g1) == _rows_read(g2) and g1.groups == g2.groups
            and (g1.r.extent, g1.n.extent, g1.k.extent) == (g2.r.extent, g2.n.extent, g2.k.extent))
    if not same or epi.scatter is not None or len(epi.lhs) != 2 \
            or tuple(v.extent for v in epi.lhs) != (g1.r.extent, g1.n.extent):
        return None
    loads = [x for x in walk(epi.rhs) if isinstance(x, Load)]
    if any(isinstance(x, Reduce) for x in walk(epi.rhs)) or not loads \
            or any(ld.tensor not in nodes[:2] or ld.indices != epi.lhs for ld in loads) \
            or {ld.tensor for ld in loads} != set(nodes[:2]):
        return None
    outputs = {t.name for t in model.outputs}
    for t in nodes[:2]:
        if t in outputs or consumers(model, t) != [epi]:
            return None
    return GroupedPair(g1, g2, epi)


def pair_positions(model: Model, regions: tuple[Region, ...]) -> list[int]:
    """Where three consecutive regions — grouped, grouped, one elementwise node — form a pair."""
    out = []
    for i in range(len(regions) - 2):
        a, b, e = regions[i:i + 3]
        if a.kind == "grouped" and b.kind == "grouped" and e.kind in ("rows", "map") and len(e.nodes) == 1 \
                and as_grouped_pair(model, (*a.nodes, *b.nodes, *e.nodes)) is not None:
            out.append(i)
    return out
