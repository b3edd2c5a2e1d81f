"""Reverse-mode differentiation on the canonical IR: the backward model of a model.

`derive(model, wrt, policy)` walks the forward nodes in reverse and, in each right side, every path
from the root to a read of a tensor that needs a gradient, multiplying the upstream gradient by each
operation's derivative rule (`habu.spec.functions`): a user's `WORD:` is already expanded into
equation nodes, so it is differentiated through its equations. The rules for the structure:

- `Σ v body`: the gradient of the body is the upstream gradient broadcast along v;
- `max v body`: the upstream gradient times the arg-max indicator `1 − step(R − body)` (R the
  maximum), divided by the number of elements equal to R: tied elements share it evenly, as
  `torch.amax` does (its sum over v is the upstream gradient, a subgradient);
- a read `S[i j]` contributes to `dS[i j]`, summed over every other variable in scope; a read through
  a size-1 broadcast `S[0 j]` sums over the broadcast extent too; a read through a gather
  `A[IX[m] k]` makes a scatter `dA[IX[m] k] += ...` (duplicate indices accumulate), so dA is an input
  of the backward model as well (its prior contents, zeros for a plain gradient);
- a scatter `Y[IX[r] n] += e` sees the upstream gradient gathered, `dY[IX[r] n]`, and passes dY
  through unchanged to Y's prior contents.

Before differentiating, every reduction whose value depends on fewer indices than its node (a row
statistic: RMSNorm's `rsqrt(Σ x²/#d + ε)`, softmax's maximum and sum) is hoisted into a node of its
own (`hoist_statistics`), so that it is a forward value the backward can save. A statistic whose adjoint
is identically zero (softmax's maximum: the output is shift-invariant) is found so over GF(p)
(`habu.spec.grad_zero`) and nothing flows through it. Which forward values
are saved (inputs of the backward model, extra outputs of `Backward.forward`) and which are recomputed
(nodes of the backward model) is `SavePolicy` (habu/spec/grad_save.py); see its docstring for the plan-space dimension.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from habu.errors import HabuError
from habu.spec.dtypes import WRITABLE_DTYPES, dtype_named
from habu.spec.equation import format_expr, format_index
from habu.spec.functions import FUNCTIONS
from habu.spec.grad_algebra import ONE, Fresh, add_all, is_const, mul, substitute
from habu.spec.grad_cover import read_elementwise_products
from habu.spec.grad_factor import factor_sum, merge_terms
from habu.spec.grad_hoist import hoist_statistics
from habu.spec.grad_indicators import drop_repeated_indicators
from habu.spec.grad_model import (
    assemble_model,
    reads_in_order,
    rename_tensors,
    saved_dtype,
    with_saved_outputs,
)
from habu.spec.grad_reuse import read_outputs
from habu.spec.grad_save import SavePolicy, contraction_operands
from habu.spec.ir import (
    Equation,
    Expr,
    Gather,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    TensorDecl,
    fold_ops,
    index_subexprs,
    map_ops,
    node_reads,
    tensors_read,
    walk,
)

# hoist the reductions an enclosing sum does not move out of the backward's sums, one node a computation across its
# gradients (`hoist_statistics(invariant=True)`, session 60), after factoring each gradient's terms (`factor_sum`,
# `merge_terms`, session 62); False derives the earlier form, neither done (tests that need it)
HOIST_INVARIANTS = True


class NotDifferentiable(HabuError):
    """A gradient flows through a function with no derivative rule (`function` names it)."""

    def __init__(self, message: str, function: str):
        super().__init__(message)
        self.function = function


@dataclass(frozen=True)
class Backward:
    """A derived backward model and how it connects to its forward model."""

    forward: Model  # the forward model with its row statistics hoisted and the saved values as outputs
    model: Model  # the backward model: gradients from forward inputs, saved values and output gradients
    gradients: tuple[tuple[str, str], ...]  # (forward input, its gradient in `model`)
    cotangents: tuple[tuple[str, str], ...]  # (forward output, the gradient of the loss by it: an input)
    saved: tuple[tuple[str, str], ...]  # (forward intermediate, its name as a saved value)
    accumulated: tuple[str, ...]  # gradients that are also inputs (scatter targets): pass zeros
    choices: tuple[str, ...]  # the forward intermediates the backward reads: save or recompute each
    policy: SavePolicy = field(default_factory=SavePolicy)


# ----------------------------------------------------------------------------- the derivation


@dataclass
class Contribution:
    """`adjoint` (an expression over `scope`) flows into the element `indices` of a tensor."""

    indices: tuple[IndexExpr, ...]
    adjoint: Expr
    scope: tuple[IndexVar, ...]


def _unique(base: str, taken: set[str]) -> str:
    name = base
    while name in taken or name.lower() in FUNCTIONS:
        name += "_"
    taken.add(name)
    return name


def _grad_dtype(decl: TensorDecl):
    if decl.dtype is not None and decl.dtype.name in WRITABLE_DTYPES:
        return decl.dtype
    return dtype_named("f32")


def differentiable_inputs(model: Model) -> tuple[str, ...]:
    return tuple(t.name for t in model.inputs if not t.is_index)


def derive(model: Model, wrt: Iterable[str] | None = None, policy: SavePolicy | None = None) -> Backward:
    """The backward model of `model` for the inputs `wrt` (default: every input that is not an index
    tensor). Raises HabuError for an index tensor in `wrt`, an unknown name, or a gradient through a
    function without a derivative rule (`NotDifferentiable`)."""
    policy = policy or SavePolicy()
    names = list(wrt) if wrt is not None else list(differentiable_inputs(model))
    inputs = {t.name: t for t in model.inputs}
    for n in names:
        if n not in inputs:
            known = ", ".join(differentiable_inputs(model)) or "none"
            raise HabuError(f"{model.name} has no input {n} to differentiate by (its inputs: {known})")
        if inputs[n].is_index:
            raise HabuError(f"{n} is an index tensor (ITENSOR): its values select elements, and {model.name} "
                            "has no gradient by it")
    fwd = hoist_statistics(model)
    return _Deriver(fwd, tuple(names), policy).run()


class _Deriver:
    def __init__(self, fwd: Model, wrt: tuple[str, ...], policy: SavePolicy):
        self.fwd = fwd
        self.wrt = wrt
        self.policy = policy
        self.fresh = Fresh()
        self.taken = {t.name for t in (*fwd.inputs, *fwd.outputs)}
        self.out_names = {t.name for t in fwd.outputs}
        self.contrib: dict[str, list[Contribution]] = {}  # keyed by forward tensor ("in:" for an input)
        self.nodes: list[Equation] = []
        self.inter: dict[str, TensorDecl] = {}
        self.decls: dict[str, TensorDecl] = {}  # the backward model's declared tensors, by name
        self.accumulated: list[str] = []
        self.active = self._active()
        inputs = {t.name for t in fwd.inputs}  # outputs a term may read (an in-place one's value is not its own)
        self.output_nodes = [eq for eq in fwd.nodes if eq.target in self.out_names and eq.scatter is None
                             and eq.target not in inputs]

    def _active(self) -> set[str]:
        """The tensors whose value depends on an input in `wrt` (their gradients are needed)."""
        act = {f"in:{n}" for n in self.wrt}
        for eq in self.fwd.nodes:
            reads = {self._key(t) for t in node_reads(eq)}
            if reads & act:
                act.add(eq.target)
        return act

    def _key(self, tensor: str) -> str:
        """How a read of `tensor` is keyed: inputs (also in-place ones, read before they are written)
        as "in:NAME", intermediates by name."""
        return f"in:{tensor}" if any(t.name == tensor for t in self.fwd.inputs) else tensor

    # -- the walk
    def run(self) -> Backward:
        cot: dict[str, str] = {}
        for o in self.fwd.outputs:
            cot[o.name] = _unique(f"d{o.name}", self.taken)
            self.decls[cot[o.name]] = TensorDecl(cot[o.name], o.extents, o.dtype)
        self.cotangents = cot
        adjoint: dict[str, str] = {}
        for eq in reversed(self.fwd.nodes):
            if eq.target in self.out_names:
                adj = cot[eq.target]
            else:
                if eq.target not in self.contrib:
                    continue  # no output's gradient depends on it
                kept = len(self.nodes)
                adj = self._emit_intermediate(eq.target)
                if self._vanishes(eq.target, adj, kept):
                    continue
            adjoint[eq.target] = adj
            if eq.target not in self.active:
                continue
            upstream = Load(adj, eq.store_indices)
            if eq.scatter is not None:  # the prior contents pass through
                self._identity(eq.target, adj)
            self.node = eq
            self._walk(eq.rhs, upstream, tuple(eq.lhs))
        grads: list[tuple[str, str]] = []
        for n in self.wrt:
            grads.append((n, self._emit_gradient(n)))
        self._inline_row_statistics()
        return self._finish(tuple(grads), tuple(cot.items()))

    def _inline_row_statistics(self) -> None:
        """A row statistic's adjoint (RMSNorm's `dQ[r] = Σ d dY·X`, softmax's `Σ c dY·y`) read by one
        elementwise node only is substituted into it, as the forward's `X · rsqrt(Σ d X² …)` is one node:
        the row kernel then computes the Σ and the row's elements in one kernel (one pass over dY and X,
        then the row again from its cache), where two nodes were two kernels, the second re-reading the
        rows."""
        for eq in list(self.nodes):
            statistic = eq.target.startswith("%ds")  # the adjoint of a hoisted statistic %s<n>
            if not statistic or eq.target not in self.inter or not isinstance(eq.rhs, Reduce):
                continue
            readers = [n for n in self.nodes if n is not eq and eq.target in tensors_read(n.rhs)]
            if len(readers) != 1:
                continue
            reader = readers[0]
            if reader.scatter is not None or any(isinstance(x, Reduce) for x in walk(reader.rhs)) \
                    or len(reader.lhs) <= len(eq.lhs):
                continue

            def leaf(x: Expr, eq: Equation = eq) -> Expr:
                if isinstance(x, Load) and x.tensor == eq.target:
                    return substitute(eq.rhs, dict(zip(eq.lhs, x.indices, strict=True)), self.fresh)
                return x

            self.nodes[self.nodes.index(reader)] = replace(reader, rhs=map_ops(reader.rhs, leaf))
            self.nodes.remove(eq)
            del self.inter[eq.target]

    def _vanishes(self, target: str, adj: str, kept: int) -> bool:
        """Whether the adjoint of the row statistic `target` is identically zero (softmax's maximum: see
        habu/spec/grad_zero.py); if so its nodes are dropped and nothing flows through it."""
        if not target.startswith("%s") or adj not in self.inter or len(self.nodes) == kept:
            return False
        from habu.spec.grad_zero import vanishes

        cot = tuple(self.decls[c] for c in self.cotangents.values())
        if not vanishes(self.fwd, cot, self.nodes, self.inter, adj):
            return False
        for eq in self.nodes[kept:]:
            self.inter.pop(eq.target, None)
        del self.nodes[kept:]
        return True

    def _identity(self, tensor: str, adj: str) -> None:
        if f"in:{tensor}" not in self.active:
            return
        decl = self.fwd.tensor(tensor)
        vars_ = tuple(self.fresh(e) for e in decl.extents)
        self.contrib.setdefault(f"in:{tensor}", []).append(Contribution(vars_, Load(adj, vars_), vars_))

    def _walk(self, rhs: Expr, upstream: Expr, scope: tuple[IndexVar, ...]) -> None:
        stack: list[tuple[Expr, Expr, tuple[IndexVar, ...]]] = [(rhs, upstream, scope)]
        while stack:
            e, adj, sc = stack.pop()
            if is_const(adj, 0):
                continue
            if isinstance(e, Load):
                key = self._key(e.tensor)
                if key in self.active:
                    self.contrib.setdefault(key, []).append(Contribution(e.indices, adj, sc))
                continue
            if isinstance(e, Reduce):
                if not self._depends(e.body):
                    continue
                if e.op == "sum":
                    stack.append((e.body, adj, sc + e.vars))
                else:
                    stack.append((e.body, mul(adj, self._own_value(self._argmax_weight(e))), sc + e.vars))
                continue
            if isinstance(e, Op):
                fn = FUNCTIONS[e.fn]
                for i, a in enumerate(e.args):
                    if not self._depends(a):
                        continue
                    if fn.derivative is None:
                        raise NotDifferentiable(f"{e.fn} has no derivative, and the gradient flows through "
                                                f"{format_expr(e)}", e.fn)
                    stack.append((a, mul(adj, self._own_value(fn.derivative(e.args, i))), sc))

    def _own_value(self, e: Expr) -> Expr:
        """`e` with the right side of the node being differentiated read from its target instead (the
        derivative of RMSNorm's `rsqrt(z)` reads the saved rstd; of a max, the saved maximum). Only for
        intermediates: the backward does not read the forward's outputs."""
        eq = self.node
        if eq.scatter is not None or eq.target in self.out_names or not any(x == eq.rhs for x in walk(e)):
            return e
        value = Load(eq.target, eq.lhs)

        def op(o: Op, args: list[Expr]) -> Expr:
            rebuilt = Op(o.fn, tuple(args))
            return value if rebuilt == eq.rhs else rebuilt

        def leaf(x: Expr) -> Expr:
            return value if x == eq.rhs else x

        return fold_ops(e, leaf, op)

    def _depends(self, e: Expr) -> bool:
        return any(self._key(t) in self.active for t in tensors_read(e))

    def _argmax_weight(self, r: Reduce) -> Expr:
        """The share of a max reduction's gradient an element of its body gets: 1 where it equals the
        maximum, divided by how many do (ties share evenly)."""
        own = r == self.node.rhs and self.node.scatter is None and self.node.target not in self.out_names
        maximum = Load(self.node.target, self.node.lhs) if own else substitute(r, {}, self.fresh)
        hit = Op("sub", (ONE, Op("step", (Op("sub", (maximum, r.body)),))))
        other = tuple(self.fresh(v.extent) for v in r.vars)
        count = Reduce("sum", other, substitute(hit, dict(zip(r.vars, other, strict=True)), self.fresh))
        return Op("div", (hit, count))

    # -- gradients as equations
    def _terms(self, tensor: str, extents: tuple[str, ...], lhs: tuple[IndexVar, ...],
               contribs: list[Contribution]) -> list[Expr]:
        terms = []
        for c in contribs:
            mapping: dict[IndexVar, IndexExpr] = {}
            for pos, ix in enumerate(c.indices):
                if isinstance(ix, IndexVar) and ix not in mapping:
                    mapping[ix] = lhs[pos]
                elif isinstance(ix, IndexConst) and self.fwd.extent(extents[pos]).size == 1:
                    continue
                else:
                    read = format_expr(Load(tensor, c.indices))
                    why = "a repeated index" if isinstance(ix, IndexVar) else "a fixed or computed index"
                    raise HabuError(f"cannot differentiate {self.fwd.name}: {tensor} is read as {read}, at "
                                    f"{why} ({format_index(ix)}), which has no gradient rule yet")
            rest = tuple(v for v in c.scope if v not in mapping)
            bound = tuple(self.fresh(v.extent) for v in rest)
            mapping |= dict(zip(rest, bound, strict=True))
            body = substitute(c.adjoint, mapping, self.fresh)
            term = read_outputs(Reduce("sum", bound, body) if bound else body, self.output_nodes)
            terms.append(factor_sum(term, self._hi) if HOIST_INVARIANTS else term)
        return merge_terms(terms) if HOIST_INVARIANTS else terms

    def _hi(self, v: IndexVar) -> int:
        return self.fwd.extent(v.extent).hi

    def _own_reductions(self, target: str, extents: tuple[str, ...], lhs: tuple[IndexVar, ...],
                        terms: list[Expr]) -> list[Expr]:
        """`terms` with each Σ among them computed by a node of its own (an f32 intermediate `%r<n><target>`)
        and read back, where that gives the planner kernels it has: a sum of a contraction and other terms
        (FFN's `dX = dT6 + Σ h dT2·W1`) is otherwise one general kernel (a thread per element, each looping
        over h), split it is a contraction whose epilogue adds the rest; and a Σ storing into a size-1
        broadcast extent it does not depend on (a bias's `dB[one h] = Σ b dT[b h]`) is otherwise a general
        kernel too, split it is a column reduction and a copy."""
        broadcast = [pos for pos, e in enumerate(extents) if self.fwd.extent(e).size == 1]
        mixed = any(not isinstance(t, Reduce) for t in terms)  # a sum of reductions alone stays one node
        out: list[Expr] = []
        for t in terms:
            if not isinstance(t, Reduce) or (not mixed and not broadcast):
                out.append(t)
                continue
            used = {v for x in walk(t) if isinstance(x, Load) for i in x.indices for v in index_subexprs(i)
                    if isinstance(v, IndexVar)}
            keep = tuple(pos for pos, v in enumerate(lhs) if pos not in broadcast or v in used)
            if len(keep) == len(lhs) and not mixed:
                out.append(t)
                continue
            name = _unique(f"%r{target.lstrip('%')}", self.taken)
            idx = tuple(lhs[pos] for pos in keep)
            self.nodes.append(Equation(name, idx, t))
            self.inter[name] = TensorDecl(name, tuple(extents[pos] for pos in keep), None)
            out.append(Load(name, idx))
        return out

    def _emit_intermediate(self, name: str) -> str:
        decl = self.fwd.tensor(name)
        adj = f"%d{name.lstrip('%')}"
        lhs = tuple(self.fresh(e) for e in decl.extents)
        contribs = self.contrib.pop(name)
        if any(isinstance(i, Gather) for c in contribs for i in c.indices):
            raise HabuError(f"cannot differentiate {self.fwd.name}: an intermediate is read through a gather")
        rhs = add_all(self._own_reductions(adj, decl.extents, lhs, self._terms(name, decl.extents, lhs, contribs)))
        if isinstance(rhs, Load) and rhs.indices == lhs:
            return rhs.tensor  # the gradient of a copy (or of an addition's term) is the same tensor
        self.nodes.append(Equation(adj, lhs, rhs))
        self.inter[adj] = TensorDecl(adj, decl.extents, None)
        return adj

    def _emit_gradient(self, name: str) -> str:
        decl = self.fwd.tensor(name)
        base = f"d{name}" + ("_in" if name in self.out_names else "")
        grad = _unique(base, self.taken)
        contribs = self.contrib.pop(f"in:{name}", [])
        gathered = [c for c in contribs if any(isinstance(i, Gather) for i in c.indices)]
        if not gathered:
            lhs = tuple(self.fresh(e) for e in decl.extents)
            self.decls[grad] = TensorDecl(grad, decl.extents, _grad_dtype(decl))
            terms = self._own_reductions(grad, decl.extents, lhs, self._terms(name, decl.extents, lhs, contribs))
            self.nodes.append(Equation(grad, lhs, add_all(terms)))
            return grad
        if len(gathered) < len(contribs):
            plain = next(c for c in contribs if c not in gathered)
            raise HabuError(f"cannot differentiate {self.fwd.name} by {name}: {name} is read through a gather "
                            f"({_read_text(name, gathered[0])}) and directly ({_read_text(name, plain)}); its "
                            "gradient would be a scatter-add into a tensor another node writes, which a model "
                            "cannot express yet")
        store, domain = self._scatter_store(name, gathered[0])
        terms = []
        for c in gathered:  # several reads through the same gather (MoE's X[IX[r] d] in gate and up) add
            if _store_pattern(c) != _store_pattern(gathered[0]):
                raise HabuError(f"cannot differentiate {self.fwd.name} by {name}: {name} is read through "
                                f"different gathers ({_read_text(name, gathered[0])} and {_read_text(name, c)}), "
                                "and a gradient scattered through several index maps is not supported yet")
            if c is not gathered[0]:
                self._scatter_store(name, c)  # each variable once, as the first read's
            mapping: dict[IndexVar, IndexExpr] = {}
            for ix, v in zip(c.indices, domain, strict=True):
                mapping[ix.indices[0] if isinstance(ix, Gather) else ix] = v  # type: ignore[index]
            rest = tuple(v for v in c.scope if v not in mapping)
            bound = tuple(self.fresh(v.extent) for v in rest)
            mapping |= dict(zip(rest, bound, strict=True))
            body = substitute(c.adjoint, mapping, self.fresh)
            terms.append(Reduce("sum", bound, body) if bound else body)
        self.decls[grad] = TensorDecl(grad, decl.extents, dtype_named("f32"))
        self.nodes.append(Equation(grad, tuple(domain), add_all(terms), scatter=tuple(store)))
        self.accumulated.append(grad)
        return grad

    def _scatter_store(self, name: str, c: Contribution) -> tuple[list[IndexExpr], list[IndexVar]]:
        """The stored element and the domain of the scatter-add a read through a gather makes: each
        position a gather of one variable, or a variable, each variable once."""
        store: list[IndexExpr] = []
        domain: list[IndexVar] = []
        seen: set[IndexVar] = set()
        for ix in c.indices:
            if isinstance(ix, Gather) and len(ix.indices) == 1 and isinstance(ix.indices[0], IndexVar) \
                    and ix.indices[0] not in seen:
                seen.add(ix.indices[0])
                v = self.fresh(ix.indices[0].extent)
                store.append(Gather(ix.tensor, (v,)))
                domain.append(v)
            elif isinstance(ix, IndexVar) and ix not in seen:
                seen.add(ix)
                v = self.fresh(ix.extent)
                store.append(v)
                domain.append(v)
            else:
                read = format_expr(Load(name, c.indices))
                raise HabuError(f"cannot differentiate {self.fwd.name} by {name}: its read {read} has an index a "
                                f"scatter cannot store through ({format_index(ix)}: a gather of a gather, a constant "
                                "or a repeated index)")
        return store, domain

    # -- saved and recomputed forward values
    def _finish(self, grads: tuple[tuple[str, str], ...], cot: tuple[tuple[str, str], ...]) -> Backward:
        producers = {eq.target: eq for eq in self.fwd.nodes}
        fwd_inter = {t.name for t in self.fwd.intermediates}
        choices: list[str] = []
        saved: dict[str, str] = {}
        recomputed: set[str] = set()
        stored = contraction_operands(self.fwd)
        pending = [t for eq in reversed(self.nodes) for t in reversed(reads_in_order(eq)) if t in fwd_inter]
        while pending:
            t = pending.pop()
            if t in saved or t in recomputed:
                continue
            choices.append(t)
            if self.policy.saves(t, producers[t], stored):
                saved[t] = _unique(("R" + t[2:]) if t.startswith("%s") else f"S{t.lstrip('%')}", self.taken)
            else:
                recomputed.add(t)
                pending.extend(r for r in reversed(reads_in_order(producers[t])) if r in fwd_inter)
        read = {t for eq in self.nodes for t in tensors_read(eq.rhs)}
        saved |= {eq.target: eq.target for eq in self.output_nodes if eq.target in read}  # (habu.spec.grad_reuse)
        order = {eq.target: i for i, eq in enumerate(self.fwd.nodes)}  # in the forward's order, whatever the
        saved = dict(sorted(saved.items(), key=lambda kv: order[kv[0]]))  # order the reads were met in
        renames = dict(saved)
        recompute_nodes = [rename_tensors(eq, renames) for eq in self.fwd.nodes if eq.target in recomputed]
        nodes = recompute_nodes + [rename_tensors(replace(eq, rhs=drop_repeated_indicators(eq.rhs)), renames)
                                   for eq in self.nodes]  # (attention's dS: its mask's indicator twice)
        for name, s in saved.items():  # a saved matrix in the forward's activation type (as its storage), a statistic f32
            self.decls[s] = self.fwd.tensor(name) if name in self.out_names else \
                TensorDecl(s, self.fwd.tensor(name).extents, dtype_named(saved_dtype(self.fwd, name)))
        for t in self.fwd.inputs:
            self.decls.setdefault(t.name, t)
        model = assemble_model(self.fwd, f"{self.fwd.name}-GRAD", nodes, self.decls,
                          {t for t in self.fwd.intermediates if t.name in recomputed} | set(self.inter.values()),
                          [g for _, g in grads])
        # a statistic the backward recomputes that is no row's (a column's maximum and its ties, for the
        # arg-max indicator of COL-MAX's `max r`) is computed once, in a node of its own, not per element
        model = hoist_statistics(model, _unique("%h", self.taken), keep_row_statistics=True,
                                 invariant=HOIST_INVARIANTS)
        if HOIST_INVARIANTS:  # attention's dS = P ⊙ (dP − D) reads P (habu/spec/grad_cover.py)
            model = read_elementwise_products(model)
        forward = with_saved_outputs(self.fwd, saved)
        if HOIST_INVARIANTS:  # a computation the saved statistics and the output share, one node (attention's scores)
            forward = hoist_statistics(forward, _unique("%f", self.taken), keep_row_statistics=True, invariant=True)
        return Backward(forward, model, grads, cot, tuple(saved.items()), tuple(self.accumulated),
                        tuple(sorted(choices)), self.policy)


def _store_pattern(c: Contribution) -> tuple[tuple[str, str], ...]:
    """How a gathered read indexes its tensor, position by position: (index tensor, extent) of a
    gather, ("", extent) of a variable; reads with the same pattern scatter into the same elements."""
    return tuple((ix.tensor, ix.indices[0].extent) if isinstance(ix, Gather) and len(ix.indices) == 1
                 and isinstance(ix.indices[0], IndexVar) else ("", getattr(ix, "extent", repr(ix)))
                 for ix in c.indices)


def _read_text(tensor: str, c: Contribution) -> str:
    return format_expr(Load(tensor, c.indices))
