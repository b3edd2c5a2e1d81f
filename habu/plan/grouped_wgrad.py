"""The grouped weight gradient: `O[E[r] m n] += A[r m] · B[IX[r] n]` (a row factor P[r] and constants allowed),
with E a grouping (the rows of each group contiguous, in order). A derived MoE backward's expert-weight
gradients are this form:

    dW1[E[r] h d] += dTgate[r h] · X[IX[r] d]
    dW2[E[r] d h] += dY[IX[r] d] · P[r] · Sact[r h]

For each group g it is one product over the group's rows, `O[g] += A[rows of g]ᵀ · B[rows of g]`: a GEMM
whose reduced axis is the group's rows (a different count in each group, found on the device), both operands
read along their rows (m and n contiguous, the wgmma loop's MN-major tiles). The grouped family builds it
(habu/lower/grouped_wgrad.py); the general family would compute each element by a loop over the rows, far
from the tensor cores."""

from __future__ import annotations

from dataclasses import dataclass

from habu.plan.storage import dtype_of
from habu.spec.ir import Const, Equation, Gather, IndexVar, Load, Model, Op, Size


@dataclass(frozen=True)
class GroupedWgrad:
    """`O[E[r] m n] += scale · P[r] · A[r m] · B[r n]`, A's and B's rows gathered (IX[r]) or not."""

    node: Equation
    r: IndexVar  # the rows: the reduced axis, cut by the grouping
    m: IndexVar  # the output's rows within a group
    n: IndexVar  # its columns (contiguous)
    a: Load  # at (r, m), m contiguous; bf16 or f32 (two bf16 parts on the tensor cores)
    b: Load  # at (r, n), n contiguous; bf16
    groups: str  # the grouping E
    group_extent: str  # the extent of E's values (O's first dimension)
    scale: Op | Const | Size | None
    row_scale: Load | None  # P[r]
    a_dtype: str


def _factors(e) -> list:
    if isinstance(e, Op) and e.fn == "mul":
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _constant(e) -> bool:
    if isinstance(e, Const | Size):
        return True
    return isinstance(e, Op) and e.fn in ("mul", "div", "add", "sub", "neg") and all(_constant(a) for a in e.args)


def _row(ix, r: IndexVar) -> bool:
    """The stored row of an operand: r itself, or a gather `IX[r]`."""
    return ix == r or (isinstance(ix, Gather) and ix.indices == (r,))


def as_grouped_wgrad(model: Model, eq: Equation) -> GroupedWgrad | None:
    """Recognise a grouped weight gradient (the grouped family's second form), or None."""
    if eq.scatter is None or len(eq.scatter) != 3 or len(eq.lhs) != 3:
        return None
    g, m, n = eq.scatter
    if not isinstance(g, Gather) or len(g.indices) != 1 or not isinstance(m, IndexVar) or not isinstance(n, IndexVar):
        return None
    (r,) = g.indices
    decl = model.tensor(g.tensor)
    target = model.tensor(eq.target)
    if not isinstance(r, IndexVar) or not decl.grouped or decl.range is None or target.extents[0] != decl.range \
            or set(eq.lhs) != {r, m, n} or len({r, m, n}) != 3:
        return None
    if target.dtype is None or target.dtype.name != "f32":
        return None  # O += …: f32, as every scatter-add
    loads = [f for f in _factors(eq.rhs) if isinstance(f, Load)]
    consts = [f for f in _factors(eq.rhs) if not isinstance(f, Load)]
    if not all(_constant(c) for c in consts):
        return None
    rows = [f for f in loads if f.indices == (r,)]
    operands = [f for f in loads if f not in rows]
    if len(rows) > 1 or len(operands) != 2:
        return None
    by_axis = {}
    for ld in operands:
        if len(ld.indices) != 2 or not _row(ld.indices[0], r) or ld.indices[1] not in (m, n) or ld.tensor == eq.target:
            return None
        by_axis[ld.indices[1]] = ld
    if set(by_axis) != {m, n}:
        return None
    a, b = by_axis[m], by_axis[n]
    a_dtype = dtype_of(model, a.tensor)
    if a_dtype not in ("bf16", "f32") or dtype_of(model, b.tensor) != "bf16":
        return None  # wgmma on bf16 operands (an f32 A in two bf16 parts)
    # (a row factor multiplies A before the tile is stored: an f32 A's product is split into two bf16 parts, a bf16
    # A's is rounded to bf16 once, as torch's bf16 autograd rounds P·dY: `--pin storage=bf16`'s dY.bf16)
    scale = None
    for c in consts:
        scale = c if scale is None else Op("mul", (scale, c))
    return GroupedWgrad(eq, r, m, n, a, b, g.tensor, decl.range, scale, rows[0] if rows else None, a_dtype)


__all__ = ["GroupedWgrad", "as_grouped_wgrad"]
