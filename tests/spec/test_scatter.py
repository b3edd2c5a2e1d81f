"""Scatter stores (`Y[IX[r] n] += ...`) and accumulates (`O[m n] += ...`) in the language: the IR they
parse to, the refusals (`FILE:LINE:COL: error:` with a caret), and their float64 and GF(p) meaning
(duplicate indices accumulate, as `np.add.at`; the target keeps its prior contents)."""

from __future__ import annotations

import numpy as np
import pytest

from habu.errors import HabuError
from habu.spec.evaluate import EvalError, Evaluator
from habu.spec.field import PrimeField
from habu.spec.ir import Gather, IndexVar, Load, Op
from habu.spec.parser import load_program, parse_text
from habu.spec.reference import evaluate
from tests.conftest import ERROR_HEAD, ROOT

DECLS = ("16 EXTENT: #R  5 EXTENT: #T  8 EXTENT: #N\n"
         "f32 TENSOR: X ( #R #N )  f32 TENSOR: W ( #R )  f32 TENSOR: Y ( #T #N )\n"
         "ITENSOR: IX ( #R #T )\n")


def model_of(equation: str, decls: str = DECLS, name: str = "S"):
    return parse_text(f"{decls}MODEL: {name}  {equation} ;\n", "s.habu").models[name]


def refusal(equation: str, decls: str = DECLS) -> HabuError:
    with pytest.raises(HabuError) as info:
        model_of(equation, decls)
    head = ERROR_HEAD.match(info.value.render().splitlines()[0])
    assert head and head.group("path") == "s.habu", info.value.render()
    assert "^" in info.value.render()
    return info.value


def test_a_scatter_parses_to_its_domain_and_store_indices():
    m = model_of("Y[IX[r] n] += W[r] · X[r n]")
    (eq,) = m.nodes
    r, n = IndexVar("r", "R"), IndexVar("n", "N")
    assert eq.lhs == (r, n) and eq.scatter == (Gather("IX", (r,)), n)
    assert {t.name for t in m.inputs} == {"W", "X", "Y", "IX"}  # Y's prior contents are read
    assert [t.name for t in m.outputs] == ["Y"]
    assert any(o.kind == "index-range" and o.tensor == "IX" for o in m.obligations)


def test_plus_equals_is_the_in_place_update_it_abbreviates():
    acc = model_of("Y[t n] += X[t n]", "8 EXTENT: #T  8 EXTENT: #N\nf32 TENSOR: X ( #T #N )  f32 TENSOR: Y ( #T #N )\n")
    (eq,) = acc.nodes
    assert eq.scatter is None and eq.rhs == Op("add", (Load("Y", eq.lhs), Load("X", eq.lhs)))
    spelled = model_of("Y[t n] = Y[t n] + X[t n]",
                       "8 EXTENT: #T  8 EXTENT: #N\nf32 TENSOR: X ( #T #N )  f32 TENSOR: Y ( #T #N )\n")
    assert acc.canonical_hash() == spelled.canonical_hash()
    assert "Y" in {t.name for t in acc.inputs}


def test_a_scatter_hashes_apart_from_its_plain_twin():
    decls = "5 EXTENT: #T  8 EXTENT: #N\nf32 TENSOR: X ( #T #N )  f32 TENSOR: Y ( #T #N )\nITENSOR: IX ( #T #T )\n"
    scatter = model_of("Y[IX[t] n] += X[t n]", decls)
    plain = model_of("Y[t n] += X[t n]", decls)
    assert scatter.canonical_hash() != plain.canonical_hash()


def test_assigning_through_a_gather_is_refused_as_ill_defined():
    err = refusal("Y[IX[r] n] = X[r n]")
    assert "ill-defined" in err.message and "several values would be written" in err.message
    assert any("+=" in n for n in err.notes)
    assert err.render().splitlines()[0].startswith("s.habu:4:")


@pytest.mark.parametrize("equation, fragment", [
    ("Y[IX[IX[r]] n] += X[r n]", "takes one index variable"),
    ("Y[IX[r] n] += X[r n] · Y[IX[r] n]", "reads Y"),
    ("Y[IX[r] r] += X[r r]", "appears twice on the left side"),
    ("Y[n IX[r]] += X[r n]", "index 1 is over #T, but n ranges over #N"),
    ("Y[X[r] n] += X[r n]", "is not an index tensor"),
    ("Y[IX[r] n] + = X[r n]", "without a space"),
    ("Y[IX[r] n] += X[r n2]", "index n2 is free on the right side"),
])
def test_scatter_refusals_name_what_is_wrong(equation, fragment):
    decls = DECLS.replace("ITENSOR: IX ( #R #T )", "ITENSOR: IX ( #R #T )") if "IX[IX" not in equation else \
        DECLS.replace("ITENSOR: IX ( #R #T )", "ITENSOR: IX ( #R #R )")
    assert fragment in refusal(equation, decls).message


def test_a_scatter_into_bf16_is_refused_naming_the_rule():
    err = refusal("Y[IX[r] n] += X[r n]", DECLS.replace("f32 TENSOR: Y", "bf16 TENSOR: Y"))
    assert "scatter-accumulates" in err.message and "declare Y f32" in err.message


