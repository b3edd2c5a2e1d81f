"""A gradient's term that recomputes a forward output reads it instead (habu.spec.grad).

Attention's forward stores `O[i d] = Σ j P[i j]·V[j d]` (P the softmax, `div0(where(…, exp(S − R1), 0), R2)`).
The adjoint of its row sum R2 comes out of the derivation as `Σ j d dO[i d]·V[j d]·(−P[i j]·div0(1, R2[i]))`: the
scores' exp and the product `Σ d dO·V` computed again, and a second pass over the I·J elements. Its factors P and V,
summed over j, are O's: the term is `Σ d dO[i d]·(−div0(1, R2[i]))·O[i d]`, one pass over I·D elements of two
tensors the step has (FlashAttention-2's `D = rowsum(dO ∘ O)`).

`read_outputs` finds such a forward node (an output `T[L] = Σ J Π H`) in a term `Σ B Π F`: a renaming φ of T's
variables onto the term's under which each factor of H is a factor of F, J goes to bound variables of the term, and
no factor left mentions them. Then `Σ B Π F = Σ (B − φJ) Π (F − φH) · T[φL]`: distributivity, exact in any
commutative ring, so the adjoint check over GF(p) (habu.spec.grad_check) sees the same values. Only outputs that
are sums: their values exist after the forward whatever the save policy, and reading one replaces a sum's work by
a load (an elementwise output, RMSNorm's `Y = X·R1`, is cheaper made again than read: it would add a read of Y).
"""

from __future__ import annotations

from fractions import Fraction

from habu.spec.grad_algebra import ONE
from habu.spec.grad_factor import product
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    Gather,
    IndexAffine,
    IndexExpr,
    IndexVar,
    Load,
    NegInf,
    Op,
    Reduce,
    Size,
    free_vars,
)

MINUS_ONE = Const(Fraction(-1))

Renaming = dict[IndexVar, IndexVar]


def signed_factors(e: Expr) -> list[Expr]:
    """The factors of a product chain, a negation one more factor −1: `−(a·b)·c` is [−1, a, b, c]."""
    if isinstance(e, Op) and e.fn == "mul":
        return [f for a in e.args for f in signed_factors(a)]
    if isinstance(e, Op) and e.fn == "neg":
        return [MINUS_ONE, *signed_factors(e.args[0])]
    return [e]


def signed_product(fs: list[Expr]) -> Expr:
    """The product of factors (`signed_factors`' inverse), a factor −1 as a negation."""
    rest = [f for f in fs if f != MINUS_ONE]
    out = product(rest) if rest else ONE
    return Op("neg", (out,)) if (len(fs) - len(rest)) % 2 else out


def _bind(v: IndexVar, w: IndexVar, phi: Renaming, used: set[IndexVar]) -> bool:
    """Extend the one-to-one renaming `phi` by v → w (same extent)."""
    if v in phi:
        return phi[v] == w
    if w in used or v.extent != w.extent:
        return False
    phi[v] = w
    used.add(w)
    return True


def _index(p: IndexExpr, t: IndexExpr, phi: Renaming, used: set[IndexVar]) -> bool:
    if isinstance(p, IndexVar):
        return isinstance(t, IndexVar) and _bind(p, t, phi, used)
    if isinstance(p, Gather):
        return isinstance(t, Gather) and p.tensor == t.tensor and len(p.indices) == len(t.indices) \
            and all(_index(a, b, phi, used) for a, b in zip(p.indices, t.indices, strict=True))
    return p == t


def _affine(p: IndexAffine, t: IndexAffine, phi: Renaming, used: set[IndexVar]) -> bool:
    return p.sizes == t.sizes and p.const == t.const and len(p.terms) == len(t.terms) and all(
        cp == ct and _index(ip, it, phi, used) for (cp, ip), (ct, it) in zip(p.terms, t.terms, strict=True))


def unify(p: Expr, t: Expr, phi: Renaming, used: set[IndexVar]) -> bool:
    """Whether `t` is `p` with its index variables renamed by an extension of `phi` (one to one, extents kept);
    `phi` and `used` (its image) are extended in place (left partly extended where the answer is no)."""
    if type(p) is not type(t):
        return False
    if isinstance(p, Const | Size | NegInf):
        return p == t
    if isinstance(p, Load):
        return p.tensor == t.tensor and len(p.indices) == len(t.indices) \
            and all(_index(a, b, phi, used) for a, b in zip(p.indices, t.indices, strict=True))
    if isinstance(p, Op):
        return p.fn == t.fn and len(p.args) == len(t.args) \
            and all(unify(a, b, phi, used) for a, b in zip(p.args, t.args, strict=True))
    if isinstance(p, Reduce):
        return p.op == t.op and len(p.vars) == len(t.vars) \
            and all(_bind(a, b, phi, used) for a, b in zip(p.vars, t.vars, strict=True)) \
            and unify(p.body, t.body, phi, used)
    if isinstance(p, Compare):
        return p.op == t.op and _affine(p.left, t.left, phi, used) and _affine(p.right, t.right, phi, used)
    return False


def cover_factors(pattern: list[Expr], factors: list[Expr], phi: Renaming, used: set[IndexVar],
                  taken: tuple[int, ...] = ()) -> tuple[Renaming, tuple[int, ...]] | None:
    """A renaming under which each of `pattern` is a distinct one of `factors` (backtracking), and which ones."""
    if not pattern:
        return phi, taken
    for k, f in enumerate(factors):
        trial, trial_used = dict(phi), set(used)
        if k in taken or not unify(pattern[0], f, trial, trial_used):
            continue
        found = cover_factors(pattern[1:], factors, trial, trial_used, (*taken, k))
        if found is not None:
            return found
    return None


def _read_one(term: Expr, node: Equation) -> Expr | None:
    """`term` reading `node`'s target where the term holds its computation (see the module's doc), or None."""
    if not isinstance(node.rhs, Reduce) or node.rhs.op != "sum":
        return None  # an elementwise output is cheaper made again than read (RMSNorm's Y = X·R1 would add a read)
    sum_vars, body = node.rhs.vars, node.rhs.body
    bound, term_body = (term.vars, term.body) if isinstance(term, Reduce) and term.op == "sum" else ((), term)
    pattern = signed_factors(body)
    if any(isinstance(f, Const) for f in pattern):
        return None  # a constant factor need not appear as one in the term
    pattern_vars = set().union(*(free_vars(f) for f in pattern))
    if not set(sum_vars) | set(node.lhs) <= pattern_vars or len(set(node.lhs)) < len(node.lhs):
        return None  # each variable fixed by the factors (else the sum counts, or the target broadcasts)
    factors = signed_factors(term_body)
    found = cover_factors(pattern, factors, {}, set())
    if found is None:
        return None
    phi, taken = found
    summed = {phi[v] for v in sum_vars}
    left = [f for k, f in enumerate(factors) if k not in taken]
    if not summed <= set(bound) or any(free_vars(f) & summed for f in left) \
            or summed & {phi[v] for v in node.lhs}:
        return None
    read = signed_product([*left, Load(node.target, tuple(phi[v] for v in node.lhs))])
    outer = tuple(v for v in bound if v not in summed)
    return Reduce("sum", outer, read) if outer else read


def read_outputs(term: Expr, outputs: list[Equation]) -> Expr:
    """`term` with the computations of the forward's `outputs` in it read from them, repeatedly."""
    changed = True
    while changed:
        changed = False
        for node in outputs:
            got = _read_one(term, node)
            if got is not None:
                term, changed = got, True
    return term
