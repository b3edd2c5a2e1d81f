"""Fusion on column reductions: an elementwise epilogue over the columns (`H[n] = G[n] · S[n] + 0.25`, a
scale, a cast to bf16) computed in the column kernel (habu/plan/patterns.py `column_epilogue`,
`ColumnLowering.epilogue`): by the combining thread with one split, else by the launch's last block from
the value the splits combined into the output's f32 buffer."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ColumnLowering, lower_plan
from habu.paths.emit import emit_plan
from habu.plan.partitions import partitions
from habu.plan.patterns import default_regions
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_kernels, default_plan, make_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

TARGET = TARGETS["sm_90a"]
TEXT = """{r} EXTENT: #R  {n} EXTENT: #N
bf16 TENSOR: A ( #R #N )  bf16 TENSOR: B ( #R #N )  f32 TENSOR: S ( #N )  f32 TENSOR: H ( #N )
bf16 TENSOR: Hb ( #N )  f32 TENSOR: G ( #N )
WORD: MUL ( a[r n] b[r n] -- y[r n] )  y[r n] = a[r n] · b[r n] ;
WORD: COLSUM ( x[r n] -- y[n] )  y[n] = Σ r x[r n] ;
WORD: COLMAX ( x[r n] -- y[n] )  y[n] = max r x[r n] ;
WORD: AFFINE ( g[n] s[n] -- h[n] )  h[n] = g[n] · s[n] + 0.25 ;
WORD: HALF ( g[n] -- h[n] )  h[n] = g[n] · 0.5 ;
MODEL: SCALED ( a s -- h )  SWAP COLSUM SWAP AFFINE ;
MODEL: CAST ( a b -- hb )  MUL COLSUM HALF ;
MODEL: MAXED ( a s -- h )  SWAP COLMAX SWAP AFFINE ;
MODEL: KEPT ( a -- g h )  COLSUM DUP HALF ;
"""


def model(name: str, r: int = 3000, n: int = 300):
    return parse_text(TEXT.format(r=r, n=n), "epi.habu").models[name]


def test_an_epilogue_is_fused_and_computed_by_the_last_block_after_the_splits():
    m = model("SCALED")
    (region,) = default_regions(m)
    assert region.kind == "columns" and region.nodes[-1] == "H"
    plan = default_plan(m, TARGET, {}, {})
    (lw,) = lower_plan(m, plan)
    assert isinstance(lw, ColumnLowering) and lw.combine == "atomic" and lw.final_pass
    assert lw.out.tensor == "H" and [a.tensor for _, a in lw.epi_loads] == ["S"]
    assert verify_plan(m, plan, trials=2).passed
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    assert "habu::last_block_done(p_counters_H + (tile), " in kernel.source and kernel.zero == ("H", "$H")
    assert "const float w = p_H[(int)(col)]; p_H[(int)(col)] = ((w * " in kernel.source


def test_a_cast_epilogue_takes_one_split_and_the_combining_thread_computes_it():
    m = model("CAST")
    (region,) = default_regions(m)
    assert region.kind == "columns" and len(region.nodes) == 3  # the prologue, the sum, the epilogue
    plan = default_plan(m, TARGET, {}, {})
    (lw,) = lower_plan(m, plan)
    assert lw.combine == "store" and int(lw.splits({"R": 3000, "N": 300})) == 1 and not lw.final_pass
    assert verify_plan(m, plan, trials=2).passed
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    assert "habu::store_bf16(p_Hb + ((int)(col)), (w * 0.5f))" in kernel.source
    split = replace(plan, kernels=(replace(plan.kernels[0], rows_per_split=512),))
    assert not prove(m, split, {}, trials=1).ok  # a bf16 output cannot take the splits' atomics


def test_a_max_with_an_epilogue_decodes_then_applies_it():
    m = model("MAXED")
    plan = default_plan(m, TARGET, {}, {})
    (lw,) = lower_plan(m, plan)
    assert lw.combine == "atomic-max" and lw.epilogue is not None
    assert verify_plan(m, plan, trials=2).passed


def test_every_cut_of_a_fused_column_region_passes():
    """The partitions cut the prologue and the epilogue off: each piece is a column, map or row kernel,
    and every plan passes."""
    m = model("CAST", 300, 200)
    kinds = set()
    for regions in partitions(m):
        cut = make_plan(m, TARGET, default_kernels(m, TARGET, {"R": 300, "N": 200}, regions), {})
        proof = prove(m, cut, {}, trials=1)
        assert proof.ok and proof.certificate is not None and proof.certificate.passed, (regions, proof.certificate)
        kinds.add(tuple(k.kind for k in cut.kernels))
    assert ("columns",) in kinds and ("rows", "columns", "map") in kinds


def test_a_reduction_another_node_reads_keeps_its_own_kernel_output():
    """`G` is an output (and read by the epilogue): it is stored, so the epilogue is not fused."""
    m = model("KEPT")
    assert [r.kind for r in default_regions(m)] == ["columns", "map"]
    assert verify_plan(m, default_plan(m, TARGET, {}, {}), trials=1).passed
