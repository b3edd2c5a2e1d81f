"""The equation is the program: a random well-typed model (tests/random_models.py) and its derived backward either
compile to a proven plan (the rules, a finite-field trial, NVRTC) or are refused in one line naming why (a
HabuError that is not a plan the proof found wrong). A default plan the field check refuses is a bug in the
planner, a lowering or an evaluator: session 45's fuzz found eight, each now a regression test."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from habu.cli_grad import backward_program
from habu.compile import compile_model, write_outputs
from habu.errors import HabuError
from habu.spec.parser import parse_text
from habu.target import target_named
from tests.random_models import (
    random_attention,
    random_batched_product,
    random_layer,
    random_masked_product,
    random_masked_rows,
    random_model,
    random_product,
    with_runtime_extent,
)

pytestmark = pytest.mark.slow

SEEDS = range(5000, 5040)


def _compile(text: str, backward: bool) -> str:
    """'ok', or the one line a refusal gave; raises on a plan the proof found wrong or any other exception."""
    program, name = parse_text(text, "fuzz.habu"), "FZ"
    try:
        if backward:
            program, name = backward_program(program, name, None, "auto")
        compiled = compile_model(program, name, {}, target_named("sm_90a"), {}, 1)
    except HabuError as err:
        first = str(err).splitlines()[0]
        assert "computes something else" not in first and "breaks rule" not in first, f"{first}\n{text}"
        assert "is valid for every size" not in first, f"{first}\n{text}"  # an unguarded member exists (session 68)
        return first
    with tempfile.TemporaryDirectory() as out:
        write_outputs(Path(out), compiled.model, compiled, target_named("sm_90a"))
    assert all(p.ok for p in compiled.proofs), text
    return "ok"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_model_and_its_backward_compile_or_are_refused_in_one_line(seed):
    text = random_model(seed)
    try:
        parse_text(text, "fuzz.habu")
    except HabuError:
        pytest.skip("the generator drew a model the checker refuses")
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize("seed", range(0, 24))
def test_a_random_product_and_its_backward_compile_or_are_refused_in_one_line(seed):
    """Products at the tensor-core paths' sizes (tests/random_models.py, `random_product`): transposed and gathered
    operands, batches, epilogues, scatter-added rows. Session 54 ran 120 seeds of them forward and backward, and 10
    sampled kernel variants of each default kernel (`region_space`) through the rules and the field check: none
    wrong, none crashed."""
    text = random_product(seed)
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize("seed", range(0, 12))
def test_a_random_masked_product_and_its_backward_compile_or_are_refused_in_one_line(seed):
    """Products with a condition on their output's indices (session 63: a contraction's epilogue computes it):
    compiled with the default's rewrites (`split:Y` puts the mask in the product's epilogue) and proven."""
    text = random_masked_product(seed)
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize("seed", range(0, 12))
def test_a_random_masked_row_reduction_and_its_backward_compile_or_are_refused_in_one_line(seed):
    """Masked row reductions and softmaxes (session 64: row kernels compute conditions on indices): compiled
    (NVRTC included), proven, and their backward too where one is derived."""
    text = random_masked_rows(seed)
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize("seed", range(0, 12))
def test_a_random_batched_product_and_its_backward_compile_or_are_refused_in_one_line(seed):
    """Products over a batch of m's or n's extent in any index order (session 68: 46 of seeds 0-299 were refused by
    their own default plan, an operand's innermost index a batch axis; seeds 5 and 10 among them)."""
    text = random_batched_product(seed)
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize("seed", [*range(0, 8), 12])
def test_a_random_attention_and_its_backward_compile_or_are_refused_in_one_line(seed):
    """Attention in any dims' order, grouped or not, masked or not (tests/random_models.py, `random_attention`;
    session 68: seeds 12 and 52 were refused by their own default plan, a batch axis of extent 1 staged)."""
    text = random_attention(seed)
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


@pytest.mark.parametrize(("kind", "seed"), [("attention", 0), ("attention", 4), ("layer", 1), ("layer", 2),
                                            ("product", 9), ("product", 32), ("attention-keys", 13),
                                            ("product-n", 5), ("product-n", 106), ("masked-n", 50)])
def test_a_random_model_over_a_runtime_extent_compiles_with_its_report(kind, seed):
    """Attention over a runtime query count, a layer over a runtime token count, a product over a runtime M (session
    68: the report of most such attention plans crashed after their proof, counting a k window's share at an unknown
    #I; a seventh of the products had no unguarded member, an m-major A read by TMA on wgmma; session 69: the derived
    backwards of products over a runtime N had none, an operand gathered on the reduction axis staged)."""
    generate, extent = {"attention": (random_attention, "I"), "layer": (random_layer, "T"),
                        "product": (random_product, "M"), "attention-keys": (random_attention, "J"),
                        "product-n": (random_product, "N"), "masked-n": (random_masked_product, "N")}[kind]
    text = with_runtime_extent(generate(seed), extent)
    assert "1.." in text
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


def test_the_generator_draws_varied_models():
    """The fuzz is worth its time only if its models vary: reductions of both kinds, gathers, several shapes."""
    texts = [random_model(s) for s in SEEDS]
    assert sum("max" in t for t in texts) >= 4 and sum("Σ" in t for t in texts) >= 10
    assert sum("ITENSOR" in t for t in texts) >= 5 and len({t.splitlines()[0] for t in texts}) >= 20


def test_regression_a_row_kernel_reads_its_inputs_along_every_column_of_a_checked_row():
    """`SQW DUP COLSUM MULCOL DUP TANHW ADDW TANHW EXPW COLSUM` (a composition from a fuzz of random word chains):
    the row kernel of X²·COLSUM(X²) computes whole rows, but the check demanded COLSUM's values only at the columns
    the last column kernel samples, so the row kernel read where no kernel had written ("kernel 2 (%3) reads %2[64],
    which no earlier kernel wrote"): a correct plan refused. The demand now covers every column of a row kernel's
    rows."""
    words = ("WORD: COLSUM ( x[r c] -- s[c] )  s[c] = Σ r x[r c] ;\n"
             "WORD: MULCOL ( x[r c] g[c] -- y[r c] )  y[r c] = x[r c] · g[c] ;\n"
             "WORD: EXPW ( x[r c] -- y[r c] )  y[r c] = exp(x[r c]) ;\n"
             "WORD: TANHW ( x[r c] -- y[r c] )  y[r c] = tanh(x[r c]) ;\n"
             "WORD: SQW ( x[r c] -- y[r c] )  y[r c] = x[r c] · x[r c] ;\n"
             "WORD: ADDW ( x[r c] z[r c] -- y[r c] )  y[r c] = x[r c] + z[r c] ;\n")
    text = ("3 EXTENT: #R 129 EXTENT: #C\nf32 TENSOR: X ( #R #C )\nf32 TENSOR: Y ( #C )\n" + words +
            "MODEL: FZ ( x -- y )  SQW DUP COLSUM MULCOL DUP TANHW ADDW TANHW EXPW COLSUM ;\n")
    assert _compile(text, backward=False) == "ok"


def test_the_product_generator_draws_every_form():
    """The product fuzz is worth its seeds only if they cover its forms: batches, gathered rows, scatter-added rows,
    transposed operands, an f32 A, epilogues."""
    texts = [random_product(s) for s in range(24)]
    assert sum("#B" in t for t in texts) >= 3 and sum("IX[m]" in t for t in texts) >= 2
    assert sum("+=" in t for t in texts) >= 1 and sum("A[k m]" in t or "A[b k m]" in t for t in texts) >= 3
    assert sum("f32 TENSOR: A" in t for t in texts) >= 3 and sum("C[n]" in t for t in texts) >= 5
