"""Session 57 (docs/PERF.md): FFN-SKIP's 128-token epilogues taken apart. An experiment, not a bench: the emitted
kernels of the default plans edited by hand (each variant named by what it leaves out), timed alone and in the
step, their outputs compared with the unedited kernels' bit for bit. Run on the device machine:

    TOK=128 OUT=/tmp python docs/experiments/epilogue_parts.py
"""
import json
import os
import re

import torch
from hand_edits import chain, sub, variant

import habu.bench.train_step_speed as ts
from habu.bench.backward_speed import build
from habu.bench.kernel_times import kernel_device_times, serial_launches
from habu.timing.harness import time_cuda

TOK = int(os.environ.get("TOK", "128"))
OLD = {"epilogue_early": "false"}  # the plans as they were before session 57 made the early loads the default
bw, fwd, back = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", OLD, OLD)

# --- fwd1 variants
BIAS_HOIST = """      float biasv[16][2];  // experiment: the tile's bias, loaded before the mainloop
#pragma unroll
      for (int j = 0; j < 16; ++j) { const int nb = n0 + 8 * j + 2 * (lane % 4); biasv[j][0] = nb < 14336 ? habu::load_bf16(p_B1 + nb) : 0.0f; biasv[j][1] = nb + 1 < 14336 ? habu::load_bf16(p_B1 + nb + 1) : 0.0f; }
"""
def hoist_bias(s):
    head, tail = s.split("// --------------------------------------------------------------------- consumers", 1)
    marker = "const int n0 = (int)(tn * 128);\n"
    tail = tail.replace(marker, marker + BIAS_HOIST, 1)
    tail = tail.replace("const float e0_0 = (((n) < 14336) ? habu::load_bf16(p_B1 + ((int)(n))) : 0.0f);", "const float e0_0 = biasv[j][0];")
    tail = tail.replace("const float e1_0 = ((((n + 1)) < 14336) ? habu::load_bf16(p_B1 + ((int)((n + 1)))) : 0.0f);", "const float e1_0 = biasv[j][1];")
    assert "biasv[j][1]" in tail
    return head + "// --------------------------------------------------------------------- consumers" + tail

NOINLINE = """#include "habu/habu.cuh"
__device__ __noinline__ float habu_erf_call(float x) { return erff(x); }
__device__ __noinline__ float habu_exp_call(float x) { return __expf(x); }
"""
def noinline(s, exp=False):
    s = s.replace('#include "habu/habu.cuh"\n', NOINLINE, 1).replace("habu::f_erf(", "habu_erf_call(")
    return s.replace("habu::f_exp(", "habu_exp_call(") if exp else s

F_VARIANTS = {
    "base": lambda s: s,
    "bias_hoist": hoist_bias,
    "no_erf": sub("habu::f_erf(", "(", 2),
    "erf_noinline": noinline,
    "plain_epi": chain(sub("habu::tma_store_2d(&tm_S1, buf0,", "if (0) habu::tma_store_2d(&tm_S1, buf0,"),
                       lambda s: re.sub(r"const float v(\d) = \(\(0\.5f \* \(acc\[s\]\[([^\]]*)\] \+ e\d_0\)\).*?;\n", lambda m: f"const float v{m.group(1)} = acc[s][{m.group(2)}];\n", s),
                       lambda s: s.replace("habu::load_bf16(p_B1 + ((int)(n)))", "0.0f").replace("habu::load_bf16(p_B1 + ((int)((n + 1))))", "0.0f")),
    "no_round_wait": sub("if (boxes_stored >= 1 && threadIdx.x % 128 == 0) habu::bulk_wait_group_read<0>();", ""),
}
B_VARIANTS = {
    "base": lambda s: s,
    "erf_noinline": noinline,
    "s1_const": lambda s: re.sub(r"habu::load_bf16\(p_S1 \+ [^;]*?\) : 0\.0f\);", "0.5f : 0.0f);", s),
    "no_gelu_grad": lambda s: re.sub(r"const float v(\d) = \(\(\(\(acc\[s\]\[([^\]]*)\] \* .*?;\n", lambda m: f"const float v{m.group(1)} = acc[s][{m.group(2)}] * (e{m.group(1)}_0 + e{m.group(1)}_1);\n", s),
}

def measure(label, plan, index, variants, args, step_of):
    """Each variant of kernel `index` of `plan`: its outputs against the unedited kernel's (bit for bit), its time
    alone (launches serialised) and the step's with it (`step_of`: the step given the edited plan)."""
    rows, ref = {}, plan(**args)
    for tag, edit in variants.items():
        v = variant(plan, index, edit, tag)
        out = v(**args)
        exact = all(torch.equal(out[k], ref[k]) for k in ref)
        with serial_launches():
            t = kernel_device_times(lambda v=v: v(**args))
        alone = [us for n, us in t.items() if n.endswith(tag)]
        step = time_cuda(lambda i, v=v: step_of(v), 1)["median_us"]
        rows[f"{label} {tag}"] = dict(kernel_us=alone[0] if alone else None, exact=exact, step_us=step)
        print(label, tag, rows[f"{label} {tag}"], flush=True)
    return rows


def main():
    names = [t.name for t in bw.forward.inputs]
    tensors = ts.inputs_for(TOK, 100)
    named = dict(zip(names, (t.detach() for t in tensors), strict=True))
    dy = torch.randn((TOK, ts.SIZES["D"]), device="cuda").to(torch.bfloat16)
    rows = measure("fwd", fwd, 0, F_VARIANTS, named, lambda v: ts.habu_step(bw, v, back, tensors, dy))
    out = fwd(**named)
    cot = dict(bw.cotangents)["Y"]
    avail = named | {cot: dy} | {s: out[s] for _, s in bw.saved}
    bargs = {t.name: avail[t.name] for t in back.model.inputs}
    rows |= measure("bwd", back, 1, B_VARIANTS, bargs, lambda v: ts.habu_step(bw, fwd, v, tensors, dy))
    eager = time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"]
    print("eager step", eager)
    rows["eager_step_us"] = eager
    with open(os.path.join(os.environ.get("OUT", "."), f"epilogue_parts_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


main()
