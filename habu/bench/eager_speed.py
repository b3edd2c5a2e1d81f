"""Is `habu.timing.torch_eager` a fair baseline? Each example model that is not one contraction, run
as torch eager ops equation by equation, timed in one process against what an expert writes by hand
for it (`torch.softmax`, `F.rms_norm`, ...), with both outputs compared to the float64 reference.

    python -m habu.bench.eager_speed [--json out.json]

A ratio (eager / expert) near 1 means the equation-by-equation runner is as fast as the expert's
torch code for that model, so the search may quote it as the baseline.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"


def _experts() -> dict[str, Callable[[dict[str, Any], dict[str, int]], Any]]:
    import torch
    import torch.nn.functional as F

    def rms(x: Any, d: int) -> Any:
        return F.rms_norm(x, (d,), eps=1e-6)

    def ffn_skip(a: dict[str, Any], s: dict[str, int]) -> Any:
        h = F.gelu(a["X"] @ a["W1"] + a["B1"])
        return rms(h @ a["W2"] + a["B2"] + a["X"], s["D"])

    def axpy_relu(a: dict[str, Any], s: dict[str, int]) -> Any:
        return a["y"].add_(a["x"] * a["a"]).relu_()

    return {
        "RMSNORM-LINEAR": lambda a, s: rms(a["X"], s["D"]) @ a["W"],
        "RMSNORM-ROWS": lambda a, s: rms(a["X"], s["D"]),
        "RMSNORM-EQ": lambda a, s: rms(a["X"], s["D"]),
        "SOFTMAX-ROWS": lambda a, s: torch.softmax(a["X"], dim=-1),
        "FFN-SKIP": ffn_skip,
        "AXPY-RELU": axpy_relu,
    }


CASES = [("rmsnorm_linear.habu", "RMSNORM-LINEAR", {}), ("rmsnorm.habu", "RMSNORM-ROWS", {"D": 4096}),
         ("rmsnorm.habu", "RMSNORM-EQ", {"D": 4096}), ("softmax.habu", "SOFTMAX-ROWS", {}),
         ("ffn_skip.habu", "FFN-SKIP", {}), ("fused.habu", "AXPY-RELU", {})]


def measure(path: str, name: str, sizes: dict[str, int]) -> dict[str, Any]:
    from habu.search.space import concrete_sizes
    from habu.spec.parser import load_program
    from habu.timing.harness import compare, make_inputs, reference, time_cuda, tolerance
    from habu.timing.torch_eager import TorchEager

    model = load_program(EX / path).models[name].with_sizes(sizes)
    full = concrete_sizes(model)
    sets = [make_inputs(model, full, seed) for seed in range(3)]
    eager = TorchEager(model, full)
    expert = _experts()[name]
    first = model.outputs[0].name
    tol = tolerance(model, {t.name: t.dtype.name for t in (*model.inputs, *model.intermediates)
                            if t.dtype and not t.is_index})
    ref = reference(model, sets[0], full)
    row: dict[str, Any] = {"example": path, "model": name, "shape": full}
    for label, run in (("eager", lambda a: eager(a)[first]), ("expert", lambda a: expert(a, full))):
        fresh = {k: v.clone() for k, v in sets[0].items()}  # AXPY-RELU updates y in place
        g = compare(run(fresh), ref[first], tol)
        row[f"{label}_rel_error"], row[f"{label}_ok"] = g.rel_error, g.ok
        row[f"{label}_us"] = time_cuda(lambda i, run=run: run(sets[i]), len(sets), reps=50)["median_us"]
    row["eager_over_expert"] = row["eager_us"] / row["expert_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for path, name, sizes in CASES:
        try:
            row = measure(path, name, sizes)
        except Exception as exc:  # one model that cannot run must not hide the others
            row = {"example": path, "model": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:<16} ERROR {row['error'][:300]}", flush=True)
        else:
            print(f"{name:<16} eager {row['eager_us']:9.1f} µs ({row['eager_rel_error']:.1e})  expert "
                  f"{row['expert_us']:9.1f} µs ({row['expert_rel_error']:.1e})  eager/expert "
                  f"{row['eager_over_expert']:.2f}", flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
