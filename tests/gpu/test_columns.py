"""The column family on the GPU: default and pinned plans bit for bit against the exact reference on
small-integer inputs in red-zoned buffers (odd column counts, one column, one row, runtime extents, max,
elementwise bodies, a bf16 output), and a planted emitter bug caught there too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.mutants import MUTANTS  # noqa: E402
from habu.bench.run import build, device_target  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.lower import ColumnLowering, lower_whole  # noqa: E402
from habu.paths.emit import emit_lowered  # noqa: E402
from habu.target import TARGETS  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

HEAD = ("{r} EXTENT: #R  {n} EXTENT: #N\n{dtype} TENSOR: dY ( #R #N )  f32 TENSOR: X ( #R #N )\n"
        "f32 TENSOR: S ( #N )  f32 TENSOR: W ( #R )  {out} TENSOR: G ( #N )\nMODEL: COLS  G[n] = {rhs} ;\n")

CASES = {  # name: (rows, columns, body, input dtype, output dtype, pins, runtime sizes)
    "bias-grad-speed-shape": ("8192", "14336", "Σ r dY[r n]", "bf16", "f32", {}, {}),
    "odd-columns": ("300", "1001", "Σ r dY[r n]", "bf16", "f32", {}, {}),
    "one-column": ("517", "1", "Σ r dY[r n]", "bf16", "f32", {}, {}),
    "one-row": ("1", "4096", "Σ r dY[r n]", "bf16", "f32", {}, {}),
    "f16-ragged-tile": ("1000", "1000", "Σ r dY[r n]", "f16", "f32", {}, {}),
    "f32-vectors": ("999", "4100", "Σ r dY[r n]", "f32", "f32", {}, {}),
    "max": ("1000", "776", "max r dY[r n]", "bf16", "f32", {}, {}),
    "product": ("1000", "776", "Σ r dY[r n] · X[r n]", "bf16", "f32", {}, {}),
    "per-column-and-row": ("333", "776", "Σ r ( dY[r n] · S[n] + W[r] )", "bf16", "f32", {}, {}),
    "bf16-output": ("64", "776", "Σ r dY[r n]", "bf16", "bf16", {}, {}),
    "vector-1": ("1000", "776", "Σ r dY[r n]", "bf16", "f32", {"vector": "1"}, {}),
    "unroll-1-ragged-splits": ("1000", "776", "Σ r dY[r n]", "bf16", "f32", {"unroll": "1", "rows_per_split": "33"}, {}),
    "three-row-groups": ("1000", "776", "Σ r dY[r n]", "bf16", "f32", {"threads": "96", "column_threads": "32"}, {}),
    "runtime": ("1..8192", "8..16384%8", "Σ r dY[r n]", "bf16", "f32", {}, {"R": 777, "N": 4104}),
    # a max split over row blocks: atomicMax on ordered keys, the last block decodes (issue 19)
    "max-split-ragged": ("3000", "776", "max r dY[r n]", "bf16", "f32", {"rows_per_split": "100"}, {}),
    "max-split-negatives": ("3000", "777", "max r (0 - abs(dY[r n]))", "bf16", "f32", {"rows_per_split": "64"}, {}),
    "max-split-runtime": ("1..8192", "8..16384%8", "max r dY[r n] · W[r]", "bf16", "f32", {}, {"R": 5001, "N": 4104}),
}


def _file(tmp_path: Path, name: str, r: str, n: str, rhs: str, dtype: str, out: str) -> Path:
    path = tmp_path / f"{name}.habu"
    path.write_text(HEAD.format(r=r, n=n, rhs=rhs, dtype=dtype, out=out))
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_column_plans_pass_the_exact_check(case, tmp_path):
    r, n, rhs, dtype, out, pins, sizes = CASES[case]
    built = build(str(_file(tmp_path, case, r, n, rhs, dtype, out)), "COLS", sizes, pins)
    assert [k.kind for k in built.plan.kernels] == ["columns"]
    result = ExactChecker(built.model, built.sizes, seed=11).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def test_the_bias_grad_example_passes_the_exact_check():
    built = build(str(ROOT / "examples" / "bias_grad.habu"), "BIAS-GRAD", {})
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["BIAS-GRAD-3D", "COL-MAX"])
def test_the_bias_grad_examples_over_two_axes_and_max_pass_the_exact_check_twice(model):
    """Σ b Σ s dY3[b s n] (rows flattened) and a max split over row blocks, at the example's size; the max
    twice in a row (each launch counts its tiles' splits on counters of its own, zero-filled first)."""
    built = build(str(ROOT / "examples" / "column_reductions.habu"), model, {})
    assert [k.kind for k in built.plan.kernels] == ["columns"]
    checker = ExactChecker(built.model, built.sizes, seed=5)
    for _ in range(2):
        result = checker.check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["BIAS-GRAD-UNSCALED", "COL-MAX"])
