"""Hoisting row statistics out of their nodes, before differentiating (`habu.spec.grad`): a reduction
whose value depends on fewer indices than its node becomes a forward value of its own, which the
backward can then save (RMSNorm's per-row rstd, softmax's maximum and sum) or recompute."""

from __future__ import annotations

from dataclasses import replace

from habu.errors import HabuError
from habu.spec.equation import format_expr
from habu.spec.grad_factor import has_reduce, sum_splits
from habu.spec.grad_layout import follow_producer_layout
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    Size,
    TensorDecl,
    free_vars,
    index_subexprs,
    rename_vars,
    tensors_read,
    walk,
)


def _shape_key(e: Expr) -> str:
    """The text of `e` with its bound variables numbered in order: equal for equal computations."""
    names: dict[IndexVar, IndexVar] = {}
    for x in walk(e):
        if isinstance(x, Reduce):
            for v in x.vars:
                names.setdefault(v, IndexVar(f"_b{len(names)}", v.extent))
    return format_expr(rename_vars(e, names))  # type: ignore[arg-type]


INVARIANT_ELEMENTS = 1 << 26  # the most elements a node hoisted out of an enclosing sum may hold (at its extents' hi)


def hoist_statistics(model: Model, prefix: str = "%s", keep_row_statistics: bool = False,
                     invariant: bool = False) -> Model:
    """The model with every maximal subexpression that holds a reduction and depends on fewer indices
    than its node made a node of its own (equal ones within a node once): `y[r d] = x[r d] · rsqrt(Σ
    d' x[r d']² / #d + ε)` becomes `%s1[r] = rsqrt(...)`, `y[r d] = x[r d] · %s1[r]`. Same values.
    `keep_row_statistics`: leave those that depend on all but the node's last index (a row kernel
    computes them in place); the others (a column's maximum) are still hoisted. `invariant`: also hoist
    such a subexpression that depends on variables of enclosing reductions but not on all of them (a loop
    invariant: `Σ q s p2 … max p3 (…)[q s p]` inside `dX0[p]` is computed once an element of a node over
    (p, q, s), not once a p2), where it depends on no variable its reductions do not (the node is no larger
    than the reductions' values: attention's scores and their exp, not the scores times dO) and holds at most
    `INVARIANT_ELEMENTS`. New nodes are named `prefix` and a number."""
    nodes: list[Equation] = []
    inter = list(model.intermediates)
    count = [0]

    def hoist(eq: Equation, cache: dict[str, tuple[str, tuple[int, ...], frozenset[str]]]) -> Equation:
        lhs_set = set(eq.lhs)

        def visit(e: Expr, scope: tuple[IndexVar, ...], root: bool) -> Expr:
            if isinstance(e, Load | Const | Size) or not has_reduce(e):
                return e
            if not root:
                # the key names `e`'s free variables by where they first appear: equal computations over
                # other variables (a max's `p3` and another's `p5`, a node's `p2`) are one node, read at each
                # one's own variables
                key, order = _keyed(e)
                fv = free_vars(e)
                # a row statistic a row kernel computes in place: at the node's own level (inside a sum over other
                # variables it is that sum's invariant, computed once an iteration: hoisted with `invariant`)
                row = (keep_row_statistics and tuple(v for v in eq.lhs if v in fv) == eq.lhs[:-1]
                       and not (invariant and set(scope) != lhs_set))
                statistic = fv <= lhs_set and fv != set(scope) and not row
                inner = (invariant and not fv <= lhs_set and fv < set(scope) and fv == _reductions_vars(e)
                         and _elements(model, fv) <= INVARIANT_ELEMENTS)
                if key not in cache and (statistic or inner):
                    # the node's lhs: the node's own variables, then the enclosing reductions'
                    # (those in the order the enclosing sums bind them: dV's `%h3[b g j r i]` under `Σ r i`, i
                    # the contraction's k and innermost, so that the contraction's loads are TMA boxes)
                    vars_ = tuple(v for v in eq.lhs if v in fv) + tuple(v for v in scope if v in fv and v not in lhs_set)
                    count[0] += 1
                    name = f"{prefix}{count[0]}"
                    nodes.append(hoist(Equation(name, vars_, e), cache))
                    inter.append(TensorDecl(name, tuple(v.extent for v in vars_), None))
                    cache[key] = (name, tuple(order.index(v) for v in vars_), frozenset(tensors_read(e)))
                if key in cache:  # made here, or a computation an earlier node of this one made
                    name, positions, _ = cache[key]
                    return Load(name, tuple(order[i] for i in positions))
            if isinstance(e, Reduce):
                return Reduce(e.op, e.vars, visit(e.body, scope + tuple(e.vars), False))
            assert isinstance(e, Op)
            return Op(e.fn, tuple(visit(a, scope, False) for a in e.args))

        try:
            return replace(eq, rhs=visit(eq.rhs, tuple(eq.lhs), True))
        except RecursionError:
            raise HabuError(f"cannot differentiate {model.name}: the expression defining {eq.target} nests "
                            "too deeply") from None

    # with `invariant`: one node for a computation any node makes, until a node writes a tensor it reads (a
    # gradient accumulated by several scatters reads otherwise after each)
    shared: dict[str, tuple[str, tuple[int, ...], frozenset[str]]] = {}
    for eq in model.nodes:
        nodes.append(hoist(eq, shared if invariant else {}))
        shared = {k: v for k, v in shared.items() if eq.target not in v[2]}
    if not invariant:
        return replace(model, nodes=tuple(nodes), intermediates=tuple(inter))
    made = {f"{prefix}{i}" for i in range(1, count[0] + 1)}
    exposed = expose_known_sums(list(reuse_later_nodes(nodes, made)))
    shared_nodes = share_computations(model, exposed, prefix, count[0] + 1)
    before = {n.target for n in nodes}
    inter += [TensorDecl(eq.target, tuple(v.extent for v in eq.lhs), None) for eq in shared_nodes
              if eq.target not in before]
    shared_nodes, moved = follow_producer_layout(shared_nodes, {n.target for n in shared_nodes if n.target.startswith(prefix)})
    inter = [replace(d, extents=moved[d.name]) if d.name in moved else d for d in inter]
    return replace(model, nodes=tuple(shared_nodes), intermediates=tuple(inter))


