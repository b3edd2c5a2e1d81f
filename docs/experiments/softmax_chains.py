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

import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from hand_edits import variant

from habu.bench.attention_speed import CASES, case_source, prove_case
from habu.bench.run import device_target
from habu.emit_cuda.runtime import CompiledModel
from habu.spec.parser import load_program
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

PINS = {"base": (), "max4": (("max_chains", "4"),), "sum2": (("sum_chains", "2"),),
        "both": (("max_chains", "4"), ("sum_chains", "2")), "noskip": (("rescale_always", "true"),)}


def always_open(src: str) -> str:
    """Every tile unmasked (right only for the full cases, whose 1024 keys are 8 whole tiles)."""
    out, n = re.subn(r"const bool open_tile = [^;]*;", "const bool open_tile = true;", src)
    assert n == 2, n
    return out


def run(case, workdir: Path, rounds: int) -> None:
    import torch

    path, name, sizes = case_source(case, workdir)
    model = load_program(path).models[name].with_sizes(sizes)
    built = {}
    for tag, pins in PINS.items():
        _plan, emitted = prove_case(replace(case, pins=case.pins + pins), str(workdir), device_target())
        built[tag] = CompiledModel(model, emitted, arch="sm_90a", check_indices=False)
    if not case.causal:
        built["open"] = variant(built["base"], 0, always_open, "open")
    ins = make_inputs(model, sizes, 1)
    heads = case.kv_heads * case.group
    q = ins["Q"].view(case.batch, heads, case.seq, case.width)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, ins["K"], ins["V"], is_causal=case.causal)

    want = sdpa().float()
    outputs, ref = {}, None
    for tag, cm in built.items():
        outs = poisoned_outputs(model, sizes)
        cm(**ins, **outs)
        torch.cuda.synchronize()
        got = outs["O"].view(case.batch, heads, case.seq, case.width).float()
        ref = got if ref is None else ref
        print(f"{case.name} {tag}: max |Δ|/max|O| against SDPA {((got - want).abs().max() / want.abs().max()).item():.2e}, "
              f"the same bits as base: {torch.equal(got, ref)}", flush=True)
        outputs[tag] = outs
    times: dict[str, list[float]] = {tag: [] for tag in [*built, "sdpa"]}
    for _ in range(rounds):
        for tag, cm in built.items():
            times[tag].append(time_cuda(lambda i, cm=cm, outs=outputs[tag]: cm(**ins, **outs), 1)["median_us"])
        times["sdpa"].append(time_cuda(lambda i: sdpa(), 1)["median_us"])
    for tag, ts in times.items():
        print(f"{case.name} {tag:6s} " + " ".join(f"{t:7.1f}" for t in ts) + f"   min {min(ts):7.1f} us", flush=True)


def main() -> None:
    names = os.environ.get("CASES", "m16k-full-1k-d64,m16k-causal-1k-d64").split(",")
    rounds = int(os.environ.get("ROUNDS", 3))
    by_name = {c.name: c for c in CASES}
    for n in names:
        with tempfile.TemporaryDirectory() as tmp:
            run(by_name[n], Path(tmp), rounds)


if __name__ == "__main__":
    sys.exit(main())
