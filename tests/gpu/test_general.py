"""The general kernel family on the GPU: every model of tests/data/general_corpus (and the bmm,
bias_grad, scatter_add and accumulate examples) built from its proven default plan, run on random
inputs with NaN-poisoned outputs (an output that is also an input, `+=` and scatter stores, starts
from its random prior contents instead), and compared with `habu eval`'s float64 reference at the
outputs' dtype tolerance. Scatter stores also run with every index in 0..6 (heavy duplicates), and
an index out of its range is masked in the kernel and reported by check_errors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

CORPUS = [p for p in sorted((ROOT / "tests" / "data" / "general_corpus").glob("*.habu"))
          if "expect-error:" not in p.read_text().splitlines()[0]]
MODELS = [*CORPUS, *(ROOT / "examples" / f for f in ("weighted_scores.habu", "bias_grad.habu", "scatter_add.habu",
                                                     "accumulate.habu"))]
SCATTERS = [p for p in MODELS if any(eq.scatter is not None for m in load_program(p).models.values()
                                     for eq in m.nodes)]


def runtime_sizes(path: Path, pick: str) -> dict[str, int]:
    """A size for every runtime extent: its smallest admitted value, or one a few multiples above it
    that fills no block evenly ("ragged")."""
    (model,) = load_program(path).models.values()
    out = {}
    for e in model.extents:
        if e.is_static:
            continue
        n = max(e.lo, e.multiple)
        n += (-n) % e.multiple
        if pick == "ragged":
            n = min(e.hi - e.hi % e.multiple, n + 3 * e.multiple)
        out[e.name] = n
    return out


def run_golden(path: Path, sizes: dict[str, int], seed: int, index: str = "random") -> None:
    (name,) = load_program(path).models
    built = build(str(path), name, sizes)
    full = built.sizes
    inputs = make_inputs(built.model, full, seed, index)
    outs = poisoned_outputs(built.model, full)
    ref = reference(built.model, inputs, full)
    result = built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    tol = plan_tolerance(built.model, built.plan)
    results = result if isinstance(result, dict) else {built.model.outputs[0].name: result}
    for out_name, out in results.items():
        g = compare(out, ref[out_name], tol)
        assert g.unwritten == 0, f"{out_name}: {g.unwritten} elements never written ({built.plan.kernels})"
        assert g.ok, f"{out_name}: relative error {g.rel_error:.2e} > {tol:.0e} ({built.plan.kernels})"


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_general_corpus_model_matches_the_float64_reference(path):
    run_golden(path, runtime_sizes(path, "smallest"), seed=len(path.stem))


@pytest.mark.parametrize("path", [p for p in MODELS if runtime_sizes(p, "smallest")], ids=lambda p: p.stem)
def test_general_corpus_model_at_ragged_runtime_sizes(path):
    run_golden(path, runtime_sizes(path, "ragged"), seed=7)


@pytest.mark.parametrize("path", SCATTERS, ids=lambda p: p.stem)
def test_scatter_model_with_heavy_duplicates_matches_the_float64_reference(path):
    """Every index in 0..6: most rows land on a few elements, whose atomicAdds all must count."""
    run_golden(path, runtime_sizes(path, "smallest"), seed=11, index="dup")


def test_a_scatter_index_out_of_range_is_masked_and_reported():
    from habu.emit_cuda.device_errors import IndexValueError, check_errors

    path = ROOT / "examples" / "scatter_add.habu"
    built = build(str(path), "UNPERMUTE", {})
    inputs = make_inputs(built.model, built.sizes, 5, "random")
    before = inputs["Y"].clone()
    tokens = built.sizes["T"]
    inputs["IX"][3] = tokens  # one past the last token: the kernel masks row 3 and records it
    built.compiled(**inputs)
    with pytest.raises(IndexValueError, match=rf"IX: values must be in 0\.\.{tokens - 1} \(an index into #T\): "
                                              rf"found {tokens} at IX\[3\]"):
        check_errors()
    ix = inputs["IX"].long()
    ok = ix < tokens
    want = before.double().index_add(0, ix[ok], (inputs["W"].double()[:, None] * inputs["X"].double())[ok])
    assert torch.allclose(inputs["Y"].double(), want, rtol=1e-4, atol=1e-3)  # every other row landed
