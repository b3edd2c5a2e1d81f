"""The fused attention kernel's online softmax float code at issue 22's short d64 prefills, which stall on the
softmax's dependent chains (session 41's ncu: FMNMX 18% of the samples, "wait") with two consumer warps a scheduler
to hide them. Session 67 ran this on an H100 (docs/PERF.md, "Session 67").

    CASES=m16k-full-1k-d64,m16k-causal-1k-d64 ROUNDS=3 python docs/experiments/softmax_chains.py

Variants of each case's default plan, each proven (the plan fields of the wgmma loop):
- `base`: the default (the max in two chains a row half, the sum l in one, O rescaled where a row maximum moved);
- `max4`: `max_chains=4` (four chains joined by a tree);
- `sum2`: `sum_chains=2` (the tile's exponentials in two chains, added to l after the tile);
- `both`;
- `noskip`: `rescale_always` (O rescaled by alpha on every tile: no vote, no branch);
- `open` (a hand edit of the default kernel, never a plan): the full cases' tiles all taken as unmasked (the masked
  branch, dead there, removed).
The max's chains and the rescale give the same bits as the default; the sum's chains change its rounding (compared
with SDPA's output like the default, and with the default's). Times: CUDA-event medians, the variants and SDPA in
interleaved rounds.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

from hand_edits import against_sdpa, run_cases, variant

from habu.bench.attention_speed import case_source, prove_case
from habu.bench.run import device_target
from habu.emit_cuda.runtime import CompiledModel
from habu.spec.parser import load_program

PINS = {"base": (), "max4": (("max_chains", "4"),), "sum2": (("sum_chains", "2"),),
        "both": (("max_chains", "4"), ("sum_chains", "2")), "noskip": (("rescale_always", "true"),)}


def always_open(src: str) -> str:
    """Every tile unmasked (right only for the full cases, whose 1024 keys are 8 whole tiles)."""
    out, n = re.subn(r"const bool open_tile = [^;]*;", "const bool open_tile = true;", src)
    assert n == 2, n
    return out


def run(case, workdir: Path, rounds: int) -> None:
    path, name, sizes = case_source(case, workdir)
    model = load_program(path).models[name].with_sizes(sizes)
    built = {}
    for tag, pins in PINS.items():
        _plan, emitted = prove_case(replace(case, pins=case.pins + pins), str(workdir), device_target())
        built[tag] = CompiledModel(model, emitted, arch="sm_90a", check_indices=False)
    if not case.causal:
        built["open"] = variant(built["base"], 0, always_open, "open")
    against_sdpa(case, model, sizes, built, rounds)


def main() -> None:
    run_cases(run, "m16k-full-1k-d64,m16k-causal-1k-d64")


if __name__ == "__main__":
    sys.exit(main())
