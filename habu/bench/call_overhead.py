"""Host overhead per call: a Python loop of calls of a Habu callable against torch's equivalent op.

    python -m habu.bench.call_overhead [--calls 1000] [--repeats 7] [--json out.json]

Cases (issue 20 §3): GGEMM 64×4096×4096 (`A[IX] @ B.T` in torch; IX as int32 and as torch's int64,
which Habu narrows on the device), RMSNorm 16×4096 (`F.rms_norm`) and FFN-SKIP at 16 tokens (three kernels,
the later two launched early; torch eager's addmm, GELU, addmm, add, rms_norm: its loop is the GPU's time, its
host column what a call costs the host, over 200 calls, fewer than the launch queue holds). For each
callable, after a warm-up, `--repeats` times: the wall time of `--calls` calls in a Python loop up to a synchronize
(`loop`, what a serving loop sees: the larger of host and device time per call), and the host time of
the same loop before it synchronizes (`host`, the enqueue cost alone while the launch queue does not
fill); medians over the repeats, and the spread of the loop figure (max/min) to read differences
against. `device` is one call's GPU time from a CUDA graph of 20 calls, replayed (no launch gaps).
The last column says whether Habu's loop time per call is at or under torch's. Inputs are random
(never zeros); every Habu output is compared with torch's before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"


def _loop(fn: Callable[[], Any], calls: int, repeats: int, sync: Callable[[], None]) -> dict[str, float]:
    for _ in range(20):
        fn()
    sync()
    loops, hosts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / calls * 1e6)
        loops.append((t2 - t0) / calls * 1e6)
    return {"loop_us": statistics.median(loops), "host_us": statistics.median(hosts),
            "spread": max(loops) / min(loops)}


def _device_us(torch: Any, fn: Callable[[], Any]) -> float | None:
    """One call's GPU time from a captured graph of 20 calls (None when the call cannot be captured)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / 20)
        return statistics.median(times)
    except Exception as exc:  # report, do not hide: the table says which call did not capture
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:160]})")
        return None


def _rel_error(got: Any, want: Any) -> float:
    want = want.double()
    return float((got.double() - want).norm() / want.norm())


def cases(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[], Any], float, int | None]]:
    """(name, Habu call, torch call, tolerance, most calls a loop (None: `--calls`)) with their inputs bound (the
    default plans, proven)."""
    from habu.bench.run import build

    F = torch.nn.functional
    g = torch.Generator(device="cpu").manual_seed(20)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=g).to("cuda", torch.bfloat16)

    out = []
    gg = build(str(EX / "ggemm.habu"), "GGEMM", {"M": 64, "N": 4096, "K": 4096}).compiled
    a, b = randn(64, 4096), randn(4096, 4096)
    ix64 = torch.randint(0, 64, (64,), generator=g).to("cuda")
    ix32 = ix64.to(torch.int32)
    out.append(("GGEMM 64x4096x4096, IX int32", lambda: gg(A=a, B=b, IX=ix32), lambda: a[ix32] @ b.T, 2e-2, None))
    out.append(("GGEMM 64x4096x4096, IX int64", lambda: gg(A=a, B=b, IX=ix64), lambda: a[ix64] @ b.T, 2e-2, None))
    rms = build(str(EX / "rmsnorm.habu"), "RMSNORM-ROWS", {"R": 16, "D": 4096}).compiled
    x = randn(16, 4096)
    out.append(("RMSNorm 16x4096", lambda: rms(X=x), lambda: F.rms_norm(x, (4096,), eps=1e-6), 2e-2, None))
    # three kernels, the later two launched early (programmatic dependent launch): the host cost of a plan's
    # later launches; its loop is the GPU's time (the weights' 235 MB), the host column what the call costs
    ffn = build(str(EX / "ffn_skip.habu"), "FFN-SKIP", {"B": 16}).compiled
    xs, w1, b1 = randn(16, 4096), randn(4096, 14336) * 0.02, randn(1, 14336)
    w2, b2 = randn(14336, 4096) * 0.02, randn(1, 4096)

    def ffn_torch() -> Any:
        y = torch.addmm(b2, F.gelu(torch.addmm(b1, xs, w1)), w2) + xs
        return F.rms_norm(y, (4096,), eps=1e-6)

    out.append(("FFN-SKIP 16 tokens (3 kernels)", lambda: ffn(X=xs, W1=w1, B1=b1, W2=w2, B2=b2), ffn_torch, 5e-2,
                200))  # (its launches within the queue)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    from habu.emit_cuda.device_errors import check_errors

    rows = []
    for name, ours, theirs, tol, most in cases(torch):
        calls = min(args.calls, most or args.calls)
        err = _rel_error(ours(), theirs())
        check_errors()
        if not err <= tol:
            raise SystemExit(f"{name}: Habu's output differs from torch's (relative error {err:.2e} > {tol})")
        row: dict[str, Any] = {"case": name, "rel_error": err}
        for who, fn in (("habu", ours), ("torch", theirs)):
            row[who] = _loop(fn, calls, args.repeats, torch.cuda.synchronize)
            row[who]["device_us"] = _device_us(torch, fn)
        check_errors()
        rows.append(row)
    print(f"\n{'case':32} {'who':6} {'loop us':>8} {'host us':>8} {'spread':>7} {'device us':>9}  habu <= torch")
    for r in rows:
        for who in ("habu", "torch"):
            t = r[who]
            dev = f"{t['device_us']:.1f}" if t["device_us"] is not None else "-"
            verdict = ("yes" if r["habu"]["loop_us"] <= r["torch"]["loop_us"] else "NO") if who == "habu" else ""
            print(f"{r['case']:32} {who:6} {t['loop_us']:8.1f} {t['host_us']:8.1f} {t['spread']:7.3f} {dev:>9}  {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"calls": args.calls, "repeats": args.repeats, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
