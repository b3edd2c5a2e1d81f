"""Which operand is a contraction's A: the one carrying the output's row axis, whichever factor the
equation writes first (the product commutes)."""

from __future__ import annotations

from habu.plan.patterns import as_contraction
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

WGRAD = """64 EXTENT: #B  256 EXTENT: #D  384 EXTENT: #H
bf16 TENSOR: X ( #B #D )  bf16 TENSOR: G ( #B #H )  bf16 TENSOR: W ( #D #H )
MODEL: WG-GX  W[d h] = Σ b G[b h] · X[b d] ;
MODEL: WG-XG  W[d h] = Σ b X[b d] · G[b h] ;
"""


def test_regression_a_weight_gradient_written_gradient_first_gets_row_tiles_and_a_tma_store():
    """FFN-SKIP's derived `dW1[d h] = Σ b dT2[b h] · X[b d]` took A = dT2, so a tile's rows were the
    output's columns and its epilogue stored scalars 28 KB apart (121 µs a weight gradient at 128 tokens
    on the H200, torch 40 µs); both factor orders now give m = d and the TMA-store epilogue."""
    program = parse_text(WGRAD, "wgrad.habu")
    plans = {}
    for name in ("WG-GX", "WG-XG"):
        model = program.models[name]
        c = as_contraction(model.nodes[0])
        assert c is not None and (c.m.name, c.n.name, c.a.load.tensor, c.b.load.tensor) == ("d", "h", "X", "G")
        plan = default_plan(model, TARGETS["sm_90a"], {})
        assert plan.kernels[0].store.value == "tma", plan.kernels[0]
        proof = prove(model, plan, {}, trials=1)
        assert proof.ok and proof.certificate is not None and proof.certificate.passed
        plans[name] = plan.kernels
    assert plans["WG-GX"] == plans["WG-XG"]
