"""Deriving the backward of a model of a program, with errors at the place in its file: a gradient
through a function without a derivative rule is reported at the word of the model that uses it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from habu.errors import HabuError, Span
from habu.spec.grad import Backward, NotDifferentiable, SavePolicy, derive
from habu.spec.ir import Op, walk
from habu.spec.program import Program
from habu.spec.words import ColonWord, ElementwiseWord, EquationWord, Word


def _uses(word: Word, fn: str, seen: set[int]) -> bool:
    """Whether running `word` applies the function `fn`."""
    if id(word) in seen:
        return False
    seen.add(id(word))
    if isinstance(word, EquationWord):
        return any(isinstance(e, Op) and e.fn == fn for e in walk(word.template.rhs))
    if isinstance(word, ElementwiseWord):
        return any(isinstance(e, Op) and e.fn == fn for e in walk(word.body))
    if isinstance(word, ColonWord):
        for tok in word.body:
            inner = word.env.get(tok.text) or word.env.get(tok.text.upper())
            if inner is not None and _uses(inner, fn, seen):
                return True
    return False


def _word_span(program: Program, model_name: str, word: str) -> Span | None:
    """Where the model's body uses `word` (its first use after the model's name)."""
    span = program.model_spans.get(model_name)
    if span is None:
        return None
    text = span.source.text
    m = re.compile(r"(?<!\S)" + re.escape(word) + r"(?!\S)").search(text, span.offset + span.length)
    return Span(span.source, m.start(), len(word)) if m else span


def derive_model(program: Program, model_name: str, wrt: Iterable[str] | None = None,
                 policy: SavePolicy | None = None) -> Backward:
    """`derive` on a model of `program`; every refusal is a HabuError at the model or at its word."""
    model = program.model(model_name)
    span = program.model_spans.get(model.name)
    try:
        return derive(model, wrt, policy)
    except NotDifferentiable as err:
        for w in model.words:
            word = program.find_word(w)
            if word is not None and _uses(word, err.function, set()):
                raise HabuError(f"cannot differentiate {model.name}: its word {word.name} uses {err.function}(), "
                                f"which has no derivative ({err.message})", _word_span(program, model.name, w),
                                (f"{err.function} is piecewise constant: its gradient is zero where it exists; "
                                 "write the word without it (max, min and abs have derivative rules)",)) from None
        raise HabuError(f"cannot differentiate {model.name}: {err.message}", span) from None
    except HabuError as err:
        if err.span is None:
            raise HabuError(err.message, span, err.notes) from None
        raise
