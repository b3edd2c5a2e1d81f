"""Any model run as torch eager ops, equation by equation: what an expert writes in torch for it
(RMSNorm + Linear, softmax, an FFN block), the baseline the search quotes for models that are not one
contraction.

Each equation becomes torch operations over tensors whose dimensions are named by the equation's
index variables. An expression that is one of the library's words runs as the word's expert call
(`F.rms_norm`, `torch.softmax`, `F.gelu`: `habu.timing.experts`); the rest is built from parts:
loads (gathers by `index_select` or advanced indexing), elementwise functions (in the 16-bit type
their tensor operands share, else float32), reductions (`sum`, `amax`), and sums of products as one
`einsum`, which torch hands to cuBLAS when the factors are 16-bit. Every result is stored at its
tensor's declared dtype, as the model says, so a bf16 intermediate is rounded where the model rounds
it.

`python -m habu.bench.eager_speed` times this runner against hand-written torch for every example.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habu.spec.evaluate import Labelled, _factors, _union
from habu.spec.ir import (
    Const,
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
    Size,
)
from habu.timing.experts import EXPERT_CALLS, Match, expert_call, find
from habu.timing.harness import TORCH_DTYPE


def _functions(torch: Any) -> dict[str, Callable[..., Any]]:
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
            "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
            "erf": torch.erf, "sigmoid": torch.sigmoid, "abs": torch.abs, "max": torch.maximum,
            "min": torch.minimum, "step": lambda x: (x > 0).to(x.dtype)}


def _align(x: Labelled, names: tuple[IndexVar, ...]) -> Any:
    """x's data with its dimensions in `names` order (size 1 where x does not vary)."""
    order = [x.labels.index(v) for v in names if v in x.labels]
    data = x.data.permute(*order) if order != list(range(len(order))) else x.data
    shape, it = [], iter(data.shape)
    for v in names:
        shape.append(next(it) if v in x.labels else 1)
    return data.reshape(shape)


