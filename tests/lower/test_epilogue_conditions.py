"""A contraction's epilogue computes a condition on its output's indices (habu/lower/conditions.py): the causal
mask `where(n ≤ m + #N − #M, Σ k A·W, 0)` is one kernel, proven by the finite-field check at each stored
element's coordinates, and printed with those coordinates' C (never a bare "@m")."""

from __future__ import annotations

import re

import pytest

import habu.lower.contraction as contraction
from habu.emit_cuda.nvrtc import CompileError, _nvrtc, compile_cuda
from habu.lower.conditions import condition_axis, conditions_on_axes
from habu.paths.emit import emit_plan
from habu.plan.conditions import epilogue_conditions
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.ir import Compare, IndexVar, walk
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "masked_products.habu")

PINS = {
    "wgmma": {},
    "wgmma-tma-store": {"store": "tma"},
    "wgmma-direct": {"store": "direct"},
    "mma.sync": {"mma": "mma.sync"},
    "fma": {"mma": "fma"},
    "cluster-split": {"split_k": "2", "split_reduce": "cluster", "tile": "128x128x64"},
}


def _proven(name: str, pins: dict[str, str]):
    model = PROGRAM.models[name]
    plan = default_plan(model, T, {}, pins)
    proof = prove(model, plan, {}, trials=1)
    return model, plan, proof


@pytest.mark.parametrize("name", ["TRIANGLE", "SCORES", "BATCHED"])
@pytest.mark.parametrize("path", list(PINS))
def test_a_masked_product_is_one_contraction_kernel_proven_and_printed_at_its_coordinates(name, path):
    model, plan, proof = _proven(name, PINS[path])
    if name == "BATCHED" and path == "cluster-split":  # (the rules: a batched product is not split)
        assert not proof.ok and "without a cluster split" in proof.violations[0].detail
        pytest.skip(f"the rules refuse {path} here: {[v.describe() for v in proof.violations]}")
    assert proof.ok, [v.describe() + ": " + v.detail for v in proof.violations] or proof.certificate.failure
    assert [k.kind for k in plan.kernels] == ["contraction"] and len(plan.kernels[0].nodes) == 2
    source = emit_plan(model, plan, T).kernels[0].source
    assert "@" not in source.split("extern \"C\"", 1)[-1]  # every condition variable printed as a coordinate
    assert "<=" in source or ">=" in source
    if _nvrtc() is not None:
        compile_cuda(source, emit_plan(model, plan, T).kernels[0].name, "sm_90a")


def test_the_field_check_refuses_a_mask_read_at_the_wrong_coordinates(monkeypatch):
    """A planted lowering mutant: the epilogue's condition compares n with n (its m renamed to n): proven
    before, the check now fails on the elements the mask then gets wrong."""
    def swapped(expr):
        out = conditions_on_axes(expr)
        def rename(ix):
            return IndexVar(condition_axis("n"), ix.extent) if ix.name == condition_axis("m") else ix
        from habu.spec.ir import map_ops
        return map_ops(out, lambda e: e.map_indices(rename) if isinstance(e, Compare) else e)

    monkeypatch.setattr(contraction, "conditions_on_axes", swapped)
    _, _, proof = _proven("TRIANGLE", {})
    assert not proof.ok and proof.certificate is not None and not proof.certificate.passed


def test_only_conditions_on_the_nodes_own_indices_join_an_epilogue():
    program = parse_text("""64 EXTENT: #M 64 EXTENT: #N 64 EXTENT: #K 4 EXTENT: #B
bf16 TENSOR: A ( #M #K ) bf16 TENSOR: W ( #N #K ) f32 TENSOR: S ( #M #N ) f32 TENSOR: O ( #M #N )
ITENSOR: LEN ( #B #N )
MODEL: OWN   O[m n] = where(n < m, S[m n], 0) ;
MODEL: TABLE O[m n] = where(n < LEN[0], S[m n], 0) ;
""", "c.habu")
    assert epilogue_conditions(program.models["OWN"].nodes[0])
    assert not epilogue_conditions(program.models["TABLE"].nodes[0])


def test_the_lowered_epilogue_names_its_conditions_by_the_kernels_axes():
    model = PROGRAM.models["BATCHED"]
    plan = default_plan(model, T, {}, {})
    from habu.lower import lower_plan

    lw = lower_plan(model, plan)[0]
    names = {ix.name for x in walk(lw.epilogue) if isinstance(x, Compare) for ix in x.index_exprs()}
    assert names == {condition_axis("batch0"), condition_axis("m"), condition_axis("n")}


def test_a_planted_emitter_that_prints_a_condition_without_its_coordinates_does_not_compile(monkeypatch):
    """The emitter mutant: the epilogue printed without the coordinates' C. Its conditions read "@m", which no
    C compiler takes (rather than some other variable named m, silently)."""
    import habu.emit_cuda.emit_fma as emit_fma

    model = PROGRAM.models["TRIANGLE"]
    plan = default_plan(model, T, {}, {})
    monkeypatch.setattr(emit_fma, "condition_names", lambda *args: {})
    kernel = emit_plan(model, plan, T).kernels[0]
    assert condition_axis("m") in kernel.source
    if _nvrtc() is not None:
        with pytest.raises(CompileError):
            compile_cuda(kernel.source, kernel.name, "sm_90a")


CONDITION = re.compile(r"\(\(1 \* \(long long\)(n|m|\(n \+ 1\)|\(m \+ 1\)) \+ 0LL\) <= \(1 \* \(long long\)(n|m|\(n \+ 1\)|\(m \+ 1\)) \+")


def printed_conditions(path: str) -> set[tuple[str, str]]:
    """TRIANGLE's printed `n ≤ m + #N − #M` conditions on `path`, as (C of n, C of m) pairs."""
    model = PROGRAM.models["TRIANGLE"]
    return set(CONDITION.findall(emit_plan(model, default_plan(model, T, {}, PINS[path]), T).kernels[0].source))


@pytest.mark.parametrize("path", list(PINS))
def test_each_elements_condition_is_printed_at_that_elements_coordinates(path):
    """n's side reads the element's column and m's its row; a pair's second element (the fragments' column pair)
    its own column `n + 1`, as its store does. Planted emitter mutants (the axes exchanged, the second element's
    condition at the first's column) are caught here on the CPU."""
    want = {("n", "m")} if path == "fma" else {("n", "m"), ("(n + 1)", "m")}
    assert printed_conditions(path) == want


def test_a_planted_emitter_that_exchanges_a_conditions_axes_is_caught(monkeypatch):
    import habu.emit_cuda.emit_fma as emit_fma

    monkeypatch.setattr(emit_fma, "condition_names", lambda m, n, batch=(): {condition_axis("m"): n,
                                                                               condition_axis("n"): m})
    assert printed_conditions("wgmma") != {("n", "m"), ("(n + 1)", "m")}
