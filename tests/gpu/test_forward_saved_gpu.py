"""One row kernel storing a row statistic and its row, on the GPU (run through the device tool): RMSNorm's
forward with the rstd its backward saves (R1[r] and Y[r d] from one read of X) against the float64
reference in every runtime-width bucket, a cluster-shared row (only block 0 of the cluster stores R1), the
forward of RMSNorm-then-linear, and bit for bit against the plan before (R1's kernel, then Y's: the same
reduction order, the same products); SOFTMAX-NODES' default (its max and sum kept on chip, 4 kernels -> 2)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.forward_saved_speed import built, forward_model, split_plan  # noqa: E402
from habu.compile import compile_model, kernel_set  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.gpu_info import current_arch  # noqa: E402
from habu.paths.emit import emit  # noqa: E402
from habu.search.space import default_plan  # noqa: E402
from habu.spec.grad_program import derive_model  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.target import target_named  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.gpu.test_golden import golden  # noqa: E402


def derived_forward(example: str, name: str, shape: dict[str, int], static: dict[str, int] | None = None,
                    pins: dict[str, str] | None = None):
    """The derived forward (with its saved values) compiled as `habu.build(..., grad=True)` compiles it (under
    `pins`); `example` is a file of examples/, or a path from the repository's root."""
    tgt = target_named(current_arch())
    program = load_program(ROOT / example if "/" in example else ROOT / "examples" / example)
    fwd = derive_model(program, name, None).forward
    key = f"{name}-FWD"
    program.models[key] = fwd.with_sizes(static) if static else fwd
    program.model_spans[key] = program.model_spans[name]
    compiled = compile_model(program, key, shape, tgt, pins or {}, trials=1)
    members = [emit(p, tgt) for p in compiled.proofs]
    return compiled, CompiledModel(compiled.model, kernel_set(compiled, members), arch=tgt.name)


def _check(compiled, built_model, sizes, seed, names):
    model = compiled.model.with_sizes(sizes)
    full = {**{e.name: e.size for e in model.extents if e.size is not None}, **sizes}
    inputs = make_inputs(model, full, seed=seed)
    got = built_model(**inputs, **poisoned_outputs(model, full))
    torch.cuda.synchronize()
    want = reference(model, inputs, full)
    plan = compiled.plans[built_model.kernel_set.index(full)]
    assert sum(k.kind == "rows" for k in plan.kernels) == 1, plan.kernels  # R1 and the row from one kernel
    for name in names:
        g = compare(got[name], want[name], tolerance(model, dict(plan.storage)))
        assert g.unwritten == 0 and g.ok, (name, sizes, g)


@pytest.mark.parametrize("model", ["RMSNORM-ROWS", "RMSNORM-EQ"])
def test_rmsnorm_forward_with_rstd_matches_the_float64_reference_in_every_bucket(model):
    compiled, fwd = derived_forward("rmsnorm.habu", model, {"R": 67})
    for d in (256, 512, 768, 1024, 4096, 4352, 16384, 33024, 65536):  # bucket edges, odd row count
        _check(compiled, fwd, {"R": 67, "D": d}, seed=d, names=("Y", "R1"))


def test_a_cluster_shared_row_stores_its_rstd_once():
    """131072 columns: a cluster of blocks shares each row; only block 0 of the cluster stores R1."""
    compiled, fwd = derived_forward("rmsnorm.habu", "RMSNORM-ROWS", {"R": 33}, static={"D": 131072})
    assert compiled.plans[0].kernels[0].cluster > 1, compiled.plans[0].kernels
    _check(compiled, fwd, {"R": 33}, seed=7, names=("Y", "R1"))


def test_rmsnorm_linear_forward_saves_rstd_and_the_normalised_row():
    compiled, fwd = derived_forward("rmsnorm_linear.habu", "RMSNORM-LINEAR", {})
    _check(compiled, fwd, {}, seed=11, names=("Y", "R1", "S1"))


@pytest.mark.parametrize("width", [1000, 4096, 16384, 65536])
def test_the_fused_kernel_is_bitwise_the_two_kernels_it_replaces(width):
    """The fused kernel reduces in the R1 kernel's order and scales each element by the same float: Y and
    R1 equal the split plan's bit for bit (same threads: the default chooses them from the row alone)."""
    tgt = target_named(current_arch())
    sizes = {"R": 129, "D": width}
    model = forward_model().with_sizes(sizes)
    fused, split = default_plan(model, tgt, sizes, {}), split_plan(model, tgt, sizes)
    assert fused.kernels[0].threads == split.kernels[0].threads
    x = torch.randn((129, width), generator=torch.Generator(device="cuda").manual_seed(width), device="cuda")
    x = x.to(torch.bfloat16)
    a, b = built(model, fused, tgt)(X=x), built(model, split, tgt)(X=x)
    torch.cuda.synchronize()
    assert torch.equal(a["R1"], b["R1"]) and torch.equal(a["Y"], b["Y"])


@pytest.mark.parametrize("rows", [1, 300])
def test_softmax_nodes_default_keeps_max_and_sum_on_chip(rows):
    """One row kernel since session 33 (`habu.plan.row_fusion.row_then_statistic`: exp(x − max) on chip too)."""
    built_model = golden("families.habu", "SOFTMAX-NODES", {"R": rows})
    assert [k.nodes for k in built_model.plan.kernels] == [("%1", "%2", "%3", "Ps")]
