"""A representative subset of plans, small, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck python -m habu.bench.sanitize_cases

Each case runs once with fresh inputs and a golden check; the sanitizer reports any invalid access.
"""

from __future__ import annotations

from habu.bench.run import build
from habu.bench.sanitize_paths import example_path
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference, torch

CASES = [
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {}),  # wgmma, ldg producers, ragged k
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 512}, {}),  # wgmma, cp.async gather + TMA
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 520}, {"mma": "mma.sync"}),
    ("ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma", "split_k": "2"}),
    ("ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma"}),  # fma, no split: plain stores
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 512}, {"store": "tma"}),  # wgmma, f32 TMA-store epilogue
    ("softmax.habu", "SOFTMAX-ROWS", {"R": 16, "C": 1000}, {}),
    ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 16, "D": 768}, {}),
    ("<rows>", "ROW-MAX", {}, {}),  # a row kernel reducing by max (habu.bench.sanitize_paths.ROWS_SOURCE)
    ("fused.habu", "AXPY-RELU", {"N": 4100}, {}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 40, "D": 256, "H": 320}, {}),
]


def main() -> None:
    t = torch()
    for path, model, sizes, pins in CASES:
        built = build(example_path(path), model, sizes, pins)
        inputs = make_inputs(built.model, built.sizes, 5)
        outs = poisoned_outputs(built.model, built.sizes)
        ref = reference(built.model, inputs, built.sizes)
        res = built.compiled(**inputs, **outs)
        t.cuda.synchronize()
        res = res if isinstance(res, dict) else {built.model.outputs[0].name: res}
        tol = plan_tolerance(built.model, built.plan)
        verdict = {k: compare(v, ref[k], tol) for k, v in res.items()}
        ok = all(g.ok for g in verdict.values())
        print(f"{'ok  ' if ok else 'FAIL'} {path} {model} {sizes} {pins} "
              + " ".join(f"{k}:{g.rel_error:.1e}" for k, g in verdict.items()), flush=True)


if __name__ == "__main__":
    main()
