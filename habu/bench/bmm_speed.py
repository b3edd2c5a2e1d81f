"""Batched contractions at attention shapes against torch.bmm, in the same run (issue 19 §2: ≥ 0.95×):

    python -m habu.bench.bmm_speed [--json OUT.json] [--no-variants]

B·H = 32 batches, I = J = 2048, D = 128, bf16 operands and bf16 outputs (torch.bmm's own output type,
so both sides write the same bytes):

    SCORES  S[b i j] = Σ d Q[b i d] · K[b j d]     torch.bmm(Q, K.transpose(1, 2))
    VALUES  O[b i d] = Σ j P[b i j] · V[b j d]     torch.bmm(P, V)   (V read n-major: d contiguous)

Each plan (Habu's default and a few pinned neighbours from the search space) is proven, built, then
checked before it is timed: the exact differential check (habu.timing.exact_gpu: small-integer inputs,
red-zoned buffers, every element compared bit for bit) and a golden check on fresh N(0,1) inputs against
torch.bmm in float32 (NaN-poisoned outputs). Timing follows /work/.library/device/METHOD.md: random
inputs rotated over enough sets to pass the L2 (`sets_for`), CUDA events, 5 warm-ups, the median of 30
(`habu.timing.harness.time_cuda`), torch.bmm timed on the same sets in the same run; ratios are torch's
time over Habu's (≥ 1: Habu is faster). Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda, torch

SIZES = {"B": 32, "I": 2048, "J": 2048, "D": 128}
MODELS = {
    "SCORES": ("S", "bf16 TENSOR: Q ( #B #I #D )  bf16 TENSOR: K ( #B #J #D )  bf16 TENSOR: S ( #B #I #J )\n"
                    "MODEL: SCORES  S[b i j] = Σ d Q[b i d] · K[b j d] ;\n"),
    "VALUES": ("O", "bf16 TENSOR: P ( #B #I #J )  bf16 TENSOR: V ( #B #J #D )  bf16 TENSOR: O ( #B #I #D )\n"
                    "MODEL: VALUES  O[b i d] = Σ j P[b i j] · V[b j d] ;\n"),
}
VARIANTS = {  # pinned neighbours of the default from the wgmma path's search space
    "128x256x64 4 stages": {"tile": "128x256x64", "stages": "4"},
    "128x128x64 6 stages": {"tile": "128x128x64", "stages": "6"},
    "128x256 persistent": {"tile": "128x256x64", "stages": "4", "persistent": "true"},
    "128x256 one block a tile": {"tile": "128x256x64", "stages": "4", "persistent": "false"},
    "128x128 persistent": {"tile": "128x128x64", "stages": "6", "persistent": "true"},
    "256x128 persistent": {"tile": "256x128x64", "stages": "4", "persistent": "true"},
    "128x128 column raster": {"tile": "128x128x64", "stages": "5", "raster": "column"},
    "256x128x64 4 stages": {"tile": "256x128x64", "stages": "4"},
    "direct stores": {"store": "direct"},
}


def model_file(name: str, folder: Path) -> Path:
    """The model as a .habu file at the benchmark's sizes."""
    extents = "  ".join(f"{v} EXTENT: #{k}" for k, v in SIZES.items())
    path = folder / f"bmm_{name.lower()}.habu"
    path.write_text(f"{extents}\n{MODELS[name][1]}")
    return path


def torch_bmm(name: str, inputs: dict):
    t = torch()
    if name == "SCORES":
        q, k = inputs["Q"], inputs["K"]
        return lambda: t.bmm(q, k.transpose(1, 2))
    p, v = inputs["P"], inputs["V"]
    return lambda: t.bmm(p, v)


