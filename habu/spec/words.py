"""Words and the composition checker.

A word sequence runs on a typed stack. Whole tensors flow through the library words (LINEAR, GELU,
RMSNORM …); each application adds an equation node to the model's graph. Element-level words
(`A@`, `A!`, `IX@`, index variables, `+`) build one equation from its parts. Four kinds of word:

- `WORD: NAME ( x[r i] w[i o] -- y[r o] ) y[r o] = ... ;` — a primitive defined by an equation over
  extent variables, instantiated at each use with the extents of its arguments;
- `WORD: NAME ( a b -- y ) a + b ;` — an elementwise word, broadcast over its inputs;
- `: NAME ( effect ) words ;` — a composition, expanded where it is used;
- builtins: stack shuffles, tensor access words, the lane index `g`, LOAD-V4 / STORE-V4.

Parameters: a word may take tensors from its caller's parameters (`: LINEAR ( x -- y | w b )`).
A model `( x w1 b1 w2 b2 -- y )` whose body words take four parameters starts with `x` on the stack
and hands `w1 b1 w2 b2` to those words in order.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from habu.errors import HabuError, Span
from habu.spec.builder import GraphBuilder, VarNamer
from habu.spec.effects import Effect, EffectItem
from habu.spec.equation import MAX_EXPONENT, TensorType, decimal_exponent, format_expr
from habu.spec.instantiate import (
    _aligned_indices,
    _at,
    _instantiate_eq,
    _substitute,
    _substitute_folded,
    broadcast,
)
from habu.spec.ir import (
    Const,
    Equation,
    Expr,
    Gather,
    IndexExpr,
    IndexVar,
    Load,
    Size,
    TensorDecl,
    free_vars,
)
from habu.spec.lexer import Token
from habu.spec.program import Program
from habu.spec.values import (
    IndexValue,
    ScalarValue,
    TensorValue,
    UnknownValue,
    Value,
)

MAX_EXPANSION_DEPTH = 64  # nesting of word calls inside word calls
# Words executed while expanding one model or one definition. A definition's size is known before it
# runs (`expansion_size`), so `: W1 ( x -- y ) W0 W0 ;` ... `W16` is refused where it is defined
# instead of running 2^16 words. 20,000 words (at most as many nodes) check in seconds; real models use hundreds.
MAX_EXPANSION = 20_000
MAX_STEPS = MAX_EXPANSION


# ----------------------------------------------------------------------------- the interpreter


@dataclass
class Frame:
    """The parameters and named values visible inside one word call (or a model's body)."""

    owner: str
    named: dict[str, Value] = field(default_factory=dict)
    queue: list[tuple[str, Value]] = field(default_factory=list)
    next_param: int = 0
    used: set[str] = field(default_factory=set)
    words: dict[str, Word] | None = None  # a definition sees the words defined before it

    def take(self) -> tuple[str, Value] | None:
        if self.next_param >= len(self.queue):
            return None
        item = self.queue[self.next_param]
        self.next_param += 1
        self.used.add(item[0])
        return item


class Interpreter:
    """Runs words on a typed stack, adding the nodes they produce to a graph builder."""

    def __init__(self, program: Program, builder: GraphBuilder):
        self.program = program
        self.builder = builder
        self.stack: list[Value] = []
        self.frames: list[Frame] = []
        self.steps = 0

    # -- stack
    def push(self, v: Value) -> None:
        self.stack.append(v)

    def pop(self, n: int, tok: Token, word: str, floor: int = 0) -> list[Value]:
        if len(self.stack) - floor < n:
            have = len(self.stack) - floor
            raise tok.error(f"stack underflow: {word} takes {n} value{'s' if n != 1 else ''}, "
                            f"but {'only ' + str(have) if have else 'none'} {'is' if have == 1 else 'are'} "
                            "on the stack")
        vals = self.stack[len(self.stack) - n :]
        del self.stack[len(self.stack) - n :]
        return vals

    @property
    def frame(self) -> Frame:
        return self.frames[-1]

    def take_param(self, tok: Token, word: str, item: EffectItem) -> Value:
        got = self.frame.take()
        if got is None:
            raise tok.error(f"{word} takes the parameter {item.name}, but {self.frame.owner} has no "
                            "parameters left", "a model's signature lists its inputs, then the parameters "
                            "of its words in order")
        return got[1]

    # -- running
    def run(self, tokens: list[Token]) -> None:
        depth = len(self.frames)
        if depth > MAX_EXPANSION_DEPTH:
            raise tokens[0].error(f"words nested more than {MAX_EXPANSION_DEPTH} deep") if tokens else \
                HabuError(f"words nested more than {MAX_EXPANSION_DEPTH} deep")
        for tok in tokens:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise tok.error(f"the model expands to more than {MAX_STEPS:,} words")
            self.execute(tok)

    def execute(self, tok: Token) -> None:
        text = tok.text
        number = parse_number(text)
        if number is not None:
            self.push(ScalarValue(tok, Const(number)))
            return
        for fr in reversed(self.frames):
            if text in fr.named:
                fr.used.add(text)
                v = fr.named[text]
                self.push(_retag(v, tok))
                return
            if fr.owner.startswith(":"):
                break  # a word's body sees its own names, not its caller's
        word = self.find_word(text)
        if word is not None:
            word.apply(self, tok)
            return
        dt = self.program.find_tensor(text)
        if dt is not None:
            d = dt.decl
            if d.is_index:
                raise tok.error(f"{d.name} is an index tensor: read it with {d.name}@ ( ix<#{d.extents[0]}> "
                                f"-- ix<#{d.range}> )" if d.extents else f"{d.name} is an index tensor")
            self.push(TensorValue(tok, d.name, d.extents, d.dtype, d.name))
            return
        if text.startswith("#"):
            ext = text[1:]
            if ext in self.program.extents:
                self.push(ScalarValue(tok, Size(ext)))
                return
            raise tok.error(f"unknown extent {text}")
        var = index_var_named(self.program, text)
        if var is not None:
            self.push(IndexValue(tok, var, var.extent))
            return
        raise tok.error(f"unknown word {text}", *self.suggest(text))

    def find_word(self, text: str) -> Word | None:
        for fr in reversed(self.frames):
            if fr.words is not None:
                return fr.words.get(text) or fr.words.get(text.upper())
        return self.program.find_word(text)

    def suggest(self, text: str) -> tuple[str, ...]:
        names = list(self.program.words) + list(self.program.tensors)
        for fr in self.frames:
            names += list(fr.named)
        close = difflib.get_close_matches(text, names, n=3, cutoff=0.75)
        if not close and text.upper() != text:
            close = difflib.get_close_matches(text.upper(), names, n=3, cutoff=0.75)
        notes = []
        if close:
            notes.append("did you mean " + " or ".join(close) + "?")
        if text.endswith(";") and len(text) > 1:
            notes.append("put a space before ;")
        return tuple(notes)


def _retag(v: Value, tok: Token) -> Value:
    if isinstance(v, TensorValue):
        return TensorValue(tok, v.tensor, v.extents, v.dtype, v.label)
    return v


def parse_number(text: str):
    from fractions import Fraction

    if not text or not (text[0].isdigit() or (text[0] in "+-." and len(text) > 1 and
                                              (text[1].isdigit() or text[1] == "."))):
        return None
    exponent = decimal_exponent(text)
    if exponent is not None and abs(exponent) > MAX_EXPONENT:
        return None
    try:
        value = Fraction(text.replace("_", ""))
    except (ValueError, ZeroDivisionError):
        return None
    if abs(value) > Fraction(10) ** 38:
        return None
    return value


def index_var_named(program: Program, text: str) -> IndexVar | None:
    from habu.spec.equation import index_base

    if not text or not (text[0].isalpha() or text[0] == "_"):
        return None
    for base in index_base(text):
        ext = program.extent_for_index(base)
        if ext is not None:
            return IndexVar(text, ext)
    return None


# ----------------------------------------------------------------------------- words


class Word:
    """A named operation on the stack."""

    name: str
    effect: Effect | None
    span: Span | None
    doc: str = ""

    @property
    def n_in(self) -> int:
        return len(self.effect.inputs) if self.effect else 0

    @property
    def n_out(self) -> int:
        return len(self.effect.outputs) if self.effect else 0

    @property
    def n_params(self) -> int:
        return len(self.effect.params) if self.effect else 0

    def effect_text(self) -> str:
        return self.effect.show() if self.effect else "( -- )"

    def meaning(self) -> str:
        return self.doc

    def apply(self, it: Interpreter, tok: Token) -> None:
        raise NotImplementedError

    def unknown_result(self, it: Interpreter, tok: Token) -> None:
        for o in self.effect.outputs if self.effect else ():
            it.push(UnknownValue(tok, f"{self.name}'s {o.name}"))


def _any_unknown(vals: list[Value]) -> bool:
    return any(isinstance(v, UnknownValue) for v in vals)


@dataclass
class BuiltinWord(Word):
    name: str
    effect: Effect | None
    run: Callable[[Interpreter, Token, list[Value]], list[Value] | None]
    doc: str = ""
    span: Span | None = None
    accepts_unknown: bool = False

    def apply(self, it: Interpreter, tok: Token) -> None:
        vals = it.pop(self.n_in, tok, self.name)
        if _any_unknown(vals) and not self.accepts_unknown:
            self.unknown_result(it, tok)
            return
        out = self.run(it, tok, vals)
        for v in out or ():
            it.push(v)


@dataclass
class EquationWord(Word):
    """`WORD: MATMUL ( x[r i] w[i o] -- y[r o] ) y[r o] = Σ i x[r i] · w[i o] ;`"""

    name: str
    effect: Effect
    template: Equation  # over extent variables '?r' and tensors '$x'
    span: Span | None = None
    doc: str = ""

    def meaning(self) -> str:
        from habu.spec.equation import format_equation

        return _untemplate(format_equation(self.template))

    def apply(self, it: Interpreter, tok: Token) -> None:
        vals = it.pop(self.n_in, tok, self.name)
        if _any_unknown(vals):
            self.unknown_result(it, tok)
            return
        binding: dict[str, str] = {}
        where: dict[str, TensorValue] = {}
        tensors: dict[str, str] = {}
        for item, v in zip(self.effect.inputs, vals, strict=True):
            if not isinstance(v, TensorValue):
                raise tok.error(f"{self.name} takes a tensor as {item.name}, got {v.describe()}",
                                f"{item.name} was pushed at {_at(v.origin)}")
            pattern = item.pattern or ()
            if len(pattern) != len(v.extents):
                raise tok.error(f"{self.name} takes {item.show()} with {len(pattern)} extent"
                                f"{'s' if len(pattern) != 1 else ''}, got {v.describe()}",
                                f"{v.label} was pushed at {_at(v.origin)}")
            for var, ext in zip(pattern, v.extents, strict=True):
                key = "?" + var
                if key in binding and binding[key] != ext:
                    other = where[key]
                    raise tok.error(
                        f"{self.name}: extent {var} is #{binding[key]} in {other.label} but #{ext} in "
                        f"{v.label}", f"{self.name} {self.effect.show()}",
                        f"{other.label} was pushed at {_at(other.origin)}, {v.label} at {_at(v.origin)}")
                binding[key] = ext
                where[key] = v
            tensors["$" + item.name] = v.tensor
        out_item = self.effect.outputs[0]
        out_extents = tuple(binding[f"?{var}"] for var in out_item.pattern or ())
        target = it.builder.new_intermediate(out_extents)
        tensors["$" + out_item.name] = target
        eq = _instantiate_eq(self.template, tensors, binding, {}, VarNamer())
        it.builder.add_node(eq, tok)
        it.push(TensorValue(tok, target, out_extents, None, f"{self.name}'s result"))


@dataclass
class ElementwiseWord(Word):
    """`WORD: GELU ( x -- y ) 0.5 · x · (1 + erf(x · 0.7071067811865476)) ;` — broadcast."""

    name: str
    effect: Effect
    body: Expr  # over placeholders Load('$x', ())
    span: Span | None = None
    doc: str = ""

    def meaning(self) -> str:
        out = self.effect.outputs[0].name
        return f"{out} = " + _untemplate(format_expr(self.body))

    def apply(self, it: Interpreter, tok: Token) -> None:
        vals = it.pop(self.n_in, tok, self.name)
        if _any_unknown(vals):
            self.unknown_result(it, tok)
            return
        for item, v in zip(self.effect.inputs, vals, strict=True):
            if not isinstance(v, TensorValue | ScalarValue):
                raise tok.error(f"{self.name} takes a tensor or an element value as {item.name}, "
                                f"got {v.describe()}")
        tensors = [v for v in vals if isinstance(v, TensorValue)]
        if not tensors:
            mapping = {"$" + item.name: v.expr for item, v in zip(self.effect.inputs, vals, strict=True)
                       if isinstance(v, ScalarValue)}
            it.push(ScalarValue(tok, _substitute_folded(self.body, mapping)))
            return
        for v in vals:
            if isinstance(v, ScalarValue) and free_vars(v.expr):
                raise tok.error(f"{self.name} mixes a whole tensor with {v.describe()}",
                                "element values and whole tensors do not combine; index the tensor")
        out_extents = broadcast(tok, self.name, tensors, it.program)
        namer = VarNamer()
        lhs = tuple(namer(e) for e in out_extents)
        mapping: dict[str, Expr] = {}
        for item, v in zip(self.effect.inputs, vals, strict=True):
            if isinstance(v, ScalarValue):
                mapping["$" + item.name] = v.expr
            else:
                mapping["$" + item.name] = Load(v.tensor, _aligned_indices(v.extents, lhs, it.program))
        target = it.builder.new_intermediate(out_extents)
        it.builder.add_node(Equation(target, lhs, _substitute(self.body, mapping)), tok)
        it.push(TensorValue(tok, target, out_extents, None, f"{self.name}'s result"))


@dataclass
class ColonWord(Word):
    """`: NAME ( effect ) words ;` — expanded where it is used."""

    name: str
    effect: Effect
    body: list[Token]
    span: Span | None = None
    doc: str = ""
    env: dict[str, Word] = field(default_factory=dict, repr=False)
    expansion: int = 0  # the words one use runs (`expansion_size` of the body), set when it is defined

    def meaning(self) -> str:
        return " ".join(t.text for t in self.body)

    def apply(self, it: Interpreter, tok: Token) -> None:
        if len(it.stack) < self.n_in:
            it.pop(self.n_in, tok, self.name)  # raises the underflow error
        frame = Frame(":" + self.name, words=self.env)
        for item in self.effect.params:
            v = it.take_param(tok, self.name, item)
            frame.named[item.name] = v
            frame.queue.append((item.name, v))
        it.frames.append(frame)
        floor = len(it.stack) - self.n_in
        try:
            it.run(self.body)
        except HabuError as err:
            if err.span is not None and err.span.source is not tok.span.source:
                # inside a library word: report it where the user's file uses the word
                inner = f"{err.span.source.path}:{err.span.line}:{err.span.col}"
                raise HabuError(f"in {self.name}: {err.message}", tok.span,
                                (f"{self.name} is defined at {inner}", *err.notes)) from None
            if err.span is not None and err.span != tok.span:
                err.notes = (*err.notes, f"in {self.name}, used at {_at(tok)}")
            raise
        it.frames.pop()
        if len(it.stack) - floor != self.n_out:  # pragma: no cover - ruled out when it was defined
            raise tok.error(f"{self.name} left {len(it.stack) - floor} values, its effect says {self.n_out}")


def expansion_size(body: list[Token], words: dict[str, Word], names: set[str]) -> tuple[int, Token | None]:
    """How many words running `body` executes (each token, plus the expansion of each composition it
    uses: the definitions' sizes are memoised on them), and the costliest token. Computed before
    running, so an exponential definition is refused without being expanded."""
    total, worst, worst_cost = 0, None, 0
    for tok in body:
        cost = 1
        if tok.text not in names:
            word = words.get(tok.text) or words.get(tok.text.upper())
            if isinstance(word, ColonWord):
                cost += word.expansion
        total += cost
        if cost > worst_cost:
            worst, worst_cost = tok, cost
    return total, worst


# ----------------------------------------------------------------------------- helpers


def _untemplate(text: str) -> str:
    return text.replace("$", "").replace("#?", "#").replace("?", "")


class WordScope:
    """Equation name resolution inside a WORD: body: extent variables and the word's tensors."""

    def __init__(self, effect: Effect, program: Program, elementwise: bool):
        self.effect = effect
        self.program = program
        self.elementwise = elementwise
        self.vars: set[str] = set()
        for item in (*effect.inputs, *effect.outputs):
            self.vars.update(item.pattern or ())

    def extent_of_index(self, name: str) -> str | None:
        return "?" + name if name in self.vars else None

    def tensor(self, name: str) -> TensorType | None:
        for item in (*self.effect.inputs, *self.effect.outputs):
            if item.name == name and item.pattern is not None:
                return TensorType("$" + name, name, tuple("?" + v for v in item.pattern), None)
        return None

    def extent(self, name: str) -> str | None:
        bare = name.lstrip("#")
        return "?" + bare if bare in self.vars else None

    def extent_size(self, extent: str) -> int | None:
        return None

    def show_extent(self, extent: str) -> str:
        return extent.lstrip("?") if extent.startswith("?") else f"#{extent}"

    def scalar(self, name: str) -> Expr | None:
        if self.elementwise and any(i.name == name for i in self.effect.inputs):
            return Load("$" + name, ())
        return None


# ----------------------------------------------------------------------------- tensor access words


@dataclass
class TensorLoadWord(Word):
    """`A@ ( ix<#M> ix<#K> -- r )` and, for index tensors, `IX@ ( ix<#M> -- ix<#M> )`."""

    name: str
    decl: TensorDecl
    effect: Effect | None = None
    span: Span | None = None
    doc: str = ""

    def effect_text(self) -> str:
        ins = " ".join(f"ix<#{e}>" for e in self.decl.extents)
        out = f"ix<#{self.decl.range}>" if self.decl.is_index else "r"
        return f"( {ins} -- {out} )".replace("(  --", "( --")

    @property
    def n_in(self) -> int:
        return self.decl.rank

    def apply(self, it: Interpreter, tok: Token) -> None:
        vals = it.pop(self.decl.rank, tok, self.name)
        if _any_unknown(vals):
            it.push(UnknownValue(tok, f"{self.name}'s result"))
            return
        indices = _check_indices(tok, self.name, self.decl, vals)
        if self.decl.is_index:
            assert self.decl.range is not None
            it.push(IndexValue(tok, Gather(self.decl.name, indices), self.decl.range))
        else:
            it.push(ScalarValue(tok, Load(self.decl.name, indices)))


@dataclass
class TensorStoreWord(Word):
    """`O! ( r ix<#M> ix<#N> -- )`: defines every element of O."""

    name: str
    decl: TensorDecl
    effect: Effect | None = None
    span: Span | None = None
    doc: str = ""

    def effect_text(self) -> str:
        ins = "".join(f" ix<#{e}>" for e in self.decl.extents)
        return f"( r{ins} -- )"

    @property
    def n_in(self) -> int:
        return self.decl.rank + 1

    def apply(self, it: Interpreter, tok: Token) -> None:
        vals = it.pop(self.decl.rank + 1, tok, self.name)
        if _any_unknown(vals):
            return
        value, idx = vals[0], vals[1:]
        if not isinstance(value, ScalarValue):
            raise tok.error(f"{self.name} stores an element value r, got {value.describe()}")
        indices = _check_indices(tok, self.name, self.decl, idx)
        lhs: list[IndexVar] = []
        for ix, v in zip(indices, idx, strict=True):
            if not isinstance(ix, IndexVar):
                raise v.origin.error(f"{self.name} stores through {v.describe()}: stores take index "
                                     "variables (scattered stores are not supported)")
            if ix in lhs:
                raise v.origin.error(f"{self.name} stores with the index {ix.name} twice")
            lhs.append(ix)
        for var in free_vars(value.expr) - set(lhs):
            raise tok.error(f"the value stored by {self.name} depends on {var.name}, which the store does "
                            f"not index: reduce over it first ({var.name} SUM-OVER)")
        it.builder.store(self.decl, Equation(self.decl.name, tuple(lhs), value.expr), tok)


def _check_indices(tok: Token, word: str, decl: TensorDecl, vals: list[Value]) -> tuple[IndexExpr, ...]:
    out: list[IndexExpr] = []
    for pos, (ext, v) in enumerate(zip(decl.extents, vals, strict=True)):
        if not isinstance(v, IndexValue):
            raise tok.error(f"{word} takes ix<#{ext}> as index {pos + 1}, got {v.describe()}",
                            f"{word} ( {' '.join('ix<#' + e + '>' for e in decl.extents)} -- ... )")
        if v.extent != ext:
            raise tok.error(f"{word}'s index {pos + 1} is over #{ext}, but {v.describe()} is over #{v.extent}",
                            f"it was pushed at {_at(v.origin)}")
        out.append(v.expr)
    return tuple(out)


def builtin_words() -> dict[str, Word]:
    """The built-in words (`habu.spec.builtin_words`)."""
    from habu.spec.builtin_words import builtin_words as words

    return words()
