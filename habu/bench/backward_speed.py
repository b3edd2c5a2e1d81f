"""RMSNorm and softmax backward (issue 21's speed targets): Habu's derived backward kernels (the default
plan of the backward model, `--save auto`: RMSNorm reads its per-row rstd, softmax its row maximum and
sum) against torch autograd and torch.compile of the same, and the fraction of copy bandwidth: a copy
moving as many bytes as the backward must read and write (x, dy, the saved rows, dx) against its time.

    python -m habu.bench.backward_speed [--rows 8192] [--widths 4096,16384] [--json out.json]
        [--variants blocks_per_sm=2,threads=256/blocks_per_sm=2,row_cluster=2]

Every line also gives dx's error against torch autograd in float32 (relative, Frobenius). `--variants`
also times the backward under each pinned plan choice (proven like the default; a variant's pins joined by
`/`). At 16384 columns the default keeps dY's and X's rows in registers, 512 threads, one block an SM
(83 registers a thread); `blocks_per_sm=2` bounds them to 64 so two blocks share each SM, `row_cluster=2`
halves each block's part of the row (a cluster of two shares it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"
CASES = [("rmsnorm.habu", "RMSNORM-ROWS", "D"), ("softmax.habu", "SOFTMAX-ROWS", "C")]


def build(path: str, name: str, sizes: dict[str, int], target: str, pins: dict[str, str] | None = None,
          forward_pins: dict[str, str] | None = None, kernel_pins: dict[str, dict[str, str]] | None = None
          ) -> tuple[Any, Any, Any]:
    """The backward (auto policy) of `name` and the compiled kernels of its forward-with-saved-values
    (under `forward_pins`) and of its backward model (under `pins`; `kernel_pins`: more pins for the backward's
    kernel that computes a node, by the node's name, the plan proven again), at `sizes`."""
    from habu.compile import compile_model
    from habu.emit_cuda.guards import KernelSet
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program
    from habu.target import target_named

    program = load_program(EX / path)
    bw = derive_model(program, name)
    tgt = target_named(target)
    kernels = []
    for derived, tag in ((bw.forward, "FWD"), (bw.model, "BWD")):
        key = f"{derived.name}-{tag}"
        program.models[key] = derived
        program.model_spans[key] = program.model_spans[name]
        compiled = compile_model(program, key, sizes, tgt, (pins or {}) if tag == "BWD" else (forward_pins or {}),
                                 trials=1)
        proofs = compiled.proofs
        if tag == "BWD" and kernel_pins:
            proofs = [_repinned(compiled.model, p.plan, kernel_pins, tgt) for p in proofs]
        members = [(proof.plan.guards, emit(proof, tgt)) for proof in proofs]
        kernels.append(CompiledModel(compiled.model, KernelSet(members), arch=tgt.name))
    return bw, kernels[0], kernels[1]


def _repinned(model: Any, plan: Any, kernel_pins: dict[str, dict[str, str]], target: Any) -> Any:
    """`plan` with each kernel computing a node of `kernel_pins` pinned further, proven (one trial)."""
    from dataclasses import replace

    from habu.plan.rewrite import planned_model
    from habu.prove import prove
    from habu.search.space import apply_pins

    graph = planned_model(model, plan)  # (the plan's own nodes: dK.in of the rewrite nest:dK)
    kernels = tuple(next((apply_pins(graph, k, kernel_pins[n], target) for n in k.nodes if n in kernel_pins), k)
                    for k in plan.kernels)
    proof = prove(model, replace(plan, kernels=kernels), dict(plan.shape), trials=1)
    if not proof.ok:
        raise SystemExit(f"the repinned plan fails: {proof.violations[:1] or proof.certificate.failure}")
    return proof


def measure(path: str, name: str, width_extent: str, rows: int, width: int, target: str,
            variants: tuple[str, ...] = ()) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from habu.timing.harness import time_cuda

    sizes = {"R": rows, width_extent: width}
    bw, fwd, back = build(path, name, sizes, target)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((rows, width), generator=g, device="cuda").to(torch.bfloat16)
    dy = torch.randn((rows, width), generator=g, device="cuda").to(torch.bfloat16)
    out = fwd(X=x)
    out = out if isinstance(out, dict) else {bw.forward.outputs[0].name: out}
    cot = dict(bw.cotangents)
    named = {"X": x, cot["Y"]: dy} | {s: out[s] for _, s in bw.saved}
    inputs = {t.name: named[t.name] for t in back.model.inputs}
    grad_name = dict(bw.gradients)["X"]

    def ours(_: int) -> Any:
        result = back(**inputs)
        return result[grad_name] if isinstance(result, dict) else result

    def torch_fn(a: Any) -> Any:
        return F.rms_norm(a, (width,), eps=1e-6) if name.startswith("RMSNORM") else torch.softmax(a, dim=-1)

    # torch.compile donates the saved buffers of a backward it expects to run once: the timing runs it again
    # (retain_graph), which raised there (RMSNorm at 16384 columns, H200, 2026-12-01)
    try:
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
    except (ImportError, AttributeError):  # a torch without the setting donates nothing
        pass
    xe = x.clone().requires_grad_()
    ye = torch_fn(xe)
    xc = x.clone().requires_grad_()
    yc = torch.compile(torch_fn)(xc)

    def eager(_: int) -> Any:
        return torch.autograd.grad(ye, xe, dy, retain_graph=True)[0]

    def compiled(_: int) -> Any:
        return torch.autograd.grad(yc, xc, dy, retain_graph=True)[0]

    xf = x.float().requires_grad_()
    want = torch.autograd.grad(torch_fn(xf), xf, dy.float())[0]
    got = ours(0).float()
    rel = float((got - want).norm() / want.norm())
    traffic = x.nbytes + dy.nbytes + got.numel() * x.element_size() + sum(out[s].nbytes for _, s in bw.saved)
    src = torch.empty(traffic // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row: dict[str, Any] = {"model": name, "rows": rows, "width": width, "bytes": traffic, "dx_rel_error": rel}
    for label, fn in (("habu", ours), ("torch_autograd", eager), ("torch_compile", compiled),
                      ("copy", lambda _: dst.copy_(src))):
        row[f"{label}_us"] = time_cuda(fn, 1, reps=50)["median_us"]
    row["copy_fraction"] = row["copy_us"] / row["habu_us"]
    for pin in variants:  # the same backward under one pinned plan choice (several joined by "/")
        try:
            plan_back = build(path, name, sizes, target, variant_pins(pin))[2]
            result = plan_back(**inputs)
            got_v = (result[grad_name] if isinstance(result, dict) else result).float()
            row[f"{pin}_dx_rel_error"] = float((got_v - want).norm() / want.norm())
            row[f"{pin}_us"] = time_cuda(lambda _, b=plan_back: b(**inputs), 1, reps=50)["median_us"]
        except Exception as exc:  # a pin the plan refuses
            row[f"{pin}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    row["over_autograd"] = row["torch_autograd_us"] / row["habu_us"]
    row["over_compile"] = row["torch_compile_us"] / row["habu_us"]
    return row


def variant_pins(variant: str) -> dict[str, str]:
    """One `--variants` entry's pins: `threads=256/blocks_per_sm=2` is two."""
    pins = {}
    for part in variant.split("/"):
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"a variant is KEY=VALUE[/KEY=VALUE...], got {variant!r}")
        pins[key.strip()] = value.strip()
    return pins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--widths", default="4096,16384")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--variants", default="", help="pinned plan choices to time as well, comma-separated")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for path, name, extent in CASES:
        for width in (int(w) for w in args.widths.split(",")):
            try:
                row = measure(path, name, extent, args.rows, width, args.target,
                              tuple(v for v in args.variants.split(",") if v))
            except Exception as exc:  # one case that cannot run must not hide the others
                row = {"model": name, "width": width, "error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:<14} {width:>6} ERROR {row['error'][:300]}", flush=True)
            else:
                print(f"{name:<14} {args.rows}x{width:<6} habu {row['habu_us']:8.1f} µs "
                      f"({row['copy_fraction']:.0%} of copy bandwidth)  torch autograd {row['torch_autograd_us']:8.1f} "
                      f"µs ({row['over_autograd']:.2f}x)  torch.compile {row['torch_compile_us']:8.1f} µs "
                      f"({row['over_compile']:.2f}x)  dx error {row['dx_rel_error']:.1e}", flush=True)
                for pin in (v for v in args.variants.split(",") if v):
                    if f"{pin}_us" in row:
                        print(f"    {pin}: {row[pin + '_us']:8.1f} µs ({row['copy_us'] / row[pin + '_us']:.0%} of copy) "
                              f"dx error {row[pin + '_dx_rel_error']:.1e}", flush=True)
                    else:
                        print(f"    {pin}: {row.get(pin + '_error')}", flush=True)
            results.append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
