"""The search on a real GPU: the timing worker, its golden check, the torch baseline, the database."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.baselines import torch_baseline  # noqa: E402
from habu.bench.harness import make_inputs  # noqa: E402
from habu.bench.worker import GpuTimer  # noqa: E402
from habu.db import PlanDB  # noqa: E402
from habu.search.loop import Budget, Search  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.spec.reference import evaluate  # noqa: E402
from habu.target import TARGETS  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


@pytest.mark.parametrize("example, sizes", [("ggemm.habu", {"M": 300, "N": 200, "K": 511}),
                                            ("gemm.habu", {"M": 256, "N": 384, "K": 128}),
                                            ("moe_gather.habu", {"T": 512, "R": 256, "N": 384, "K": 256})])
def test_the_torch_baseline_computes_the_model(example, sizes):
    model = next(iter(load_program(ROOT / "examples" / example).models.values()))
    sizes = {k: v for k, v in sizes.items() if k in {e.name for e in model.extents}}
    model = model.with_sizes(sizes)
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=7)
    name, fn = torch_baseline(model, inputs)
    got = fn(inputs).double().cpu().numpy()
    host = {k: v.double().cpu().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in inputs.items()}
    (expect,) = evaluate(model, host, full).values()
    err = np.linalg.norm(got - expect) / np.linalg.norm(expect)
    assert err < 2e-2, (name, err)


def test_a_gpu_search_times_golden_checks_and_stores_measured_plans(tmp_path):
    path = ROOT / "examples" / "ggemm.habu"
    sizes = {"M": 1024, "N": 1024, "K": 511}
    model = next(iter(load_program(path).models.values())).with_sizes(sizes)
    timer = GpuTimer(str(path), model.name, sizes)
    assert timer.start() is not None
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=6), timer=timer).run()
        assert result.measured and result.stats.timed >= 2
        assert result.stats.baseline_us and result.stats.baseline.startswith("torch")
        best = db.get(result.key).records[0]
        assert best.status == "measured" and best.median_us > 0 and best.golden["O"]["ok"]
        assert best.provenance["baseline_us"] == result.stats.baseline_us
        assert db.get(result.key).key.target.gpu == timer_info_gpu(result)


def timer_info_gpu(result):
    from habu.gpu_info import device_info

    return device_info()["gpu"]
