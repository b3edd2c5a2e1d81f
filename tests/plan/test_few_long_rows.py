"""An elementwise node of a few long rows is a map kernel over the grid, not a row kernel of one block a row
(`habu.plan.patterns.few_long_rows`): FFN-SKIP's bias gradients `dB1[one h] = TrdB1[h]` (14336 columns) and
`dB2` (4096) ran in one block each."""

from __future__ import annotations

from habu.plan.patterns import default_regions
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]


def test_regression_the_bias_gradients_of_ffn_skip_are_map_kernels():
    backward = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model
    sizes = {"B": 300}
    model = backward.with_sizes(sizes)
    plan = default_plan(model, TARGET, sizes)
    kinds = {k.nodes: k.kind for k in plan.kernels}
    assert kinds[("dB1",)] == "map" and kinds[("dB2",)] == "map"
    assert prove(model, plan, sizes, trials=1).ok


def test_many_rows_or_short_rows_stay_row_kernels():
    text = ("{rows} EXTENT: #R  {cols} EXTENT: #C\nf32 TENSOR: X ( #R #C )  bf16 TENSOR: Y ( #R #C )\n"
            "MODEL: M  Y[r c] = X[r c] · 2 ;\n")
    kind = lambda rows, cols: [r.kind for r in default_regions(  # noqa: E731
        parse_text(text.format(rows=rows, cols=cols)).models["M"])]
    assert kind(1, 14336) == ["map"] and kind(8, 4096) == ["map"]
    assert kind(64, 14336) == ["rows"] and kind(1, 1024) == ["rows"]
