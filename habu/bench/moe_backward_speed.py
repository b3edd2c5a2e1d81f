"""The MoE FFN layer's derived backward (issue 21: the backward of a gather is a scatter-add; examples/
moe_mixtral.habu) against torch autograd of the same layer in the same run:

    python -m habu.bench.moe_backward_speed [--tokens 512,4096] [--reps 5] [--json OUT.json] [--pins storage=bf16]

For each token count (uniform top-2 routing over Mixtral's 8 experts, rows sorted by expert): Habu's forward
with the values its backward saves (gate, up, act: `habu grad`'s auto policy) and its backward, both the
proven default plans (rules + a finite-field trial at the witness); torch's layer as a loop over the experts
(gather, three bf16 matmuls, index_add_) under autograd. Each of Habu's gradients (dX, dW1, dW3, dW2, dP) is
checked against torch autograd of the layer in float32 on the same inputs (relative Frobenius error ≤ 2e-2:
the saved values are bf16) before anything is timed; then CUDA-event medians: Habu's backward call (its
accumulated gradients zeroed in the call, as autograd allocates them) against `torch.autograd.grad` of the
loop's output (the forward's graph kept). `--profile` lists each of Habu's backward kernels (torch.profiler);
`--pins` pins the backward's plan (`storage=bf16`: its cotangents stored in bf16, as torch keeps them).
torch's own bf16 autograd is checked against the same float32 reference and its errors printed beside Habu's.
Self-checking: exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from habu.bench.moe_speed import SHAPES, kernel_times, rel_error, routing, weights
from habu.timing.harness import time_cuda, torch

TOL = 2e-2
GRADS = ("dX", "dW1", "dW3", "dW2", "dP")


def torch_layer(x, w1, w3, w2, p, ix, offsets, y0):
    """Y = Y0 + the layer, one expert at a time (as habu.bench.moe_speed.torch_loop), differentiable."""
    t = torch()
    out = y0.clone()
    bounds = [0, *offsets.tolist()]
    for g in range(len(bounds) - 1):
        lo, hi = bounds[g], bounds[g + 1]
        if lo == hi:
            continue
        rows = ix[lo:hi].long()
        xs = x[rows]
        act = t.nn.functional.silu(xs @ w1[g].T) * (xs @ w3[g].T)
        z = act @ w2[g].T
        out = out.index_add(0, rows, (p[lo:hi, None].to(z.dtype) * z).to(out.dtype))
    return out


def measure(tokens: int, reps: int, profile: bool, seed: int = 0, pins: dict[str, str] | None = None) -> dict[str, Any]:
    from habu.bench.backward_speed import build

    t = torch()
    shape = SHAPES["mixtral"]
    rows = tokens * shape.topk
    _, fwd, back = build(shape.file, "MOE-FFN", {"T": tokens, "R": rows}, "sm_90a", pins)
    ix, e, p, offsets = routing(tokens, shape.topk, shape.experts, "uniform", seed)
    w = weights(shape, seed)
    g = t.Generator(device="cuda").manual_seed(seed + 1)
    x = t.randn((tokens, shape.d), generator=g, device="cuda").bfloat16()
    dy = t.randn((tokens, shape.d), generator=g, device="cuda")
    y0 = t.zeros((tokens, shape.d), device="cuda")
    saved = fwd(X=x, IX=ix, W1=w["W1"], E=e, W3=w["W3"], P=p, W2=w["W2"], Y=y0.clone())
    acc = {"dX": (tokens, shape.d), "dW1": (shape.experts, shape.h, shape.d), "dW3": (shape.experts, shape.h, shape.d),
           "dW2": (shape.experts, shape.d, shape.h)}
    zeros = {k: t.zeros(s, device="cuda") for k, s in acc.items()}
    inputs = {"dY": dy, "IX": ix, "P": p, "W2": w["W2"], "E": e, "Sgate": saved["Sgate"], "Sup": saved["Sup"],
              "W3": w["W3"], "W1": w["W1"], "X": x, "Sact": saved["Sact"]}

    def habu_backward(_: int) -> Any:
        for z in zeros.values():
            z.zero_()
        return back(**inputs, **zeros)

    got = habu_backward(0)
    t.cuda.synchronize()
    # torch autograd of the layer in float32, the same inputs
    leaves = [v.float().requires_grad_() for v in (x, w["W1"], w["W3"], w["W2"], p)]
    out = torch_layer(*leaves, ix, offsets, y0)
    want = dict(zip(GRADS, t.autograd.grad(out, leaves, dy), strict=True))
    errors = {k: rel_error(got[k], want[k].double()) for k in GRADS}
    ok = all(err <= TOL for err in errors.values())
    row: dict[str, Any] = {"tokens": tokens, "rows": rows, "errors": errors, "ok": ok}
    if not ok:
        return row
    bf = [v.detach().clone().requires_grad_() for v in (x, w["W1"], w["W3"], w["W2"])]
    pf = p.detach().clone().requires_grad_()
    graph = torch_layer(*bf, pf, ix, offsets, y0)

    def torch_backward(_: int) -> Any:
        return t.autograd.grad(graph, [*bf, pf], dy, retain_graph=True)

    # torch's own bf16 autograd against the same float32 reference: the error a user of torch accepts today
    mine = dict(zip(GRADS, torch_backward(0), strict=True))
    row["torch errors"] = {k: rel_error(mine[k], want[k].double()) for k in GRADS}
    row["habu us"] = time_cuda(habu_backward, 1, warmup=1, reps=reps)["median_us"]
    row["torch autograd us"] = time_cuda(torch_backward, 1, warmup=1, reps=reps)["median_us"]
    row["x torch"] = row["torch autograd us"] / row["habu us"]
    if profile:
        row["habu kernels"] = kernel_times(habu_backward, reps=2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,4096")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pins", default="", help="the backward plan's pins, KEY=VALUE joined by commas")
    args = ap.parse_args(argv)
    pins = dict(p.split("=", 1) for p in args.pins.split(",") if p.strip())
    rows, failed = [], False
    print("Mixtral MoE FFN backward (D 4096, H 14336, 8 experts, top-2), µs a call, medians of CUDA events")
    for tokens in (int(x) for x in args.tokens.split(",")):
        row = measure(tokens, args.reps, args.profile, pins=pins)
        rows.append(row)
        errs = " ".join(f"{k} {v:.1e}" for k, v in row["errors"].items())
        if not row["ok"]:
            failed = True
            print(f"{tokens} tokens: check FAILED ({errs})", flush=True)
            continue
        theirs = " ".join(f"{k} {v:.1e}" for k, v in row["torch errors"].items())
        print(f"{tokens} tokens: habu {row['habu us']:.1f}  torch autograd {row['torch autograd us']:.1f}  "
              f"{row['x torch']:.2f}x torch  (errors: {errs}; torch bf16 autograd's: {theirs})", flush=True)
        for name, us in row.get("habu kernels", [])[:12]:
            print(f"    {us:10.1f}  {name[:110]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
