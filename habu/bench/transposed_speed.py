"""Transposed operands on the tensor-core paths (issue 19): `O[b i d] = Σ j P[b j i] · V[b j d]`, P stored
[b j i] (A contiguous along m) and V [b j d] (B contiguous along n), each read transposed where it lies
(wgmma: 64-column TMA boxes and the transpose bit; mma.sync: ldmatrix.x4.trans / x2.trans; fma: the
copies along the contiguous axis), against `torch.bmm(P.transpose(1, 2), V)` in the same run:

    python -m habu.bench.transposed_speed [--json OUT.json]

Each plan is built and golden-checked (fresh random inputs, a NaN-poisoned output, the float64
reference), then timed with CUDA events (the median of 30) on input sets rotated past the L2.
Self-checking: exits 1 if a golden fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, time_cuda, tolerance, torch

MODEL = """2 EXTENT: #B  2048 EXTENT: #I  2048 EXTENT: #J  128 EXTENT: #D
bf16 TENSOR: P ( #B #J #I )  bf16 TENSOR: V ( #B #J #D )  f32 TENSOR: O ( #B #I #D )
MODEL: PV-T  O[b i d] = Σ j P[b j i] · V[b j d] ;
"""
PLANS = {"default": {}, "mma.sync (ldmatrix.trans)": {"mma": "mma.sync"}, "fma (SIMT)": {"mma": "fma"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    args = ap.parse_args(argv)
    t = torch()
    failed, rows = False, []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pv_t.habu"
        path.write_text(MODEL)
        for name, pins in PLANS.items():
            built = build(str(path), "PV-T", {}, pins)
            full = built.sizes
            nsets = sets_for(2 * full["B"] * full["J"] * (full["I"] + full["D"]))
            sets = [make_inputs(built.model, full, 100 + i) for i in range(nsets)]
            outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
            ref = reference(built.model, sets[0], full)
            got = built.compiled(**sets[0], **outs[0])
            t.cuda.synchronize()
            golden = compare(got, ref["O"], tolerance(built.model, dict(built.plan.storage)))
            k = built.plan.kernels[0]
            row: dict = {"plan": name, "kernel": f"{k.mma} {k.tile_m}x{k.tile_n}x{k.tile_k} A {k.a_move}",
                         "golden": {"rel_error": golden.rel_error, "ok": golden.ok}}
            if golden.ok:
                row["habu_us"] = time_cuda(lambda i, sets=sets, outs=outs, c=built.compiled: c(**sets[i], **outs[i]),
                                           nsets)["median_us"]
                if not rows:  # torch once, on the same sets
                    row["torch_us"] = time_cuda(lambda i, sets=sets: t.bmm(sets[i]["P"].transpose(1, 2), sets[i]["V"]),
                                                nsets)["median_us"]
            failed = failed or not golden.ok
            rows.append(row)
    flops = 2 * 2 * 2048 * 2048 * 128
    print(f"{'plan':<28} {'kernel':<36} {'µs':>8} {'TFLOP/s':>8}  golden")
    for row in rows:
        us = row.get("habu_us")
        print(f"{row['plan']:<28} {row['kernel']:<36} {us or float('nan'):8.1f} "
              f"{flops / (us or float('nan')) / 1e6:8.1f}  {row['golden']}")
    if "torch_us" in rows[0]:
        print(f"{'torch.bmm(Pᵀ, V) (bf16 out)':<65} {rows[0]['torch_us']:8.1f} {flops / rows[0]['torch_us'] / 1e6:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
