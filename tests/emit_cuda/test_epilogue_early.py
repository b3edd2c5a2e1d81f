"""`epilogue_early`: each consumer thread of a wgmma TMA-store epilogue reads the epilogue's loads of model inputs
into registers at each tile's start (habu/lower/epilogue_early.py), and the epilogue reads the registers. Only a
model input, which no kernel of the plan writes, is read early (`early-epilogue-loads`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_plan
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.obligation import context
from habu.prove.rules import failures, obligations
from habu.prove.rules_early import early_obligations
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
EARLY = {"epilogue_early": "true"}


def ffn(which: str, tokens: int = 100):
    derived = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP")
    return (derived.model if which == "backward" else derived.forward).with_sizes({"B": tokens})


def kernel_of(plan, node: str) -> int:
    return next(i for i, k in enumerate(plan.kernels) if node in k.nodes)


def test_the_gelu_derivatives_s1_and_b1_are_read_at_the_tile_start_and_the_plan_is_proven():
    model = ffn("backward")
    plan = default_plan(model, T, {}, EARLY)
    i = kernel_of(plan, "%d2")
    lw = lower_plan(model, plan)[i]
    early = {e.access.tensor: e for e in lw.early_loads}
    assert set(early) == {"S1", "B1"}
    assert early["S1"].rows and early["S1"].columns and early["S1"].dims(1, 16, 2) == (1, 16, 2)
    assert not early["B1"].rows and early["B1"].dims(1, 16, 2) == (16,)  # a bias: one pair per column group
    source = emit_plan(model, plan, T).kernels[i].source
    start, loop = source.index("habu::u32 pre"), source.index("for (long long kt = kt_begin; kt < kt_end; ++kt)",
                                                               source.index("consumers"))
    assert start < loop  # in the registers before the k loop
    assert "habu::bf16x2_lo(pre" in source and "habu::bf16x2_hi(pre" in source
    epilogue = source[source.index("habu::wgmma_wait<0>();", loop):]
    assert "p_S1" not in epilogue and "p_B1" not in epilogue  # the epilogue reads registers only
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    if _nvrtc() is not None:
        res = compile_cuda(source, emit_plan(model, plan, T).kernels[i].name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_the_forwards_bias_is_read_early_and_its_saved_product_is_not_an_early_load():
    model = ffn("forward")
    plan = default_plan(model, T, {}, EARLY)
    i = kernel_of(plan, "S3")
    (bias,) = lower_plan(model, plan)[i].early_loads
    assert bias.access.tensor == "B1"
    assert not any(lw.early_loads for j, lw in enumerate(lower_plan(model, plan)) if j != i and hasattr(lw, "early_loads")
                   and "S4" in plan.kernels[j].nodes)  # S4's product has no epilogue load
    assert prove(model, plan, {}, trials=1).ok


def test_an_epilogue_load_of_a_tensor_the_plan_writes_is_never_read_early():
    model = ffn("backward")
    plan = default_plan(model, T, {}, EARLY)
    i = kernel_of(plan, "dX")
    lw = lower_plan(model, plan)[i]
    written = {n for k in plan.kernels for n in k.nodes}
    assert any(a.tensor in written for _, a in lw.epi_loads)  # dX's epilogue reads the row kernel's output
    assert not any(e.access.tensor in written for e in lw.early_loads)


def test_regression_a_lowering_that_reads_an_intermediate_early_is_refused():
    """A lowering whose list of model inputs is wrong (hand-edited, or a bug in the lowering) would read early a
    tensor an earlier kernel of the plan writes: the rule checks each early load against the model itself."""
    model = ffn("backward")
    plan = default_plan(model, T, {}, EARLY)
    i = kernel_of(plan, "dX")
    lw = lower_plan(model, plan)[i]
    tampered = replace(lw, epi_inputs=tuple(a.tensor for _, a in lw.epi_loads))
    assert tampered.early_loads
    found = [o for o in early_obligations(f"k{i}", tampered, context(model, plan)) if o.formula is not True]
    assert found and "not a model input" in found[0].detail


def test_the_pin_is_refused_nowhere_and_changes_nothing_without_a_tma_store_epilogue():
    model = ffn("backward")
    plan = default_plan(model, T, {}, {**EARLY, "store": "direct"})
    assert not any(getattr(lw, "early_loads", ()) for lw in lower_plan(model, plan))
    assert not failures(obligations(model, plan))


@pytest.mark.parametrize("tokens", [64, 200])
def test_partial_tiles_read_early_under_the_accesses_masks(tokens):
    model = ffn("backward", tokens)
    plan = default_plan(model, T, {}, EARLY)
    i = kernel_of(plan, "%d2")
    source = emit_plan(model, plan, T).kernels[i].source
    fill = next(line for line in source.splitlines() if "= habu::load_pair16(p_S1" in line)  # the pair's masks
    assert f"(m) < {tokens} && (n) < 14336, (m) < {tokens} && ((n + 1)) < 14336)" in fill
    assert prove(model, plan, {}, trials=1).ok


def test_the_default_reads_early_and_the_search_offers_both_where_an_epilogue_reads_a_model_input():
    from habu.paths import region_space
    from habu.plan.rewrite import apply_rewrites
    from habu.search.cuts import default_partition

    model = ffn("backward", 128)
    plan = default_plan(model, T, {})
    graph, sizes = apply_rewrites(model, plan.rewrites), dict(plan.shape)
    early = {k.nodes[0]: k.epilogue_early for k in plan.kernels if k.kind == "contraction"}
    assert early["%d3"] and not early["dW1"]  # the default reads S1 and B1 early; dW1's epilogue loads nothing
    offered = {r.nodes[0]: {getattr(k, "epilogue_early", False) for k in region_space(graph, r, T, sizes)}
               for r in default_partition(graph, T, sizes) if r.kind == "contraction"}
    assert offered["%d3"] == {True, False}  # the default, and its loads left in the epilogue
    assert offered["dW1"] == offered["dW2"] == {False}  # no epilogue loads


def test_regression_an_in_place_accumulators_input_is_not_read_early():
    """`C[m n] += Σ k A·B` (examples/accumulate.habu): C is a model input the plan's kernel also writes. The
    lowering read it at the tile's start (its list of inputs took the model's inputs whole), and the
    `early-epilogue-loads` rule refused the default plan; an input a node writes is read in the epilogue."""
    model = load_program(ROOT / "examples" / "accumulate.habu").models["GEMM-ACC"]
    plan = default_plan(model, T)
    (lw,) = lower_plan(model, plan)
    assert any(a.tensor == "C" for _, a in lw.epi_loads) and not lw.early_loads
    assert not failures(obligations(model, plan))


def test_a_per_row_scale_and_an_f32_bias_are_read_early_one_value_a_row_and_a_float2_a_column_pair():
    from habu.spec.parser import parse_text

    text = """256 EXTENT: #M  384 EXTENT: #N  128 EXTENT: #K
bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  f32 TENSOR: R ( #M )  f32 TENSOR: C ( #N )
bf16 TENSOR: Y ( #M #N )
MODEL: SCALED  Y[m n] = (Σ k A[m k] · B[n k]) · R[m] + C[n] ;
"""
    model = parse_text(text, "scaled.habu").models["SCALED"]
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    early = {e.access.tensor: e for e in lw.early_loads}
    assert (early["R"].rows, early["R"].columns, early["C"].rows, early["C"].columns) == (True, False, False, True)
    kernel = emit_plan(model, plan, T).kernels[0]
    assert "float pre0[1][2];" in kernel.source and "float2 pre1[8];" in kernel.source
    assert "if (j == 0) pre0[s][h] = " in kernel.source and "pre1[j].y" in kernel.source
    assert prove(model, plan, {}, trials=1).ok
    if _nvrtc() is not None:
        cubin = compile_cuda(kernel.source, kernel.name, "sm_90a")
        assert not cubin.resources.spills and "warning" not in cubin.log, cubin.log


def test_a_batched_products_matrix_and_bias_are_read_early_at_the_blocks_batch():
    from habu.spec.parser import parse_text

    text = """4 EXTENT: #B  256 EXTENT: #I  256 EXTENT: #J  64 EXTENT: #D
bf16 TENSOR: Q ( #B #I #D )  bf16 TENSOR: K ( #B #J #D )  bf16 TENSOR: M ( #B #I #J )  bf16 TENSOR: C ( #B #J )
f32 TENSOR: S ( #B #I #J )
MODEL: SCORES-BIAS  S[b i j] = Σ d Q[b i d] · K[b j d] + M[b i j] + C[b j] ;
"""
    model = parse_text(text, "scores.habu").models["SCORES-BIAS"]
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    assert {e.access.tensor for e in lw.early_loads} == {"M", "C"}
    kernel = emit_plan(model, plan, T).kernels[0]
    assert prove(model, plan, {}, trials=1).ok
    if _nvrtc() is not None:
        cubin = compile_cuda(kernel.source, kernel.name, "sm_90a")
        assert not cubin.resources.spills and "warning" not in cubin.log, cubin.log


@pytest.mark.parametrize("mutant", ["second-column-as-first", "rows-without-their-half", "pair-halves-swapped"])
def test_a_planted_error_in_the_early_registers_map_is_refused(monkeypatch, mutant):
    """The emitter prints the registers' entries, fills and reads from the lowering's `EarlyLoad` maps, and the
    `early-epilogue-loads` rule runs the same maps over a warpgroup's fragment: a planted error in them (each
    half loading the pair's first column; a row-dependent value stored once per slab, not per row half; the
    epilogue reading the other half) is a refusal, not a kernel that reads another element."""
    from habu.lower.epilogue_early import EarlyLoad

    if mutant == "second-column-as-first":
        monkeypatch.setattr(EarlyLoad, "held_column", lambda self, half: 0)
    elif mutant == "rows-without-their-half":
        monkeypatch.setattr(EarlyLoad, "kept", lambda self: tuple(
            a for a, used in (("s", self.rows), ("j", self.columns)) if used))
    else:
        monkeypatch.setattr(EarlyLoad, "half_of", lambda self, q: 1 - q if self.columns else 0)
    model = ffn("backward")
    plan = default_plan(model, T, {})
    broken = [o for o in failures(obligations(model, plan)) if o.rule.name == "early-epilogue-loads"]
    assert broken and "S1" in broken[0].detail, [o.describe() for o in broken]


@pytest.mark.parametrize("held", [1, 3])
def test_an_unpaired_column_loads_fill_reads_each_half_where_the_lowering_says(monkeypatch, held):
    """A column-dependent early load that is not read one pair at a time (a transposed M[n m]: not contiguous
    along n) fills its second half at the column `EarlyLoad.held_column` names, printed from it: with the
    lowering's own map (1) and with a planted one (3), the fill's second load is at that column (an emitter that
    printed another column would pass the rule that checks the map, and read another element)."""
    from habu.lower.epilogue_early import EarlyLoad
    from habu.spec.parser import parse_text

    text = """256 EXTENT: #M  384 EXTENT: #N  128 EXTENT: #K
bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  bf16 TENSOR: M ( #N #M )  f32 TENSOR: Y ( #M #N )
MODEL: TRANSPOSED  Y[m n] = (Σ k A[m k] · B[n k]) + M[n m] ;
"""
    model = parse_text(text, "transposed.habu").models["TRANSPOSED"]
    monkeypatch.setattr(EarlyLoad, "held_column", lambda self, half: half * held)
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    assert [(e.access.tensor, e.columns) for e in lw.early_loads] == [("M", True)]
    source = emit_plan(model, plan, T).kernels[0].source
    (fill,) = [line for line in source.splitlines() if line.strip().startswith("pre0[s][j][h] = ")]
    assert "p_M + ((int)(n) * (int)(256) + (int)(m))" in fill
    assert f"p_M + ((int)((n + {held})) * (int)(256) + (int)(m))" in fill