def _keyed(e: Expr) -> tuple[str, list[IndexVar]]:
    """`e`'s computation with its free variables named by where they first appear, and those variables."""
    fv = free_vars(e)
    order = [v for v in _appearance(e) if v in fv]
    return _shape_key(rename_vars(e, {v: IndexVar(f"_f{i}_{v.extent}", v.extent)
                                      for i, v in enumerate(order)})), order  # type: ignore[arg-type]


def reuse_later_nodes(nodes: list[Equation], made: set[str]) -> tuple[Equation, ...]:
    """The hoisted nodes with a computation a later hoisted node makes read from that node: attention's dQ2 factor
    `Th1 = −div0(where(…, exp(S − R1), 0), R2²)` was hoisted whole before dQ's equation made `Th2 = exp(S − R1)`,
    and computed the scores a second time. Each such later node moves to just before the first node that reads
    it, where nothing between writes what it reads (else it stays, and so does the copy). No node is made."""
    out = list(nodes)
    for later in [n for n in nodes if n.target in made]:
        j = out.index(later)
        key, order = _keyed(later.rhs)
        positions = tuple(order.index(v) for v in later.lhs)
        reads = set(tensors_read(later.rhs))
        rewritten = {}  # the earlier nodes that make it, each read from the later node instead
        for i in range(j):
            if out[i].target not in made or any(n.target in reads for n in out[i:j]):
                continue
            rhs = _read_from(out[i].rhs, key, later.target, positions)
            if rhs != out[i].rhs and rhs != Load(later.target, tuple(out[i].lhs)):
                rewritten[i] = rhs
        for i, rhs in rewritten.items():
            out[i] = replace(out[i], rhs=rhs)
        if rewritten:  # before the first that reads it (fuzz model 18703: moved before each in turn, it ended after one)
            out.insert(min(rewritten), out.pop(j))
    return tuple(out)


def _inner_computations(e: Expr) -> list[Expr]:
    """Every subexpression of `e` but `e` itself that holds a reduction, outermost first."""
    out: list[Expr] = []
    stack = list(e.args) if isinstance(e, Op) else [e.body] if isinstance(e, Reduce) else []
    while stack:
        x = stack.pop()
        if isinstance(x, Op | Reduce) and has_reduce(x):
            out.append(x)
            stack.extend(x.args if isinstance(x, Op) else (x.body,))
    return out


