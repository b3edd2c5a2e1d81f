"""Decode attention (issue 22): one query row per sequence against a KV cache, the fused kernel whole and
split over the cache (split-KV, flash-decoding: `--pin kv_split=N`), against torch's
scaled_dot_product_attention in the same run; bf16, heads as in examples/decode_attention.habu (2 KV heads
× 2 query heads, head width 128), every cache entry valid.

    python -m habu.bench.attention_decode_speed [--json OUT.json] [--quick] [--only KV,BATCH;...]
        [--plans "kv_warps=4,bn=64,kv_split=256;..."] [--no-default] [--profile]

KV 4096 and 32768 × batch 1, 16 and 64. For each: build the plans (build proves each: the rules and a trial
over Z_q × GF(p) on the witness shape), check each on the GPU against SDPA's output on the same inputs
(max |Δ| / max |O| ≤ 2e-2; tests/gpu/test_attention_decode_split.py holds the float64 goldens), then time
them and SDPA (habu.timing.harness.time_cuda: CUDA events, median of 30 calls; SDPA's backend recorded from
the kernels it launches) on input sets rotated past the L2 (`sets_for` up to 64 sets: a 4 MB cache is not
evicted by 8; a decode step reads each layer's cache once, cold: before 2026-12-04 the bench timed one set,
the whole cache L2-resident for KV ≤ 32768 at batch 1). The measure is the KV cache read: 2 · B · G · KV · D bf16 elements per call, as
TB/s and as a share of the GPU's device-to-device copy bandwidth, measured at the start of the run
(`habu.timing.harness.copy_bandwidth`; the H200's 4.22 TB/s before session 56, which read low on an H100). Without
`--no-default` it times the default plan ("default": since session 55 the 8-warp block of
`habu.paths.attention.decode_split_one_wave`), "fused", the whole-cache kernel (`kv_split=0`), and the 4-warp
block's split (`kv_split_for`: about two blocks per SM; the default before session 55) with KV tiles of 64 and of
32 keys. `--plans` adds plans by their pins
(`kv_split=auto`: the 4-warp block's split, `kv_split_for`; `unpinned`: the plan without pins; `unfused`: the
unfused attention plan, scores, softmax rows and value contraction), `--no-default` leaves those out (timing only the
`--plans`).
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"
SMS = 132
KV_HEADS, GROUP, WIDTH = 2, 2, 128  # examples/decode_attention.habu
SHAPES = tuple((kv, batch) for kv in (4096, 32768) for batch in (1, 16, 64))


def kernel_times(fn, calls: int = 5) -> str:
    """The device time of each kernel (and memset) one call runs, averaged over `calls` calls (torch's profiler):
    where a call's time goes besides the launches' gaps."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    parts = []
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None)
        if total is None:
            total = getattr(e, "cuda_time_total", 0.0)
        if total and e.count:
            parts.append(f"{e.key[:40]} {total / calls:.1f}us x{e.count // calls}")
    return "; ".join(parts)


