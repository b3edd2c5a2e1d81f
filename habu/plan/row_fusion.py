"""Which row and elementwise nodes share one row kernel (`merge_or_add`, called by
`habu.plan.patterns.default_regions` as it walks the model's nodes): a node of the previous region's shape
that is the only reader of its result; a row that reads the statistic the previous region ends in
(`statistic_then_row`); a statistic of the previous region's rows with the rows after it that read both
(`row_then_statistic`)."""

from __future__ import annotations

from habu.plan.conditions import row_conditions
from habu.plan.patterns import Region, consumers, row_local
from habu.spec.ir import Equation, Model, Reduce, loads, walk


def statistic_then_row(model: Model, prev: Region, new_eq: Equation) -> bool:
    """`prev` is a row region that ends in a row statistic (`R1[r] = rsqrt(Σ d X[r d]² / #D + ε)`) and
    `new_eq` reads it over the same rows and columns (`Y[r d] = X[r d] · R1[r]`): one row kernel computes
    both, storing the statistic too where it is an output or read elsewhere (`stored_nodes`), and reads
    the row once (H200 figures: docs/PERF.md, session 32, rows2)."""
    if prev.kind != "rows":
        return False
    stat = next(e for e in model.nodes if e.target == prev.output)
    at, new_at = row_local(stat), row_local(new_eq)
    if at is None or at != new_at or len(stat.lhs) != len(at[0]) or new_eq.scatter is not None:
        return False
    # each read of the statistic at the new node's own row: one read along the columns (`max q2 S[q2]`, every
    # row's statistic) needs the other rows' values, which this row kernel has not computed (a fuzz's model)
    return any(ld.tensor == stat.target for ld in loads(new_eq.rhs)) and reads_own_rows(new_eq, stat.target)


def row_kernel_conditions(model: Model, regions: list[Region], eq: Equation) -> bool:
    """Whether a row kernel computes `eq` with its conditions on indices (habu/plan/conditions.py
    `row_conditions`): a row reduction (attention's masked row sum), or an elementwise node that joins the row
    region before it (`statistic_then_row`: a masked softmax's weights `div0(where(c, exp(S − M), 0), L)` after the
    row kernel of M and L; a map kernel would compute no condition)."""
    if not row_conditions(eq) or row_local(eq) is None:
        return False
    return any(isinstance(x, Reduce) for x in walk(eq.rhs)) or (bool(regions) and statistic_then_row(model, regions[-1], eq))


def reads_own_rows(eq: Equation, tensor: str) -> bool:
    """Every read of `tensor` in `eq` is in the row `eq` writes: its leading indices are `eq`'s row variables
    (`row_local`'s leading axes; a row statistic `S[q]` read as `S[q]`, not `S[q2]` under a reduction over q2)."""
    at = row_local(eq)
    if at is None:
        return True  # not a row node: elementwise fusion checks its own shapes
    rows = tuple(eq.lhs[:len(at[0])])
    return all(tuple(ld.indices[:len(rows)]) == rows for ld in loads(eq.rhs) if ld.tensor == tensor)


def row_then_statistic(model: Model, prev: Region, new_eq: Equation) -> bool:
    """`prev` is a row or map region whose result `H[r d]` (`H = S4 + B2 + X`, not an output) `new_eq` reduces to
    a row statistic over the same rows (`R1[r] = rsqrt(Σ d H[r d]² / #D + ε)`), and every other reader of H is
    one of the nodes right after `new_eq` that read the statistic over those rows (`Y[r d] = H[r d] · R1[r]`,
    merged next by `statistic_then_row`): one row kernel computes H, the statistic and the row, and H never
    reaches memory (FFN-SKIP's forward at 4096 tokens ran H alone in a row kernel of scalar 2-byte loads and
    stores, and wrote and read back its 33.5 MB: one launch and ≥ 16 µs of copy bandwidth fewer)."""
    if prev.kind not in ("rows", "map") or new_eq.scatter is not None:
        return False
    h = next(e for e in model.nodes if e.target == prev.output)
    at, h_at = row_local(new_eq), row_local(h)
    if at is None or at != h_at or len(new_eq.lhs) != len(at[0]) or len(h.lhs) != len(at[0]) + 1:
        return False
    if prev.output in {t.name for t in model.outputs}:
        return False
    readers = consumers(model, prev.output)
    if new_eq not in readers:
        return False
    order = [e.target for e in model.nodes]
    after = model.nodes[order.index(new_eq.target) + 1:]
    rest = [e for e in readers if e is not new_eq]
    follow = Region("rows", (*prev.nodes, new_eq.target))
    return all(e in after[:len(rest)] and statistic_then_row(model, follow, e) for e in rest)


def merge_or_add(regions: list[Region], new: Region, model: Model) -> None:
    """Fuse a row/map node into the previous region when they share the shape and the previous
    region's result is read by nothing else, when the previous region ends in a row statistic that
    the node reads over the same rows (`statistic_then_row`), or when the node is a statistic of the
    previous region's rows that only it and the rows after it read (`row_then_statistic`)."""
    if regions:
        prev = regions[-1]
        prev_eq = next(e for e in model.nodes if e.target == prev.output)
        new_eq = next(e for e in model.nodes if e.target == new.output)
        if statistic_then_row(model, prev, new_eq) or row_then_statistic(model, prev, new_eq):
            regions[-1] = Region("rows", prev.nodes + new.nodes)
            return
        outputs = {t.name for t in model.outputs}
        same_shape = [v.extent for v in prev_eq.lhs] == [v.extent for v in new_eq.lhs]
        # two row nodes share a kernel only along the same columns: a statistic over #Q (Th1[q] = ... max q2 ...)
        # and one over #P (dX0[q] = Σ p ...) have the same shape, and the row kernel ran the first's reduction
        # along the second's columns (a load of X0 past its end, refused by the bounds rule; found by a fuzz)
        if prev.kind == new.kind == "rows" and row_local(prev_eq) != row_local(new_eq):
            same_shape = False
        only_reader = consumers(model, prev.output) == [new_eq] and prev.output not in outputs
        if "rows" in (prev.kind, new.kind) and not reads_own_rows(new_eq, prev.output):
            same_shape = False  # the node reads the previous one's result in other rows (`Σ q3 S[q3]`)
        kind = "rows" if "rows" in (prev.kind, new.kind) else "map"
        # a row kernel ends in a row-local node: an elementwise node over a row statistic's own shape (`%h1[p] =
        # dY[p] · step(%h2[p])` after `%h2[p] = Σ p3 …`) is no row of it (the fuzz's model 520: a crash in the
        # row lowering, once session 62's backward made the statistic a node of its own)
        if kind == "rows" and row_local(new_eq) is None:
            same_shape = False
        if prev.kind in ("rows", "map") and same_shape and only_reader:
            regions[-1] = Region(kind, prev.nodes + new.nodes)
            return
    regions.append(new)


__all__ = ["merge_or_add", "row_kernel_conditions", "row_then_statistic", "statistic_then_row"]
