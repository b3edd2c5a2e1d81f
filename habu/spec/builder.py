"""Collecting equation nodes into a `Model`: reads, writes, intermediates, obligations."""

from __future__ import annotations

from dataclasses import replace

from habu.spec.dtypes import WRITABLE_DTYPES
from habu.spec.ir import (
    MAX_NESTING,
    Compare,
    Equation,
    Expr,
    Gather,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    Obligation,
    Reduce,
    Size,
    TensorDecl,
    expr_size,
    gathers,
    index_subexprs,
    loads,
    map_ops,
    scatter_gathers,
    walk,
)
from habu.spec.lexer import Token
from habu.spec.program import Program

# Limits on one node's expression, so that every later stage (which walks expressions, some of them
# recursively) stays fast and within Python's recursion limit. An operator chain of 5,000 terms is
# accepted; `x^16^16^16` (a tree of 4,096 copies of x) is refused.
MAX_EXPR_NODES = 100_000  # nodes, a subexpression counted at each of its uses
MAX_EXPR_HEIGHT = 10_000  # the longest path from the root to a leaf: the length of an operator chain


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"about 10^{len(str(n)) - 1}"


class GraphBuilder:
    """Accumulates the nodes a model's words or equation produce."""

    def __init__(self, program: Program):
        self.program = program
        self.nodes: list[Equation] = []
        self.intermediates: dict[str, TensorDecl] = {}
        self.reads: dict[str, TensorDecl] = {}
        self.written: dict[str, TensorDecl] = {}
        self.obligations: list[Obligation] = []
        self._vars: dict[str, int] = {}

    # -- names
    def fresh_var(self, extent: str) -> IndexVar:
        """A program-wide fresh index variable (for definition-time placeholders)."""
        n = self._vars.get(extent, 0)
        self._vars[extent] = n + 1
        base = extent.lower()
        return IndexVar(base if n == 0 else f"{base}{n}", extent)

    def new_intermediate(self, extents: tuple[str, ...]) -> str:
        name = f"%{len(self.intermediates) + 1}"
        self.intermediates[name] = TensorDecl(name, extents, None)
        return name

    def oblige(self, ob: Obligation) -> None:
        if ob not in self.obligations:
            self.obligations.append(ob)

    # -- nodes
    def _declared(self, name: str) -> TensorDecl | None:
        dt = self.program.tensors.get(name)
        return dt.decl if dt else None

    def _register_reads(self, eq: Equation, tok: Token) -> None:
        names: list[str] = _tensors_in(eq.rhs)
        if eq.scatter is not None:  # a scatter adds to its target's prior contents
            names.extend([eq.target, *(g.tensor for g in scatter_gathers(eq))])
        for name in names:
            if name in self.intermediates:
                continue
            if name in self.written:
                raise tok.error(f"{name} is read after it is written in this model; "
                                "write the new value to another tensor")
            decl = self._declared(name)
            if decl is not None:
                self.reads.setdefault(name, decl)

    def check_writable(self, decl: TensorDecl, tok: Token) -> None:
        """Refuse to write a tensor whose element type no kernel can store."""
        if decl.dtype is not None and decl.dtype.name not in WRITABLE_DTYPES:
            raise tok.error(f"{decl.name} is {decl.dtype.name}, and kernels store only "
                            f"{', '.join(WRITABLE_DTYPES)}: declare the output as one of those")

    def check_size(self, eq: Equation, tok: Token) -> None:
        """Refuse an expression too large for the later stages (before anything walks it)."""
        size = expr_size(eq.rhs)
        if size.nodes > MAX_EXPR_NODES:
            raise tok.error(f"the expression defining {eq.target} has {_count(size.nodes)} nodes "
                            f"(at most {MAX_EXPR_NODES:,})", "split it into several equations or models")
        if size.height > MAX_EXPR_HEIGHT:
            raise tok.error(f"the expression defining {eq.target} is a chain of {size.height:,} operations "
                            f"(at most {MAX_EXPR_HEIGHT:,})", "split it into several equations")
        if size.nesting > MAX_NESTING:
            raise tok.error(f"the expression defining {eq.target} nests reductions and gathers "
                            f"{size.nesting} deep (at most {MAX_NESTING})")

    def add_node(self, eq: Equation, tok: Token) -> None:
        self.check_size(eq, tok)
        self._register_reads(eq, tok)
        self.nodes.append(eq)

    def store(self, decl: TensorDecl, eq: Equation, tok: Token) -> None:
        """A node that defines a declared tensor (an output of the model)."""
        if decl.name in self.written:
            raise tok.error(f"{decl.name} is written twice in this model")
        if decl.is_index:
            raise tok.error(f"{decl.name} is an index tensor; models read index tensors, never write them")
        self.check_writable(decl, tok)
        self.check_size(eq, tok)
        if eq.scatter is not None:
            self.check_scatter(decl, eq, tok)
        for ld in loads(eq.rhs):
            if ld.tensor == decl.name and ld.indices != eq.lhs:
                raise tok.error(f"{decl.name} is read at other elements than the ones being written "
                                "(an in-place update must read each element it writes, and no other)")
        self._register_reads(eq, tok)
        self.nodes.append(eq)
        self.written[decl.name] = decl

    def check_scatter(self, decl: TensorDecl, eq: Equation, tok: Token) -> None:
        """What a scatter store may be: an f32 target (duplicates accumulate with f32 atomicAdd) that
        its right side does not read."""
        if decl.dtype is not None and decl.dtype.name != "f32":
            raise tok.error(f"{decl.name} is {decl.dtype.name}, but a scatter store adds into its target with "
                            f"f32 atomicAdd (rule scatter-accumulates): declare {decl.name} f32",
                            "duplicate indices accumulate in any order; a 16-bit target would round at "
                            "every addition")
        if any(ld.tensor == decl.name for ld in loads(eq.rhs)):
            raise tok.error(f"the right side of a scatter into {decl.name} reads {decl.name}: which value it "
                            "sees would depend on the order the additions land in")

    def rename(self, old: str, new: str) -> None:
        """Give an intermediate the name of the declared output it turned out to be."""
        self.intermediates.pop(old)
        self.nodes = [_rename_eq(eq, old, new) for eq in self.nodes]

    # -- the model
    def finish(self, name: str, form: str, outputs: list[TensorDecl], words: tuple[str, ...] = ()) -> Model:
        out_names = {o.name for o in outputs}
        nodes = _fold_copies(_prune_dead(self.nodes, out_names), set(self.intermediates))
        live = {eq.target for eq in nodes}
        read_names: dict[str, None] = {}  # in order of first read
        for eq in nodes:
            for t in _tensors_in(eq.rhs):
                read_names.setdefault(t)
            if eq.scatter is not None:
                for t in (eq.target, *(g.tensor for g in scatter_gathers(eq))):
                    read_names.setdefault(t)
        inputs = tuple(self.reads[n] for n in read_names if n in self.reads)
        intermediates = tuple(d for n, d in self.intermediates.items() if n in live)
        used: dict[str, None] = {}  # in order of first use

        def use(ext: str) -> None:
            used.setdefault(ext)

        for t in (*inputs, *outputs, *intermediates):
            for e in t.extents:
                use(e)
            if t.range:
                use(t.range)
        for eq in nodes:
            for v in eq.lhs:
                use(v.extent)
            for e in walk(eq.rhs):
                if isinstance(e, Size):
                    use(e.extent)
                if isinstance(e, Compare):
                    for size_extent in e.extents():
                        use(size_extent)
                if isinstance(e, Reduce):
                    for v in e.vars:
                        use(v.extent)
        order = {name: k for k, name in enumerate(self.program.extents)}
        used_extents = sorted(used, key=lambda e: order.get(e, len(order)))
        extents = tuple(self.program.extents[e].extent for e in used_extents)
        obligations = list(self.obligations)
        for eq in nodes:
            for g in (*gathers(eq.rhs), *scatter_gathers(eq)):
                decl = self.reads.get(g.tensor) or self._declared(g.tensor)
                assert decl is not None and decl.range is not None
                ext = self.program.extents[decl.range].extent
                top = str(ext.size - 1) if ext.size is not None else f"#{ext.name}-1"
                ob = Obligation("index-range", f"every value of {g.tensor} is in 0..{top} "
                                f"(an index into #{decl.range}); checked at run time unless proven",
                                tensor=g.tensor, extent=decl.range)
                if ob not in obligations:
                    obligations.append(ob)
        for t in inputs:
            if t.grouped:
                obligations.append(Obligation(
                    "grouped", f"the values of {t.name} never decrease: the rows of #{t.extents[0]} come in "
                    f"#{t.range} groups, in order (a group may be empty); habu eval refuses other values (the "
                    "general family computes the equation for any values; kernels that tile by group need it)",
                    tensor=t.name, extent=t.range))
        for ext in extents:
            if not ext.is_static:
                obligations.append(Obligation("runtime-extent", f"{ext.describe()}", extent=ext.name))
        return Model(name, form, extents, inputs, tuple(outputs), intermediates, tuple(nodes),
                     tuple(obligations), words)