def expose_known_sums(nodes: list[Equation]) -> list[Equation]:
    """The nodes with each sum `Σ V Π F` whose factors F_v and the bound variables W only they read form a sum `Σ W
    Π F_v` another place computes written as `Σ V−W Π(F − F_v) · (Σ W Π F_v)`, so that `share_computations` makes
    that sum once: attention's `%ds2 = Σ d j dO·V·P′` holds dP = `Σ d dO·V`, which dS computes (`factor_sum` leaves
    it whole: alone, the inner sum would be computed at every point of the outer one)."""
    known = {_keyed(x)[0] for eq in nodes for x in _inner_computations(eq.rhs) if isinstance(x, Reduce)}

    def expose(e: Expr) -> Expr:
        if isinstance(e, Op):
            return Op(e.fn, tuple(expose(a) for a in e.args))
        if not isinstance(e, Reduce):
            return e
        e = Reduce(e.op, e.vars, expose(e.body))
        if e.op != "sum":
            return e
        return next((sp.expr() for sp in sum_splits(e) if _keyed(sp.inner)[0] in known), e)

    return [replace(eq, rhs=expose(eq.rhs)) for eq in nodes]


def share_computations(model: Model, nodes: list[Equation], prefix: str, first_number: int) -> tuple[Equation, ...]:
    """The nodes with a computation holding a reduction that two or more places make (in several nodes, or twice
    in one) made once, by a node of its own just before the first that reads it: attention's scores' exp, which
    the merged dS (habu.spec.grad_factor) computes twice, and the two nodes before and after it each once. The
    computation made most often goes first (then the largest): the scores' exp before the masked one that holds
    it. A place after a node that writes what the computation reads keeps its own copy; a node over more than
    `INVARIANT_ELEMENTS` is not made. New nodes are `prefix` and numbers from `first_number`."""
    out = list(nodes)
    number = first_number
    tried: set[str] = set()
    while True:
        places: dict[str, list[tuple[int, Expr, list[IndexVar]]]] = {}
        for i, eq in enumerate(out):
            for sub in _inner_computations(eq.rhs):
                key, order = _keyed(sub)
                if key not in tried:
                    places.setdefault(key, []).append((i, sub, order))
        ranked = sorted(((len(v), sum(1 for _ in walk(v[0][1])), k) for k, v in places.items() if len(v) > 1),
                        reverse=True)
        for _, _, key in ranked:
            tried.add(key)
            at = places[key]
            first, sub, order = at[0]
            reads = set(tensors_read(sub))
            readers = sorted({i for i, _, _ in at if not any(out[j].target in reads for j in range(first, i))})
            if sum(1 for i, _, _ in at if i in readers) < 2 or _elements(model, frozenset(order)) > INVARIANT_ELEMENTS:
                continue
            lhs = tuple(v for v in out[first].lhs if v in order) + tuple(v for v in order if v not in out[first].lhs)
            name = f"{prefix}{number}"
            number += 1
            positions = tuple(order.index(v) for v in lhs)
            for i in readers:
                out[i] = replace(out[i], rhs=_read_from(out[i].rhs, key, name, positions))
            out.insert(first, Equation(name, lhs, sub))
            break
        else:
            return tuple(out)


def _read_from(e: Expr, key: str, node: str, positions: tuple[int, ...]) -> Expr:
    """`e` with each maximal subexpression computing `key` read from `node` (its lhs: `positions` into the
    subexpression's free variables by first appearance)."""
    if isinstance(e, Reduce | Op) and has_reduce(e):
        got, at = _keyed(e)
        if got == key:
            return Load(node, tuple(at[p] for p in positions))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, _read_from(e.body, key, node, positions))
    if isinstance(e, Op):
        return Op(e.fn, tuple(_read_from(a, key, node, positions) for a in e.args))
    return e


def _elements(model: Model, vars_: frozenset[IndexVar]) -> int:
    """The elements of a node over `vars_`, each extent at its largest size."""
    n = 1
    for v in vars_:
        n *= model.extent(v.extent).hi
    return n


def _appearance(e: Expr) -> list[IndexVar]:
    """The index variables of `e`'s loads and index conditions, in the order they first appear."""
    seen: dict[IndexVar, None] = {}
    for x in walk(e):
        exprs = x.indices if isinstance(x, Load) else x.index_exprs() if isinstance(x, Compare) else ()
        for ix in exprs:
            for sub in index_subexprs(ix):
                if isinstance(sub, IndexVar):
                    seen.setdefault(sub)
    return list(seen)


def _reductions_vars(e: Expr) -> set[IndexVar]:
    """The free variables of the outermost reductions in `e`, together."""
    out: set[IndexVar] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Reduce):
            out |= free_vars(x)
        elif isinstance(x, Op):
            stack.extend(x.args)
    return out
