"""The Python cost of a CompiledModel call on this machine, without a GPU: the default GGEMM plan
(sm_90a, 4096³) called in a loop through the fake driver of `tests/emit_cuda/fakes.py` (every driver
call returns at once), timed and profiled with cProfile.

    python -m tests.emit_cuda.profile_call [--calls 20000] [--top 14]

What it shows is Habu's own host work per call (layout lookup, pointer filling, allocation stand-ins,
launch bookkeeping); the real driver's launch cost and torch's allocator come on top on a GPU
(`python -m habu.bench.call_overhead` measures those)."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from habu.emit_cuda import driver, runtime
from habu.emit_cuda.runtime import CompiledModel
from habu.paths.emit import emit_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.emit_cuda.fakes import BASE, fake_gpu, info


class _Patch:
    """monkeypatch.setattr for a script (the patches stay for the process)."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--top", type=int, default=14)
    args = p.parse_args()
    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    plan = emit_plan(model, default_plan(model, TARGETS["sm_90a"], None), TARGETS["sm_90a"])
    fake_gpu(_Patch(), runtime, driver)
    compiled = CompiledModel(model, plan)
    arrays = {"A": info((4096, 4096), "bf16", BASE), "B": info((4096, 4096), "bf16", BASE + 0x4000000),
              "IX": info((4096,), "i32", BASE + 0x8000000)}
    compiled(**arrays)
    start = time.perf_counter()
    for _ in range(args.calls):
        compiled(**arrays)
    print(f"{(time.perf_counter() - start) / args.calls * 1e6:.2f} us per call (fake driver)")
    profile = cProfile.Profile()
    profile.runcall(lambda: [compiled(**arrays) for _ in range(args.calls // 4)])
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