class TorchEager:
    """`TorchEager(model, sizes)(inputs)`: the model's outputs, by name, computed with torch."""

    def __init__(self, model: Model, sizes: dict[str, int]):
        import torch

        self.torch, self.model, self.sizes = torch, model, dict(sizes)
        self.fns = _functions(torch)
        self.constants: dict[tuple[float, str], Any] = {}
        self.matches: dict[int, Match | None] = {}  # by id: the model's expressions live as long as it

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        self.env = dict(inputs)
        for eq in self.model.nodes:
            self.env[eq.target] = self.node(eq)
        return {t.name: self.env[t.name] for t in self.model.outputs}

    def dtype(self, tensor: str) -> Any:
        """The declared dtype; an intermediate without one is stored as a plan stores it (the
        inputs' 16-bit type): left in f32, RMSNorm's normalised rows made the next matmul an
        fp32 GEMM, 1.6 ms against 0.2 ms for 2048 x 4096 x 4096 on the H200."""
        from habu.plan.storage import dtype_of

        return getattr(self.torch, TORCH_DTYPE[dtype_of(self.model, tensor)])

    def node(self, eq: Equation) -> Any:
        if eq.scatter is not None:  # Y[IX[r] n] += ...: what an expert writes, index_put_ accumulating
            domain = tuple(self.sizes[v.extent] for v in eq.lhs)
            target = self.env[eq.target]
            val = _align(self.expr(eq.rhs), eq.lhs).to(target.dtype).expand(domain)
            idx = tuple(_align(self.index(ix), eq.lhs).expand(domain) for ix in eq.scatter)
            return target.index_put_(idx, val, accumulate=True)
        val = self.expr(eq.rhs)
        full = tuple(self.sizes[v.extent] for v in eq.lhs)
        return _align(val, eq.lhs).to(self.dtype(eq.target)).expand(full).contiguous()

    def index(self, ix: IndexExpr) -> Labelled:
        t = self.torch
        if isinstance(ix, IndexVar):
            return Labelled(t.arange(self.sizes[ix.extent], device=self._device()), (ix,))
        if isinstance(ix, IndexConst):
            return Labelled(t.zeros((), dtype=t.int64, device=self._device()) + ix.value, ())
        subs = [self.index(i) for i in ix.indices]
        names = _union(*(s.labels for s in subs))
        idx = tuple(_align(s, names).long() for s in subs)
        table = self.env[ix.tensor]
        return Labelled(table[idx].long() if idx else table.long(), names)

    def scalar(self, value: float) -> Any:
        """A float32 constant on the device, made once: a host-to-device copy on every call would
        wait for the GPU's queue, and the timer's events would count the CPU's time after it."""
        key = (value, str(self._device()))
        if key not in self.constants:
            self.constants[key] = self.torch.tensor(value, dtype=self.torch.float32, device=self._device())
        return self.constants[key]

    def _device(self) -> Any:
        return next(iter(v for v in self.env.values() if hasattr(v, "device"))).device

    def load(self, e: Load) -> Labelled:
        data = self.env[e.tensor]
        if all(isinstance(i, IndexVar) for i in e.indices) and len(set(e.indices)) == len(e.indices):
            return Labelled(data, tuple(e.indices))  # type: ignore[arg-type]
        plain = [i for i in e.indices if isinstance(i, IndexVar)]
        if all(isinstance(i, (IndexVar, IndexConst)) for i in e.indices) and len(set(plain)) == len(plain):
            # constant positions (a bias row B[0 h]) select a view: no index kernels, as an expert
            # writes `x + b` (as a gather, each call ran an arange, a fill and an indexing kernel)
            view = data[tuple(i.value if isinstance(i, IndexConst) else slice(None) for i in e.indices)]
            return Labelled(view, tuple(plain))
        gathers = [p for p, i in enumerate(e.indices) if isinstance(i, Gather)]
        if len(gathers) == 1 and all(isinstance(i, IndexVar) or p in gathers for p, i in enumerate(e.indices)):
            p = gathers[0]
            g = e.indices[p]
            assert isinstance(g, Gather)
            rows = self.index(g)
            plain = [i for i in e.indices if isinstance(i, IndexVar)]
            if len(rows.labels) == 1 and rows.labels[0] not in plain and len(set(plain)) == len(plain):
                picked = data.index_select(p, rows.data.reshape(-1))  # one gather kernel, like torch users write
                names = tuple(rows.labels[0] if q == p else i for q, i in enumerate(e.indices))
                return Labelled(picked, names)  # type: ignore[arg-type]
        subs = [self.index(i) for i in e.indices]
        names = _union(*(s.labels for s in subs))
        return Labelled(data[tuple(_align(s, names) for s in subs)], names)

    def expr(self, e: Expr) -> Labelled:
        if isinstance(e, Const):
            return Labelled(self.scalar(float(e.value)), ())
        if isinstance(e, Size):
            return Labelled(self.scalar(float(self.sizes[e.extent])), ())
        if isinstance(e, Load):
            return self.load(e)
        if id(e) not in self.matches:
            self.matches[id(e)] = find(e) if isinstance(e, (Op, Reduce)) else None
        match = self.matches[id(e)]
        if match is not None:
            return self.expert(match)
        if isinstance(e, Op):
            args = [self.expr(a) for a in e.args]
            names = _union(*(a.labels for a in args))
            common = self.elementwise_dtype(args)
            return Labelled(self.fns[e.fn](*[_align(a, names).to(common) for a in args]), names)
        assert isinstance(e, Reduce)
        return self.reduction(e)

    def elementwise_dtype(self, args: list[Labelled]) -> Any:
        """The type an elementwise op runs in: the 16-bit type its tensor operands share (a bias add
        on a bf16 matmul result is one bf16 kernel in an expert's code: `x @ w + b`), else float32.
        Scalars (the model's constants, 0-dimensional) do not count: torch keeps the tensor's type.
        Upcasting every operand ran FFN-SKIP's bias and residual adds as cast and f32 kernels, and
        its baseline took 1.75x the hand-written torch (H200, 2026-11-30)."""
        t = self.torch
        kinds = {a.data.dtype for a in args if a.data.dim() > 0}
        if len(kinds) == 1 and (k := kinds.pop()) in (t.bfloat16, t.float16):
            return k
        return t.float32

    def expert(self, match: Match) -> Labelled:
        data, labels = expert_call(match, {k: self.expr(v) for k, v in match.wild.items()}, self.torch)
        return Labelled(data, labels)

    def reduction(self, e: Reduce) -> Labelled:
        if e.op == "sum" and len(_factors(e.body)) > 1:
            return self.contraction(e, _factors(e.body))
        return self._reduce(e.op, e.vars, self.expr(e.body))

    def _reduce(self, op: str, over: tuple[IndexVar, ...], body: Labelled) -> Labelled:
        dims = [body.labels.index(v) for v in over if v in body.labels]
        data = body.data.float()
        if dims:
            data = data.sum(dim=dims) if op == "sum" else data.amax(dim=dims)
        count = self._absent(over, [body])
        if count > 1 and op == "sum":
            data = data * count
        return Labelled(data, tuple(v for v in body.labels if v not in over))

    def _absent(self, over: tuple[IndexVar, ...], vals: list[Labelled]) -> int:
        """How many terms a sum over `over` adds that no value varies along (a repeated term)."""
        count = 1
        for v in over:
            if not any(v in x.labels for x in vals):
                count *= self.sizes[v.extent]
        return count

    def contraction(self, e: Reduce, factors: list[Expr]) -> Labelled:
        t = self.torch
        vals = [self.expr(f) for f in factors]
        names = _union(*(x.labels for x in vals))
        out = tuple(v for v in names if v not in e.vars)
        if all(all(v in x.labels for x in vals) for v in out):
            # no output dimension belongs to one factor alone (Σ d x·x per row): not a matrix
            # product; einsum would run it as a batch of 1 x 1 matmuls (2 ms for 2048 x 4096)
            prod = _align(vals[0], names).float()
            for x in vals[1:]:
                prod = prod * _align(x, names).float()
            return self._reduce("sum", e.vars, Labelled(prod, names))
        letters = {v: chr(ord("a") + i) for i, v in enumerate(_union(names, e.vars))}
        spec = ",".join("".join(letters[v] for v in x.labels) for x in vals) + "->" + "".join(letters[v] for v in out)
        dtypes = {x.data.dtype for x in vals}
        # 16-bit factors of one dtype go to cuBLAS as they are (fp32 accumulation); otherwise fp32
        common = dtypes.pop() if len(dtypes) == 1 and next(iter(dtypes)) in (t.bfloat16, t.float16) else t.float32
        data = t.einsum(spec, *[x.data.to(common) for x in vals])
        count = self._absent(e.vars, vals)
        return Labelled(data.float() * count if count > 1 else data, out)


