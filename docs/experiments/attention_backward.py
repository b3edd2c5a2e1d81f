"""Attention's derived backward (session 62: FlashAttention-2's form, habu/spec/grad_factor.py) at a real size,
against torch autograd through scaled_dot_product_attention in the same run: not a target yet (issue 22 leaves
attention's backward for later), the gap measured.

    SEQ=1024 HEADS=16 KV=8 [PINS=storage=bf16] [FWD_PINS=rewrite=split:%f2] [KPINS=dQ:tile=64x128x64] [OBF16=1] \
        [PROFILE=1] \
        python docs/experiments/attention_backward.py

`PROFILE=1`: each kernel's own time, its launches serialised (habu.bench.kernel_times.serial_launches).

Causal GQA of examples/attention.habu (batch 1, head width 128). Habu's forward-with-saved-values gives the
row maximum and sum the backward reads; both sides get the same Q, K, V and dO; dQ, dK and dV are compared with
torch's in float32 (relative Frobenius error). CUDA events, medians (habu.timing.harness.time_cuda). `PINS`:
the backward plan's pins (KEY=VALUE joined by commas), `FWD_PINS` the forward's (`rewrite=split:%f2`: the unfused
forward, the default before session 65's fused kernel storing R1 and R2); `OBF16=1`: O declared bf16 (so dO is bf16, as SDPA's).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

import habu.bench.backward_speed as backward_speed
from habu.bench.backward_speed import build
from habu.timing.harness import time_cuda

SEQ, HEADS, KV = int(os.environ.get("SEQ", 1024)), int(os.environ.get("HEADS", 16)), int(os.environ.get("KV", 8))
R = HEADS // KV
sizes = {"B": 1, "G": KV, "R": R, "I": SEQ, "J": SEQ}
pins = dict(p.split("=", 1) for p in os.environ.get("PINS", "").split(",") if p)
forward_pins = dict(p.split("=", 1) for p in os.environ.get("FWD_PINS", "").split(",") if p)
# KPINS="dQ:tile=64x128x64;dK.in:tile=64x128x64,stages=4": more pins for the kernel computing each node
kernel_pins = {node: dict(p.split("=", 1) for p in rest.split(",") if p)
               for node, _, rest in (part.partition(":") for part in os.environ.get("KPINS", "").split(";") if part)}
path = "attention.habu"
if os.environ.get("OBF16"):  # the example with O declared bf16, in a temporary file (an absolute path to the build)
    text = (backward_speed.EX / path).read_text().replace("f32  TENSOR: O", "bf16 TENSOR: O")
    path = str(Path(tempfile.mkdtemp()) / "attention_bf16o.habu")
    Path(path).write_text(text)
bw, fwd, back = build(path, "ATTENTION-GQA", sizes, "sm_90a", pins, forward_pins, kernel_pins)
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn((1, KV, R, SEQ, 128), generator=g, device="cuda").to(torch.bfloat16)
k = torch.randn((1, KV, SEQ, 128), generator=g, device="cuda").to(torch.bfloat16)
v = torch.randn((1, KV, SEQ, 128), generator=g, device="cuda").to(torch.bfloat16)
do = torch.randn((1, KV, R, SEQ, 128), generator=g, device="cuda")
out = fwd(Q=q, K=k, V=v)
out = out if isinstance(out, dict) else {bw.forward.outputs[0].name: out}
cot = dict(bw.cotangents)
named = {"Q": q, "K": k, "V": v, cot["O"]: do} | {s: out[s] for _, s in bw.saved}
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16}
inputs = {t.name: named[t.name].to(TORCH[t.dtype.name]) for t in back.model.inputs}
grads = dict(bw.gradients)


def ours(_: int):
    return back(**inputs)


# torch's layout: (batch, heads, seq, width), query head h = g·R + r
qt = q.reshape(1, HEADS, SEQ, 128).clone().requires_grad_()
kt, vt = k.clone().requires_grad_(), v.clone().requires_grad_()
ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
dot = do.reshape(1, HEADS, SEQ, 128).to(torch.bfloat16)


def theirs(_: int):
    return torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)


want = [x.float() for x in theirs(0)]
got = ours(0)
for name, w in zip(("Q", "K", "V"), want, strict=True):
    x = got[grads[name]].float().reshape(w.shape)
    print(f"d{name} rel error {float((x - w).norm() / w.norm()):.2e}")
hf = time_cuda(lambda _: fwd(Q=q, K=k, V=v), 1, reps=10)["median_us"]  # the forward that saves R1, R2
tf = time_cuda(lambda _: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True), 1, reps=30)["median_us"]
print(f"forward with saved statistics: habu {hf:.1f} us, torch SDPA forward {tf:.1f} us, x{tf / hf:.3f}")
h = time_cuda(ours, 1, reps=10)["median_us"]
t = time_cuda(theirs, 1, reps=30)["median_us"]
print(f"seq {SEQ} heads {HEADS}/{KV}: habu {h:.1f} us, torch SDPA backward {t:.1f} us, x{t / h:.3f}")
print(f"training step (forward with saved statistics + backward): habu {hf + h:.1f} us, SDPA {tf + t:.1f} us, "
      f"x{(tf + t) / (hf + h):.3f}")
if os.environ.get("PROFILE"):  # each kernel's own time, launches serialised (an early one counts its wait too)
    from habu.bench.kernel_times import kernel_device_times, serial_launches

    with serial_launches():
        for name, us in kernel_device_times(lambda: ours(0), reps=10).items():
            print(f"kernel {name} {us:.1f} us")
