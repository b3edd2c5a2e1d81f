"""The backend's nesting limit: a model `habu check` accepts either compiles or is refused in one line."""

from __future__ import annotations

import pytest

from habu.compile import compile_model
from habu.errors import HabuError
from habu.plan.limits import MAX_NESTING, nesting
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.conftest import assert_error_format


def _chain(terms: int):
    chain = " + ".join(["1"] * terms)
    text = f"64 EXTENT: #M\nTENSOR: X ( #M )\nTENSOR: Y ( #M )\nMODEL: M Y[m] = X[m] + {chain} ;\n"
    return parse_text(text, "t.habu")


def test_regression_compile_of_a_500_term_chain_gave_a_recursion_error_in_verify():
    """`habu check` takes a 500-term chain since the spec's walks are iterative; `habu compile` crashed
    with RecursionError in prove/verify.py's degree bound (and deeper, in the interpreter)."""
    program = _chain(500)
    assert nesting(program.models["M"].nodes[0].rhs) == 501
    with pytest.raises(HabuError) as info:
        compile_model(program, "M", {}, TARGETS["sm_90a"], {}, trials=1)
    assert f"nests 501 operations deep; the compiler builds at most {MAX_NESTING}" in info.value.message
    assert_error_format(info.value)


def test_a_chain_within_the_limit_compiles_and_is_proven():
    compiled = compile_model(_chain(MAX_NESTING - 2), "M", {}, TARGETS["sm_90a"], {}, trials=1)
    assert all(p.ok for p in compiled.proofs)