def experts_in(model: Model) -> list[str]:
    """The library words the runner will run as expert calls, in the order it meets them."""
    used: list[str] = []

    def walk(e: Expr) -> None:
        m = find(e) if isinstance(e, (Op, Reduce)) else None
        if m is not None:
            used.append(m.word)
            for sub in m.wild.values():
                walk(sub)
        elif isinstance(e, Op):
            for a in e.args:
                walk(a)
        elif isinstance(e, Reduce):
            walk(e.body)

    for eq in model.nodes:
        walk(eq.rhs)
    return list(dict.fromkeys(used))


def eager_baseline(model: Model, sizes: dict[str, int]) -> tuple[str, Callable[[dict[str, Any]], Any]]:
    """(a description, a function of the inputs giving the first output) for the baseline timer."""
    run = TorchEager(model, sizes)
    first = model.outputs[0].name
    return describe(model), lambda args: run(args)[first]


def describe(model: Model) -> str:
    """`torch eager (2 equations; RMSNORM as F.rms_norm)`: what the baseline runs."""
    n = len(model.nodes)
    calls = "; ".join(f"{w} as {EXPERT_CALLS[w]}" for w in experts_in(model))
    return f"torch eager ({n} equation{'s' if n != 1 else ''}{'; ' + calls if calls else ''})"
