"""Reading Habu source: Forth's input stream of whitespace-separated words, and the finer tokens of
equations.

As in Forth, the defining words read ahead: `EXTENT:` takes the next word as its name, `TENSOR:`
reads a `( ... )` group, `MODEL:` reads an equation up to `;`. `\\` starts a comment to the end of
the line; outside of those groups `( ... )` is a comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from habu.errors import HabuError, Source, Span

MAX_TOKEN = 256  # longer words are certainly a mistake (and would make error lines unreadable)


@dataclass(frozen=True)
class Token:
    text: str
    span: Span

    def error(self, message: str, *notes: str) -> HabuError:
        return HabuError(message, self.span, notes)


class Reader:
    """A cursor over a source: the input stream the defining words read from."""

    def __init__(self, source: Source):
        self.source = source
        self.text = source.text
        self.pos = 0

    def span(self, start: int, end: int) -> Span:
        return Span(self.source, start, max(1, end - start))

    def eof_span(self) -> Span:
        # point at the last character of the file (or the start of an empty one)
        return Span(self.source, max(0, len(self.text.rstrip()) - 1), 1)

    # -- raw scanning
    def _skip_space(self) -> None:
        m = _SPACE.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()

    def _scan_word(self) -> Token | None:
        m = _SPACE_THEN_WORD.match(self.text, self.pos)
        assert m is not None  # the pattern matches the empty string
        start, self.pos = m.span(1)
        if start == self.pos:
            return None
        tok = Token(self.text[start : self.pos], self.span(start, self.pos))
        if len(tok.text) > MAX_TOKEN:
            raise HabuError(f"a word of {len(tok.text)} characters is too long (at most {MAX_TOKEN})",
                            Span(self.source, start, 1))
        return tok

    def _skip_line(self) -> None:
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end

    def _skip_paren_comment(self, open_tok: Token) -> None:
        # a ( comment ends at the first ')' character
        end = self.text.find(")", open_tok.span.offset + 1)
        if end < 0:
            raise HabuError("unterminated ( comment: no closing )", Span(self.source, open_tok.span.offset, 1))
        self.pos = end + 1

    # -- words
    def next_word(self, paren_comments: bool = True) -> Token | None:
        """The next word, skipping comments; None at the end of the source."""
        while True:
            tok = self._scan_word()
            if tok is None:
                return None
            if tok.text.startswith("\\"):
                self.pos = tok.span.offset
                self._skip_line()
                continue
            if paren_comments and tok.text.startswith("("):
                self._skip_paren_comment(tok)
                continue
            return tok

    def peek_char(self) -> str:
        """The next non-space character ('' at the end), skipping `\\` comments."""
        save = self.pos
        while True:
            self._skip_space()
            if self.pos < len(self.text) and self.text[self.pos] == "\\":
                self._skip_line()
                continue
            ch = self.text[self.pos] if self.pos < len(self.text) else ""
            self.pos = save
            return ch

    def read_group(self, what: str, after: Token) -> tuple[Span, list[Token]]:
        """Read a `( ... )` group (the parentheses may touch the words inside)."""
        self._skip_space_and_line_comments()
        if self.pos >= len(self.text) or self.text[self.pos] != "(":
            got = self._scan_word()
            if got is None:
                raise HabuError(f"expected ( {what} ) after {after.text}", self.eof_span())
            raise got.error(f"expected ( {what} ) after {after.text}, found {got.text!r}")
        open_at = self.pos
        self.pos += 1
        words: list[Token] = []
        n = len(self.text)
        while True:
            while self.pos < n and self.text[self.pos].isspace():
                self.pos += 1
            if self.pos >= n:
                raise HabuError(f"unterminated ( {what} ): no closing )", Span(self.source, open_at, 1))
            ch = self.text[self.pos]
            if ch == ")":
                self.pos += 1
                return self.span(open_at, self.pos), words
            if ch == "\\":
                self._skip_line()
                continue
            if ch == "(":
                raise HabuError(f"( inside ( {what} )", Span(self.source, self.pos, 1))
            start = self.pos
            while self.pos < n and not self.text[self.pos].isspace() and self.text[self.pos] not in "()":
                self.pos += 1
            if self.pos - start > MAX_TOKEN:
                raise HabuError(f"a word of {self.pos - start} characters is too long (at most {MAX_TOKEN})",
                                Span(self.source, start, 1))
            words.append(Token(self.text[start : self.pos], self.span(start, self.pos)))

    def _skip_space_and_line_comments(self) -> None:
        while True:
            self._skip_space()
            if self.pos < len(self.text) and self.text[self.pos] == "\\":
                self._skip_line()
                continue
            return

    def read_body(self, what: str, opener: Token) -> tuple[list[Token], Token]:
        """Words up to the closing `;` of a definition; returns them and the `;`."""
        words: list[Token] = []
        while True:
            tok = self.next_word()
            if tok is None:
                glued = [w.text for w in words if w.text.endswith(";")]
                notes = (f"put a space before ; in {glued[0]!r}",) if glued else ()
                raise opener.error(f"{what} has no closing ;", *notes)
            if tok.text == ";":
                return words, tok
            words.append(tok)

    # -- equation tokens
    def equation_tokens(self, what: str, opener: Token) -> tuple[list[Token], Token]:
        """The tokens of an equation up to its closing `;` (which is returned separately)."""
        tokens: list[Token] = []
        text, n = self.text, len(self.text)
        while True:
            while self.pos < n and text[self.pos].isspace():
                self.pos += 1
            if self.pos >= n:
                raise opener.error(f"{what} has no closing ;")
            ch = text[self.pos]
            start = self.pos
            if ch == "\\":
                self._skip_line()
                continue
            if ch == ";":
                self.pos += 1
                return tokens, Token(";", self.span(start, self.pos))
            if _ident_start(ch):
                self.pos += 1
                while self.pos < n and _ident_char(text[self.pos]):
                    self.pos += 1
            elif ch.isdigit() or (ch == "." and self.pos + 1 < n and text[self.pos + 1].isdigit()):
                self.pos = _scan_number(text, self.pos)
            elif ch in SYMBOLS:
                self.pos += 1
            else:
                raise HabuError(f"unexpected character {ch!r} in {what}", Span(self.source, start, 1))
            tok = Token(text[start : self.pos], self.span(start, self.pos))
            if len(tok.text) > MAX_TOKEN:
                raise HabuError(f"a token of {len(tok.text)} characters is too long", Span(self.source, start, 1))
            tokens.append(tok)


_SPACE = re.compile(r"\s*")
_SPACE_THEN_WORD = re.compile(r"\s*(\S*)")
SYMBOLS = set("[](),=+-−*·×/^²Σ<>≤≥≠∞")


def _ident_start(ch: str) -> bool:
    return (ch.isalpha() and ch != "Σ") or ch in "_#"


def _ident_char(ch: str) -> bool:
    return (ch.isalnum() and ch not in "Σ²") or ch in "_'"


def _scan_number(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and (text[pos].isdigit() or text[pos] == "_"):
        pos += 1
    if pos < n and text[pos] == "." and not text.startswith("..", pos):
        pos += 1
        while pos < n and text[pos].isdigit():
            pos += 1
    if pos < n and text[pos] in "eE":
        save = pos
        pos += 1
        if pos < n and text[pos] in "+-":
            pos += 1
        if pos < n and text[pos].isdigit():
            while pos < n and text[pos].isdigit():
                pos += 1
        else:
            pos = save
    return pos
