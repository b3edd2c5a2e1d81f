"""The wgmma TMA-store epilogue reads each of its own loads contiguous along n as one load of the thread's column
pair (habu/lower/epilogue_pairs.py): the emitted source, the finite-field check's reading of the pair's second
element at the first's offset plus one, and the `epilogue-load-pairs` rule."""

from __future__ import annotations

import itertools

import pytest

import habu.lower.epilogue_pairs as epilogue_pairs
import habu.prove.rules_early as rules_early
from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_plan
from habu.lower.access import Access, Bound, IndexCheck, Position
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

T = TARGETS["sm_90a"]

SOURCE = """256 EXTENT: #M  256 EXTENT: #N  512 EXTENT: #K
bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  bf16 TENSOR: R ( #M #N )  bf16 TENSOR: Q ( #N #M )
f32 TENSOR: F ( #M #N )  bf16 TENSOR: O ( #M #N )
MODEL: ROWS     O[m n] = (Σ k A[m k] · B[n k]) + R[m n] ;
MODEL: COLUMNS  O[m n] = (Σ k A[m k] · B[n k]) + Q[n m] ;
MODEL: F32      O[m n] = (Σ k A[m k] · B[n k]) · F[m n] ;
"""


def model(name: str, m: int = 256, n: int = 256):
    return parse_text(SOURCE, "pairs.habu").models[name].with_sizes({"M": m, "N": n})


def access(positions, strides, checks=()) -> Access:
    return Access("X", "bf16", ("P", "Q"), positions, strides, (), checks)


def test_a_load_is_pairable_where_its_rows_have_a_static_even_length():
    m, n = Position("axis", "m"), Position("axis", "n")
    rows = Access("X", "bf16", ("P", "Q"), (m, n), (("Q",), ()), (Bound("m", "P"), Bound("n", "Q")))
    assert epilogue_pairs.pairable(rows, {"P": 7, "Q": 64})
    assert rules_early.pair_fault(rows, {"P": 7, "Q": 64}) is None
    for sizes in ({"P": 8, "Q": 63}, {"P": 8, "Q": None}):  # an odd row length; a runtime one
        assert not epilogue_pairs.pairable(rows, sizes)
        assert "not" in rules_early.pair_fault(rows, sizes)
    assert not epilogue_pairs.pairable(Access("X", "i32", ("P", "Q"), (m, n), (("Q",), ()), ()), {"P": 8, "Q": 64})


def test_contiguous_along_n_means_n_feeds_the_last_position_alone_with_stride_one():
    m, n = Position("axis", "m"), Position("axis", "n")
    assert epilogue_pairs.contiguous_along(access((m, n), (("Q",), ())), "n")
    assert not epilogue_pairs.contiguous_along(access((n, m), (("Q",), ())), "n")  # transposed
    assert not epilogue_pairs.contiguous_along(access((Position("const", value=0), n), (("Q",), ("Q",))), "n")
    gathered = access((m, Position("gather", "n", table="IX")), (("Q",), ()), (IndexCheck("IX", "n", "Q"),))
    assert not epilogue_pairs.contiguous_along(gathered, "n")


@pytest.mark.parametrize("name, dtype", [("ROWS", "bf16"), ("F32", "f32")])
def test_a_row_major_epilogue_load_is_read_one_pair_a_load_and_the_plan_is_proven(name, dtype):
    mdl = model(name)
    plan = default_plan(mdl, T, {})
    (lw,) = lower_plan(mdl, plan)
    assert (plan.kernels[0].mma.value, plan.kernels[0].store.value) == ("wgmma", "tma")
    assert len(epilogue_pairs.paired_loads(lw)) == 1
    kernel = emit_plan(mdl, plan, T).kernels[0]
    source = kernel.source
    tensor = "R" if name == "ROWS" else "F"
    load = "habu::load_pair16" if dtype == "bf16" else "habu::load_pair32"
    assert source.count(f"{load}(p_{tensor}") == 1 and f"habu::load_{dtype}(p_{tensor}" not in source
    assert prove(mdl, plan, {}, trials=1).ok
    if _nvrtc() is not None:
        res = compile_cuda(source, kernel.name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_a_transposed_epilogue_load_is_read_element_by_element():
    mdl = model("COLUMNS")
    plan = default_plan(mdl, T, {})
    (lw,) = lower_plan(mdl, plan)
    assert epilogue_pairs.paired_loads(lw) == ()
    source = emit_plan(mdl, plan, T).kernels[0].source
    assert "load_pair16" not in source and source.count("habu::load_bf16(p_Q") == 2


def test_partial_tiles_keep_each_elements_own_mask():
    """Tiles past the edges (199 rows, 264 columns): each element of the pair is read under its own mask (zero
    outside), and the device function reads a pair whose address is not aligned element by element."""
    mdl = model("ROWS", 199, 264)
    plan = default_plan(mdl, T, {})
    assert plan.kernels[0].store.value == "tma"
    source = emit_plan(mdl, plan, T).kernels[0].source
    line = next(x for x in source.splitlines() if "habu::load_pair16(p_R" in x)
    assert "(m) < 199 && (n) < 264, (m) < 199 && ((n + 1)) < 264)" in line
    assert prove(mdl, plan, {}, trials=1).ok


def test_planted_a_transposed_load_read_as_pairs_fails_the_rule_and_the_check(monkeypatch):
    """The mutant: a lowering that pairs every epilogue load. The `epilogue-load-pairs` rule names the transposed Q;
    with the rule planted blind too, the finite-field check reads the pair's second element where the kernel does
    (the first's offset plus one: the next row's element) and finds the wrong values."""
    mdl = model("COLUMNS")
    plan = default_plan(mdl, T, {})
    monkeypatch.setattr(epilogue_pairs, "contiguous_along", lambda access, axis: True)
    failed = failures(obligations(mdl, plan))
    assert [o.tensor for o in failed if o.rule.name == "epilogue-load-pairs"] == ["Q"]
    assert not prove(mdl, plan, {}, trials=1).ok
    monkeypatch.setattr(rules_early, "pair_fault", lambda access, sizes: None)
    proof = prove(mdl, plan, {}, trials=1)
    assert not proof.violations and proof.certificate is not None and not proof.certificate.passed


def test_the_emitter_prints_each_pairs_first_element_from_the_low_half_at_the_first_offset():
    """What the field check reads (element q at the pair's first offset plus q, each under its own mask) is what
    is printed, in the epilogue and in the early fill: the load at column n under n's mask then n + 1's, the
    first element the low half (f32: .x)."""
    for name, pins in itertools.product(("ROWS", "F32"), ({}, {"epilogue_early": "false"})):
        mdl = model(name, 199, 264)
        source = emit_plan(mdl, default_plan(mdl, T, {}, pins), T).kernels[0].source
        tensor = "R" if name == "ROWS" else "F"
        load = next(x for x in source.splitlines() if "= habu::load_pair" in x)
        held = load.split("=")[0].split()[-1]  # pr0, or the early fill's pre0[s][j][h]
        assert ("pre0" in held) == (pins == {}), held
        assert (f"(p_{tensor} + ((int)(m) * (int)(264) + (int)(n)), (m) < 199 && (n) < 264, (m) < 199 && "
                "((n + 1)) < 264)") in load, load
        lo, hi = (f"habu::bf16x2_lo({held})", f"habu::bf16x2_hi({held})") if name == "ROWS" else (f"{held}.x",
                                                                                                   f"{held}.y")
        assert f"const float e0_0 = {lo};" in source and f"const float e1_0 = {hi};" in source, (lo, hi)