def test_regression_two_streams_running_one_column_kernel_at_once_are_both_exact(model):
    """The same column kernel (splits combined atomically, each tile finished by its last split) on two
    streams at once, with different inputs, many times: each launch counts its splits on its own counters
    (a workspace of the call), so both results are exact. With one counter of the module, the launches
    counted on it together: a tile's "last" block could finish it before its own splits were in."""
    built = build(str(ROOT / "examples" / "column_reductions.habu"), model, {})
    assert [k.kind for k in built.plan.kernels] == ["columns"]
    (kernel,) = built.compiled.kernel_set.members[0][1].kernels
    assert kernel.workspace, "the plan has no final pass: nothing counts its splits"
    R, N = built.sizes["R"], built.sizes["N"]
    gen = torch.Generator(device="cuda").manual_seed(29)
    inputs = [torch.randint(-8, 9, (R, N), device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2)]
    if model == "COL-MAX":
        expected = [x.float().amax(0) for x in inputs]
    else:  # Σ r dY · 2^-10: small integer sums, exact in f32 in any order
        expected = [(x.double().sum(0) * 0.0009765625).float() for x in inputs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results: list[list] = [[], []]
    for _ in range(40):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                results[i].append(built.compiled(dY=inputs[i]))
    torch.cuda.synchronize()
    for i in range(2):
        wrong = [j for j, y in enumerate(results[i]) if not torch.equal(y, expected[i])]
        assert not wrong, f"stream {i}: launches {wrong} differ from the reference"


def test_a_column_kernel_captured_in_a_graph_zero_fills_its_counters_on_every_replay():
    """The counters' memset is captured with the launch: every replay finds each tile's last split anew
    (a counter left at its count would finish no tile on the second replay)."""
    built = build(str(ROOT / "examples" / "column_reductions.habu"), "COL-MAX", {})
    R, N = built.sizes["R"], built.sizes["N"]
    gen = torch.Generator(device="cuda").manual_seed(3)
    static = {"dY": torch.randint(-8, 9, (R, N), device="cuda", generator=gen).to(torch.bfloat16)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            built.compiled(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = built.compiled(**static)
    for _ in range(3):
        static["dY"].copy_(torch.randint(-8, 9, (R, N), device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, static["dY"].float().amax(0))


# (not columns-max-splits-stored: the exact check's inputs are small integers in ±1..±3, so every split of
# 100 rows holds a 3 and the last split's maximum is the column's — the mutant is invisible to it on the
# H200, 2026-12-01; the finite-field check kills it on the CPU)
@pytest.mark.parametrize("name", ["columns-partials-transposed", "columns-split-stores", "columns-max-splits-added",
                                  "columns-flattening-divisor-wrong"])
def test_a_planted_emitter_bug_fails_the_exact_check_on_the_gpu(name):
    """The mutant the finite-field check kills on the CPU, printed and run: the GPU shows it too."""
    (m,) = [m for m in MUTANTS if m.name == name]
    built = build(str(ROOT / "examples" / m.example), m.model, m.shape, m.pins)
    lowered = lower_whole(built.model, built.plan)
    assert isinstance(lowered.kernels[0], ColumnLowering)
    bad = replace(lowered, kernels=(m.mutate(lowered.kernels[0]),))
    target = TARGETS[device_target()]
    compiled = CompiledModel(built.model, emit_lowered(bad, built.plan, target), arch=target.name)
    result = ExactChecker(built.model, built.sizes, seed=2).check(compiled, kept_types(built.plan))
    assert not result.ok, result.summary



def test_a_fused_prologue_passes_the_exact_check(tmp_path):
    from tests.lower.test_columns import PROLOGUE

    path = tmp_path / "prologue.habu"
    path.write_text(PROLOGUE.replace("300 EXTENT", "4000 EXTENT").replace("200 EXTENT", "1032 EXTENT"))
    # the kept product is an elementwise row region, which takes the vectorised general kernel (since 8b961fd)
    for name, kinds in (("PRO", ["columns"]), ("PRO-KEPT", ["general", "columns"])):
        built = build(str(path), name, {})
        assert [k.kind for k in built.plan.kernels] == kinds
        result = ExactChecker(built.model, built.sizes, seed=13).check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, result.reason()


SCALAR = ("{n} EXTENT: #N\nf32 TENSOR: x ( #N )  bf16 TENSOR: y ( #N )  f32 TENSOR: d ( )\n"
          "MODEL: DOT  d = {rhs} ;\n")


@pytest.mark.parametrize("n,rhs,pins", [("1000003", "Σ n x[n] · y[n]", {}),
                                         ("5000", "max n x[n] · y[n]", {"rows_per_split": "700"}),
                                         ("77", "Σ n x[n]", {})])
def test_a_scalar_output_split_over_the_grid_passes_the_exact_check(n, rhs, pins, tmp_path):
    """A scalar reduction (AXPY-RELU's da = Σ n dT2[n] · x[n]) as a column reduction of one column: row
    splits added (or maxed) atomically into the zeroed output, twice in a row."""
    path = tmp_path / "dot.habu"
    path.write_text(SCALAR.format(n=n, rhs=rhs))
    built = build(str(path), "DOT", {}, pins)
    assert [k.kind for k in built.plan.kernels] == ["columns"]
    checker = ExactChecker(built.model, built.sizes, seed=3)
    for _ in range(2):
        result = checker.check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, result.reason()
