"""The GPU benchmark table (docs/PERF.md): Habu's plans against torch/cuBLAS in the same run.

    python -m habu.bench.gpu_bench [--quick] [--json OUT.json] [--only PART[,PART...]]

Every timed plan is golden-checked first (fresh inputs, poisoned outputs, float64 reference).
Timing: CUDA events, 5 warm-ups, median of 30, inputs rotated over enough sets to exceed the L2.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

from habu.bench.run import build
from habu.timing.harness import (
    compare,
    copy_bandwidth,
    make_inputs,
    plan_tolerance,
    poisoned_outputs,
    reference,
    time_cuda,
    torch,
)

EX = Path(__file__).resolve().parents[2] / "examples"
L2_BYTES = 60 << 20


def sets_for(nbytes: int, most: int = 8) -> int:
    """Input sets of `nbytes` each to rotate through so that a call finds its inputs outside the L2 (three L2s'
    worth), at least 2 and at most `most`."""
    return max(2, min(most, -(-3 * L2_BYTES // max(1, nbytes))))


def torch_ggemm(inputs, out_key):
    t = torch()
    a, b, ix = inputs["A" if "A" in inputs else "X"], inputs["B" if "B" in inputs else "W1"], inputs["IX"]
    return lambda: t.matmul(a[ix.long()], b.t())


def torch_ggemm_f32(inputs):
    """The expert's call for the example's f32 output: cuBLAS writes f32 itself (torch >= 2.8)."""
    t = torch()
    a, b, ix = inputs["A"], inputs["B"], inputs["IX"]
    return lambda: t.mm(a[ix.long()], b.t(), out_dtype=t.float32)


# the winner of the 5-minute GGEMM search on the H200 (second session, 188.9 µs; register stores then)
GGEMM_WINNER_PINS = {"tile": "128x256x64", "stages": "4", "persistent": "true", "group_m": "1", "raster": "column"}


def run_case(name, path, model, sizes, pins, baseline, golden_check=True, flops=None, bytes_moved=None):
    t = torch()
    row = {"case": name, "example": path, "model": model, "shape": sizes, "pins": pins}
    built = build(str(EX / path), model, sizes, pins, check_indices=False)
    row["plan"] = built.plan.to_json()["kernels"]
    full = built.sizes
    in_bytes = sum(v.numel() * v.element_size() for v in make_inputs(built.model, full, 0).values())
    nsets = sets_for(in_bytes)
    sets = [make_inputs(built.model, full, 100 + i) for i in range(nsets)]
    outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
    if golden_check:
        ref = reference(built.model, sets[0], full)  # before the run: in-place models overwrite inputs
        res = built.compiled(**sets[0], **outs[0])
        t.cuda.synchronize()
        res = res if isinstance(res, dict) else {built.model.outputs[0].name: res}
        tol = plan_tolerance(built.model, built.plan)
        goldens = {k: compare(v, ref[k], tol) for k, v in res.items()}
        row["golden"] = {k: {"rel_error": g.rel_error, "tol": g.tol, "unwritten": g.unwritten, "ok": g.ok}
                         for k, g in goldens.items()}
        if not all(g.ok for g in goldens.values()):
            row["error"] = "golden check failed"
            return row
    row["habu"] = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)
    if baseline is not None:
        try:
            fns = [baseline(s) for s in sets]
            row["baseline"] = time_cuda(lambda i: fns[i](), nsets)
            row["ratio"] = row["baseline"]["median_us"] / row["habu"]["median_us"]
        except Exception as exc:  # a baseline that cannot run here (the seed's TMA gather on Hopper)
            row["baseline_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if flops:
        row["tflops"] = flops / (row["habu"]["median_us"] * 1e-6) / 1e12
    if bytes_moved:
        row["bytes"] = bytes_moved
        row["gbps"] = bytes_moved / (row["habu"]["median_us"] * 1e-6) / 1e9
    return row


def triton_seed(use_td: bool):
    from habu.bench.triton_seed import build

    run = build()
    return lambda s: (lambda: run(s["A"], s["B"], s["IX"], use_td))


def cases(quick: bool):
    t = torch()
    gg = lambda M, N, K: 2 * M * N * K  # noqa: E731
    out = [
        ("ggemm-4096", "ggemm.habu", "GGEMM", {}, {}, lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-4096-winner", "ggemm.habu", "GGEMM", {}, GGEMM_WINNER_PINS | {"store": "direct"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-4096-winner-vs-f32", "ggemm.habu", "GGEMM", {}, GGEMM_WINNER_PINS | {"store": "direct"},
         torch_ggemm_f32, gg(4096, 4096, 4096), None),
        ("ggemm-4096-winner-store-tma", "ggemm.habu", "GGEMM", {}, GGEMM_WINNER_PINS | {"store": "tma"},
         torch_ggemm_f32, gg(4096, 4096, 4096), None),
        ("gemm-4096-store-tma", "gemm.habu", "GEMM", {"M": 4096, "N": 4096, "K": 4096}, {"store": "tma", "persistent": "true"},
         lambda s: (lambda: t.matmul(s["A"], s["B"].t())), gg(4096, 4096, 4096), None),
        # clusters of 2 along m sharing B's tile by TMA multicast, against the same schedules without
        ("ggemm-4096-winner-cluster2", "ggemm.habu", "GGEMM", {}, GGEMM_WINNER_PINS | {"store": "tma", "cluster": "2"},
         torch_ggemm_f32, gg(4096, 4096, 4096), None),
        ("ggemm-4096-winner-s3-store-tma", "ggemm.habu", "GGEMM", {}, GGEMM_WINNER_PINS | {"store": "tma", "stages": "3"},
         torch_ggemm_f32, gg(4096, 4096, 4096), None),
        ("ggemm-4096-winner-s3-cluster2", "ggemm.habu", "GGEMM", {},
         GGEMM_WINNER_PINS | {"store": "tma", "stages": "3", "cluster": "2"}, torch_ggemm_f32, gg(4096, 4096, 4096), None),
        ("gemm-4096-store-tma-cluster2", "gemm.habu", "GEMM", {"M": 4096, "N": 4096, "K": 4096},
         {"store": "tma", "persistent": "true", "cluster": "2"},
         lambda s: (lambda: t.matmul(s["A"], s["B"].t())), gg(4096, 4096, 4096), None),
        ("gemm-8192-cluster2", "gemm.habu", "GEMM", {}, {"persistent": "true", "cluster": "2"},
         lambda s: (lambda: t.matmul(s["A"], s["B"].t())), gg(8192, 8192, 8192), None),
        ("gemm-4096", "gemm.habu", "GEMM", {"M": 4096, "N": 4096, "K": 4096}, {"persistent": "true"},
         lambda s: (lambda: t.matmul(s["A"], s["B"].t())), gg(4096, 4096, 4096), None),
        ("ggemm-4096-n128", "ggemm.habu", "GGEMM", {}, {"tile": "128x128x64", "stages": "5"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-4096-persistent", "ggemm.habu", "GGEMM", {}, {"persistent": "true"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-4096-staged", "ggemm.habu", "GGEMM", {}, {"A": "staged"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-4096-staged-pers", "ggemm.habu", "GGEMM", {}, {"A": "staged", "persistent": "true"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 4096), None),
        ("ggemm-k511", "ggemm.habu", "GGEMM", {"K": 511}, {}, lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 511), None),
        ("ggemm-4096-vs-seed-triton", "ggemm.habu", "GGEMM", {}, {}, triton_seed(False), gg(4096, 4096, 4096), None),
        ("ggemm-k511-vs-seed-triton", "ggemm.habu", "GGEMM", {"K": 511}, {}, triton_seed(False),
         gg(4096, 4096, 511), None),
        ("ggemm-k511-vs-seed-triton-td", "ggemm.habu", "GGEMM", {"K": 511}, {}, triton_seed(True),
         gg(4096, 4096, 511), None),
        ("ggemm-k511-n128", "ggemm.habu", "GGEMM", {"K": 511}, {"tile": "128x128x64", "stages": "4"},
         lambda s: torch_ggemm(s, "O"), gg(4096, 4096, 511), None),
        ("moe-8192x14336x4096", "moe_gather.habu", "MOE-UP", {}, {},
         lambda s: (lambda: t.matmul(s["X"][s["IX"].long()], s["W1"].t())), gg(8192, 14336, 4096), None),
        ("moe-staged", "moe_gather.habu", "MOE-UP", {}, {"A": "staged"},
         lambda s: (lambda: t.matmul(s["X"][s["IX"].long()], s["W1"].t())), gg(8192, 14336, 4096), None),
        ("gemm-8192", "gemm.habu", "GEMM", {}, {}, lambda s: (lambda: t.matmul(s["A"], s["B"].t())),
         gg(8192, 8192, 8192), None),
        ("gemm-8192-persistent", "gemm.habu", "GEMM", {}, {"persistent": "true"},
         lambda s: (lambda: t.matmul(s["A"], s["B"].t())), gg(8192, 8192, 8192), None),
    ]
    for D in ([4096] if quick else [4096, 16384, 65536]):
        out.append((f"rmsnorm-8192x{D}", "rmsnorm.habu", "RMSNORM-ROWS", {"D": D}, {},
                    lambda s: (lambda: s["X"] * t.rsqrt((s["X"].float() ** 2).mean(-1, keepdim=True) + 1e-6).to(s["X"].dtype)),
                    None, 2 * 2 * 8192 * D))
        out.append((f"softmax-8192x{D}", "softmax.habu", "SOFTMAX-ROWS", {"C": D}, {},
                    lambda s: (lambda: t.softmax(s["X"], dim=-1)), None, 2 * 2 * 8192 * D))
    return out


SWEEP = [{"stages": "3"}, {"stages": "5", "tile": "128x192x64"}, {"group_m": "4"}, {"group_m": "16"},
         {"tile": "256x128x64", "warps": "12"}, {"raster": "column"}]


def sweep_cases():
    t = torch()
    gg = 2 * 4096 ** 3
    out = []
    for pins in SWEEP:
        tag = ",".join(f"{k}={v}" for k, v in pins.items())
        out.append((f"ggemm-4096[{tag}]", "ggemm.habu", "GGEMM", {}, pins, lambda s: torch_ggemm(s, "O"), gg, None))
        out.append((f"moe[{tag}]", "moe_gather.habu", "MOE-UP", {}, pins,
                    lambda s: (lambda: t.matmul(s["X"][s["IX"].long()], s["W1"].t())), 2 * 8192 * 14336 * 4096, None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--no-golden", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="only the GGEMM/MoE schedule variants")
    args = ap.parse_args()
    t = torch()
    name = t.cuda.get_device_name()
    bw = copy_bandwidth()
    rows = [{"device": name, "date": time.strftime("%Y-%m-%d"), "copy_gbps": bw / 1e9}]
    print(f"# {name}, {time.strftime('%Y-%m-%d')}: device copy {bw / 1e12:.2f} TB/s", flush=True)
    for case in (sweep_cases() if args.sweep else cases(args.quick)):
        cname = case[0]
        if args.only and not any(part in cname for part in args.only.split(",")):
            continue
        t0 = time.time()
        try:
            row = run_case(*case[:6], golden_check=not args.no_golden, flops=case[6], bytes_moved=case[7])
        except Exception as exc:  # one failing case must not hide the others
            row = {"case": cname, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        row["seconds"] = time.time() - t0
        if "gbps" in row:
            row["copy_fraction"] = row["gbps"] * 1e9 / bw
        rows.append(row)
        h = row.get("habu", {}).get("median_us")
        b = row.get("baseline", {}).get("median_us")
        extra = f" {row['tflops']:.0f} TFLOP/s" if "tflops" in row else ""
        extra += f" {row['copy_fraction'] * 100:.0f}% of copy" if "copy_fraction" in row else ""
        g = row.get("golden")
        gtxt = " golden " + ",".join(f"{k}:{v['rel_error']:.1e}" for k, v in g.items()) if g else ""
        if "error" in row:
            print(f"{cname:<24} ERROR {row['error'][:300]}", flush=True)
        elif "baseline_error" in row:
            print(f"{cname:<24} habu {h:9.1f} us  baseline failed: {row['baseline_error']}", flush=True)
        else:
            print(f"{cname:<24} habu {h:9.1f} us  torch {b if b else float('nan'):9.1f} us  "
                  f"ratio {row.get('ratio', float('nan')):5.2f}{extra}{gtxt}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
