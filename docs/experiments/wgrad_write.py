"""Session 59 (docs/PERF.md): where FFN-SKIP's 128-token weight gradients (dW1 = Xᵀ·dT2, dW2 = S3ᵀ·dT6: K = 128,
each a 117 MB bf16 write) spend their time. An experiment, not a bench: the emitted dW kernels of the default
backward plan edited by hand (no wgmma: the store stream alone; no TMA store: loads and products alone), each timed
alone (profiler, launches serialised), beside the write and copy floors of the same bytes and cuBLAS's product
(torch.mm into bf16). Run on the device machine:

    TOK=128 OUT=/tmp python docs/experiments/wgrad_write.py
"""
import dataclasses
import json
import os

import torch

import habu.bench.train_step_speed as ts
from habu.bench.backward_speed import build
from habu.bench.kernel_times import kernel_device_times, serial_launches
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.runtime import CompiledModel
from habu.timing.harness import time_cuda

TOK = int(os.environ.get("TOK", "128"))
bw, fwd, back = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", {}, {})


def variant(cm, idx, edit, tag):
    members = []
    for guards, ep in cm.kernel_set.members:
        ks = list(ep.kernels)
        k = ks[idx]
        src = edit(k.source)
        assert src != k.source or tag == "base", tag
        new_name = k.name + "_" + tag
        ks[idx] = dataclasses.replace(k, source=src.replace(k.name, new_name), name=new_name)
        members.append((guards, dataclasses.replace(ep, kernels=tuple(ks))))
    return CompiledModel(cm.model, KernelSet(members), arch="sm_90a")


def sub(old, new):
    def f(s):
        assert old in s, old[:60]
        return s.replace(old, new)
    return f


def variants(store_map: str) -> dict:
    return {
        "base": lambda s: s,
        "no_mma": sub("  habu_wgmma_m64n256_bf16_at_bt(acc[0],", "  if (0) habu_wgmma_m64n256_bf16_at_bt(acc[0],"),
        "no_store": sub(f"habu::tma_store_2d(&{store_map},", f"if (0) habu::tma_store_2d(&{store_map},"),
    }


def floors(rows: int, cols: int) -> dict:
    """A write (fill) and a copy of a rows × cols bf16 tensor, µs (medians of CUDA events, 4 buffers in turn)."""
    bufs = [torch.empty((rows, cols), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    src = [torch.randn((rows, cols), device="cuda").to(torch.bfloat16) for _ in range(4)]
    fill = time_cuda(lambda i: bufs[i].fill_(1.0), 4)["median_us"]
    copy = time_cuda(lambda i: bufs[i].copy_(src[(i + 1) % 4]), 4)["median_us"]
    return {"fill_us": fill, "copy_us": copy, "bytes": rows * cols * 2}


def main():
    names = [t.name for t in bw.forward.inputs]
    tensors = ts.inputs_for(TOK, 100)
    named = dict(zip(names, (t.detach() for t in tensors), strict=True))
    dy = torch.randn((TOK, ts.SIZES["D"]), device="cuda").to(torch.bfloat16)
    out = fwd(**named)
    cot = dict(bw.cotangents)["Y"]
    avail = named | {cot: dy} | {s: out[s] for _, s in bw.saved}
    args = {t.name: avail[t.name] for t in back.model.inputs}
    ref = back(**args)
    rows = {"gpu": torch.cuda.get_device_name()}
    kernels = back.kernel_set.members[0][1].kernels
    for idx, k in enumerate(kernels):
        if not ("dW1" in k.stores or "dW2" in k.stores):
            continue
        tm = "tm_" + k.stores[0]
        for tag, edit in variants(tm).items():
            v = variant(back, idx, edit, tag)
            got = v(**args)
            exact = all(torch.equal(got[n], ref[n]) for n in ref)
            with serial_launches():
                t = kernel_device_times(lambda v=v: v(**args))
            alone = [us for n, us in t.items() if n.endswith(tag)]
            rows[f"{k.stores[0]} {tag}"] = dict(kernel_us=alone[0] if alone else None, exact=exact)
            print(k.stores[0], tag, rows[f"{k.stores[0]} {tag}"], flush=True)
    h, d = ts.SIZES["H"], ts.SIZES["D"]
    rows["floors"] = floors(h, d)
    s3 = [torch.randn((TOK, h), device="cuda").to(torch.bfloat16) for _ in range(4)]
    g = [torch.randn((TOK, d), device="cuda").to(torch.bfloat16) for _ in range(4)]
    rows["cublas_dW2_us"] = time_cuda(lambda i: torch.mm(s3[i].t(), g[i]), 4)["median_us"]
    print("floors", rows["floors"], "cublas dW2", rows["cublas_dW2_us"], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"wgrad_write_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


main()
