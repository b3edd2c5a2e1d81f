"""Stack effects: `( x w1 b1 w2 b2 -- y )`, `( x[r i] w[i o] -- y[r o] )`, `( x -- y | w b )`,
`( ix<#M> ix<#K> -- r )`.

An item is a name, a name with an index pattern over extent variables (`x[r i]`), or a type:
`ix<#M>` (an index over #M) or `r` (an element value). After `|` come the word's parameters: the
tensors it takes, in order, from its caller's parameters (LINEAR takes a weight and a bias).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from habu.errors import HabuError, Span
from habu.spec.lexer import Token

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_']*$")
_INDEX_TYPE = re.compile(r"^ix<#([A-Za-z_][A-Za-z0-9_]*)>$")


@dataclass(frozen=True)
class EffectItem:
    name: str
    span: Span
    pattern: tuple[str, ...] | None = None  # extent variables, for x[r i]
    index_of: str | None = None  # ix<#M>: an index over extent M
    is_element: bool = False  # r: an element value

    def show(self) -> str:
        if self.pattern is not None:
            return f"{self.name}[{' '.join(self.pattern)}]"
        return self.name


@dataclass(frozen=True)
class Effect:
    inputs: tuple[EffectItem, ...]
    outputs: tuple[EffectItem, ...]
    params: tuple[EffectItem, ...] = ()
    span: Span | None = None

    def show(self) -> str:
        text = " ".join(i.show() for i in self.inputs)
        out = " ".join(o.show() for o in self.outputs)
        s = f"( {text} -- {out}".replace("(  --", "( --")
        if self.params:
            s += " | " + " ".join(p.show() for p in self.params)
        return s.rstrip() + " )"

    @property
    def typed(self) -> bool:
        return any(i.pattern is not None for i in (*self.inputs, *self.outputs))


def parse_effect(group_span: Span, words: list[Token], what: str) -> Effect:
    """Parse the words of a `( ... )` group as a stack effect."""
    sections: list[list[EffectItem]] = [[]]
    seen_dash = seen_bar = False
    i = 0
    while i < len(words):
        tok = words[i]
        text = tok.text
        if text == "--":
            if seen_dash:
                raise tok.error(f"two -- in the stack effect of {what}")
            seen_dash = True
            sections.append([])
            i += 1
            continue
        if text == "|":
            if not seen_dash:
                raise tok.error(f"| (parameters) must come after -- in the stack effect of {what}")
            if seen_bar:
                raise tok.error(f"two | in the stack effect of {what}")
            seen_bar = True
            sections.append([])
            i += 1
            continue
        # a pattern may be split over several words: x[r  i]  or  x[ r i ]
        if "[" in text:
            parts = [text]
            j = i
            while "]" not in parts[-1]:
                j += 1
                if j >= len(words):
                    raise tok.error(f"missing ] in the stack effect of {what}")
                parts.append(words[j].text)
            joined = " ".join(parts)
            i = j + 1
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_']*)\[(.*)\]$", joined)
            if not m:
                raise tok.error(f"malformed pattern {joined!r}: write name[r i] with extent variables")
            vars_ = tuple(v for v in m.group(2).split() if v)
            for v in vars_:
                if not _NAME.match(v) or v != v.lower():
                    raise tok.error(f"{v!r} in {joined!r} is not an extent variable (lower-case letters)")
            sections[-1].append(EffectItem(m.group(1), tok.span, pattern=vars_))
            continue
        m = _INDEX_TYPE.match(text)
        if m:
            sections[-1].append(EffectItem(text, tok.span, index_of=m.group(1)))
        elif text == "r":
            sections[-1].append(EffectItem(text, tok.span, is_element=True))
        elif _NAME.match(text):
            sections[-1].append(EffectItem(text, tok.span))
        else:
            raise tok.error(f"{text!r} is not a stack-effect item (a name, name[r i], ix<#M> or r)")
        i += 1
    if not seen_dash:
        raise HabuError(f"the stack effect of {what} needs -- between inputs and outputs", group_span)
    inputs = tuple(sections[0])
    outputs = tuple(sections[1])
    params = tuple(sections[2]) if seen_bar else ()
    names = [it.name for it in (*inputs, *params) if it.index_of is None and not it.is_element]
    for it in params:
        if names.count(it.name) > 1:
            raise HabuError(f"parameter {it.name} is named twice in the stack effect of {what}", it.span)
    return Effect(inputs, outputs, params, group_span)
