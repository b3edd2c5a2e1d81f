"""A row computed elementwise, a statistic of it, and the row that reads both: one row kernel
(`habu.plan.row_fusion.row_then_statistic`). FFN-SKIP's forward with its saved values computed H = S4 + B2 + X in a
row kernel of its own (scalar loads; H written and read back) and RMSNorm's R1 and Y in the next; H is now inlined
into the RMSNorm kernel and never stored."""

from __future__ import annotations

import pytest

from habu.plan.patterns import default_regions
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
HEADER = ("64 EXTENT: #B  512 EXTENT: #D  1 EXTENT: #ONE\nbf16 TENSOR: S ( #B #D )  bf16 TENSOR: X ( #B #D )  "
          "bf16 TENSOR: C ( #ONE #D )  bf16 TENSOR: Y ( #B #D )  f32 TENSOR: R ( #B )  bf16 TENSOR: H ( #B #D )\n")


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_the_saved_forward_of_ffn_skip_computes_its_residual_in_the_rmsnorm_kernel():
    forward = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").forward
    sizes = {"B": 512}
    model = forward.with_sizes(sizes)
    plan = default_plan(model, TARGET, sizes)
    # (GELU leaves S1's product for a kernel of its own at 512 tokens: habu/search/cuts.py; at 300 it stays in the
    # product's epilogue since S1 is staged and stored by TMA beside S3, session 48)
    assert [(k.kind, k.nodes) for k in plan.kernels] == [
        ("contraction", ("S1",)), ("general", ("%2", "S3")), ("contraction", ("S4",)),
        ("rows", ("%5", "%6", "R1", "Y"))]
    assert dict(plan.storage) == {}  # H (%6) never reaches memory
    assert prove(model, plan, sizes, trials=1).ok


def test_softmax_written_node_by_node_is_one_row_kernel():
    model = load_program(ROOT / "examples" / "families.habu").models["SOFTMAX-NODES"]
    assert [(r.kind, r.nodes) for r in default_regions(model)] == [("rows", ("%1", "%2", "%3", "Ps"))]


WORDS = ("WORD: ADDB ( s[b d] c[one d] x[b d] -- h[b d] )  h[b d] = s[b d] + c[0 d] + x[b d] ;\n"
         "WORD: RSTD ( h[b d] -- r[b] )  r[b] = rsqrt(Σ d h[b d] · h[b d] / #d + 0.000001) ;\n"
         "WORD: SCALE ( h[b d] r[b] -- y[b d] )  y[b d] = h[b d] · r[b] ;\n"
         "WORD: DOUBLE ( h[b d] -- z[b d] )  z[b d] = h[b d] · 2 ;\n")


def _regions(model_line: str) -> list[tuple[str, tuple[str, ...]]]:
    model = parse_text(HEADER + "bf16 TENSOR: Z ( #B #D )\n" + WORDS + model_line).models["M"]
    return [(r.kind, r.nodes) for r in default_regions(model)]


def test_the_rule_merges_the_plain_chain():
    assert [kind for kind, _ in _regions("MODEL: M ( s c x -- y )  ADDB DUP RSTD SCALE ;\n")] == ["rows"]


def test_a_row_that_is_an_output_stays_in_its_own_kernel():
    """H is an output: the statistic's kernel does not take it (the row kernel stores one row)."""
    regions = _regions("MODEL: M ( s c x -- h y )  ADDB DUP DUP RSTD SCALE ;\n")
    assert len(regions) == 2 and regions[0][1] == ("H",), regions


def test_a_row_read_again_past_the_row_that_reads_the_statistic_stays_in_its_own_kernel():
    """A third reader of H after Y: merging H into the statistic's kernel would lose it, so the region stops."""
    regions = _regions("MODEL: M ( s c x -- y z )  ADDB DUP DUP RSTD SCALE SWAP DOUBLE ;\n")
    assert not any(len(nodes) > 1 and nodes[0] == "%1" and "%2" in nodes for _, nodes in regions), regions
