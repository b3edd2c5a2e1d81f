"""The built-in words: stack shuffles (DUP DROP SWAP OVER ROT NIP TUCK), lanes, 4-wide vector loads
and stores, reductions and arithmetic on stack values. Every program starts with them
(`habu.spec.words.builtin_words`), before the prelude's and the file's own definitions."""

from __future__ import annotations

from collections.abc import Callable

from habu.errors import Span
from habu.spec.builder import VarNamer
from habu.spec.effects import Effect
from habu.spec.ir import Equation, IndexVar, Load, Obligation, Reduce
from habu.spec.lexer import Token
from habu.spec.values import IndexValue, LaneValue, ScalarValue, TensorValue, Value
from habu.spec.words import BuiltinWord, Interpreter, Word


def _fx(text: str) -> Effect:
    from habu.errors import Source
    from habu.spec.effects import parse_effect
    from habu.spec.lexer import Reader

    src = Source("<builtin>", text)
    r = Reader(src)
    tok = Token("(", Span(src, 0, 1))
    span, words = r.read_group("stack effect", tok)
    return parse_effect(span, words, "a builtin")


def _dup(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[0], v[0]]


def _drop(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return []


def _swap(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[1], v[0]]


def _over(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[0], v[1], v[0]]


def _rot(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[1], v[2], v[0]]


def _nip(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[1]]


def _tuck(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [v[1], v[0], v[1]]


def _lane(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    return [LaneValue(tok)]


VECTOR = 4


def _load_v4(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    t, lane = v
    if not isinstance(lane, LaneValue):
        raise tok.error(f"LOAD-V4 takes the lane index g, got {lane.describe()}")
    if not isinstance(t, TensorValue):
        raise tok.error(f"LOAD-V4 takes a tensor, got {t.describe()}")
    _check_vector_tensor(it, tok, "LOAD-V4", t)
    return [TensorValue(tok, t.tensor, t.extents, t.dtype, t.label)]


def _store_v4(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
    val, t, lane = v
    if not isinstance(lane, LaneValue):
        raise tok.error(f"STORE-V4 takes the lane index g, got {lane.describe()}")
    if not isinstance(t, TensorValue) or t.tensor not in it.program.tensors:
        raise tok.error(f"STORE-V4 stores into a declared tensor, got {t.describe()}")
    if not isinstance(val, TensorValue):
        raise tok.error(f"STORE-V4 stores a vector loaded with LOAD-V4, got {val.describe()}")
    _check_vector_tensor(it, tok, "STORE-V4", t)
    if val.extents != t.extents:
        raise tok.error(f"STORE-V4: the vector is over {_shape(val.extents)} but {t.label} is over "
                        f"{_shape(t.extents)}")
    decl = it.program.tensors[t.tensor].decl
    namer = VarNamer()
    lhs = tuple(namer(e) for e in decl.extents)
    it.builder.store(decl, Equation(decl.name, lhs, Load(val.tensor, lhs)), tok)
    return []


def _shape(exts: tuple[str, ...]) -> str:
    return "( " + " ".join(f"#{e}" for e in exts) + " )"


def _check_vector_tensor(it: Interpreter, tok: Token, word: str, t: TensorValue) -> None:
    if len(t.extents) != 1:
        raise tok.error(f"{word} works on vectors (one extent); {t.describe()} has {len(t.extents)}")
    ext = it.program.extents[t.extents[0]].extent
    if ext.size is not None:
        if ext.size % VECTOR:
            raise tok.error(f"{word} moves {VECTOR} elements at a time, but #{ext.name} = {ext.size} is not a "
                            f"multiple of {VECTOR}")
        return
    it.builder.oblige(Obligation("divisible", f"#{ext.name} is a multiple of {VECTOR} ({word} of {t.label})",
                                 extent=ext.name, value=VECTOR))


def _reduce(op: str) -> Callable[[Interpreter, Token, list[Value]], list[Value]]:
    def run(it: Interpreter, tok: Token, v: list[Value]) -> list[Value]:
        val, ix = v
        word = "SUM-OVER" if op == "sum" else "MAX-OVER"
        if not isinstance(val, ScalarValue):
            raise tok.error(f"{word} reduces an element value r, got {val.describe()}")
        if not isinstance(ix, IndexValue) or not isinstance(ix.expr, IndexVar):
            raise tok.error(f"{word} reduces over an index variable, got {ix.describe()}")
        return [ScalarValue(tok, Reduce(op, (ix.expr,), val.expr))]

    return run


def _arith(word: str) -> Callable[[Interpreter, Token, list[Value]], list[Value] | None]:
    def run(it: Interpreter, tok: Token, v: list[Value]) -> list[Value] | None:
        target = it.program.find_word(word)
        assert target is not None, f"the prelude defines {word}"
        it.stack.extend(v)
        target.apply(it, tok)
        return None

    return run


def builtin_words() -> dict[str, Word]:
    table: list[BuiltinWord] = [
        BuiltinWord("DUP", _fx("( a -- a a )"), _dup, "copy the top value", accepts_unknown=True),
        BuiltinWord("DROP", _fx("( a -- )"), _drop, "discard the top value", accepts_unknown=True),
        BuiltinWord("SWAP", _fx("( a b -- b a )"), _swap, "exchange the top two values", accepts_unknown=True),
        BuiltinWord("OVER", _fx("( a b -- a b a )"), _over, "copy the second value", accepts_unknown=True),
        BuiltinWord("ROT", _fx("( a b c -- b c a )"), _rot, "rotate the third value to the top",
                    accepts_unknown=True),
        BuiltinWord("NIP", _fx("( a b -- b )"), _nip, "drop the second value", accepts_unknown=True),
        BuiltinWord("TUCK", _fx("( a b -- b a b )"), _tuck, "copy the top value under the second",
                    accepts_unknown=True),
        BuiltinWord("g", _fx("( -- g )"), _lane, "the lane index of an element-wise kernel"),
        BuiltinWord("LOAD-V4", _fx("( t g -- v )"), _load_v4, "the 4 elements of vector t at lane g"),
        BuiltinWord("STORE-V4", _fx("( v t g -- )"), _store_v4, "store 4 elements of v into t at lane g"),
        BuiltinWord("SUM-OVER", _fx("( r ix -- r )"), _reduce("sum"), "sum an element value over an index"),
        BuiltinWord("MAX-OVER", _fx("( r ix -- r )"), _reduce("max"), "maximum of an element value over an index"),
        BuiltinWord("+", _fx("( a b -- y )"), _arith("ADD"), "ADD", accepts_unknown=False),
        BuiltinWord("-", _fx("( a b -- y )"), _arith("SUB"), "SUB"),
        BuiltinWord("*", _fx("( a b -- y )"), _arith("MUL"), "MUL"),
        BuiltinWord("/", _fx("( a b -- y )"), _arith("DIV"), "DIV"),
    ]
    return {w.name: w for w in table}
