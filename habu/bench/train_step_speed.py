"""FFN-SKIP forward + backward (issue 21's training-step target): Habu's forward-with-saved-values and
derived backward kernels (save policy auto; the kernels `habu.build(..., grad=True)` runs inside
torch.autograd, called here directly) against torch eager autograd and torch.compile of the same block,
in the same run, bf16 parameters and activations.

    python -m habu.bench.train_step_speed [--tokens 128,4096] [--json out.json]

One step is `y = block(x, w1, b1, w2, b2); y.backward(dy)` with every input requiring a gradient (x too,
as inside a network); Habu's step is its forward kernels then its backward kernels. Before timing, each side's gradients are compared with an f32 torch reference
(relative Frobenius error); a Habu step whose gradient is off by more than 5e-2 is reported and not
timed. Goal (issue 21): ≥ 1.2× torch eager and ≥ 1.0× torch.compile at 128 and 4096 tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"
SIZES = {"D": 4096, "H": 14336}
GRAD_RTOL = 5e-2


def torch_block(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """FFN-SKIP as a torch user writes it: LINEAR, GELU (erf), LINEAR, the residual, RMSNorm."""
    import torch.nn.functional as F

    h = F.gelu(x @ w1 + b1) @ w2 + b2 + x
    return F.rms_norm(h, (h.shape[-1],), eps=1e-6)


def inputs_for(tokens: int, seed: int, device: str = "cuda", sizes: dict[str, int] = SIZES,
               dtype: str = "bfloat16") -> list[Any]:
    """x, w1, b1, w2, b2 (scaled so the hidden values stay near 1), each requiring a gradient."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    d, h = sizes["D"], sizes["H"]
    shapes = [((tokens, d), 1.0), ((d, h), d ** -0.5), ((1, h), 0.1), ((h, d), h ** -0.5), ((1, d), 0.1)]
    return [(torch.randn(s, generator=g, device=device) * scale).to(getattr(torch, dtype)).requires_grad_()
            for s, scale in shapes]


def grads(step: Any, tensors: list[Any], dy: Any) -> list[Any]:
    for t in tensors:
        t.grad = None
    step(*tensors).backward(dy)
    return [t.grad for t in tensors]


def rel_error(got: Any, want: Any) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def habu_step(bw: Any, fwd: Any, back: Any, tensors: list[Any], dy: Any) -> list[Any]:
    """One step by Habu's kernels: the forward with its saved values (`fwd`), then the backward (`back`,
    whose `model` names its inputs) on the inputs, dY and the saved values; the gradients of the forward's
    inputs in their order (`bw`: the derived backward, habu.spec.grad_program)."""
    names = [t.name for t in bw.forward.inputs]  # X W1 B1 W2 B2
    grad_of = dict(bw.gradients)
    cot = dict(bw.cotangents)["Y"]
    named = dict(zip(names, (t.detach() for t in tensors), strict=True))
    out = fwd(**named)
    out = out if isinstance(out, dict) else {bw.forward.outputs[0].name: out}
    avail = named | {cot: dy} | {s: out[s] for _, s in bw.saved}
    result = back(**{t.name: avail[t.name] for t in back.model.inputs})
    result = result if isinstance(result, dict) else {back.model.outputs[0].name: result}
    return [result[grad_of[n]] for n in names]


def measure(tokens: int, target: str, built: tuple[Any, Any, Any] | None = None,
            pins: dict[str, str] | None = None, backward_pins: dict[str, str] | None = None) -> dict[str, Any]:
    """The step's row; `built`: the (backward, forward kernels, backward kernels) of
    `habu.bench.backward_speed.build` when the caller has them (built here otherwise, the forward's and the
    backward's plans under `pins`, the backward's also under `backward_pins`)."""
    import torch

    from habu.bench.backward_speed import build
    from habu.timing.harness import time_cuda

    row: dict[str, Any] = {"tokens": tokens, **SIZES}
    t0 = time.time()
    bw, fwd, back = built if built is not None else build("ffn_skip.habu", "FFN-SKIP", {"B": tokens}, target,
                                                            {**(pins or {}), **(backward_pins or {})}, pins)
    row["build_s"] = round(time.time() - t0, 1)

    sets = [inputs_for(tokens, 100 + i) for i in range(2)]
    dys = [torch.randn((tokens, SIZES["D"]), device="cuda").to(torch.bfloat16) for _ in sets]
    reference = grads(lambda *a: torch_block(*[t.float() for t in a]),
                      [t.detach().clone().requires_grad_() for t in sets[0]], dys[0].float())
    compiled = torch.compile(torch_block)
    sides = {"habu": lambda ts, dy: habu_step(bw, fwd, back, ts, dy),
             "torch eager": lambda ts, dy: grads(torch_block, ts, dy),
             "torch.compile": lambda ts, dy: grads(compiled, ts, dy)}
    for name, step in sides.items():
        got = step(sets[0], dys[0])
        row[f"{name} grad rel error"] = max(rel_error(g.reshape(r.shape), r) for g, r in zip(got, reference, strict=True))
    if row["habu grad rel error"] > GRAD_RTOL:
        row["failed"] = f"a gradient differs from the f32 reference by {row['habu grad rel error']:.2e}"
        return row
    for name, step in sides.items():
        row[f"{name} us"] = time_cuda(lambda i, step=step: step(sets[i], dys[i]), len(sets))["median_us"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--pins", default="", help="both plans' pins, KEY=VALUE joined by commas (lag=2)")
    ap.add_argument("--backward-pins", default="", help="the backward plan's besides (lanes=2)")
    args = ap.parse_args(argv)
    pins = dict(p.split("=", 1) for p in args.pins.split(",") if p.strip())
    backward_pins = dict(p.split("=", 1) for p in args.backward_pins.split(",") if p.strip())
    print("FFN-SKIP forward + backward, D 4096, H 14336, bf16 (µs, median of CUDA events)", flush=True)
    print(HEADER, flush=True)
    rows = []
    for t in args.tokens.split(","):
        rows.append(measure(int(t), args.target, pins=pins, backward_pins=backward_pins))
        print(table_line(rows[-1]), flush=True)  # each row as it is measured (a later one may run out of time)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any("failed" in r for r in rows) else 0


HEADER = f"{'tokens':>6} {'habu':>9} {'eager':>9} {'compile':>9} {'× eager':>8} {'× compile':>9}  grad errors"


def table_line(r: dict[str, Any]) -> str:
    """One measured row of the table (a failed one says why)."""
    if "failed" in r:
        return f"{r['tokens']:>6} FAILED: {r['failed']}"
    h, e, c = r["habu us"], r["torch eager us"], r["torch.compile us"]
    return (f"{r['tokens']:>6} {h:9.1f} {e:9.1f} {c:9.1f} {e / h:8.2f} {c / h:9.2f}  habu {r['habu grad rel error']:.1e}, "
            f"eager {r['torch eager grad rel error']:.1e}, compile {r['torch.compile grad rel error']:.1e} "
            f"(build {r['build_s']} s)")


if __name__ == "__main__":
    raise SystemExit(main())
