"""User-facing errors: `FILE:LINE:COL: error: message`, the source line and a caret.

Every mistake a user can make in a `.habu` file or on the command line is a `HabuError`. The CLI
prints `err.render()` and exits 1; a Python traceback reaching a user is a bug.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field


@dataclass(frozen=True, eq=False)
class Source:
    """A program text and the name it is reported under."""

    path: str
    text: str
    _line_starts: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = [0, *(m.end() for m in re.finditer("\n", self.text))]
        object.__setattr__(self, "_line_starts", starts)

    @staticmethod
    def from_bytes(path: str, data: bytes) -> Source:
        """Decode UTF-8, reporting the first bad byte at its line and column."""
        try:
            return Source(path, data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            good = data[: exc.start].decode("utf-8")
            src = Source(path, good)
            raise HabuError(
                f"the file is not UTF-8: byte 0x{data[exc.start]:02x} cannot start a character",
                Span(src, len(good), 1),
            ) from None

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column (in characters) of a character offset."""
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def line_text(self, line: int) -> str:
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]


@dataclass(frozen=True)
class Span:
    """A range of characters in a source: where an error points."""

    source: Source
    offset: int
    length: int = 1

    @property
    def line(self) -> int:
        return self.source.line_col(self.offset)[0]

    @property
    def col(self) -> int:
        return self.source.line_col(self.offset)[1]

    def to(self, other: Span) -> Span:
        """The span from the start of this one to the end of `other`."""
        end = max(self.offset + self.length, other.offset + other.length)
        return Span(self.source, self.offset, end - self.offset)

    def __repr__(self) -> str:
        return f"Span({self.source.path}:{self.line}:{self.col}+{self.length})"


class HabuError(Exception):
    """A mistake in the user's input, reported with its location."""

    def __init__(self, message: str, span: Span | None = None, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = tuple(notes)

    def render(self) -> str:
        lines: list[str] = []
        if self.span is None:
            lines.append(f"habu: error: {self.message}")
        else:
            src = self.span.source
            line, col = src.line_col(self.span.offset)
            lines.append(f"{src.path}:{line}:{col}: error: {self.message}")
            text, col = _window(src.line_text(line), col)
            lines.append(text)
            # keep tabs so the caret lines up under tab-indented code
            pad = "".join("\t" if ch == "\t" else " " for ch in text[: col - 1])
            width = max(1, min(self.span.length, len(text) - (col - 1)))
            lines.append(pad + "^" + "~" * (width - 1))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


SHOWN_LINE = 160  # an error shows at most this many characters of its source line


def _window(text: str, col: int) -> tuple[str, int]:
    """At most `SHOWN_LINE` characters of a source line around 1-based column `col`, with `…` where
    the line is cut, and the column of the same character in what is shown."""
    if len(text) <= SHOWN_LINE:
        return text, col
    start = max(0, min(col - 1 - SHOWN_LINE // 3, len(text) - SHOWN_LINE))
    end = start + SHOWN_LINE
    shown = text[start:end]
    if start > 0:
        shown, col = "…" + shown[1:], col - start
    if end < len(text):
        shown = shown[:-1] + "…"
    return shown, col


class UsageError(HabuError):
    """A mistake on the command line or in an API call (no source location)."""