class VarNamer:
    """Index variables for one node: `b`, `h`, then `b2` for a second variable over #B."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def __call__(self, extent: str) -> IndexVar:
        n = self.count.get(extent, 0) + 1
        self.count[extent] = n
        base = extent.lower()
        return IndexVar(base if n == 1 else f"{base}{n}", extent)


def _tensors_in(expr: Expr) -> list[str]:
    out: list[str] = []
    for ld in loads(expr):
        if ld.tensor not in out:
            out.append(ld.tensor)
        for ix in ld.indices:
            for g in index_subexprs(ix):
                if isinstance(g, Gather) and g.tensor not in out:
                    out.append(g.tensor)
    for g in gathers(expr):  # and those of the conditions (`j < LEN[b]`)
        if g.tensor not in out:
            out.append(g.tensor)
    return out


def _fold_copies(nodes: list[Equation], intermediates: set[str]) -> list[Equation]:
    """`T[v] = %k[v]` where %k is read by nothing else: define T directly (no copy node)."""
    out = list(nodes)
    changed = True
    while changed:
        changed = False
        for i, eq in enumerate(out):
            rhs = eq.rhs
            if eq.scatter is not None or not (isinstance(rhs, Load) and rhs.tensor in intermediates
                                              and rhs.indices == eq.lhs):
                continue  # a scatter adds where it stores: it is no copy
            readers = [e for e in out if rhs.tensor in _tensors_in(e.rhs)]
            producer = next((j for j, e in enumerate(out) if e.target == rhs.tensor), None)
            if len(readers) != 1 or producer is None or eq.target in _tensors_in(out[producer].rhs):
                continue
            src = out[producer]
            renamed = _rename_eq(src, rhs.tensor, eq.target)
            out[producer] = renamed
            del out[i]
            changed = True
            break
    return out


def _prune_dead(nodes: list[Equation], outputs: set[str]) -> list[Equation]:
    needed = set(outputs)
    keep: list[Equation] = []
    for eq in reversed(nodes):
        if eq.target in needed:
            keep.append(eq)
            needed |= set(_tensors_in(eq.rhs))
    return list(reversed(keep))


def _rename_ix(ix: IndexExpr, old: str, new: str) -> IndexExpr:
    if isinstance(ix, Gather):
        return Gather(new if ix.tensor == old else ix.tensor, tuple(_rename_ix(i, old, new) for i in ix.indices))
    return ix


def _rename_expr(e: Expr, old: str, new: str) -> Expr:
    def leaf(x: Expr) -> Expr:
        if isinstance(x, Load):
            return Load(new if x.tensor == old else x.tensor, tuple(_rename_ix(i, old, new) for i in x.indices))
        if isinstance(x, Reduce):
            return Reduce(x.op, x.vars, _rename_expr(x.body, old, new))
        if isinstance(x, Compare):
            return x.map_indices(lambda i: _rename_ix(i, old, new))
        return x

    return map_ops(e, leaf)


def _rename_eq(eq: Equation, old: str, new: str) -> Equation:
    return replace(eq, target=new if eq.target == old else eq.target, rhs=_rename_expr(eq.rhs, old, new))
