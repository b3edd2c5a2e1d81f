"""The grouped GEMM pattern (the grouped family's node, habu/paths/grouped.py): `T[r n] = scale · Σ k A[IX[r] k] ·
W[E[r] n k]` and its forms beyond the default (a row factor, a scatter-add store, an f32 A, n-major weights)."""

from __future__ import annotations

from dataclasses import dataclass

from habu.plan.patterns import _factors, _is_constant
from habu.plan.storage import dtype_of
from habu.spec.ir import Equation, Expr, Gather, IndexExpr, IndexVar, Load, Model, Op, Reduce


@dataclass(frozen=True)
class GroupedGemm:
    """`T[r n] = scale · Σ k A[IX[r] k] · W[E[r] n k]`: the rows r of A (gathered through `gather`, or
    not), each row's weights the slab W[E[r]] of its group (E a grouping: rows of a group contiguous),
    stored [g n k] or, n-major, [g k n] (`W[E[r] k n]`: a backward's product through the transposed weights,
    `dTact[r h] = Σ d dY[IX[r] d] · W2[E[r] d h]`; only the wgmma loop reads it, in 64-column TMA boxes).
    The forms beyond it (`by_default` false) are built by the grouped family only through the search or
    `--pin family=grouped`: a row factor `P[r]`, a scatter-add store `T[IX[r] n] += …` (an f32 target), an
    f32 A (split into bf16 parts for mma.sync)."""

    node: Equation
    r: IndexVar
    n: IndexVar
    k: IndexVar
    a: Load
    w: Load
    groups: str  # the grouping E
    group_extent: str  # the extent of E's values (W's first dimension)
    scale: Expr | None
    row_scale: Load | None = None  # a factor read per row, `P[r]`
    scatter: tuple[IndexExpr, ...] | None = None  # the stored element's indices (`IX[r] n`) of a `+=`
    a_dtype: str = "bf16"  # A's element type (its storage's, for an intermediate)
    # the form the default plan computes with the grouped family: `T[r n] = Σ k …` with constant factors
    # inside the sum, A and W declared bf16 (the others keep the general kernel unless searched or pinned)
    by_default: bool = True
    w_n_major: bool = False  # W stored [g k n]: its rows along n contiguous


def as_grouped_gemm(model: Model, eq: Equation) -> GroupedGemm | None:
    """Recognise a grouped GEMM (the grouped family's node), or None."""
    outer = _factors(eq.rhs)
    sums = [i for i, f in enumerate(outer) if isinstance(f, Reduce)]
    if len(eq.lhs) != 2 or len(sums) != 1:
        return None
    rhs = outer[sums[0]]
    assert isinstance(rhs, Reduce)
    if rhs.op != "sum" or len(rhs.vars) != 1:
        return None
    (r, n), (k,) = eq.lhs, rhs.vars
    factors = [f for i, f in enumerate(outer) if i != sums[0]] + _factors(rhs.body)
    row_loads = [f for f in factors if isinstance(f, Load) and f.indices == (r,) and f.tensor != eq.target]
    loads = [f for f in factors if isinstance(f, Load) and f not in row_loads]
    consts = [f for f in factors if not isinstance(f, Load)]
    if len(loads) != 2 or len(row_loads) > 1 or not all(_is_constant(c) for c in consts) or len({r, n, k}) != 3:
        return None
    if any(f not in _factors(rhs.body) for f in loads):
        return None  # A and W inside the sum
    if eq.scatter is not None and (model.tensor(eq.target).dtype is None or str(model.tensor(eq.target).dtype) != "f32"
                                   or eq.scatter[1:] != (n,) or not _row_of(eq.scatter[0], r)):
        return None  # the scatter-add epilogue: f32 atomicAdd into T[IX[r] n] (or T[r n])
    for a, w in ((loads[0], loads[1]), (loads[1], loads[0])):
        row = a.indices[0] if len(a.indices) == 2 else None
        gathered = isinstance(row, Gather) and row.indices == (r,)
        if a.indices[1:] != (k,) or not (row == r or gathered):
            continue
        if len(w.indices) != 3 or w.indices[1:] not in ((n, k), (k, n)) or not isinstance(w.indices[0], Gather):
            continue
        g = w.indices[0]
        decl = model.tensor(g.tensor)
        if g.indices != (r,) or not decl.grouped or decl.range is None:
            continue
        if model.tensor(w.tensor).extents[0] != decl.range or a.tensor == eq.target or w.tensor == eq.target:
            continue
        a_dtype = dtype_of(model, a.tensor)
        if a_dtype not in ("bf16", "f32") or str(model.tensor(w.tensor).dtype) != "bf16":
            continue  # mma.sync m16n8k16 on bf16 operands (an f32 A split in parts); others stay general
        scale = None
        for c in consts:
            scale = c if scale is None else Op("mul", (scale, c))
        plain = len(outer) == 1 and not row_loads and eq.scatter is None and str(model.tensor(a.tensor).dtype) == "bf16"
        return GroupedGemm(eq, r, n, k, a, w, g.tensor, decl.range, scale, row_loads[0] if row_loads else None,
                           eq.scatter, a_dtype, plain, w.indices[1:] == (k, n))
    return None


def _row_of(ix: IndexExpr, r: IndexVar) -> bool:
    """The stored row of a scatter: r itself, or a gather `IX[r]`."""
    return ix == r or (isinstance(ix, Gather) and ix.indices == (r,))
