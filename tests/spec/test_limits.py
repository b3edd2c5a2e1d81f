"""Inputs that are large rather than wrong: long operator chains, exponential word definitions, many
declarations, huge tokens. Each either works in time linear in its size or is refused with
`FILE:LINE:COL: error:` naming the limit; none reaches Python's recursion limit."""

from __future__ import annotations

import time

import numpy as np
import pytest

from habu.spec.builder import MAX_EXPR_HEIGHT, MAX_EXPR_NODES
from habu.spec.equation import format_expr
from habu.spec.field import PrimeField, evaluate_field
from habu.spec.ir import Const, IndexVar, Load, Op, expr_size, free_vars, rename_vars, walk
from habu.spec.reference import evaluate
from habu.spec.words import MAX_EXPANSION, Interpreter
from tests.conftest import assert_error_format, error_of, parse

HEAD = "8 EXTENT: #M\nTENSOR: X ( #M )\nTENSOR: Y ( #M )\n"


def chain(n: int, op: str = "+") -> str:
    return HEAD + "MODEL: M Y[m] = X[m]" + f" {op} 1" * n + " ;\n"


@pytest.mark.parametrize("n", [500, 5000])
def test_regression_flat_chain_of_500_terms_hit_recursion_error_in_ir(n):
    model = parse(chain(n)).models["M"]
    rhs = model.nodes[0].rhs
    assert expr_size(rhs).height == n + 1 and sum(1 for _ in walk(rhs)) == 2 * n + 1
    assert len(model.canonical_hash()) == 64
    assert free_vars(rhs) == {IndexVar("m", "M")}
    text = format_expr(rhs)
    assert text.startswith("X[m] + 1 + 1") and text.count("+") == n
    renamed = rename_vars(rhs, {IndexVar("m", "M"): IndexVar("q", "M")})
    assert format_expr(renamed).startswith("X[q] + 1")
    x = np.arange(8.0)
    assert np.array_equal(evaluate(model, {"X": x})["Y"], x + n)
    field = PrimeField()
    got = evaluate_field(model, {"X": np.arange(8)}, field)["Y"]
    assert np.array_equal(got, (field.from_input("X", np.arange(8)) + n) % field.p)


def test_regression_flat_chain_hash_is_the_one_json_dumps_gives():
    import hashlib
    import json

    model = parse(chain(50, "·")).models["M"]
    text = json.dumps(model.canonical(), sort_keys=True, separators=(",", ":"))
    assert model.canonical_hash() == hashlib.sha256(text.encode()).hexdigest()


def test_regression_parenthesised_formatting_is_unchanged_by_the_iterative_printer():
    x = Load("X", (IndexVar("m", "M"),))
    e = Op("mul", (Op("add", (x, Const(-1))), Op("neg", (Op("exp", (Op("sub", (x, x)),)),))))
    assert format_expr(e) == "(X[m] + (-1)) · −exp(X[m] − X[m])"
    assert format_expr(Op("sub", (x, Op("sub", (x, x))))) == "X[m] − (X[m] − X[m])"


def test_regression_chain_beyond_the_limit_is_a_clean_error():
    err = error_of(chain(MAX_EXPR_HEIGHT + 5))
    assert f"at most {MAX_EXPR_HEIGHT:,}" in err.message and "chain" in err.message
    assert_error_format(err)
    assert len(err.render()) < 1000  # the 40 kB line is shown around the column only


def test_regression_power_tower_is_refused_by_its_tree_size():
    err = error_of(HEAD + "MODEL: M Y[m] = X[m]^16^16^16^16^16^16^16^16 ;\n")
    assert "nodes" in err.message and f"at most {MAX_EXPR_NODES:,}" in err.message
    assert_error_format(err)


def test_regression_gathers_nested_by_words_are_refused_not_recursed():
    text = (HEAD + "ITENSOR: IX ( #M #M )\nMODEL: M ( -- Y ) m " + "IX@ " * 3000 + "X@ m Y! ;\n")
    err = error_of(text)
    assert "nests reductions and gathers 3000 deep" in err.message
    assert_error_format(err)


def test_regression_element_words_chained_5000_times_fold_without_recursion():
    # `1 +` five thousand times on an element value: one node, a 5,000-long chain
    text = HEAD + "MODEL: M ( -- ) m X@ " + "1 + " * 5000 + "m Y! ;\n"
    model = parse(text).models["M"]
    assert expr_size(model.nodes[0].rhs).height == 5001
    assert np.array_equal(evaluate(model, {"X": np.ones(8)})["Y"], np.full(8, 5001.0))


def doubling_words(n: int) -> str:
    return (HEAD + ": W0 ( x -- y ) GELU ;\n"
            + "".join(f": W{i} ( x -- y ) W{i - 1} W{i - 1} ;\n" for i in range(1, n + 1))
            + f"MODEL: M ( X -- Y ) W{n} ;\n")


def test_regression_doubling_words_to_w16_ran_56_seconds():
    start = time.process_time()
    err = error_of(doubling_words(16))
    assert time.process_time() - start < 15
    assert err.message == f"W13 would expand to 24,574 words (at most {MAX_EXPANSION:,})", err.message
    assert any("W12 alone runs 12,287 words" in n for n in err.notes)
    assert_error_format(err)
    assert err.span is not None and (err.span.line, err.span.col) == (17, 3)


