"""RMSNorm's forward with the rstd its backward saves (issue 21: training users compare with Liger's
RMSNorm, whose forward reads X once and writes Y and the per-row rstd): Habu's default, one row kernel
storing R1[r] and Y[r d] (`RowLowering.stats`), against the plan before it (the statistic's kernel, then
the row's: X read twice, two launches), Liger-style torch (`x · rsqrt(mean(x²) + ε)`, returning the rstd
too), its torch.compile, and a copy moving the bytes the forward must move (X read, Y and R1 written).

    python -m habu.bench.forward_saved_speed [--rows 8192] [--widths 4096,16384] [--json out.json]

Every line gives Y's and R1's errors against the same computation in float32 (relative, Frobenius).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from habu.plan.patterns import Region, default_regions
from habu.plan.plan import Plan
from habu.spec.ir import Model
from habu.target import Target

EX = Path(__file__).resolve().parents[2] / "examples"
EPS = 1e-6  # examples/rmsnorm.habu's 0.000001


def split_plan(model: Model, target: Target, sizes: dict[str, int]) -> Plan:
    """The plan before one row kernel stored a statistic and its row: each node of a row region in a row
    kernel of its own (RMSNorm's R1, then Y reading it back), every other region as the default has it."""
    from habu.paths import default_kernel
    from habu.search.space import make_plan

    regions: list[Region] = []
    for r in default_regions(model):
        regions += [Region(r.kind, (n,)) for n in r.nodes] if r.kind == "rows" else [r]
    return make_plan(model, target, tuple(default_kernel(model, r, target, sizes) for r in regions), sizes)


def forward_model(name: str = "RMSNORM-ROWS") -> Model:
    """The forward with its saved values (the auto save policy: R1, the per-row rstd)."""
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program

    return derive_model(load_program(EX / "rmsnorm.habu"), name, None).forward


def built(model: Model, plan: Plan, target: Target) -> Any:
    """`plan` proven and compiled (a static shape: one member)."""
    from habu.emit_cuda.guards import KernelSet
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.prove import prove

    proof = prove(model, plan, trials=1)
    if proof.certificate is None or not proof.certificate.passed:
        raise RuntimeError(f"the plan is not proven: {proof.violations or proof.certificate.failure}")
    return CompiledModel(model, KernelSet([((), emit(proof, target))]), arch=target.name)


def measure(rows: int, width: int, target_name: str) -> dict[str, Any]:
    import torch

    from habu.search.space import default_plan
    from habu.target import target_named
    from habu.timing.harness import time_cuda

    tgt = target_named(target_name)
    sizes = {"R": rows, "D": width}
    model = forward_model().with_sizes(sizes)
    fused_plan = default_plan(model, tgt, sizes, {})
    habu_fused, habu_split = built(model, fused_plan, tgt), built(model, split_plan(model, tgt, sizes), tgt)
    x = torch.randn((rows, width), generator=torch.Generator(device="cuda").manual_seed(0), device="cuda")
    x = x.to(torch.bfloat16)

    def liger_style(a: Any) -> tuple[Any, Any]:
        rstd = torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + EPS)
        return (a.float() * rstd).to(a.dtype), rstd.squeeze(-1)

    compiled = torch.compile(liger_style)
    want_y, want_r = liger_style(x)
    row: dict[str, Any] = {"model": "RMSNORM-ROWS forward + rstd", "rows": rows, "width": width,
                           "kernels": [k.nodes for k in fused_plan.kernels]}
    for label, fn in (("habu", habu_fused), ("habu_split", habu_split)):
        out = fn(X=x)
        row[f"{label}_y_rel_error"] = float((out["Y"].float() - want_y.float()).norm() / want_y.float().norm())
        row[f"{label}_r1_rel_error"] = float((out["R1"] - want_r).norm() / want_r.norm())
    traffic = x.nbytes * 2 + rows * 4  # X read, Y written, R1 written
    src = torch.empty(traffic // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for label, fn in (("habu", lambda _: habu_fused(X=x)), ("habu_split", lambda _: habu_split(X=x)),
                      ("torch", lambda _: liger_style(x)), ("torch_compile", lambda _: compiled(x)),
                      ("copy", lambda _: dst.copy_(src))):
        row[f"{label}_us"] = time_cuda(fn, 1, reps=50)["median_us"]
    row["copy_fraction"] = row["copy_us"] / row["habu_us"]
    row["split_copy_fraction"] = row["copy_us"] / row["habu_split_us"]
    for label in ("habu_split", "torch", "torch_compile"):
        row[f"over_{label}"] = row[f"{label}_us"] / row["habu_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--widths", default="4096,16384")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for width in (int(w) for w in args.widths.split(",")):
        try:
            row = measure(args.rows, width, args.target)
        except Exception as exc:  # one case that cannot run must not hide the others
            row = {"width": width, "error": f"{type(exc).__name__}: {exc}"}
            print(f"RMSNorm fwd+rstd {width:>6} ERROR {row['error'][:300]}", flush=True)
        else:
            print(f"RMSNorm fwd+rstd {args.rows}x{width:<6} habu {row['habu_us']:7.1f} µs ({row['copy_fraction']:.0%} "
                  f"of copy)  two kernels {row['habu_split_us']:7.1f} µs ({row['split_copy_fraction']:.0%}, "
                  f"{row['over_habu_split']:.2f}x)  torch {row['torch_us']:7.1f} µs ({row['over_torch']:.2f}x)  "
                  f"torch.compile {row['torch_compile_us']:7.1f} µs ({row['over_torch_compile']:.2f}x)  copy "
                  f"{row['copy_us']:.1f} µs  Y error {row['habu_y_rel_error']:.1e}  R1 error "
                  f"{row['habu_r1_rel_error']:.1e}", flush=True)
        results.append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
