"""The torch call an expert writes for a library word, found inside any model's equations.

The eager runner (`habu.timing.torch_eager`) turns an equation into torch ops one operation at a
time: an RMSNorm becomes a square, a sum, a divide, an rsqrt and a product, each a kernel over f32
data, 16x slower than `F.rms_norm` on the H200 (678 against 43 µs for 8192 x 4096). A baseline that
slow flatters every plan. So before the runner builds an expression from its parts, it asks here
whether the expression is one of the library's words, and runs the word's expert call instead:

    RMSNORM    F.rms_norm          RMSNORM-W  F.rms_norm with a weight    LAYERNORM  F.layer_norm
    SOFTMAX    torch.softmax       GELU       F.gelu                      GELU-TANH  F.gelu(tanh)
    SILU       F.silu

The patterns are not written twice: each is the equation the prelude's word expands to (a one-word
model over placeholder tensors), so the match follows the library if a definition changes. Matching
is structural: the same operations, constants and reductions, with index variables renamed
consistently; a placeholder tensor stands for a tensor the model loads (a normalisation's input) or,
in an elementwise word, for any subexpression. A match is still only a claim: the search golden-checks
the baseline's output against the float64 reference before it quotes a ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from habu.spec.evaluate import Labelled
from habu.spec.ir import Const, Expr, Gather, IndexConst, IndexVar, Load, Op, Reduce, Size

# the placeholder program: each word applied to X (rows of #D) and, for RMSNORM-W, a weight row W
_PATTERNS_SOURCE = """
8 EXTENT: #R
8 EXTENT: #D
1 EXTENT: #ONE
TENSOR: X ( #R #D )
TENSOR: W ( #ONE #D )
TENSOR: Y ( #R #D )
MODEL: RMSNORM ( x -- y ) RMSNORM ;
MODEL: RMSNORM-W ( x w -- y ) RMSNORM-W ;
MODEL: LAYERNORM ( x -- y ) LAYERNORM ;
MODEL: SOFTMAX ( x -- y ) SOFTMAX ;
MODEL: GELU ( x -- y ) GELU ;
MODEL: GELU-TANH ( x -- y ) GELU-TANH ;
MODEL: SILU ( x -- y ) SILU ;
"""
_WILD = ("X", "W")
ROW_WORDS = ("RMSNORM", "RMSNORM-W", "LAYERNORM", "SOFTMAX")  # reduce over the last axis of X
ELEMENTWISE_WORDS = ("GELU", "GELU-TANH", "SILU")
EXPERT_CALLS = {"RMSNORM": "F.rms_norm", "RMSNORM-W": "F.rms_norm", "LAYERNORM": "F.layer_norm",
                "SOFTMAX": "torch.softmax", "GELU": "F.gelu", "GELU-TANH": "F.gelu(approximate='tanh')",
                "SILU": "F.silu"}


@dataclass(frozen=True)
class Pattern:
    word: str
    rhs: Expr
    lhs: tuple[IndexVar, ...]  # the pattern's free variables: X[r d]
    elementwise: bool


@dataclass
class Match:
    """What a pattern's placeholders and index variables stand for in the matched expression."""

    pattern: Pattern
    wild: dict[str, Expr]  # placeholder tensor -> the subexpression (a load, for row words)
    vars: dict[str, IndexVar]  # pattern variable name -> the expression's variable
    extents: dict[str, str]  # pattern extent -> the expression's

    @property
    def word(self) -> str:
        return self.pattern.word


@cache
def patterns() -> tuple[Pattern, ...]:
    from habu.spec.parser import parse_text

    program = parse_text(_PATTERNS_SOURCE, "<habu.timing.experts>")
    out = []
    for word in (*ROW_WORDS, *ELEMENTWISE_WORDS):
        (eq,) = program.models[word].nodes
        out.append(Pattern(word, eq.rhs, eq.lhs, word in ELEMENTWISE_WORDS))
    return tuple(out)


def find(e: Expr) -> Match | None:
    """The first library word that `e` is, or None."""
    for p in patterns():
        m = Match(p, {}, {}, {})
        if _unify(p.rhs, e, m):
            return m
    return None


def _unify(p: Expr, e: Expr, m: Match) -> bool:
    if isinstance(p, Load) and p.tensor in _WILD:
        return _bind(p, e, m)
    if type(p) is not type(e):
        return False
    if isinstance(p, Const):
        return p.value == e.value  # type: ignore[attr-defined]
    if isinstance(p, Size):
        return _same_extent(p.extent, e.extent, m)  # type: ignore[attr-defined]
    if isinstance(p, Load):
        assert isinstance(e, Load)
        return p.tensor == e.tensor and len(p.indices) == len(e.indices) and all(
            _same_index(a, b, m) for a, b in zip(p.indices, e.indices, strict=True))
    if isinstance(p, Op):
        assert isinstance(e, Op)
        return p.fn == e.fn and len(p.args) == len(e.args) and all(
            _unify(a, b, m) for a, b in zip(p.args, e.args, strict=True))
    assert isinstance(p, Reduce) and isinstance(e, Reduce)
    return (p.op == e.op and len(p.vars) == len(e.vars)
            and all(_same_var(a, b, m) for a, b in zip(p.vars, e.vars, strict=True))
            and _unify(p.body, e.body, m))


def _bind(p: Load, e: Expr, m: Match) -> bool:
    """A placeholder load X[i j]: a row word needs the model to load a tensor with plain, distinct
    variables (its axes are then known); an elementwise word takes any subexpression, the same one
    at every occurrence."""
    if m.pattern.elementwise:
        if p.indices != m.pattern.lhs:
            return False
        seen = m.wild.setdefault(p.tensor, e)
        return seen == e
    if not isinstance(e, Load) or len(e.indices) != len(p.indices):
        return False
    for a, b in zip(p.indices, e.indices, strict=True):
        if isinstance(a, IndexConst):
            if not (isinstance(b, IndexConst) and b.value == a.value):
                return False
        elif not (isinstance(a, IndexVar) and isinstance(b, IndexVar) and _same_var(a, b, m)):
            return False
    plain = [b for b in e.indices if isinstance(b, IndexVar)]
    if len(set(plain)) != len(plain):
        return False
    first = m.wild.setdefault(p.tensor, e)
    return isinstance(first, Load) and first.tensor == e.tensor


def _same_var(a: IndexVar, b: IndexVar, m: Match) -> bool:
    """The pattern's variable a is the expression's b, consistently, one to one."""
    if a.name in m.vars:
        return m.vars[a.name] == b
    if b in m.vars.values() or not _same_extent(a.extent, b.extent, m):
        return False
    m.vars[a.name] = b
    return True


def _same_extent(a: str, b: str, m: Match) -> bool:
    if a not in m.extents and b in m.extents.values():
        return False
    return m.extents.setdefault(a, b) == b


def _same_index(a: Any, b: Any, m: Match) -> bool:
    if isinstance(a, IndexVar):
        return isinstance(b, IndexVar) and _same_var(a, b, m)
    if isinstance(a, IndexConst):
        return isinstance(b, IndexConst) and a.value == b.value
    assert isinstance(a, Gather)
    return (isinstance(b, Gather) and a.tensor == b.tensor and len(a.indices) == len(b.indices)
            and all(_same_index(x, y, m) for x, y in zip(a.indices, b.indices, strict=True)))


def expert_call(match: Match, args: dict[str, Labelled], torch: Any) -> tuple[Any, tuple[IndexVar, ...]]:
    """(the word's result as torch computes it, its variables in the expression's names)."""
    import torch.nn.functional as F

    word = match.word
    if word in ELEMENTWISE_WORDS:
        x = args["X"]
        fn: dict[str, Callable[[Any], Any]] = {
            "GELU": lambda v: F.gelu(v), "GELU-TANH": lambda v: F.gelu(v, approximate="tanh"), "SILU": F.silu}
        return fn[word](x.data), x.labels  # a 16-bit input stays 16-bit, as an expert passes it
    r, d = (match.vars[v.name] for v in match.pattern.lhs)
    x = args["X"]
    data = x.data.permute(x.labels.index(r), x.labels.index(d)) if x.labels != (r, d) else x.data
    width = data.shape[-1]
    if word == "RMSNORM":
        y = F.rms_norm(data, (width,), eps=_eps(word))
    elif word == "RMSNORM-W":
        y = F.rms_norm(data, (width,), weight=args["W"].data.reshape(-1), eps=_eps(word))
    elif word == "LAYERNORM":
        y = F.layer_norm(data, (width,), eps=_eps(word))
    else:  # SOFTMAX: no epsilon
        y = torch.softmax(data, dim=-1)
    return y, (r, d)


@cache
def _eps(word: str) -> float:
    """The constant the word adds under its square root (rsqrt(... + eps)), read from the library."""
    p = next(p for p in patterns() if p.word == word)
    found: list[float] = []

    def walk(e: Expr) -> None:
        if isinstance(e, Op):
            if e.fn == "rsqrt" and isinstance(e.args[0], Op) and e.args[0].fn == "add":
                found.extend(float(a.value) for a in e.args[0].args if isinstance(a, Const))
            for a in e.args:
                walk(a)
        elif isinstance(e, Reduce):
            walk(e.body)

    walk(p.rhs)
    if len(found) != 1:
        raise ValueError(f"cannot read {word}'s epsilon from its definition: found {found}")
    return found[0]
