"""The grouped-GEMM family on the GPU (habu/lower/grouped.py, emit_grouped.py): its default plans (rows
gathered or not) pass the exact differential check bit for bit (habu/timing/exact.py: integer inputs,
red-zoned buffers, a sorted grouping), and hand-made groupings — empty groups first, inside and last,
groups smaller than a tile, one group holding every row — match the float64 product exactly."""

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

GG = ROOT / "tests" / "data" / "grouped_gemm.habu"
T, N, K, G = 300, 200, 72, 8
GROUPINGS = {  # rows of each of the 8 groups (tiles of 64 rows)
    "first-empty": [0, 100, 50, 50, 50, 25, 20, 5],
    "inner-empty": [64, 0, 0, 100, 1, 0, 70, 65],
    "last-empty": [40, 40, 40, 40, 40, 40, 60, 0],
    "one-group-holds-every-row": [0, 0, 0, 300, 0, 0, 0, 0],
    "smaller-than-a-tile": [1, 2, 3, 5, 7, 11, 13, 258],
}


# the default (on the H200: the wgmma loop, issue 20 §1) and the mma.sync loop (`--pin family=grouped`, sm_80's default)
LOOPS = {"default": {}, "mma.sync": {"family": "grouped"}}


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("model", ["GROUPED-GATHER", "GROUPED-PLAIN"])
@pytest.mark.parametrize("rows", [1, 37, 1000])
def test_the_grouped_default_plan_passes_the_exact_check(model, rows, loop):
    built = build(str(GG), model, {"T": T, "R": rows}, LOOPS[loop])
    assert [k.kind for k in built.plan.kernels] == ["grouped"]
    result = ExactChecker(built.model, built.sizes, seed=rows).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("name", list(GROUPINGS))
def test_hand_made_groupings_match_the_float64_product_exactly(name, loop):
    counts = GROUPINGS[name]
    rows = sum(counts)
    built = build(str(GG), "GROUPED-GATHER", {"T": T, "R": rows}, LOOPS[loop])
    g = torch.Generator().manual_seed(rows)
    x = torch.randint(-3, 4, (T, K), generator=g).bfloat16().cuda()
    w = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    ix = torch.randint(0, T, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(X=x, W=w, IX=ix, E=e)
    out = out["Y"] if isinstance(out, dict) else out
    torch.cuda.synchronize()
    ref = torch.einsum("rk,rnk->rn", x[ix.long()].double(), w[e.long()].double())
    assert torch.equal(out.double(), ref), f"{int((out.double() != ref).sum())} of {ref.numel()} elements differ"


def test_a_grouping_out_of_order_raises_the_device_error_at_check_errors():
    import habu

    rows = 300
    built = build(str(GG), "GROUPED-GATHER", {"T": T, "R": rows})
    x = torch.ones((T, K), device="cuda").bfloat16()
    w = torch.ones((G, N, K), device="cuda").bfloat16()
    ix = torch.arange(rows, device="cuda").int() % T
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(GROUPINGS["first-empty"])).int()
    e[150], e[151] = 7, 1  # rows out of order (values still in range)
    with pytest.raises(Exception, match="never decrease"):
        built.compiled(X=x, W=w, IX=ix, E=e.cuda())
        torch.cuda.synchronize()
        habu.check_errors()