def test_a_word_defines_its_output_with_equals_only():
    text = (DECLS + "WORD: ACC ( x[r n] -- y[r n] ) y[r n] += x[r n] ;\n")
    with pytest.raises(HabuError, match=r"\+= belongs in a MODEL"):
        parse_text(text, "w.habu")


def test_a_scatter_adds_every_duplicate_in_float64():
    m = model_of("Y[IX[r] n] += W[r] · X[r n]")
    rng = np.random.default_rng(0)
    x, w, y = rng.standard_normal((16, 8)), rng.standard_normal(16), rng.standard_normal((5, 8))
    ix = np.array([0, 0, 0, 4, 1, 2, 3, 4, 4, 0, 1, 1, 2, 2, 3, 0])
    want = y.copy()
    for r in range(16):
        want[ix[r]] += w[r] * x[r]
    got = evaluate(m, {"X": x, "W": w, "Y": y, "IX": ix})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(y, y.copy())  # the caller's prior contents are not changed


def test_a_scatter_adds_every_duplicate_over_gf_p():
    m = model_of("Y[IX[r] n] += W[r] · X[r n]")
    f = PrimeField()
    rng = np.random.default_rng(1)
    x, w, y = (rng.integers(0, f.p, s) for s in ((16, 8), (16,), (5, 8)))
    ix = np.zeros(16, np.int64)  # every row into row 0
    got = Evaluator(m, {"R": 16, "T": 5, "N": 8}, f).run({"X": x, "W": w, "Y": y, "IX": ix})["Y"]
    want = y.copy()
    want[0] = (y[0] + (w[:, None] * x % f.p).sum(axis=0)) % f.p
    np.testing.assert_array_equal(got, want)


def test_a_scatter_index_out_of_range_is_an_eval_error():
    m = model_of("Y[IX[r] n] += X[r n]")
    ix = np.arange(16)
    with pytest.raises(EvalError, match="outside #T"):
        evaluate(m, {"X": np.ones((16, 8)), "Y": np.zeros((5, 8)), "IX": ix})


def test_check_prints_the_scatter_as_written():
    from habu.spec.report import describe_program

    text = describe_program(load_program(ROOT / "examples" / "scatter_add.habu"))
    assert "Y[IX[r] n] += W[r] · X[r n]" in text and "Y[IX[r] n] <- W[r]" in text


def test_habu_eval_adds_into_the_given_prior_contents(tmp_path):
    """`habu eval` takes the target's prior contents as an input (its .npz names Y) and writes Y
    with every routed row added, duplicates included."""
    import subprocess
    import sys

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4096, 1024)).astype(np.float32)
    w, y = rng.standard_normal(4096).astype(np.float32), rng.standard_normal((2048, 1024)).astype(np.float32)
    ix = rng.integers(0, 2048, 4096).astype(np.int32)
    np.savez(tmp_path / "in.npz", X=x, W=w, Y=y, IX=ix)
    r = subprocess.run([sys.executable, "-m", "habu", "eval", str(ROOT / "examples" / "scatter_add.habu"),
                        "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    want = y.astype(np.float64)
    np.add.at(want, ix, w[:, None].astype(np.float64) * x)
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["Y"], want, rtol=1e-12, atol=1e-12)


def test_a_scatter_evaluated_on_a_box_agrees_with_the_whole_target():
    """The field check's reference evaluates a scatter on the checked box only (its domain restricted
    along plain positions, values landing outside the box dropped): the same elements as in full."""
    m = model_of("Y[IX[r] n] += W[r] · X[r n]")
    f = PrimeField()
    rng = np.random.default_rng(3)
    inputs = {"X": rng.integers(0, f.p, (16, 8)), "W": rng.integers(0, f.p, 16), "Y": rng.integers(0, f.p, (5, 8)),
              "IX": rng.integers(0, 5, 16)}
    sizes = {"R": 16, "T": 5, "N": 8}
    whole = Evaluator(m, sizes, f).run(inputs)["Y"]
    box = (np.array([0, 3, 4]), np.array([1, 6, 7]))  # partial along the gathered position too
    part = Evaluator(m, sizes, f, {"Y": box}).run(inputs)["Y"]
    np.testing.assert_array_equal(part.data, whole[np.ix_(*box)])


def test_regression_scatter_through_a_grouping_named_like_its_extent():
    # habu grad writes the MoE weight gradient `dW1[E[r] h d] += ...` where the grouping E ranges over #E: the left
    # side took `E` for an index variable of #E and refused the `[` after it
    decls = ("4 EXTENT: #R  3 EXTENT: #E  2 EXTENT: #H\nf32 TENSOR: G ( #R #H )  f32 TENSOR: DW ( #E #H )\n"
             "GROUPS: E ( #R #E )\n")
    m = model_of("DW[E[r] h] += G[r h]", decls)
    assert m.nodes[0].scatter == (Gather("E", (IndexVar("r", "R"),)), IndexVar("h", "H"))
