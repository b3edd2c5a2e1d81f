"""Golden checks on the GPU (run through the device tool): every code path against the float64
reference, with fresh random inputs, poisoned outputs and shapes that break tile assumptions; and,
where the model is integer-exact, the exact check (every element bit for bit, red zones)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference  # noqa: E402
from tests.conftest import ROOT, gemm_kn_source, winner_plan  # noqa: E402
from tests.gpu.row_cases import (  # noqa: E402
    PREFETCH_CASES,
    ROW_COLUMNS,
    ROW_EXAMPLES,
    ROW_VARIANTS,
    row_case_skip,
)

EX = ROOT / "examples"

GG_PATHS = {
    "wgmma": {},
    "wgmma-a-ldg": {"A": "ldg"},
    "wgmma-b-cp.async": {"B": "cp.async"},
    "mma.sync": {"mma": "mma.sync"},
    "fma": {"mma": "fma"},
    "fma-split3": {"mma": "fma", "split_k": "3"},
    "wgmma-persistent": {"persistent": "true", "tile": "128x128x64", "stages": "5"},
    "wgmma-split2": {"split_k": "2", "tile": "128x128x64"},
    "wgmma-staged": {"A": "staged", "B": "staged"},
    "wgmma-staged-persistent": {"A": "staged", "persistent": "true"},
    "wgmma-store-direct": {"store": "direct"},  # the default stores by TMA where the rules allow it
    "wgmma-persistent-store-tma": {"persistent": "true", "store": "tma", "tile": "128x256x64", "stages": "4", "group_m": "1",
                                   "raster": "column"},
    # clusters of 2 along m: B's tile multicast by TMA (the rules skip shapes with an odd tile-row count)
    "wgmma-cluster2": {"cluster": "2", "tile": "128x256x64", "stages": "3"},
    "wgmma-persistent-cluster2": {"cluster": "2", "persistent": "true", "tile": "128x256x64", "stages": "4",
                                  "group_m": "1", "raster": "column"},
    "wgmma-cluster2-n128-direct": {"cluster": "2", "persistent": "true", "tile": "128x128x64", "stages": "4",
                                   "store": "direct"},
}
GG_SHAPES = [
    {"M": 1000, "N": 777, "K": 511},
    {"M": 1000, "N": 777, "K": 17},
    {"M": 257, "N": 130, "K": 1},
    {"M": 1000, "N": 777, "K": 4095},
    {"M": 4096, "N": 4096, "K": 512},
    {"M": 1000, "N": 776, "K": 511},  # f32 rows of 3104 bytes: TMA can store them (776 is not a multiple of 32)
]


def golden(path, model, sizes, pins=None, index="random", seed=0, plan=None):
    built = build(str(EX / path), model, sizes, pins, plan=plan)
    full = built.sizes
    inputs = make_inputs(built.model, full, seed, index)
    outs = poisoned_outputs(built.model, full)
    ref = reference(built.model, inputs, full)  # before the run: a model may update an input in place
    result = built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    tol = plan_tolerance(built.model, built.plan)
    results = result if isinstance(result, dict) else {built.model.outputs[0].name: result}
    for name, out in results.items():
        g = compare(out, ref[name], tol)
        assert g.unwritten == 0, f"{name}: {g.unwritten} elements never written"
        assert g.ok, f"{name}: relative error {g.rel_error:.2e} > {tol:.0e} ({built.plan.kernels})"
    exact = ExactChecker(built.model, full, seed).check(built.compiled, kept_types(built.plan))
    assert exact.ok, f"{exact.reason()} ({built.plan.kernels})"
    return built


@pytest.mark.parametrize("sizes", GG_SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("path", list(GG_PATHS))
def test_ggemm_paths_and_ragged_shapes(path, sizes):
    pins = GG_PATHS[path]
    try:
        golden("ggemm.habu", "GGEMM", sizes, pins, seed=hash((path, tuple(sizes.values()))) % 1000)
    except AssertionError as err:
        if "plan not proven" in str(err) and ("cp.async-size" in str(err) or "tma" in str(err)
                                              or "supported-path" in str(err) or "vector-align" in str(err)
                                              or "cluster-tiles" in str(err) or "split-k-tiles" in str(err)):
            pytest.skip(f"the rules reject {path} at this shape: {err}")
        raise


@pytest.mark.parametrize("index", ["dup", "perm"])
def test_ggemm_index_tensor_with_duplicates_and_a_permutation(index):
    golden("ggemm.habu", "GGEMM", {"M": 1024, "N": 1024, "K": 1024}, index=index)


def test_ggemm_k511_full_shape():
    golden("ggemm.habu", "GGEMM", {"K": 511})


def test_moe_gather_reduced():
    golden("moe_gather.habu", "MOE-UP", {"T": 4096, "R": 1000, "N": 1536, "K": 4096})


@pytest.mark.parametrize("pins", [
    {"tile": "256x96x64", "warps": "20", "stages": "3", "split_k": "2"},  # 4 consumer warpgroups
    {"tile": "192x128x64", "warps": "16", "stages": "3"},  # 3 consumer warpgroups
], ids=["20-warps", "16-warps"])
def test_regression_setmaxnreg_hang_many_consumer_warpgroups(pins):
    """With 40/232 for every warp count, 20 warps asked setmaxnreg.inc for more registers than the
    CTA has and hung the H200 (2026-11-30). Runs in a subprocess with a timeout: a hang fails."""
    import subprocess
    import sys

    code = ("from tests.gpu.test_golden import golden; "
            f"golden('moe_gather.habu', 'MOE-UP', {{'T': 4096, 'R': 1000, 'N': 1536, 'K': 4096}}, {pins!r})")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_gemm_default():
    golden("gemm.habu", "GEMM", {"M": 2048, "N": 2048, "K": 2048})


def test_ffn_skip():
    golden("ffn_skip.habu", "FFN-SKIP", {"B": 128, "D": 1024, "H": 2816})


@pytest.mark.parametrize("D", [256, 4096, 65536])
def test_rmsnorm_runtime_width(D):
    golden("rmsnorm.habu", "RMSNORM-ROWS", {"R": 64, "D": D})


@pytest.mark.parametrize("C", [1000, 16384])
def test_softmax(C):
    golden("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": C})



@pytest.mark.parametrize("cols", ROW_COLUMNS)
@pytest.mark.parametrize("variant", list(ROW_VARIANTS))
@pytest.mark.parametrize("example, model, key", ROW_EXAMPLES, ids=["softmax", "rmsnorm"])
def test_row_kernel_variants(example, model, key, variant, cols):
    """Registers (with softmax's exp kept between passes), shared memory and uncached rows; a warp,
    a block or a cluster of blocks per row; ragged rows (1000 columns) and rows too long for registers."""
    why = row_case_skip(variant, cols)
    if why == "vector-align":
        with pytest.raises(AssertionError, match="vector-align"):
            golden(example, model, {"R": 64, key: cols}, ROW_VARIANTS[variant])
        return  # each block's part of the row must start on a 16-byte vector: the rules reject it
    if why:
        pytest.skip(why)
    golden(example, model, {"R": 64, key: cols}, ROW_VARIANTS[variant])


@pytest.mark.parametrize("example, model, key, cols", [("rmsnorm.habu", "RMSNORM-ROWS", "D", 4352),
                                                       ("softmax.habu", "SOFTMAX-ROWS", "C", 1000)],
                         ids=["rmsnorm", "softmax"])
def test_a_kept_row_of_8_byte_vectors_goes_through_shared_memory_column_by_column(example, model, key, cols):
    """A kept row that does not move in 16-byte vectors (bf16 in 4-element accesses) is copied into
    shared memory one column a thread at a time, under the load's mask, at the slots the lowering's
    cache map gives (the emitted-source sample has no such plan; the CPU proof and NVRTC cover it)."""
    from dataclasses import replace

    from habu.bench.run import device_target
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    sizes = {"R": 64, key: cols}
    m = load_program(EX / example).models[model].with_sizes(sizes)
    plan = default_plan(m, TARGETS[device_target()], sizes)
    plan = replace(plan, kernels=(replace(plan.kernels[0], vector=4, threads=128, rows_per_block=1,
                                          cache_row=True, cluster=1, prefetch=False),))
    golden(example, model, sizes, plan=plan)




@pytest.mark.parametrize("case", list(PREFETCH_CASES))
def test_persistent_blocks_that_prefetch_their_next_row(case):
    """More rows (1500) than blocks the GPU holds at once: each block walks several rows, computing
    one from registers while its next is copied into shared memory."""
    example, model, key, cols, pins = PREFETCH_CASES[case]
    built = golden(example, model, {"R": 1500, key: cols}, pins | {"row_prefetch": "true", "cache_row": "true"})
    assert built.plan.kernels[0].prefetch


def test_a_row_too_long_for_one_block_by_default():
    """131072 columns: the default shares each row among a cluster of 4 blocks."""
    built = golden("softmax.habu", "SOFTMAX-ROWS", {"R": 16, "C": 131072})
    assert built.plan.kernels[0].cluster == 4


def test_layernorm(tmp_path):
    src = tmp_path / "ln.habu"
    src.write_text("64 EXTENT: #R\n4096 EXTENT: #D\nbf16 TENSOR: X ( #R #D )\nbf16 TENSOR: Y ( #R #D )\n"
                   "MODEL: LN ( x -- y ) LAYERNORM ;\n")
    golden(str(src), "LN", {})


@pytest.mark.parametrize("cols", [64, 4096])
def test_regression_row_words_in_a_row(tmp_path, cols):
    """RMSNORM RMSNORM SOFTMAX fused into one row kernel (emission raised KeyError before)."""
    from tests.emit_cuda.test_emit_rows import CHAINED_ROWS

    src = tmp_path / "chain.habu"
    src.write_text(CHAINED_ROWS.format(cols=cols))
    golden(str(src), "X", {})


def test_rmsnorm_linear():
    golden("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 300, "D": 1024, "N": 520})


@pytest.mark.parametrize("sizes", [{"T": 300, "D": 1024, "N": 520}, {"T": 2048, "D": 4096, "N": 4096}],
                         ids=["ragged", "example"])
def test_rmsnorm_linear_with_the_row_scale_after_the_contraction(sizes):
    """The factor:Y rewrite (a row-statistic kernel, then the contraction over X with the scale in
    its epilogue), every partition of it, against the float64 reference of the model as written."""
    from habu.bench.run import device_target
    from habu.plan.partitions import partitions
    from habu.plan.rewrite import apply_rewrites
    from habu.search.space import concrete_sizes, default_kernels, make_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    target = TARGETS[device_target()]
    m = load_program(EX / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"].with_sizes(sizes)
    s = concrete_sizes(m)
    g = apply_rewrites(m, ("factor:Y",))
    for parts in partitions(g):
        plan = make_plan(m, target, default_kernels(g, target, s, parts), s, ("factor:Y",))
        golden("rmsnorm_linear.habu", "RMSNORM-LINEAR", sizes, plan=plan)


@pytest.mark.parametrize("sizes", [{"T": 300, "D": 1000, "N": 520}, {"T": 2048, "D": 4096, "N": 4096}],
                         ids=["ragged", "example"])
def test_rmsnorm_linear_with_w_staged_k_major_through_the_tiled_transpose(sizes):
    """The search's winner for RMSNorm + Linear: factor:Y, then wgmma with W (stored D x N) copied
    K-major by the staging pass, which moves 32 x 32 tiles through shared memory (the rows of the
    tiles are ragged here: 520 and 1000 are not multiples of 32)."""
    from habu.bench.run import device_target
    from habu.search.space import concrete_sizes
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    target = TARGETS[device_target()]
    m = load_program(EX / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"].with_sizes(sizes)
    s = concrete_sizes(m)
    plan = winner_plan(m, target, s)
    built = golden("rmsnorm_linear.habu", "RMSNORM-LINEAR", sizes, plan=plan)
    ((_, emitted),) = built.compiled.kernel_set.members
    (stage,) = [k for k in emitted.kernels if "stage" in k.name]
    assert stage.lowering.tile is not None and stage.lowering.tile.axis == "n"  # a transposing pass


@pytest.mark.parametrize("sizes", [{"T": 300, "D": 1000, "N": 520}, {"T": 2048, "D": 4096, "N": 4096}],
                         ids=["ragged", "example"])
@pytest.mark.parametrize("store", ["direct", "tma"])
def test_rmsnorm_linear_winner_with_w_read_n_major_by_wgmma(sizes, store):
    """The winner's schedule with W (stored D x N, contiguous along n) loaded by TMA in 64-column boxes
    and read by wgmma with its transpose bit: no staging pass (520 is not a multiple of 64: the last
    box is cut by the tensor map's bounds)."""
    from habu.bench.run import device_target
    from habu.plan.plan import Plan
    from habu.search.space import concrete_sizes
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    target = TARGETS[device_target()]
    m = load_program(EX / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"].with_sizes(sizes)
    s = concrete_sizes(m)
    plan = winner_plan(m, target, s)
    plan = Plan.from_json(plan.to_json() | {"kernels": [
        dict(k, b_move="tma", store=store) if k["kind"] == "contraction" else k for k in plan.to_json()["kernels"]]})
    built = golden("rmsnorm_linear.habu", "RMSNORM-LINEAR", sizes, plan=plan)
    ((_, emitted),) = built.compiled.kernel_set.members
    assert not [k for k in emitted.kernels if "stage" in k.name]
    assert any("_bt(acc" in k.source for k in emitted.kernels)




@pytest.mark.parametrize("pins", [{}, {"tile": "128x128x64", "stages": "5", "persistent": "true"},
                                  {"tile": "128x64x64", "split_k": "2"}, {"tile": "256x192x64", "warps": "12", "stages": "3"},
                                  {"tile": "128x256x64", "stages": "3", "cluster": "2", "persistent": "true",
                                   "split_k": "1"}],
                         ids=["default", "128x128-persistent", "128x64-split2", "256x192", "cluster2"])
@pytest.mark.parametrize("sizes", [{}, {"M": 64, "N": 64, "K": 64}, {"M": 129, "N": 200, "K": 4100}],
                         ids=["1000x776x511", "64x64x64", "129x200x4100"])
def test_gemm_with_b_contiguous_along_n_on_wgmma(tmp_path, pins, sizes):
    """B stored (K, N): TMA boxes of 64 columns, wgmma's transposed B, ragged in every dimension (a
    cluster multicasts alternate boxes from each block)."""
    path = tmp_path / "gemm_kn.habu"
    path.write_text(gemm_kn_source())
    if pins.get("cluster") == "2" and -(-sizes.get("M", 1000) // 128) % 2:
        pytest.skip("an odd number of 128-row tiles: the cluster-tiles rule rejects clusters of 2")
    if int(pins.get("split_k", "1")) > -(-sizes.get("K", 511) // 64):
        pytest.skip("more splits than k tiles: the split-k-tiles rule rejects the split")
    built = golden(str(path), "GEMM-KN", sizes, pins)
    (k,) = built.plan.kernels
    assert (k.mma, k.b_move) == ("wgmma", "tma"), built.plan.kernels


@pytest.mark.parametrize("sizes", [{"M": 300, "N": 520, "K": 100}, {"M": 64, "N": 64, "K": 64}],
                         ids=["300x520x100", "64x64x64"])
def test_gemm_tma_store_with_two_slabs_per_consumer(sizes):
    """256-row tiles, two 64-row slabs per consumer warpgroup, each stored in boxes through the two
    buffers in turn; a bf16 output whose last box is cut at 520 columns and at 300 rows."""
    built = golden("gemm.habu", "GEMM", sizes, {"tile": "256x128x64", "warps": "12", "stages": "3", "store": "tma"})
    (k,) = built.plan.kernels
    assert k.store == "tma"


@pytest.mark.parametrize("sizes", [{"M": 512, "N": 520, "K": 300}, {"M": 4096, "N": 4096, "K": 4096}],
                         ids=["512x520x300", "4096"])
def test_gemm_cluster_of_two_shares_b_by_multicast(sizes):
    """Clusters of 2 blocks along m, each loading half of B's 256 rows and multicasting it to both; the
    stage is free again only when the consumers of both blocks released it. Persistent, so the grid
    is sized by the clusters that fit (cuOccupancyMaxActiveClusters)."""
    built = golden("gemm.habu", "GEMM", sizes, {"tile": "128x256x64", "stages": "4", "persistent": "true",
                                                "cluster": "2", "store": "tma"})
    (k,) = built.plan.kernels
    assert k.cluster_m == 2
    ((_, emitted),) = built.compiled.kernel_set.members
    assert "__cluster_dims__(2, 1, 1)" in emitted.kernels[-1].source  # after the staging passes (K = 300)


def test_fused_axpy_relu():
    golden("fused.habu", "AXPY-RELU", {"N": 1 << 20})


def test_argument_errors_never_launch():
    """A wrong shape is refused before any launch in either mode; a bad index value is refused before any
    launch only by check_indices="host" (the default "device" mode masks it in the kernel and reports it
    at habu.check_errors(), tests/gpu/test_graph_capture.py). This test expected the host refusal from the
    default mode, which has checked on the device since issue 20 §3: it failed unnoticed behind -x."""
    from habu.emit_cuda.device_errors import check_errors
    from habu.errors import HabuError

    check_errors()  # nothing left over from earlier tests
    built = build(str(EX / "ggemm.habu"), "GGEMM", {"M": 256, "N": 256, "K": 512}, check_indices="host")
    inputs = make_inputs(built.model, built.sizes, 1)
    bad = dict(inputs, A=inputs["A"][:, :511])
    with pytest.raises(HabuError, match="A"):
        built.compiled(**bad)
    ix = inputs["IX"].clone()
    ix[3] = 9999
    out = torch.full((256, 256), float("nan"), dtype=torch.float32, device="cuda")
    with pytest.raises(HabuError, match=r"IX: values must be in 0\.\.255 .*found 9999 at IX\[3\]"):
        built.compiled(**dict(inputs, IX=ix), O=out)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call launched a kernel"
    check_errors()  # and the device found nothing: nothing ran
