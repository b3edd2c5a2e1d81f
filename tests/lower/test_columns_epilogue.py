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


BIAS_TEXT = """3000 EXTENT: #R  300 EXTENT: #N  1 EXTENT: #ONE
bf16 TENSOR: X ( #R #N )  bf16 TENSOR: B ( #ONE #N )  bf16 TENSOR: Y ( #R #N )
MODEL: BIAS-ADD  Y[r n] = X[r n] · X[r n] + B[0 n] ;
"""


def bias_backward():
    from habu.spec.grad_program import derive_model

    return derive_model(parse_text(BIAS_TEXT, "bias.habu"), "BIAS-ADD").model


def test_regression_a_bias_gradient_stored_in_its_broadcast_shape_is_one_column_kernel():
    """The derived backward stores a bias's gradient `dB[one n] = Σ r dY[r n]` as a column sum and a copy into
    the (1, N) shape; the copy was a kernel of its own (a row kernel: a launch and a read of the sum, two a
    layer's step). It is now the column kernel's epilogue, storing at row 0."""
    m = bias_backward()
    plan = default_plan(m, TARGET, {}, {})
    (kernel,) = [k for k in plan.kernels if "dB" in k.nodes]
    assert kernel.kind == "columns" and kernel.nodes[-1] == "dB", plan.kernels
    lw = next(lw for k, lw in zip(plan.kernels, lower_plan(m, plan), strict=True) if k is kernel)
    assert lw.out.tensor == "dB" and lw.combine == "store"
    assert [p.kind for p in lw.out.positions] == ["const", "axis"]
    assert verify_plan(m, plan, trials=2).passed


def test_a_broadcast_epilogue_reading_its_unit_variable_is_not_fused():
    """An epilogue node over (one, n) that reads `one` is not elementwise over the columns alone."""
    from habu.plan.patterns import epilogue_column
    from habu.spec.ir import Equation, IndexVar, Load, Op

    m = bias_backward()
    one, n = IndexVar("one", "ONE"), IndexVar("n", "N")
    plain = Equation("dB", (one, n), Load("G", (n,)))
    assert epilogue_column(m, plain) == n
    reads_one = Equation("dB", (one, n), Op("mul", (Load("G", (n,)), Load("V", (one,)))))
    assert epilogue_column(m, reads_one) is None
    assert epilogue_column(m, Equation("dB", (n, n), Load("G", (n,)))) is None


def test_regression_a_bias_gradient_stored_at_the_wrong_row_is_killed_not_a_crash():
    """The field check's box of a broadcast-shaped output came from the row the lowering stores at: a lowering
    storing dB at row 1 of its (1, N) shape crashed the comparison (an index past #ONE) instead of failing it.
    The box now comes from the tensor's extents."""
    from habu.bench.mutants import MUTANTS, run_mutant

    (mutant,) = [m for m in MUTANTS if m.name == "columns-broadcast-row-one"]
    outcome = run_mutant(mutant, trials=1)
    assert outcome.killed and "dB[0, 0] was never written" in outcome.message, outcome.message
