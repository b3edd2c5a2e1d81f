"""The search on a real GPU: the timing worker, its golden check, the torch baseline, the database."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.db import PlanDB  # noqa: E402
from habu.search.loop import Budget, Search  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.spec.reference import evaluate  # noqa: E402
from habu.target import TARGETS  # noqa: E402
from habu.timing.baselines import torch_baseline  # noqa: E402
from habu.timing.harness import make_inputs  # noqa: E402
from habu.timing.worker import GpuTimer  # noqa: E402
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


def test_habu_run_computes_the_model_from_npz_inputs(tmp_path):
    import subprocess
    import sys

    from habu.emit_cuda.driver import bf16_bits_to_float, float_to_bf16_bits

    sizes = {"M": 256, "N": 128, "K": 64}
    model = next(iter(load_program(ROOT / "examples" / "ggemm.habu").models.values())).with_sizes(sizes)
    rng = np.random.default_rng(5)
    inputs = {"A": rng.standard_normal((256, 64)).astype(np.float32),
              "B": rng.standard_normal((128, 64)).astype(np.float32),
              "IX": rng.integers(0, 256, 256).astype(np.int32)}
    np.savez(tmp_path / "in.npz", **inputs)
    r = subprocess.run([sys.executable, "-m", "habu", "run", str(ROOT / "examples" / "ggemm.habu"),
                        "--shape", "M=256,N=128,K=64", "--inputs", str(tmp_path / "in.npz"),
                        "--output", str(tmp_path / "out.npz"), "--db", str(tmp_path / "db.sqlite")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "no tuned plan" in r.stderr  # an empty database: the default plan, said once
    rounded = {k: bf16_bits_to_float(float_to_bf16_bits(v)).astype(np.float64) if k != "IX" else v
               for k, v in inputs.items()}
    expect = evaluate(model, rounded, sizes)["O"]
    got = np.load(tmp_path / "out.npz")["O"]
    assert np.abs(got - expect).max() / np.abs(expect).max() < 1e-4


def test_regression_a_timing_worker_killed_mid_search_is_restarted_and_the_search_goes_on(tmp_path):
    """Issue 23: nothing tested a real timing worker dying. The worker process is killed (SIGKILL) 0.2 s
    into the first measurement: that plan fails with the reason, a new worker starts for the next plan,
    and the search still ends with measured plans in the database."""
    import os
    import signal
    import threading

    path = ROOT / "examples" / "ggemm.habu"
    sizes = {"M": 1024, "N": 1024, "K": 511}
    model = next(iter(load_program(path).models.values())).with_sizes(sizes)
    timer = GpuTimer(str(path), model.name, sizes)
    assert timer.start() is not None
    killed: list[int] = []
    workers: list[int] = []  # the worker process that answered each measurement
    real = timer.measure

    def measure(plan_json, cubins=None):
        if not killed:
            pid = timer.proc.pid
            killed.append(pid)
            threading.Timer(0.2, lambda: os.kill(pid, signal.SIGKILL)).start()
        m = real(plan_json, cubins)
        if timer.proc is not None:
            workers.append(timer.proc.pid)
        return m

    timer.measure = measure
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=6), timer=timer).run()
        assert killed and any(pid != killed[0] for pid in workers)  # a new worker took over
        assert result.measured and result.stats.timed >= 2
        assert db.get(result.key).records[0].status == "measured"
    timer.close()


def test_habu_tune_on_the_gpu_reports_the_winners_measurement_once(tmp_path):
    """habu/tuning.py on a GPU: the winner is timed and stored as measured, and report.md (written once,
    never read back) has one "Measured" section with the stored record's median."""
    import io

    from rich.console import Console

    from habu.tuning import tune, winner_record

    out = tmp_path / "out"
    result = tune(ROOT / "examples" / "ggemm.habu", shape={"M": 512, "N": 512, "K": 256}, budget=3, jobs=1,
                  db=tmp_path / "db.sqlite", out=out, log=Console(file=io.StringIO()))
    (tuned,) = result.tuned
    record = winner_record(tuned.result)
    assert tuned.result.measured and record is not None and record.status == "measured"
    report = (out / "report.md").read_text()
    assert report.count("# Compilation report") == 1 and report.count("## Measured") == 1
    assert f"median {record.median_us:.1f} µs" in report
    assert (out / "candidates.csv") in tuned.files