def run_shape(kv: int, batch: int, extra: list[dict[str, str]] = (), defaults: bool = True,  # type: ignore[assignment]
              profile: bool = False, copy_tbps: float = 4.22) -> list[dict[str, Any]]:
    """Each plan of the shape timed against SDPA; `copy_tbps`: the device-to-device copy bandwidth the shares are
    of (measured by `main`; 4.22, the H200's, when called alone)."""
    import torch

    from habu.bench.attention_speed import sdpa_backend
    from habu.bench.gpu_bench import sets_for
    from habu.bench.run import build
    from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

    sizes = {"B": batch, "G": KV_HEADS, "R": GROUP, "J": kv, "L": kv + 1, "E": WIDTH, "D": WIDTH}
    from habu.paths.attention import kv_split_for

    split = kv_split_for(batch * KV_HEADS, kv, SMS)  # the 4-warp block's split (the default before session 55)
    # the default plan (unpinned), the whole-cache kernel
    variants = [("default", {}), ("fused", {"family": "attention", "bm": "16", "kv_split": "0"})] if defaults else []
    # the 4-warp block's split of about two blocks per SM, with KV tiles of 64 and of 32 keys (half the shared memory:
    # more blocks resident, each warp's copies and products of a tile shorter)
    if split and defaults:
        for bn in ("64", "32"):
            variants.append((f"split {split}/{bn}", {"family": "attention", "bm": "16", "bn": bn, "kv_split": str(split)}))
    for pins in extra:
        pins = dict(pins)
        if "unpinned" in pins:  # the plan without pins (`habu.search.space.default_plan`)
            variants.append(("unpinned", {}))
            continue
        if "unfused" in pins:  # the unfused attention plan (scores, softmax rows, value contraction)
            variants.append(("unfused", {"rewrite": "attention:O+split:O.s"}))
            continue
        if pins.get("kv_split") == "auto":
            pins["kv_split"] = str(kv_split_for(batch * KV_HEADS, kv, SMS))
        label = "/".join(f"{k}={v}" for k, v in pins.items())
        variants.append((label, {"family": "attention", "bm": "16", **pins}))
    heads = KV_HEADS * GROUP
    cache = 2.0 * 2 * batch * KV_HEADS * kv * WIDTH  # K and V, bf16
    ins = None
    sets: list[dict[str, Any]] = []
    rows = []
    sdpa_row: dict[str, Any] = {}
    for label, pins in variants:
        row: dict[str, Any] = {"kv": kv, "batch": batch, "plan": label}
        try:
            built = build(str(EX / "decode_attention.habu"), "DECODE-ATTENTION", sizes, pins, check_indices=False)
            row["kernel"] = built.plan.to_json()["kernels"]
            if ins is None:
                sets = [make_inputs(built.model, built.sizes, 1 + i) for i in range(sets_for(int(cache), 64))]
                for one in sets:
                    one["LEN"].fill_(kv)
                ins = sets[0]

                def sdpa(i=0, sets=sets):
                    one = sets[i % len(sets)]
                    return torch.nn.functional.scaled_dot_product_attention(one["Q"].view(batch, heads, 1, WIDTH),
                                                                            one["K"], one["V"], enable_gqa=True)

                want = sdpa().float()
                sdpa_row = {"backend": sdpa_backend(sdpa), **time_cuda(sdpa, len(sets))}
                sdpa_row.pop("samples", None)
            outs = poisoned_outputs(built.model, built.sizes)
            built.compiled(**ins, **outs)
            torch.cuda.synchronize()
            got = outs["O"].view(batch, heads, 1, WIDTH)
            row["check_max_rel"] = err = ((got - want).abs().max() / want.abs().max()).item()
            if not err <= 2e-2:
                raise AssertionError(f"differs from SDPA: max |Δ| / max |O| = {err:.3e}")
            t = time_cuda(lambda i, built=built, outs=outs, sets=sets: built.compiled(**sets[i % len(sets)], **outs),
                          len(sets))
            row["median_us"] = t["median_us"]
            row["cache_tbps"] = cache / (t["median_us"] * 1e-6) / 1e12
            row["copy_share"] = row["cache_tbps"] / copy_tbps
            row["sdpa_backend"], row["sdpa_us"] = sdpa_row["backend"], sdpa_row["median_us"]
            row["sdpa_copy_share"] = cache / (sdpa_row["median_us"] * 1e-6) / 1e12 / copy_tbps
            row["speedup_vs_sdpa"] = sdpa_row["median_us"] / t["median_us"]
            if profile:
                try:
                    row["kernels"] = kernel_times(lambda built=built, ins=ins, outs=outs: built.compiled(**ins, **outs))
                except Exception as exc:  # the profile is extra: its failure keeps the timing
                    row["kernels"] = f"profile failed: {type(exc).__name__}: {exc}"
        except Exception as exc:  # one plan's failure is reported on its row
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["trace"] = traceback.format_exc()[-2000:]
        rows.append(row)
        if "error" in row:
            print(f"KV {kv:6d} batch {batch:3d} {label:11s} ERROR {row['error'][:300]}", flush=True)
        else:
            print(f"KV {kv:6d} batch {batch:3d} {label:11s} {row['median_us']:8.1f} us {row['cache_tbps']:5.2f} TB/s "
                  f"({100 * row['copy_share']:4.1f}% of copy) | SDPA[{row['sdpa_backend']}] {row['sdpa_us']:8.1f} us "
                  f"({100 * row['sdpa_copy_share']:4.1f}%) | {row['speedup_vs_sdpa']:.2f}x | check "
                  f"{row['check_max_rel']:.1e}" + (f" | {row['kernels']}" if "kernels" in row else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--quick", action="store_true", help="KV 4096 at batch 1 only")
    ap.add_argument("--only", help="KV,BATCH pairs separated by ';'")
    ap.add_argument("--plans", help="more plans: pins k=v,k=v separated by ';' (kv_split=auto: the default split)")
    ap.add_argument("--no-default", action="store_true", help="time only the --plans (and SDPA)")
    ap.add_argument("--profile", action="store_true", help="also each plan's kernels' device times (torch profiler)")
    args = ap.parse_args()
    extra = [dict(kv.partition("=")[::2] for kv in one.split(",")) for one in args.plans.split(";")] if args.plans else []
    shapes = [tuple(int(x) for x in one.split(",")) for one in args.only.split(";")] if args.only else list(SHAPES)
    if args.quick:
        shapes = shapes[:1]
    from habu.timing.harness import copy_bandwidth

    copy_tbps = copy_bandwidth() / 1e12
    print(f"device-to-device copy: {copy_tbps:.2f} TB/s (the shares below are of it)", flush=True)
    rows = [r for kv, batch in shapes for r in run_shape(kv, batch, extra, not args.no_default, args.profile, copy_tbps)]
    for r in rows:
        r["copy_tbps"] = copy_tbps
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    raise SystemExit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    main()
