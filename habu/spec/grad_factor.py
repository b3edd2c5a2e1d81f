"""Sum–product factoring of a gradient's terms (habu.spec.grad): each term comes out of the derivation as
one flat `Σ V Π F` over every variable of its forward scope the gradient does not index, and two terms of
one gradient that contract the same operand stay two sums. Attention's dK came out as `Σ r i d dO·V·(…)·Q`,
recomputing `Σ d dO·V` for each of its elements (a general kernel the cost model put at 144 ms at the
example's sizes), and its dQ as two sums over j against K. Both rewrites below are distributivity, exact in
any commutative ring (the GF(p) proof of a backward and its adjoint check see equal values) and never more
work: a factored sum is at worst recomputed per outer iteration, as the flat one was, and the invariant hoist
(`hoist_statistics(invariant=True)`) makes it a node of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from habu.spec.ir import Expr, IndexVar, Load, Op, Reduce, free_vars, rename_vars, walk


def factors(e: Expr) -> list[Expr]:
    """The factors of a product chain `a · b · …` (an expression that is not a product: itself alone)."""
    if isinstance(e, Op) and e.fn == "mul":
        return [f for a in e.args for f in factors(a)]
    return [e]


def terms(e: Expr) -> list[Expr]:
    """The terms of a sum (its top-level additions flattened, in order)."""
    if isinstance(e, Op) and e.fn == "add":
        return [t for a in e.args for t in terms(a)]
    return [e]


def product(fs: list[Expr]) -> Expr:
    out = fs[0]
    for f in fs[1:]:
        out = Op("mul", (out, f))
    return out


def _elements(vars_: frozenset[IndexVar] | set[IndexVar], size: Callable[[IndexVar], int]) -> int:
    n = 1
    for v in vars_:
        n *= size(v)
    return n


@dataclass(frozen=True)
class SumSplit:
    """`Σ V Π F` as `Σ outer Π rest · inner`, inner = `Σ W Π F_v`: F_v the factors that mention a bound variable v,
    W the bound variables no other factor mentions (v among them)."""

    inner: Reduce
    outer: tuple[IndexVar, ...]
    rest: tuple[Expr, ...]

    def expr(self) -> Reduce:
        return Reduce("sum", self.outer, product([*self.rest, self.inner]))


def sum_splits(term: Reduce) -> list[SumSplit]:
    """Every way to sum some of a sum's factors apart (one per bound variable that some but not all factors
    mention), leaving at least one bound variable outside: a factor of the term's own variables is not pulled out
    of it."""
    fs = factors(term.body)
    fvs = [free_vars(f) for f in fs]
    out = []
    for v in term.vars:
        holding = [i for i, s in enumerate(fvs) if v in s]
        if not holding or len(holding) == len(fs):
            continue
        inner_bound = tuple(w for w in term.vars if all(i in holding for i, s in enumerate(fvs) if w in s))
        if len(inner_bound) < len(term.vars):
            out.append(SumSplit(Reduce("sum", inner_bound, product([fs[i] for i in holding])),
                                tuple(w for w in term.vars if w not in inner_bound),
                                tuple(f for i, f in enumerate(fs) if i not in holding)))
    return out


def factor_sum(term: Expr, size: Callable[[IndexVar], int]) -> Expr:
    """`Σ V Π F` with the factors that mention some bound variables only summed over those (`sum_splits`),
    repeated on the outer sum. Of the candidates, the one whose inner sum has the fewest elements (its free
    variables at `size`); one whose factors mention every variable the body does is skipped (the inner sum would be
    computed at every point the outer one is: nothing saved). Anything but a sum of a product comes back as it is."""
    if not isinstance(term, Reduce) or term.op != "sum":
        return term
    body_vars = free_vars(term.body)
    useful = [sp for sp in sum_splits(term) if not free_vars(sp.inner.body) >= body_vars]
    if not useful:
        return term
    best = min(useful, key=lambda sp: _elements(free_vars(sp.inner), size))
    return factor_sum(best.expr(), size)


def has_reduce(e: Expr) -> bool:
    return any(isinstance(x, Reduce) for x in walk(e))


def _mentions(e: Expr) -> set[IndexVar]:
    """Every index variable `e` reads or binds."""
    return free_vars(e) | {v for x in walk(e) if isinstance(x, Reduce) for v in x.vars}


def _partner(term: Expr) -> tuple[tuple[IndexVar, ...], Load, list[Expr]] | None:
    """(bound variables, the partner, the other factors) of `Σ V Π F`, the partner the one load that indexes every
    bound variable and a free variable no other factor does (attention's K in `Σ j dS[i j]·K[j e]`, not the row sum
    `R2[i]` of a sum over i); None where no load or more than one is."""
    if not isinstance(term, Reduce) or term.op != "sum":
        return None
    fs = factors(term.body)
    fvs = [free_vars(f) for f in fs]
    at = [i for i, f in enumerate(fs) if isinstance(f, Load) and set(term.vars) <= set(f.indices)
          and fvs[i] - set(term.vars) - set().union(*(s for j, s in enumerate(fvs) if j != i))]
    if len(at) != 1:
        return None
    load = fs[at[0]]
    assert isinstance(load, Load)
    return term.vars, load, [f for i, f in enumerate(fs) if i != at[0]]


def _correspondence(a: tuple[tuple[IndexVar, ...], Load], b: tuple[tuple[IndexVar, ...], Load]
                    ) -> dict[IndexVar, IndexVar] | None:
    """The renaming of b's bound variables onto a's under which b's partner load reads as a's, or None."""
    (bound_a, load_a), (bound_b, load_b) = a, b
    if load_a.tensor != load_b.tensor or len(bound_a) != len(bound_b):
        return None
    mapping: dict[IndexVar, IndexVar] = {}
    for ia, ib in zip(load_a.indices, load_b.indices, strict=True):
        if ib in bound_b:
            if ia not in bound_a or mapping.setdefault(ib, ia) != ia:  # type: ignore[arg-type]
                return None
        elif ia != ib or ia in bound_a:
            return None
    if set(mapping) != set(bound_b) or len(set(mapping.values())) != len(mapping):
        return None
    return mapping


def merge_terms(terms: list[Expr]) -> list[Expr]:
    """Two terms `Σ V A · X` and `Σ V' B · X'` of one gradient that contract one operand read alike (X' is X with
    V' renamed to V) become `Σ V (A + B) · X`: attention's dQ = `Σ j dS·K` with dS = `P ⊙ (dP − D)` one value,
    as FlashAttention-2 writes it, instead of two sums over j against K. Only where A and B each hold a
    reduction (so their sum is a node of its own after the invariant hoist, which dK then shares); a sum of
    cofactors without one (`Σ n (dY + dZ)·W`) would leave the contraction path for a general kernel."""
    out = list(terms)
    merged = True
    while merged:
        merged = False
        for a in range(len(out)):
            pa = _partner(out[a])
            if pa is None or not any(has_reduce(f) for f in pa[2]):
                continue
            for b in range(a + 1, len(out)):
                pb = _partner(out[b])
                if pb is None or not any(has_reduce(f) for f in pb[2]):
                    continue
                mapping = _correspondence((pa[0], pa[1]), (pb[0], pb[1]))
                if mapping is None or _mentions(product(pb[2])) & set(pa[0]):
                    continue
                cofactor_b = rename_vars(product(pb[2]), mapping)  # type: ignore[arg-type]
                out[a] = Reduce("sum", pa[0], Op("mul", (Op("add", (product(pa[2]), cofactor_b)), pa[1])))
                del out[b]
                merged = True
                break
            if merged:
                break
    return out
