"""Tiny outputs over a trailing axis on the GPU: a row statistic of a few long rows (`O[b] = Σ i X[b i]`,
#B small) or a reduction over several trailing axes (`Σ i j X[b i j]`) as a transposed column reduction
(the column family, its loads reading `[c r]`, its rows split over the grid, the splits combined
atomically), bit for bit against the exact reference on small-integer inputs in red-zoned buffers.
`CASES` is also what the CPU test (tests/lower/test_tiny_rows.py) proves."""

from __future__ import annotations

import pytest

COLUMNS = {"family": "columns"}

# name: (model text, pins)
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "sum-4-rows": ("4 EXTENT: #B  100000 EXTENT: #I  f32 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                   "MODEL: T  O[b] = Σ i X[b i] ;\n", COLUMNS),
    "sum-1-row-bf16-odd": ("1 EXTENT: #B  100003 EXTENT: #I  bf16 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                           "MODEL: T  O[b] = Σ i X[b i] ;\n", COLUMNS),
    "max-3-rows-ragged-splits": ("3 EXTENT: #B  70001 EXTENT: #I  f32 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                                 "MODEL: T  O[b] = max i X[b i] ;\n", {**COLUMNS, "rows_per_split": "1000"}),
    "dot-per-row": ("5 EXTENT: #B  40000 EXTENT: #I  f32 TENSOR: X ( #B #I )  bf16 TENSOR: Y ( #I )\n"
                    "f32 TENSOR: O ( #B )  MODEL: T  O[b] = Σ i X[b i] · Y[i] ;\n", COLUMNS),
    "two-trailing-axes": ("5 EXTENT: #B  300 EXTENT: #I  70 EXTENT: #J  bf16 TENSOR: X ( #B #I #J )\n"
                          "f32 TENSOR: O ( #B )  MODEL: T  O[b] = Σ i j X[b i j] ;\n", COLUMNS),
    "bf16-output-one-split": ("3 EXTENT: #B  5000 EXTENT: #I  f32 TENSOR: X ( #B #I )  bf16 TENSOR: O ( #B )\n"
                              "MODEL: T  O[b] = Σ i X[b i] ;\n", COLUMNS),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_a_transposed_column_reduction_passes_the_exact_check(case, tmp_path):
    torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
    if not torch.cuda.is_available():  # pragma: no cover - CPU machines
        pytest.skip("no CUDA device: GPU tests run on the device machine")
    from habu.bench.run import build
    from habu.plan.plan import ColumnKernel
    from habu.timing.exact import kept_types
    from habu.timing.exact_gpu import ExactChecker

    text, pins = CASES[case]
    path = tmp_path / "tiny.habu"
    path.write_text(text)
    built = build(str(path), "T", {}, pins)
    assert isinstance(built.plan.kernels[0], ColumnKernel), built.plan.kernels
    result = ExactChecker(built.model, built.sizes, seed=3).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
