"""The top level of a Habu file: declarations, word definitions and models.

    128 EXTENT: #M                 \\ a static extent
    1..65536%8 EXTENT: #T          \\ a runtime extent: 1 to 65536, a multiple of 8 (? is 1..2^31-1)
    bf16 TENSOR: A ( #M #K )       \\ an element type before TENSOR: (f32 when none is given)
    ITENSOR: IX ( #M #M )          \\ an index map: IX over #M, values in #M
    GROUPS: E ( #R #G )            \\ a grouping: E[r] is row r's group, never decreasing (empty groups)
    MODEL: GGEMM  O[m n] = Σ k A[ IX[m] k ] · B[n k] ;
    MODEL: FFN ( x w1 b1 -- y ) LINEAR GELU ;
    : WORD ( effect ) words ;
    WORD: NAME ( x[r i] -- y[r] ) y[r] = Σ i x[r i] ;

As in Forth, numbers and element types wait on a stack until a defining word takes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from habu.errors import HabuError, Source, Span
from habu.spec.builder import GraphBuilder, VarNamer
from habu.spec.dtypes import (
    DEFAULT_INDEX_DTYPE,
    DEFAULT_TENSOR_DTYPE,
    INDEX_DTYPES,
    READABLE_DTYPES,
    WRITABLE_DTYPES,
    DType,
    dtype_named,
)
from habu.spec.effects import Effect, parse_effect
from habu.spec.equation import EquationParser
from habu.spec.equations import equations_model
from habu.spec.functions import FUNCTIONS, REDUCTIONS
from habu.spec.ir import INT31_MAX, MAX_EXTENT, Equation, Extent, IndexVar, Load, Model, TensorDecl
from habu.spec.lexer import Reader, Token
from habu.spec.program import DeclaredExtent, DeclaredTensor, Program
from habu.spec.values import IndexValue, ScalarValue, TensorValue, UnknownValue, Value
from habu.spec.words import (
    MAX_EXPANSION,
    ColonWord,
    ElementwiseWord,
    EquationWord,
    Frame,
    Interpreter,
    TensorLoadWord,
    TensorStoreWord,
    builtin_words,
    expansion_size,
)

_TENSOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXTENT_NAME = re.compile(r"^#[A-Za-z_][A-Za-z0-9_]*$")
_RANGE = re.compile(r"^(?:(\?)|(\d[\d_]*)\.\.(\d[\d_]*))(?:%(\d+))?$")
DEFINERS = ("EXTENT:", "TENSOR:", "ITENSOR:", "GROUPS:", "MODEL:", ":", "WORD:")


@dataclass(frozen=True)
class Literal:
    kind: str  # "int", "range", "dtype"
    value: object
    tok: Token


class TopLevel:
    """Reads one source into a Program."""

    def __init__(self, source: Source, program: Program, is_prelude: bool = False):
        self.reader = Reader(source)
        self.program = program
        self.literals: list[Literal] = []
        self.is_prelude = is_prelude

    def run(self) -> Program:
        seen_any = False
        while True:
            tok = self.reader.next_word()
            if tok is None:
                break
            seen_any = True
            self.word(tok)
        if not seen_any and not self.is_prelude:
            src = self.reader.source
            what = "empty" if not src.text.strip() else "only comments"
            raise HabuError(f"the file is {what}: declare extents and tensors, then a MODEL",
                            Span(src, 0, 1))
        for lit in self.literals:
            raise lit.tok.error(f"{lit.tok.text} is never used: a number or element type goes before "
                                "the defining word that takes it (EXTENT:, TENSOR:, ITENSOR:, GROUPS:)")
        return self.program

    # -- the top-level words
    def word(self, tok: Token) -> None:
        text = tok.text
        upper = text.upper()
        if upper == "EXTENT:":
            self.extent(tok)
        elif upper == "TENSOR:":
            self.tensor(tok, index=False)
        elif upper == "ITENSOR:":
            self.tensor(tok, index=True)
        elif upper == "GROUPS:":
            self.tensor(tok, index=True, grouped=True)
        elif upper == "MODEL:":
            self.model(tok)
        elif text == ":":
            self.colon(tok)
        elif upper == "WORD:":
            self.word_def(tok)
        elif text == ";":
            raise tok.error("; without a definition to close")
        elif dtype_named(text) is not None:
            self.literals.append(Literal("dtype", dtype_named(text), tok))
        elif (lit := _literal(tok)) is not None:
            self.literals.append(lit)
        else:
            hint = ()
            if self.program.find_word(text) is not None or self.program.find_tensor(text) is not None:
                hint = ("words run inside a MODEL or a definition, not at the top level",)
            raise tok.error(f"unknown word {text} at the top level", *hint,
                            "the top level declares: N EXTENT:, TENSOR:, ITENSOR:, GROUPS:, MODEL:, : and WORD:")

    def take_literal(self, definer: Token, kinds: tuple[str, ...]) -> Literal | None:
        if not self.literals:
            return None
        lit = self.literals[-1]
        if lit.kind not in kinds:
            return None
        self.literals.pop()
        return lit

    def name_after(self, definer: Token, what: str) -> Token:
        tok = self.reader.next_word()
        if tok is None:
            raise definer.error(f"{definer.text} needs {what} after it")
        if tok.text in DEFINERS or tok.text.upper() in DEFINERS:
            raise tok.error(f"{definer.text} needs {what} after it, found {tok.text}")
        return tok

    # -- EXTENT:
    def extent(self, tok: Token) -> None:
        if self.is_prelude:
            raise tok.error("the prelude declares words only")
        lit = self.take_literal(tok, ("int", "range"))
        if lit is None:
            found = f", found {self.literals[-1].tok.text}" if self.literals else ""
            raise tok.error(f"EXTENT: takes a size before it (128 EXTENT: #M, or 1..4096 EXTENT: #T for a "
                            f"size known at run time){found}")
        name = self.name_after(tok, "an extent name like #M")
        if not _EXTENT_NAME.match(name.text):
            raise name.error(f"extent names start with # and continue with letters, digits or _: {name.text!r}")
        ext_name = name.text[1:]
        if ext_name in self.program.extents:
            prev = self.program.extents[ext_name].span
            raise name.error(f"extent {name.text} is already declared at {_at(prev)}")
        for other in self.program.extents_like(ext_name):
            if other != ext_name:
                raise name.error(f"extent {name.text} differs from #{other} only in case; index variables "
                                 "would not tell them apart")
        if lit.kind == "int":
            extent = Extent(ext_name, int(lit.value))  # type: ignore[call-overload]
            extent = Extent(ext_name, extent.size, extent.size, extent.size)  # type: ignore[arg-type]
        else:
            lo, hi, mult = lit.value  # type: ignore[misc]
            extent = Extent(ext_name, None, lo, hi, mult)
        self.program.declare_extent(ext_name, DeclaredExtent(extent, name.span))

    # -- TENSOR: / ITENSOR:
    def tensor(self, tok: Token, index: bool, grouped: bool = False) -> None:
        if self.is_prelude:
            raise tok.error("the prelude declares words only")
        lit = self.take_literal(tok, ("dtype",))
        dtype: DType = lit.value if lit else (DEFAULT_INDEX_DTYPE if index else DEFAULT_TENSOR_DTYPE)  # type: ignore[assignment]
        if index and dtype.name not in INDEX_DTYPES:
            raise (lit.tok if lit else tok).error(f"an index tensor holds integers ({', '.join(INDEX_DTYPES)}), "
                                                  f"not {dtype.name}")
        name = self.name_after(tok, "a tensor name")
        self.check_tensor_name(name)
        if dtype.name not in READABLE_DTYPES:
            raise (lit.tok if lit else tok).error(
                f"tensor {name.text} cannot be {dtype.name}: no kernel reads or writes {dtype.name} yet",
                f"tensors hold {', '.join(READABLE_DTYPES)}; models write {', '.join(WRITABLE_DTYPES)}")
        group_span, words = self.reader.read_group("extents", name)
        extents: list[str] = []
        for w in words:
            if not w.text.startswith("#"):
                raise w.error(f"expected an extent like #M in the shape of {name.text}, found {w.text!r}")
            ext = w.text[1:]
            if ext not in self.program.extents:
                raise w.error(f"unknown extent {w.text}", *_suggest(ext, self.program.extents, "#"))
            extents.append(ext)
        if index:
            if not extents:
                raise HabuError(f"ITENSOR: {name.text} needs its domain extents and then the extent its "
                                "values index into: ( #M #S )", group_span)
            if grouped and len(extents) != 2:
                raise HabuError(f"GROUPS: {name.text} takes the extent of its rows and then the extent of its "
                                f"groups: ( #R #G ), not {len(extents)} extent{'s' if len(extents) != 1 else ''}",
                                group_span)
            decl = TensorDecl(name.text, tuple(extents[:-1]), dtype, range=extents[-1], grouped=grouped)
        else:
            decl = TensorDecl(name.text, tuple(extents), dtype)
        self.program.declare_tensor(name.text, DeclaredTensor(decl, name.span))
        self.program.words[name.text + "@"] = TensorLoadWord(name.text + "@", decl, span=name.span)
        if not index:
            self.program.words[name.text + "!"] = TensorStoreWord(name.text + "!", decl, span=name.span)

    def check_tensor_name(self, name: Token) -> None:
        if not _TENSOR_NAME.match(name.text):
            raise name.error(f"tensor names are letters, digits and _ (so equations can use them): {name.text!r}")
        if name.text in self.program.tensors:
            raise name.error(f"tensor {name.text} is already declared at {_at(self.program.tensors[name.text].span)}")
        if name.text in FUNCTIONS or name.text in REDUCTIONS:
            raise name.error(f"{name.text} is a function of the equation language; name the tensor otherwise")
        if self.program.find_word(name.text) is not None and name.text in self.program.words:
            raise name.error(f"{name.text} is already a word; name the tensor otherwise")
        if dtype_named(name.text) is not None:
            raise name.error(f"{name.text} is an element type; name the tensor otherwise")

    # -- MODEL:
    def model(self, tok: Token) -> None:
        if self.is_prelude:
            raise tok.error("the prelude declares words only")
        name = self.name_after(tok, "a model name")
        if name.text in self.program.models:
            raise name.error(f"model {name.text} is already defined at {_at(self.program.model_spans[name.text])}")
        if self.reader.peek_char() == "(":
            model = self.composition(tok, name)
        else:
            model = self.equation_model(tok, name)
        self.program.models[name.text] = model
        self.program.model_spans[name.text] = name.span

    def equation_model(self, tok: Token, name: Token) -> Model:
        tokens, end = self.reader.equation_tokens(f"MODEL {name.text}", tok)
        if not tokens:
            raise end.error(f"MODEL {name.text} is empty: write an equation like O[m n] = Σ k A[m k] · B[k n]")
        return equations_model(self.program, name, tokens, end)

    def composition(self, tok: Token, name: Token) -> Model:
        group_span, words = self.reader.read_group("signature", name)
        sig = parse_effect(group_span, words, f"MODEL {name.text}")
        if sig.params:
            raise HabuError("a model's signature lists its inputs and outputs only; its parameters are its "
                            "inputs after the first", group_span)
        body, end = self.reader.read_body(f"MODEL {name.text}", tok)
        inputs = [self.signature_tensor(item, "input") for item in sig.inputs]
        outputs = [self.signature_tensor(item, "output") for item in sig.outputs]
        builder = GraphBuilder(self.program)
        it = Interpreter(self.program, builder)
        frame = Frame(f"MODEL {name.text}")
        values: list[TensorValue] = []
        for item, decl in zip(sig.inputs, inputs, strict=True):
            v = TensorValue(Token(item.name, item.span), decl.name, decl.extents, decl.dtype, item.name)
            frame.named[item.name] = v
            values.append(v)
        n_params = 0
        for w in body:
            if w.text in frame.named:
                continue
            word = self.program.find_word(w.text)
            if word is not None:
                n_params += word.n_params
        n_stack = len(values) - n_params
        if n_stack < 0:
            raise name.error(f"the words of {name.text} take {n_params} parameters but its signature has "
                             f"{len(values)} inputs")
        frame.queue = [(item.name, v) for item, v in zip(sig.inputs[n_stack:], values[n_stack:], strict=True)]
        self.check_expansion(f"MODEL {name.text}", name, body, self.program.words, set(frame.named))
        it.frames.append(frame)
        for v in values[:n_stack]:
            it.push(v)
        it.run(body)
        for item in sig.inputs[n_stack:]:
            if item.name not in frame.used:
                raise HabuError(f"parameter {item.name} of {name.text} is never used", item.span)
        if len(it.stack) != len(outputs):
            left = ", ".join(v.describe() for v in it.stack) or "nothing"
            raise end.error(f"{name.text} leaves {len(it.stack)} value{'s' if len(it.stack) != 1 else ''} on "
                            f"the stack but its signature has {len(outputs)} output"
                            f"{'s' if len(outputs) != 1 else ''}", f"left: {left}")
        for item, decl, v in zip(sig.outputs, outputs, it.stack, strict=True):
            self.bind_output(builder, item, decl, v, end)
        all_outputs = list(outputs) + [d for n, d in builder.written.items() if d not in outputs]
        if not all_outputs:
            raise end.error(f"{name.text} computes nothing: it has no outputs and stores nothing")
        return builder.finish(name.text, "composition", all_outputs, tuple(t.text for t in body))

    def signature_tensor(self, item, role: str) -> TensorDecl:
        if item.pattern is not None or item.index_of or item.is_element:
            raise HabuError(f"a model's {role}s are tensor names; shapes come from the declarations", item.span)
        dt = self.program.find_tensor(item.name)
        if dt is None:
            raise HabuError(f"{role} {item.name} is not a declared tensor",
                            item.span, _suggest(item.name, self.program.tensors, ""))
        if dt.decl.is_index and role == "output":
            raise HabuError(f"{dt.decl.name} is an index tensor; a model cannot write it", item.span)
        return dt.decl

    def bind_output(self, builder: GraphBuilder, item, decl: TensorDecl, v: Value, end: Token) -> None:
        if not isinstance(v, TensorValue):
            raise end.error(f"output {item.name} must be a tensor, but the stack holds {v.describe()}")
        if v.extents != decl.extents:
            have = " ".join(f"#{e}" for e in v.extents)
            want = " ".join(f"#{e}" for e in decl.extents)
            raise end.error(f"the result bound to {item.name} has extents ( {have} ) but {decl.name} is "
                            f"declared ( {want} )", f"the result is {v.describe()}, from {_at(v.origin.span)}")
        if v.tensor in builder.intermediates:
            builder.check_writable(decl, end)
            builder.rename(v.tensor, decl.name)
            builder.written[decl.name] = decl
        else:
            namer = VarNamer()
            lhs = tuple(namer(e) for e in decl.extents)
            builder.store(decl, Equation(decl.name, lhs, Load(v.tensor, lhs)), end)

    # -- : NAME ( effect ) words ;
    def colon(self, tok: Token) -> None:
        name = self.name_after(tok, "a word name")
        self.check_word_name(name)
        group_span, words = self.reader.read_group("stack effect", name)
        effect = parse_effect(group_span, words, name.text)
        body, end = self.reader.read_body(f"the definition of {name.text}", tok)
        env = dict(self.program.words)
        size = self.check_expansion(f"{name.text}", name, body, env, {p.name for p in effect.params})
        word = ColonWord(name.text, effect, body, span=name.span, env=env, expansion=size)
        self.check_colon(word, end)
        self.program.words[name.text] = word

    def check_expansion(self, what: str, name: Token, body: list[Token], words: dict, names: set[str]) -> int:
        """The number of words `body` runs, refused beyond `MAX_EXPANSION` before anything is expanded."""
        size, worst = expansion_size(body, words, names)
        if size > MAX_EXPANSION:
            notes = (f"{worst.text} alone runs {size_of(worst, words):,} words",) if worst is not None else ()
            raise name.error(f"{what} would expand to {size:,} words (at most {MAX_EXPANSION:,})", *notes,
                             "each use of a : word runs its whole definition; a word used twice in the "
                             "next doubles its size")
        return size

    def check_colon(self, word: ColonWord, end: Token) -> None:
        """Run the body once on placeholders: arity, and every type that is already known."""
        builder = GraphBuilder(self.program)
        it = Interpreter(self.program, builder)
        frame = Frame(":" + word.name, words=word.env)
        for p in word.effect.params:
            frame.named[p.name] = UnknownValue(Token(p.name, p.span), f"parameter {p.name}")
            frame.queue.append((p.name, frame.named[p.name]))
        it.frames.append(frame)
        for item in word.effect.inputs:
            it.push(_placeholder(item, builder, self.program))
        try:
            it.run(word.body)
        except HabuError as err:
            if err.message.startswith("stack underflow"):
                err.notes = (*err.notes, f"the effect {word.effect.show()} of {word.name} declares "
                             f"{word.n_in} input{'s' if word.n_in != 1 else ''}")
            raise
        if len(it.stack) != word.n_out:
            raise end.error(f"{word.name} leaves {len(it.stack)} value{'s' if len(it.stack) != 1 else ''} but "
                            f"its effect {word.effect.show()} says {word.n_out}")
        for item, v in zip(word.effect.outputs, it.stack, strict=True):
            if item.index_of and not isinstance(v, IndexValue | UnknownValue):
                raise end.error(f"{word.name} should leave {item.name}, but leaves {v.describe()}")
            if isinstance(v, IndexValue) and item.index_of and v.extent != item.index_of:
                raise end.error(f"{word.name} should leave {item.name}, but leaves {v.describe()}")
            if item.is_element and not isinstance(v, ScalarValue | UnknownValue):
                raise end.error(f"{word.name} should leave an element value r, but leaves {v.describe()}")
        for p in word.effect.params:
            if p.name not in frame.used:
                raise HabuError(f"parameter {p.name} of {word.name} is never used", p.span)

    def check_word_name(self, name: Token) -> None:
        if _literal(name) is not None or name.text in DEFINERS or name.text == ";":
            raise name.error(f"{name.text!r} cannot be a word name")
        if name.text in self.program.tensors:
            raise name.error(f"{name.text} is a tensor; name the word otherwise")

    # -- WORD: NAME ( effect ) equation ;
    def word_def(self, tok: Token) -> None:
        name = self.name_after(tok, "a word name")
        self.check_word_name(name)
        group_span, words = self.reader.read_group("stack effect", name)
        effect = parse_effect(group_span, words, name.text)
        if effect.params:
            raise HabuError("WORD: definitions take no parameters; use : for compositions", group_span)
        if len(effect.outputs) != 1:
            raise HabuError(f"WORD: {name.text} must have exactly one output", group_span)
        tokens, end = self.reader.equation_tokens(f"WORD {name.text}", tok)
        if not tokens:
            raise end.error(f"WORD {name.text} is empty")
        from habu.spec.words import WordScope

        if effect.typed:
            self.check_patterns(effect, name)
            parser = EquationParser(tokens, end, WordScope(effect, self.program, False), f"WORD {name.text}")
            eq = parser.parse_equation(accumulate_allowed=False)
            if eq.target != "$" + effect.outputs[0].name:
                raise tokens[0].error(f"the equation of {name.text} must define its output "
                                      f"{effect.outputs[0].name}")
            word = EquationWord(name.text, effect, eq, span=name.span)
        else:
            for item in (*effect.inputs, *effect.outputs):
                if item.index_of or item.is_element:
                    raise HabuError(f"{item.name}: elementwise words take plain names", item.span)
            parser = EquationParser(tokens, end, WordScope(effect, self.program, True), f"WORD {name.text}")
            body = parser.parse_scalar()
            word = ElementwiseWord(name.text, effect, body, span=name.span)
        self.program.words[name.text] = word

    def check_patterns(self, effect: Effect, name: Token) -> None:
        in_vars: set[str] = set()
        for item in effect.inputs:
            if item.pattern is None:
                raise HabuError(f"{item.name}: give every input of an equation word a pattern like "
                                f"{item.name}[r i]", item.span)
            in_vars.update(item.pattern)
        out = effect.outputs[0]
        if out.pattern is None:
            raise HabuError(f"{out.name}: give the output a pattern like {out.name}[r o]", out.span)
        for v in out.pattern:
            if v not in in_vars:
                raise HabuError(f"extent {v} of {out.name} comes from no input of {name.text}", out.span)


def size_of(tok: Token, words: dict) -> int:
    word = words.get(tok.text) or words.get(tok.text.upper())
    return 1 + (word.expansion if isinstance(word, ColonWord) else 0)


def _placeholder(item, builder: GraphBuilder, program: Program) -> Value:
    tok = Token(item.name, item.span)
    if item.index_of:
        if item.index_of not in program.extents:
            raise HabuError(f"unknown extent #{item.index_of}", item.span)
        return IndexValue(tok, IndexVar(builder.fresh_var(item.index_of).name, item.index_of), item.index_of)
    return UnknownValue(tok, item.name)


def _literal(tok: Token) -> Literal | None:
    text = tok.text
    if re.fullmatch(r"[+-]?\d[\d_]*", text):
        n = int(text.replace("_", ""))
        if n < 1:
            raise tok.error(f"an extent has at least one element, not {n}")
        if n > MAX_EXTENT:
            raise tok.error(f"{text} is too large for an extent (at most 2^40)")
        return Literal("int", n, tok)
    m = _RANGE.match(text)
    if m:
        if m.group(1):
            lo, hi = 1, INT31_MAX
        else:
            lo, hi = int(m.group(2).replace("_", "")), int(m.group(3).replace("_", ""))
        mult = int(m.group(4)) if m.group(4) else 1
        if lo < 1 or hi > MAX_EXTENT or lo > hi:
            raise tok.error(f"range {text} must satisfy 1 <= low <= high <= 2^40")
        if mult < 1 or mult > hi:
            raise tok.error(f"multiple {mult} in {text} must be between 1 and the upper bound")
        lo = -(-lo // mult) * mult
        if lo > hi:
            raise tok.error(f"no multiple of {mult} lies in {text}")
        return Literal("range", (lo, hi, mult), tok)
    return None


def _at(span: Span) -> str:
    return f"{span.source.path}:{span.line}:{span.col}"


def _suggest(name: str, options, prefix: str) -> tuple[str, ...]:
    import difflib

    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    return (f"did you mean {' or '.join(prefix + c for c in close)}?",) if close else ()


# ----------------------------------------------------------------------------- entry points


PRELUDE_NAME = "prelude.habu"


@lru_cache(maxsize=1)
def _prelude_source() -> Source:
    text = resources.files("habu.spec").joinpath(PRELUDE_NAME).read_text(encoding="utf-8")
    return Source(f"<prelude>/{PRELUDE_NAME}", text)


def prelude() -> Program:
    """The word library: builtins plus the words of prelude.habu (a fresh copy each call)."""
    return _prelude_program_copy()


@lru_cache(maxsize=1)
def _prelude_words() -> dict:
    program = Program(path="<prelude>")
    program.words.update(builtin_words())
    TopLevel(_prelude_source(), program, is_prelude=True).run()
    return program.words


def _prelude_program_copy() -> Program:
    program = Program()
    program.words.update(_prelude_words())
    return program


def parse_text(text: str, path: str = "<input>") -> Program:
    return parse_source(Source(path, text))


def parse_source(source: Source) -> Program:
    program = prelude()
    program.path = source.path
    return TopLevel(source, program).run()


def load_program(path: str | Path) -> Program:
    """Read and check a `.habu` file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise HabuError(f"no such file: {p}") from None
    except IsADirectoryError:
        raise HabuError(f"{p} is a directory, not a .habu file") from None
    except OSError as exc:
        raise HabuError(f"cannot read {p}: {exc.strerror}") from None
    return parse_source(Source.from_bytes(str(path), data))
