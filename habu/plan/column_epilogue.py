"""A column reduction of a contraction's result computed in the contraction's epilogue: `G[n] = Σ m V[m n]`
(then its column epilogue, `dB[one n] = G[n]`) where V is the chain's end of a contraction kernel and m its
row axis. The kernel's nodes are then its chain, then the column nodes (`kernel_chain`); the lowering keeps
the column part apart (`ContractionLowering.column_sum`, habu/lower/column_epilogue.py).

The 128-token FFN backward's `dB1 = Σ b dT2[b h]` beside `dT2`, each 128 × 128 tile holding all 128 tokens:
the column kernel, a launch and a pass over V (7.3 MB of f32 at 128 × 14336) are gone, for a few shuffles per
tile. Where the tiles of m may be several, each block's sums meet in a workspace of the launch and the column
tile's last block finishes (`EpilogueColumnSum.combine`). The default partition joins the regions
(`fuse_column_regions`, habu/search/cuts.py).
"""

from __future__ import annotations

from habu.plan.patterns import as_contraction, column_parts, column_region, consumers, epilogue_column
from habu.spec.ir import Equation, IndexVar, Load, Model, Reduce, loads, walk


def _node(model: Model, target: str) -> Equation:
    return next(e for e in model.nodes if e.target == target)


def kernel_chain(model: Model, nodes: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A contraction kernel's nodes split into its chain (the contraction and its elementwise epilogue
    nodes) and the column nodes after it (a reduction, then its column epilogue; () for most kernels)."""
    for i, t in enumerate(nodes[1:], start=1):
        if any(isinstance(x, Reduce) for x in walk(_node(model, t).rhs)):
            return nodes[:i], nodes[i:]
    return nodes, ()


def chain_end(model: Model, nodes: tuple[str, ...]) -> str:
    """The node a contraction kernel's main output holds: its chain's last node."""
    return kernel_chain(model, nodes)[0][-1]


def summed_tensor(model: Model, chain: tuple[str, ...], columns: tuple[str, ...]) -> str | None:
    """The tensor the column nodes `columns` sum over the contraction's m axis, where the kernel of `chain` has it
    at every element of its tiles: the chain's end (`G[n] = Σ m V[m n]`), or a tensor a node of the chain's epilogue
    reads at its own element (`dB2 = Σ b dT6[b d]` where the epilogue computes `dX = dT6 + Σ h …`); nothing inlined
    before the sum, and a column epilogue that reads only the sum and constants (a cast, a scale, a store into the
    broadcast shape). None otherwise."""
    if not columns or column_region(model, columns) is None:
        return None
    red, epilogue = column_parts(model, columns)
    if red.target != columns[0] or not isinstance(red.rhs, Reduce) or red.rhs.op != "sum":
        return None
    first, end = _node(model, chain[0]), _node(model, chain[-1])
    c = as_contraction(first)
    body = red.rhs.body
    if c is None or c.batch or len(end.lhs) != 2 or len(red.lhs) != 1 or not isinstance(body, Load):
        return None
    if len(red.rhs.vars) != 1 or end.scatter is not None or first.lhs[0] != c.m or first.lhs[1] != c.n:
        return None  # (each node of the chain is over the contraction's own (m, n), position by position)
    r, col = red.rhs.vars[0], red.lhs[0]
    at_element = {ld.tensor for t in chain[1:] for ld in loads(_node(model, t).rhs) if ld.indices == _node(model, t).lhs}
    if body.indices != (r, col) or (body.tensor != end.target and body.tensor not in at_element):
        return None
    inside = {red.target, *(e.target for e in epilogue)}
    for e in epilogue:
        if any(ld.tensor not in inside for ld in loads(e.rhs)) or not isinstance(epilogue_column(model, e), IndexVar):
            return None
    return body.tensor


def fusable_columns(model: Model, chain: tuple[str, ...], columns: tuple[str, ...]) -> bool:
    """`summed_tensor`, and nothing else reads the column nodes but the region itself (the last is stored)."""
    if summed_tensor(model, chain, columns) is None:
        return False
    outputs = {t.name for t in model.outputs}
    return all(t not in outputs and all(c.target in columns for c in consumers(model, t)) for t in columns[:-1])


__all__ = ["chain_end", "fusable_columns", "kernel_chain", "summed_tensor"]
