"""GGEMM's backward on tensor cores (tests/data/ggemm_backward.habu, the default plans on sm_90a at ragged
shapes): dA by the wgmma contraction with an f32 atomicAdd scatter epilogue at IX's rows, dB by the wgmma
contraction reading A's rows gathered on the reduction axis through a staging pass (at 4096³ the defaults
are the split plans, checked bit for bit by habu.bench.ggemm_backward_speed). The exact differential check (integer
inputs, red zones), and both against float64 torch with duplicates in IX, ragged shapes and dA's prior
contents kept."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

PATH = ROOT / "tests" / "data" / "ggemm_backward.habu"
PINS: dict[str, str] = {}  # the defaults: the wgmma contractions (`--pin family=contraction` gives the same)
SPLIT = {"rewrite": "scatter:dA"}  # dA's product stored plainly, then the scatter-add kernel
RAGGED = {"M": 200, "N": 136, "K": 264}  # no extent a multiple of the tiles; N and K of 16-byte rows


@pytest.mark.parametrize("model", ["GGEMM-DA", "GGEMM-DB"])
def test_the_pinned_backward_kernels_pass_the_exact_check(model):
    built = build(str(PATH), model, RAGGED, PINS)
    assert [(k.kind, k.mma) for k in built.plan.kernels] == [("contraction", "wgmma")]
    result = ExactChecker(built.model, built.sizes, seed=11).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def test_da_as_a_plain_product_and_a_scatter_kernel_passes_the_exact_check():
    """`--pin rewrite=scatter:dA` (habu/plan/scatter_split.py): the product stored plainly in f32 by the wgmma
    contraction (TMA stores), then the general scatter-add kernel; the default at 4096³."""
    for pins in (SPLIT, {**SPLIT, "elements": "4"}):  # (four elements a thread: four loads in flight)
        built = build(str(PATH), "GGEMM-DA", RAGGED, pins)
        assert [k.kind for k in built.plan.kernels] == ["contraction", "general"]
        assert built.plan.rewrites == ("scatter:dA",)
        result = ExactChecker(built.model, built.sizes, seed=12).check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, (pins, result.reason())


def test_db_as_a_gathered_copy_and_a_plain_contraction_passes_the_exact_check():
    """`--pin rewrite=gather:dB` (habu/plan/gather_split.py): A's rows copied through IX (the general kernel),
    then the wgmma contraction of two m-major operands by TMA (the transpose bits)."""
    for pins in ({"rewrite": "gather:dB"}, {"rewrite": "gather:dB", "elements": "8"}):  # (8 elements a thread)
        built = build(str(PATH), "GGEMM-DB", RAGGED, pins)
        assert [k.kind for k in built.plan.kernels] == ["general", "contraction"]
        result = ExactChecker(built.model, built.sizes, seed=14).check(built.compiled, kept_types(built.plan))
        assert result.ok and result.applicable, (pins, result.reason())


def test_the_simt_scatter_of_an_f32_gradient_passes_the_exact_check():
    """examples/ggemm.habu's backward (f32 dO): dA by the fma contraction's scatter-add, pinned."""
    built = build(str(PATH), "GGEMM-DA-F32", RAGGED, {"family": "contraction"})
    assert [(k.kind, k.mma) for k in built.plan.kernels] == [("contraction", "fma")]
    result = ExactChecker(built.model, built.sizes, seed=13).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def test_duplicates_in_ix_accumulate_onto_da_and_db_reads_the_gathered_rows_exactly():
    m, n, k = RAGGED["M"], RAGGED["N"], RAGGED["K"]
    g = torch.Generator().manual_seed(5)
    d_o = torch.randint(-3, 4, (m, n), generator=g).bfloat16().cuda()
    a = torch.randint(-3, 4, (m, k), generator=g).bfloat16().cuda()
    b = torch.randint(-3, 4, (n, k), generator=g).bfloat16().cuda()
    ix = torch.randint(0, m // 4, (m,), generator=g).int().cuda()  # every row of dA hit about 4 times, some none
    da0 = torch.randint(-5, 6, (m, k), generator=g).float().cuda()
    da_built = build(str(PATH), "GGEMM-DA", RAGGED, PINS)
    split_built = build(str(PATH), "GGEMM-DA", RAGGED, SPLIT)
    db_built = build(str(PATH), "GGEMM-DB", RAGGED, PINS)
    da = da_built.compiled(dO=d_o, B=b, dA=da0.clone(), IX=ix)
    da_split = split_built.compiled(dO=d_o, B=b, dA=da0.clone(), IX=ix)
    db = db_built.compiled(dO=d_o, A=a, IX=ix)
    db_gathered = build(str(PATH), "GGEMM-DB", RAGGED, {"rewrite": "gather:dB"}).compiled(dO=d_o, A=a, IX=ix)
    torch.cuda.synchronize()
    da_ref = da0.double().index_add(0, ix.long(), d_o.double() @ b.double())
    db_ref = (d_o.double().t() @ a[ix.long()].double()).bfloat16()  # exact integers, rounded once to bf16
    assert torch.equal(da.double(), da_ref), f"{int((da.double() != da_ref).sum())} of {da_ref.numel()} dA differ"
    assert torch.equal(da_split.double(), da_ref), f"{int((da_split.double() != da_ref).sum())} split dA differ"
    assert torch.equal(db, db_ref), f"{int((db != db_ref).sum())} of {db_ref.numel()} dB differ"
    assert torch.equal(db_gathered, db_ref), f"{int((db_gathered != db_ref).sum())} gathered dB differ"


@pytest.mark.parametrize("path, model, sizes, pins, shape", [
    # grids of at least four blocks an SM: the general kernels without loops take vectors and several elements
    # a thread by default, (elements, vector) as `loopless_shape` gives them (habu/paths/general.py)
    (PATH, "GGEMM-DA", {"M": 1100, "N": 136, "K": 1032}, SPLIT, (2, 4)),  # the scatter-add, ragged against 256·2·4
    # the gathered copy (session 30 listed it as failing: its exact check was "not applicable", never run;
    # tests/timing/test_exact.py::test_regression_a_gathered_copy_is_bounded_by_its_source_not_the_models_peak)
    (PATH, "GGEMM-DB", {"M": 1100, "N": 136, "K": 1032}, {"rewrite": "gather:dB"}, (1, 8)),
    (PATH, "GGEMM-DB", {"M": 1100, "N": 136, "K": 1032}, {"rewrite": "gather:dB", "vector": "1", "elements": "8"}, (8, 1)),
    (ROOT / "examples" / "scatter_add.habu", "UNPERMUTE", {}, {}, (4, 4)),  # the MoE un-permute at its sizes
])
def test_loopless_general_kernels_with_several_elements_a_thread_pass_the_exact_check(path, model, sizes, pins, shape):
    built = build(str(path), model, sizes, pins)
    assert [(k.elements, k.vector) for k in built.plan.kernels if k.kind == "general"] == [shape]
    result = ExactChecker(built.model, built.sizes, seed=15).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model, sizes, pins", [
    # vector moves (GeneralKernel.vector): dA's scatter-add by red.global.add.v4.f32, dB's gathered copy by
    # 16-byte loads and stores; ragged against every block and sweep, K a multiple of the vector
    ("GGEMM-DA", RAGGED, {**SPLIT, "vector": "4"}),
    ("GGEMM-DA", {"M": 1100, "N": 136, "K": 1032}, {**SPLIT, "vector": "4", "elements": "2"}),
    ("GGEMM-DA", {"M": 1100, "N": 136, "K": 1032}, {**SPLIT, "vector": "2", "elements": "8"}),
    ("GGEMM-DA", {"M": 1100, "N": 136, "K": 1032}, {**SPLIT, "vector": "4", "elements": "8", "reverse": "true"}),
    ("GGEMM-DB", RAGGED, {"rewrite": "gather:dB", "vector": "8"}),
    ("GGEMM-DB", {"M": 1100, "N": 136, "K": 1032}, {"rewrite": "gather:dB", "vector": "8", "elements": "4"}),
    ("GGEMM-DB", {"M": 1100, "N": 136, "K": 1032}, {"rewrite": "gather:dB", "vector": "4", "elements": "1"}),
])
def test_general_kernels_moving_vectors_pass_the_exact_check(model, sizes, pins):
    built = build(str(PATH), model, sizes, pins)
    general = [k for k in built.plan.kernels if k.kind == "general"]
    assert [k.vector for k in general] == [int(pins["vector"])]
    result = ExactChecker(built.model, built.sizes, seed=16).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, (pins, result.reason())
