"""The fused attention kernel's online softmax with its row reductions in more independent chains (hand edits of
the emitted default kernel, never plans): issue 22's short d64 prefills stall on the softmax's dependent chains
(session 41's ncu: FMNMX 18% of the samples, "wait"), with two consumer warps a scheduler to hide them.

    CASES=m16k-full-1k-d64,m16k-causal-1k-d64 ROUNDS=3 python docs/experiments/softmax_chains.py

Variants of each case's default kernel:
- `base`: as emitted (the max in two chains a row half, the sum l in one);
- `max4`: the max in four chains a row half (8-key groups jn mod 4), combined by a two-level tree;
- `sum2`: the sum of the tile's exponentials in two chains a row half, added to l after the tile;
- `both`;
- `noskip`: O rescaled by alpha on every tile (not only where a warp's row maximum moved: the vote and its branch);
- `open`: the full cases' tiles all taken as unmasked (the masked branch, dead there, removed).
The max's chains give the same bits (a max is exact); the sum's change its rounding (compared with SDPA's output
like the unedited kernel, and with the unedited kernel's). Times: CUDA-event medians, the variants and SDPA in
interleaved rounds.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from hand_edits import chain, sub, variant

from habu.bench.attention_speed import CASES, case_source, prove_case
from habu.bench.run import device_target
from habu.emit_cuda.runtime import CompiledModel
from habu.spec.parser import load_program
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

MAX4 = chain(
    sub("float mx[4];", "float mx[8];", 2),
    sub("for (int x = 0; x < 4; ++x) mx[x]", "for (int x = 0; x < 8; ++x) mx[x]", 2),
    sub("mx[2 * (jn % 2) + h] = fmaxf(mx[2 * (jn % 2) + h],", "mx[2 * (jn % 4) + h] = fmaxf(mx[2 * (jn % 4) + h],", 4),
    sub("fmaxf(mx[h], mx[2 + h])", "fmaxf(fmaxf(mx[h], mx[2 + h]), fmaxf(mx[4 + h], mx[6 + h]))", 2),
)
SUM2 = chain(
    sub("float mx[4];", "float ls[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n        float mx[4];", 2),
    sub("l[h] += s[", "ls[2 * (jn % 2) + h] += s[", 2),
    sub("pa[0][0] = habu::pack_bf16x2(", "l[0] += ls[0] + ls[2];\n        l[1] += ls[1] + ls[3];\n"
        "        pa[0][0] = habu::pack_bf16x2(", 2),
)
NOSKIP = sub("if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // a row's max moved",
             "{  // always", 2)


def always_open(src: str) -> str:
    """Every tile unmasked (right only for the full cases, whose 1024 keys are 8 whole tiles)."""
    import re

    out, n = re.subn(r"const bool open_tile = [^;]*;", "const bool open_tile = true;", src)
    assert n == 2, n
    return out


VARIANTS = {"base": lambda s: s, "max4": MAX4, "sum2": SUM2, "noskip": NOSKIP, "open": always_open,
            "both": chain(SUM2, sub("float mx[4];", "float mx[8];", 2),
                          sub("for (int x = 0; x < 4; ++x) mx[x]", "for (int x = 0; x < 8; ++x) mx[x]", 2),
                          sub("mx[2 * (jn % 2) + h] = fmaxf(mx[2 * (jn % 2) + h],",
                              "mx[2 * (jn % 4) + h] = fmaxf(mx[2 * (jn % 4) + h],", 4),
                          sub("fmaxf(mx[h], mx[2 + h])", "fmaxf(fmaxf(mx[h], mx[2 + h]), fmaxf(mx[4 + h], mx[6 + h]))", 2))}


def run(case, workdir: Path, rounds: int) -> None:
    import torch

    _plan, emitted = prove_case(case, str(workdir), device_target())
    path, name, sizes = case_source(case, workdir)
    model = load_program(path).models[name].with_sizes(sizes)
    base = CompiledModel(model, emitted, arch="sm_90a", check_indices=False)
    ins = make_inputs(model, sizes, 1)
    heads = case.kv_heads * case.group
    q = ins["Q"].view(case.batch, heads, case.seq, case.width)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, ins["K"], ins["V"], is_causal=case.causal)

    want = sdpa().float()
    built, ref = {}, None
    for tag, edit in VARIANTS.items():
        if tag == "open" and case.causal:
            continue
        cm = variant(base, 0, edit, tag)
        outs = poisoned_outputs(model, sizes)
        cm(**ins, **outs)
        torch.cuda.synchronize()
        got = outs["O"].view(case.batch, heads, case.seq, case.width).float()
        ref = got if ref is None else ref
        print(f"{case.name} {tag}: max |Δ|/max|O| against SDPA {((got - want).abs().max() / want.abs().max()).item():.2e}, "
              f"the same bits as base: {torch.equal(got, ref)}", flush=True)
        built[tag] = (cm, outs)
    times: dict[str, list[float]] = {tag: [] for tag in [*built, "sdpa"]}
    for _ in range(rounds):
        for tag, (cm, outs) in built.items():
            times[tag].append(time_cuda(lambda i, cm=cm, outs=outs: cm(**ins, **outs), 1)["median_us"])
        times["sdpa"].append(time_cuda(lambda i: sdpa(), 1)["median_us"])
    for tag, ts in times.items():
        print(f"{case.name} {tag:5s} " + " ".join(f"{t:7.1f}" for t in ts) + f"   min {min(ts):7.1f} us", flush=True)


def main() -> None:
    names = os.environ.get("CASES", "m16k-full-1k-d64,m16k-causal-1k-d64").split(",")
    rounds = int(os.environ.get("ROUNDS", 3))
    by_name = {c.name: c for c in CASES}
    for n in names:
        with tempfile.TemporaryDirectory() as tmp:
            run(by_name[n], Path(tmp), rounds)


if __name__ == "__main__":
    sys.exit(main())
