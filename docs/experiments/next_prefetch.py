"""Session 58 (docs/PERF.md): the next kernel's weights warmed in the L2 during a one-wave product's tail. An
experiment, not a bench: the emitted kernels of FFN-SKIP's default plans edited by hand. After its last TMA load,
each producer thread of the forward's first product (112 blocks, one wave) issues `cp.async.bulk.prefetch.L2` for
a share of the first bytes the plan's next product reads (W2's first k rows, contiguous); likewise the backward's
dT2 product for the prefixes of W1's rows that dX reads first. A prefetch is a hint: no value depends on it, so
each variant's outputs must equal the unedited kernel's bit for bit. Run on the device machine:

    TOK=128 OUT=/tmp python docs/experiments/next_prefetch.py
"""
import dataclasses
import json
import os
import re
import statistics

import torch

import habu.bench.train_step_speed as ts
from habu.bench.backward_speed import build
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.kernel import Param
from habu.emit_cuda.runtime import CompiledModel
from habu.timing.harness import time_cuda

TOK = int(os.environ.get("TOK", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
MIN = os.environ.get("MIN") == "1"  # the fewest variants: none, the largest prefetch, every other k tile
bw, fwd, back = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", {}, {})
D, H = ts.SIZES["D"], ts.SIZES["H"]
CONSUMERS = "  } else {  // --------------------------------------------------------------------- consumers"

PREFETCH = """    // experiment: warm the first bytes the plan's next kernel reads of {tensor} in the L2
    for (int r = blockIdx.x * 128 + ptid; r < {rows}; r += gridDim.x * 128) {{
      const char* line = reinterpret_cast<const char*>(p_NEXT) + (long long)({row}) * {stride};
#pragma unroll 1
      for (int off = {start}; off < {prefix}; off += {step})
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(line + off), "r"(min({chunk}, {prefix} - off)) : "memory");
    }}
"""
CONTIGUOUS = dict(row="r", start=0, step=4096, chunk=4096)


EARLY_PAIR = re.compile(r"= habu::pack_bf16x2\(\((.+?) \? habu::load_bf16\((.+?)\) : 0\.0f\), .*?\);\n")


def pair4(src):
    """The early loads' pairs as one 4-byte load each (n even and the rows of an even length: both or neither in
    bounds, and 4-byte aligned)."""
    def one(m):
        cond, ptr = m.group(1), m.group(2)
        assert "(n) < 14336" in cond or "(n) < 4096" in cond, cond
        return f"= ({cond} ? __ldg(reinterpret_cast<const unsigned int*>({ptr})) : 0u);\n"
    out, count = EARLY_PAIR.subn(one, src)
    assert count >= 1, "no early pair"
    return out


def with_prefetch(cm, idx, tensor, rows, stride, prefix, tag, pairs=False, walk=CONTIGUOUS):
    """`cm` with kernel `idx` prefetching `rows` rows of `tensor` (`stride` bytes apart), `prefix` bytes of each;
    `pairs`: its early loads 4 bytes a pair."""
    members = []
    for guards, ep in cm.kernel_set.members:
        ks = list(ep.kernels)
        k = ks[idx]
        src = pair4(k.source) if pairs else k.source
        params = k.params
        if rows:
            assert src.count(CONSUMERS) == 1
            src = src.replace(CONSUMERS, PREFETCH.format(tensor=tensor, rows=rows, stride=stride, prefix=prefix, **walk)
                              + CONSUMERS)
            head, sig = src.split(f" {k.name}(", 1)
            sig, rest = sig.split(") {\n", 1)
            src = f"{head} {k.name}({sig}, const habu::bf16* __restrict__ p_NEXT) {{\n{rest}"
            params = (*k.params, Param("p_NEXT", "ptr", tensor, "bf16"))
        name = f"{k.name}_{tag}"
        ks[idx] = dataclasses.replace(k, source=src.replace(k.name, name), name=name, params=params)
        members.append((guards, dataclasses.replace(ep, kernels=tuple(ks))))
    return CompiledModel(cm.model, KernelSet(members), arch="sm_90a")


def main():
    names = [t.name for t in bw.forward.inputs]
    tensors = ts.inputs_for(TOK, 100)
    named = dict(zip(names, (t.detach() for t in tensors), strict=True))
    dy = torch.randn((TOK, D), device="cuda").to(torch.bfloat16)
    out = fwd(**named)
    cot = dict(bw.cotangents)["Y"]
    avail = named | {cot: dy} | {s: out[s] for _, s in bw.saved}
    bargs = {t.name: avail[t.name] for t in back.model.inputs}
    ref_f, ref_b = fwd(**named), back(**bargs)
    # W2 is [H][D] (fwd2 reads its k rows in order: contiguous); W1 is [D][H] (dX reads each row's first bytes)
    fvars = {f"fwd W2 {mb} MB": with_prefetch(fwd, 0, "W2", mb * 2**20 // (2 * D), 2 * D, 2 * D, f"f{mb}")
             for mb in ((0, 16) if MIN else (0, 8, 16, 24))}
    # every other k tile (64 rows of W2; 128 bytes of a W1 row): the next kernel's misses keep the DRAM busy
    # while its hits come from the L2
    fvars["fwd W2 16 MB odd k tiles"] = with_prefetch(fwd, 0, "W2", 16 * 2**20 // (2 * D), 2 * D, 2 * D, "fo16",
                                                      walk=dict(row="(r / 64) * 128 + 64 + r % 64", start=0,
                                                                step=4096, chunk=4096))
    if not MIN:
        fvars["fwd pairs of 4 bytes"] = with_prefetch(fwd, 0, "W2", 0, 0, 0, "fp4", pairs=True)
    bvars = {f"bwd W1 {kb} KB a row": with_prefetch(back, 1, "W1", D if kb else 0, 2 * H, kb * 1024, f"b{kb}")
             for kb in ((0, 4) if MIN else (0, 2, 4))}
    bvars["bwd W1 4 KB odd k tiles"] = with_prefetch(back, 1, "W1", D, 2 * H, 8192, "bo4",
                                                     walk=dict(row="r", start=128, step=256, chunk=128))
    if not MIN:
        bvars["bwd pairs of 4 bytes"] = with_prefetch(back, 1, "W1", 0, 0, 0, "bp4", pairs=True)
        bvars["bwd pairs, W1 4 KB"] = with_prefetch(back, 1, "W1", D, 2 * H, 4096, "bp4w", pairs=True)
    # the plan's own `warm_next` (habu/lower/warm_next.py: the next kernel's first k tiles by its tensor map),
    # pinned on both plans
    for t in (int(x) for x in os.environ.get("WARM", "16,32").split(",") if x):
        _, wf, wb = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", {"warm_next": str(t)},
                          {"warm_next": str(t)})
        fvars[f"fwd plan warm_next={t}"], bvars[f"bwd plan warm_next={t}"] = wf, wb
    rows = {}
    for label, v in fvars.items():
        o = v(**named)
        rows[label] = {"exact": all(torch.equal(o[k], ref_f[k]) for k in ref_f), "plan": [], "step": []}
    for label, v in bvars.items():
        o = v(**bargs)
        o = o if isinstance(o, dict) else {"out": o}
        r = ref_b if isinstance(ref_b, dict) else {"out": ref_b}
        rows[label] = {"exact": all(torch.equal(o[k], r[k]) for k in r), "plan": [], "step": []}
    print({k: v["exact"] for k, v in rows.items()}, flush=True)
    base_f, base_b = fvars["fwd W2 0 MB"], bvars["bwd W1 0 KB a row"]
    eager = []
    for _ in range(ROUNDS):
        for label, v in fvars.items():
            rows[label]["plan"].append(time_cuda(lambda i, v=v: v(**named), 1)["median_us"])
            rows[label]["step"].append(time_cuda(lambda i, v=v: ts.habu_step(bw, v, base_b, tensors, dy), 1)["median_us"])
            print(f"  {label}: plan {rows[label]['plan'][-1]:.1f} step {rows[label]['step'][-1]:.1f}", flush=True)
        for label, v in bvars.items():
            rows[label]["plan"].append(time_cuda(lambda i, v=v: v(**bargs), 1)["median_us"])
            rows[label]["step"].append(time_cuda(lambda i, v=v: ts.habu_step(bw, base_f, v, tensors, dy), 1)["median_us"])
            print(f"  {label}: plan {rows[label]['plan'][-1]:.1f} step {rows[label]['step'][-1]:.1f}", flush=True)
        eager.append(time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"])
        print(f"  eager step {eager[-1]:.1f}", flush=True)
    for label, r in rows.items():
        print(f"{label:22s} exact {r['exact']}  plan {statistics.median(r['plan']):7.1f} µs "
              f"({' '.join(f'{x:.1f}' for x in r['plan'])})  step {statistics.median(r['step']):7.1f} "
              f"({' '.join(f'{x:.1f}' for x in r['step'])})", flush=True)
    print(f"eager step {statistics.median(eager):.1f} ({' '.join(f'{x:.1f}' for x in eager)})")
    rows["eager_step_us"] = eager
    with open(os.path.join(os.environ.get("OUT", "."), f"next_prefetch_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


main()
