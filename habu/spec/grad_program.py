"""Deriving the backward of a model of a program, with errors at the place in its file: a gradient
through a function without a derivative rule is reported at the word of the model that uses it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from habu.errors import HabuError, Span
from habu.spec.grad import Backward, NotDifferentiable, derive
from habu.spec.grad_save import SavePolicy
from habu.spec.ir import Model, Op, walk
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


# ----------------------------------------------------------------------------- backward models by name

GRAD_SUFFIX = "-GRAD"


def backward_name(model_name: str, save: str = "auto") -> str:
    """The name a derived backward model goes by in searches, the plan database and `habu.load`:
    `NAME-GRAD` (save policy auto) or `NAME-GRAD-SAVE` / `NAME-GRAD-RECOMPUTE`; `with_backward`
    derives it again from the name alone (a search's workers and timer read the source by name)."""
    return model_name + GRAD_SUFFIX + ("" if save == "auto" else f"-{save.upper()}")


def backward_of(name: str) -> tuple[str, str] | None:
    """(forward model, save mode) of a `backward_name`, or None for a forward model's name."""
    from habu.spec.grad_save import SaveMode

    for mode in SaveMode:
        suffix = GRAD_SUFFIX + ("" if mode is SaveMode.AUTO else f"-{mode.value.upper()}")
        if name.upper().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], mode.value
    return None


def with_backward(program: Program, name: str | None) -> Program:
    """`program` with the backward model `name` (a `backward_name`) derived and added under that name when
    it names one the file does not define; otherwise `program` as it is."""
    from dataclasses import replace

    from habu.spec.grad_save import SaveMode

    if name is None or name in program.models:
        return program
    parsed = backward_of(name)
    if parsed is None or parsed[0] not in program.models:
        return program
    forward, mode = parsed
    bw = derive_model(program, forward, None, SavePolicy(SaveMode(mode)))
    program.models[name] = replace(bw.model, name=name, backward_of=forward)
    program.model_spans[name] = program.model_spans.get(forward)
    return program


def direction(model: Model) -> str:
    """'backward' for a backward model `with_backward` derived, else 'forward' (the plan database keys
    them apart); a model its file defines is forward even when its name ends in -GRAD."""
    return "backward" if model.backward_of is not None else "forward"