def test_regression_expansion_bound_equals_the_words_the_interpreter_runs(monkeypatch):
    steps: list[int] = []
    real_run = Interpreter.run

    def run(self, tokens):
        real_run(self, tokens)
        if len(self.frames) == 1 and self.frames[0].owner == "MODEL M":
            steps.append(self.steps)

    monkeypatch.setattr(Interpreter, "run", run)
    program = parse(doubling_words(6))
    assert program.words["W6"].expansion == 2 * (1 + program.words["W5"].expansion)
    assert steps == [1 + program.words["W6"].expansion]
    assert len(program.models["M"].nodes) == 2**6


def test_regression_model_body_is_bounded_before_it_runs():
    body = "W11 " * 5
    text = doubling_words(11).replace("MODEL: M ( X -- Y ) W11 ;", f"MODEL: M ( X -- Y ) {body};")
    err = error_of(text)
    assert "MODEL M would expand to" in err.message and "W11 alone runs 6,143 words" in " ".join(err.notes)


def test_regression_32k_extent_lines_took_39_seconds():
    text = "".join(f"4 EXTENT: #E{i}\nTENSOR: T{i} ( #E{i} )\n" for i in range(20_000))
    start = time.process_time()
    program = parse(text + "MODEL: M T7[e7] = T7[e7] + T19999[0] ;\n")
    assert time.process_time() - start < 10
    assert len(program.extents) == 20_000 and program.find_tensor("t7") is program.tensors["T7"]


def test_regression_extent_differing_only_in_case_still_refused():
    err = error_of("4 EXTENT: #Ab\n4 EXTENT: #ab\n")
    assert "differs from #Ab only in case" in err.message


def test_regression_5mb_token_echoed_all_of_it():
    err = error_of("4 EXTENT: #M\n" + "x" * 5_000_000 + "\n")
    assert "too long" in err.message
    text = err.render()
    assert len(text) < 1000
    assert_error_format(err)


def test_regression_long_word_in_a_group_is_refused():
    err = error_of("4 EXTENT: #M\nTENSOR: A ( " + "#" * 100_000 + " )\n")
    assert "too long" in err.message and len(err.render()) < 1000


@pytest.mark.parametrize("k", [0, 500, 9_999])
def test_regression_long_line_error_keeps_the_caret_under_its_column(k):
    terms = ["1"] * 10_000
    terms[k] = "@"
    line = "MODEL: M Y[m] = X[m] + " + " + ".join(terms) + " ;"  # 40,022 characters
    err = error_of(HEAD + line + "\n")
    assert "unexpected character '@'" in err.message
    shown, caret = err.render().split("\n")[1:3]
    assert len(shown) <= 160 and shown[len(caret) - 1] == "@"
    assert shown.startswith("…") == (k > 0) and shown.endswith("…") == (k < 9_999)
    assert_error_format(err)


@pytest.mark.parametrize("literal, where", [("1e99999999", "equation"), ("1e-99999999", "equation"),
                                             ("1e99999999", "word")])
def test_regression_huge_decimal_exponent_hung_making_the_fraction(literal, where):
    start = time.process_time()
    if where == "equation":
        err = error_of(HEAD + f"MODEL: M Y[m] = X[m] + {literal} ;\n")
        assert "a decimal exponent is at most 400" in err.message
    else:
        err = error_of(HEAD + f"MODEL: M ( X -- Y ) {literal} ADD ;\n")
        assert f"unknown word {literal}" in err.message
    assert time.process_time() - start < 2
    assert_error_format(err)


def test_exponent_400_is_still_exact():
    model = parse(HEAD + "MODEL: M Y[m] = X[m] · 1e-400 + 1e38 ;\n").models["M"]
    from fractions import Fraction

    rhs = model.nodes[0].rhs
    assert isinstance(rhs, Op) and isinstance(rhs.args[0], Op)
    assert rhs.args[0].args[1] == Const(Fraction(1, 10**400)) and rhs.args[1] == Const(Fraction(10**38))


@pytest.mark.parametrize("body, says", [
    ("m X@ m " + "IX@ " * 3000 + "SUM-OVER", "got the index IX[IX["),
    ("m X@ " + "1 + " * 3000 + "X@", "got the element value X[m] + 1 + 1"),
])
def test_regression_error_describing_a_deep_value_recursed_and_echoed_all_of_it(body, says):
    err = error_of(HEAD + "ITENSOR: IX ( #M #M )\nMODEL: M ( -- ) " + body + " m Y! ;\n")
    assert says in err.message and len(err.message) < 200, err.message
    assert_error_format(err)


def test_regression_hashing_a_5000_term_chain_recursed_in_the_dataclass_hash():
    import pickle

    a = parse(chain(5000)).models["M"].nodes[0].rhs
    b = parse(chain(5000)).models["M"].nodes[0].rhs
    assert a is not b and hash(a) == hash(b)  # (== on two distinct 5,000-deep trees still recurses)
    small = parse(chain(3)).models["M"].nodes[0].rhs
    again = pickle.loads(pickle.dumps(small))  # the cached hash is recomputed, not unpickled
    assert again == small and hash(again) == hash(small)