def measure(name: str, case: str, pins: dict[str, str], folder: Path, baseline: bool) -> dict:
    t = torch()
    row: dict = {"model": name, "case": case, "pins": pins}
    try:
        built = build(str(model_file(name, folder)), name, {}, pins)
    except AssertionError as err:  # a pinned neighbour the rules reject at this shape
        row["refused"] = str(err)[:300]
        return row
    row["plan"] = built.plan.to_json()["kernels"][0]
    exact = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
    row["exact"] = {"ok": exact.ok, "applicable": exact.applicable, "summary": exact.summary}
    if not exact.ok:
        row["exact"]["reason"] = exact.reason()
        return row
    full = built.sizes
    per_set = sum(int(t.tensor([], dtype=t.bfloat16).element_size()) * n for n in (
        full["B"] * full["I"] * full["D"], full["B"] * full["J"] * full["D"], full["B"] * full["I"] * full["J"]))
    nsets = sets_for(per_set)
    sets = [make_inputs(built.model, full, 500 + i) for i in range(nsets)]
    outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
    got = built.compiled(**sets[0], **outs[0])
    want = torch_bmm(name, {k: v.float() for k, v in sets[0].items()})()
    t.cuda.synchronize()
    rel = float((got.float() - want).norm() / want.norm())
    row["golden"] = {"rel_error_vs_f32": rel, "unwritten": int(t.isnan(got).sum()), "ok": rel < 1e-2 and
                     not bool(t.isnan(got).any())}
    assert got.shape == want.shape, (got.shape, want.shape)
    if not row["golden"]["ok"]:
        return row
    row["habu_us"] = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)["median_us"]
    if baseline:
        fns = [torch_bmm(name, s) for s in sets]
        row["torch_bmm_us"] = time_cuda(lambda i: fns[i](), nsets)["median_us"]
        row["habu_again_us"] = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)["median_us"]
    row["flops"] = 2 * full["B"] * full["I"] * full["J"] * full["D"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--no-variants", action="store_true", help="time the default plans only")
    args = ap.parse_args(argv)
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            rows.append(measure(name, "default", {}, Path(tmp), baseline=True))
            if not args.no_variants:
                rows += [measure(name, case, pins, Path(tmp), baseline=False) for case, pins in VARIANTS.items()]
    failed = False
    print(f"batched contractions, B={SIZES['B']} I={SIZES['I']} J={SIZES['J']} D={SIZES['D']}, bf16 in and out")
    print(f"{'model':<7} {'case':<24} {'plan':<40} {'µs':>8} {'TFLOP/s':>8} {'torch/habu':>10}  checks")
    torch_us = {r["model"]: r["torch_bmm_us"] for r in rows if "torch_bmm_us" in r}
    for r in rows:
        if "refused" in r:
            print(f"{r['model']:<7} {r['case']:<24} refused by the rules: {r['refused'][:80]}")
            continue
        k = r["plan"]
        plan = (f"{k['mma']} {k['tile_m']}x{k['tile_n']}x{k['tile_k']} s{k['stages']} A:{k['a_move']} "
                f"B:{k['b_move']}{' pers' if k['persistent'] else ''}")
        if "habu_us" not in r:
            failed = True
            print(f"{r['model']:<7} {r['case']:<24} {plan:<40} CHECK FAILED {r.get('exact')} {r.get('golden')}")
            continue
        ratio = torch_us[r["model"]] / r["habu_us"] if r["model"] in torch_us else float("nan")
        print(f"{r['model']:<7} {r['case']:<24} {plan:<40} {r['habu_us']:8.1f} {r['flops'] / r['habu_us'] / 1e6:8.1f} "
              f"{ratio:10.3f}  exact {'ok' if r['exact']['applicable'] else 'n/a'}, "
              f"rel {r['golden']['rel_error_vs_f32']:.1e}")
    for r in rows:
        if "torch_bmm_us" in r:
            print(f"{r['model']:<7} torch.bmm {r['torch_bmm_us']:.1f} µs ({r['flops'] / r['torch_bmm_us'] / 1e6:.1f} "
                  f"TFLOP/s); Habu's default timed twice: {r['habu_us']:.1f}, {r['habu_again_us']:.1f} µs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
