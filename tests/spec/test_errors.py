"""Every kind of user mistake: FILE:LINE:COL: error: message, the line, a caret; never a traceback."""

from __future__ import annotations

import pytest

from habu.errors import HabuError, Source
from habu.spec.parser import parse_source
from tests.conftest import assert_error_format, error_of, where

GOOD = """128 EXTENT: #M
64 EXTENT: #N
32 EXTENT: #K
TENSOR: A ( #M #K )
TENSOR: B ( #N #K )
TENSOR: O ( #M #N )
MODEL: G O[m n] = Σ k A[m k] · B[n k] ;
"""

CASES = {
    "unknown word": ("128 EXTENT: #M\nFROB\n", (2, 1), "unknown word FROB"),
    "unknown word in a body": (GOOD + "MODEL: H ( a -- o ) GELU FROBNICATE ;\n", (8, 26), "unknown word FROBNICATE"),
    "undeclared tensor": (GOOD.replace("B[n k] ;", "C[n k] ;"), (7, 32), "unknown tensor C"),
    "undeclared extent": ("TENSOR: A ( #M #K )\n", (1, 13), "unknown extent #M"),
    "wrong arity": (GOOD.replace("A[m k]", "A[m]"), (7, 23), "A has 2 extents"),
    "mismatched extents": (GOOD.replace("A[m k]", "A[k m]"), (7, 25), "#M"),
    "missing ; after a model": (GOOD.rstrip().rstrip(";") + "\n", (7, 1), "has no closing ;"),
    "missing ; after a definition": (GOOD + ": F ( a -- b ) GELU\n", (8, 1), "has no closing ;"),
    "unterminated ( comment": ("128 EXTENT: #M ( never closed\n", (1, 16), "unterminated ( comment"),
    "unterminated shape": ("128 EXTENT: #M\nTENSOR: A ( #M\n", (2, 11), "no closing )"),
    "empty file": ("", (1, 1), "the file is empty"),
    "only comments": ("\\ nothing here\n( nor here )\n", (1, 1), "only comments"),
    "huge extent": ("99999999999999999999999999 EXTENT: #M\n", (1, 1), "too large for an extent"),
    "zero extent": ("0 EXTENT: #M\n", (1, 1), "at least one element"),
    "huge constant": (GOOD.replace("Σ k", "1e300 · Σ k"), (7, 19), "too large"),
    "number never used": ("128 EXTENT: #M 7\n", (1, 16), "never used"),
    "EXTENT: without a size": ("EXTENT: #M\n", (1, 1), "takes a size"),
    "extent redeclared": ("1 EXTENT: #M 2 EXTENT: #M\n", (1, 24), "already declared at t.habu:1:11"),
    "bad extent name": ("1 EXTENT: M\n", (1, 11), "start with #"),
    "index tensor of floats": ("1 EXTENT: #M f32 ITENSOR: I ( #M #M )\n", (1, 14), "holds integers"),
    "deep nesting": (GOOD.replace("Σ k A[m k] · B[n k]", "(" * 500 + "1" + ")" * 500), None, "nested too deeply"),
    "long word chain": (GOOD + "".join(f": W{i} ( a -- b ) {'W' + str(i - 1) if i else 'GELU'} ;\n" for i in range(80))
                        + "MODEL: H ( a -- o ) W79 ;\n", None, "nested more than"),
    "token too long": ("x" * 5000 + "\n", (1, 1), "too long"),
    "; alone": ("; \n", (1, 1), "without a definition"),
    "word at top level": ("GELU\n", (1, 1), "not at the top level"),
    "tensor named like a word": ("1 EXTENT: #M TENSOR: GELU ( #M )\n", (1, 22), "already a word"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_user_mistake_is_reported_at_its_place(name):
    text, pos, fragment = CASES[name]
    err = error_of(text)
    assert fragment in err.render(), err.render()
    assert_error_format(err)
    if pos is not None:
        assert where(err) == pos, err.render()


def test_recursion_is_impossible_a_word_is_unknown_inside_itself():
    err = error_of(GOOD + ": LOOP ( a -- b ) LOOP ;\n")
    assert "unknown word LOOP" in err.message


def test_non_utf8_bytes_point_at_the_bad_byte():
    data = GOOD.encode() + b"\\ caf\xe9 \xff\n"
    with pytest.raises(HabuError) as info:
        parse_source(Source.from_bytes("t.habu", data))
    err = info.value
    assert "not UTF-8" in err.message and "0xe9" in err.message
    assert where(err) == (8, 6)
    assert_error_format(err)


def test_tabs_keep_the_caret_under_the_column():
    err = error_of("\t\t128 EXTENT: #M\n\tTENSOR: A ( #M #Q )\n")
    lines = err.render().split("\n")
    assert lines[2].startswith("\t") and lines[2].strip() == "^~"
