"""The MoE FFN layer's speed (issue 20 §1) at the three example shapes, against torch in the same run:

    python -m habu.bench.moe_speed [--json OUT.json] [--tokens 16,128,4096] [--models mixtral,qwen3,deepseek]
                                   [--habu-max-rows 1024] [--pin family=grouped ...] [--alt-pin bm=64 ...]
                                   [--profile] [--triton]

For each example (examples/moe_mixtral.habu, moe_qwen3_30b_a3b.habu, moe_deepseek_v3.habu), token count
and routing (uniform top-k; Zipf-skewed top-k with a quarter of the experts chosen by no token), the
layer Y[t] += Σ over t's routed rows r of P[r] · W2[E[r]] · SwiGLU(W1[E[r]] x, W3[E[r]] x) runs as:
  - habu: the model's proven default plan (`habu.bench.run.build`: rules + a finite-field trial),
    built once per (model, token count), skipped above --habu-max-rows routed rows (on the H200 two
    grouped-GEMM kernels on the wgmma loop over every expert's tiles: gate, up and SwiGLU fused, then the
    down projection with the router weight and the scatter-add combine in its epilogue; any --pin goes to
    the plan as `habu compile --pin` takes it: `--pin family=general` is the general combine of before,
    `--pin family=grouped` the mma.sync loop);
  - torch loop: a Python loop over the experts with rows (gather, three bf16 matmuls, index_add_);
  - torch._grouped_mm: the gathered rows through torch's grouped GEMM (offsets = the groups' ends),
    recorded as unavailable where this torch lacks it or refuses the shapes;
  - triton (`--triton`): a Triton grouped GEMM written for the benchmark (habu.bench.moe_triton: W1|W3 as one
    GEMM, the router weight in the down projection's epilogue, index_add_), each GEMM autotuned over 10 configs.
Every output is checked against a float64 torch loop on the GPU (fresh random inputs; Y starts from
random prior contents; relative error ≤ 2e-2, bf16 operands), then timed with CUDA events
(habu.timing.harness.time_cuda: warm-ups, the median of the repetitions). Self-checking: exits 1 if a
check fails. Numbers: µs per layer call and each method's ratio to the fastest torch baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habu.timing.harness import time_cuda, torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOL = 2e-2


@dataclass(frozen=True)
class Shape:
    name: str
    file: str
    experts: int
    topk: int
    d: int
    h: int


SHAPES = {
    "mixtral": Shape("Mixtral 8x7B", "moe_mixtral.habu", 8, 2, 4096, 14336),
    "qwen3": Shape("Qwen3-30B-A3B", "moe_qwen3_30b_a3b.habu", 128, 8, 2048, 768),
    "deepseek": Shape("DeepSeek-V3", "moe_deepseek_v3.habu", 256, 8, 7168, 2048),
}


def routing(tokens: int, topk: int, experts: int, kind: str, seed: int, device: str = "cuda"
            ) -> tuple[Any, Any, Any, Any]:
    """(IX, E, P, offsets): routed rows sorted by expert, as int32 on the GPU. `kind` "uniform": each
    token's top-k experts uniformly; "zipf": probabilities 1/rank^1.2 over a random order of the
    experts, a quarter of them (at least one) never chosen."""
    t = torch()
    g = t.Generator(device="cpu").manual_seed(seed)
    if kind == "uniform":
        probs = t.ones(experts)
    else:
        rank = t.randperm(experts, generator=g).double() + 1
        probs = rank ** -1.2
        dead = t.randperm(experts, generator=g)[:max(1, experts // 4)]
        probs[dead] = 0
        if int((probs > 0).sum()) < topk:
            raise ValueError(f"zipf routing leaves fewer than {topk} experts")
    choice = t.multinomial(probs.expand(tokens, experts).contiguous(), topk, replacement=False, generator=g)
    token = t.arange(tokens).repeat_interleave(topk)
    expert = choice.reshape(-1)
    order = t.argsort(expert, stable=True)
    ix, e = token[order], expert[order]
    counts = t.bincount(e, minlength=experts)
    offsets = t.cumsum(counts, 0)
    p = t.rand(tokens * topk, generator=g) + 0.1
    return ix.int().to(device), e.int().to(device), p.float().to(device), offsets.int().to(device)


def weights(shape: Shape, seed: int) -> dict[str, Any]:
    t = torch()
    g = t.Generator(device="cuda").manual_seed(seed)
    e, h, d = shape.experts, shape.h, shape.d
    return {"W1": (t.randn((e, h, d), generator=g, device="cuda") * d ** -0.5).bfloat16(),
            "W3": (t.randn((e, h, d), generator=g, device="cuda") * d ** -0.5).bfloat16(),
            "W2": (t.randn((e, d, h), generator=g, device="cuda") * h ** -0.5).bfloat16()}


def torch_loop(x, w: dict[str, Any], ix, p, offsets, y, dtype=None) -> Any:
    """Y += the layer, one expert at a time (its rows gathered, three matmuls, index_add_): bf16
    operands with torch's accumulation, or every operand in `dtype` (float64: the reference)."""
    t = torch()
    out = y.clone()
    bounds = [0, *offsets.tolist()]
    for g in range(len(bounds) - 1):
        lo, hi = bounds[g], bounds[g + 1]
        if lo == hi:
            continue
        rows = ix[lo:hi].long()
        xs = x[rows] if dtype is None else x[rows].to(dtype)
        w1, w3, w2 = ((w[k][g] if dtype is None else w[k][g].to(dtype)) for k in ("W1", "W3", "W2"))
        gate, up = xs @ w1.T, xs @ w3.T
        act = t.nn.functional.silu(gate) * up
        z = act @ w2.T
        out.index_add_(0, rows, (p[lo:hi, None].to(z.dtype) * z).to(out.dtype))
    return out


def grouped_mm(x, w: dict[str, Any], ix, p, offsets, y) -> Any:
    """Y += the layer through torch._grouped_mm over the gathered rows (one launch a projection)."""
    t = torch()
    xs = x[ix.long()]
    gate = t._grouped_mm(xs, w["W1"].transpose(1, 2), offs=offsets)
    up = t._grouped_mm(xs, w["W3"].transpose(1, 2), offs=offsets)
    act = t.nn.functional.silu(gate) * up
    z = t._grouped_mm(act, w["W2"].transpose(1, 2), offs=offsets)
    out = y.clone()
    out.index_add_(0, ix.long(), (p[:, None] * z.float()))
    return out


def rel_error(got, ref) -> float:
    t = torch()
    got = got.double()
    if t.isnan(got).any():
        return float("nan")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def build_layer(key: str, tokens: int, habu_max_rows: int, pins: dict[str, str] | None = None) -> tuple[Any, str | None]:
    """(the built default plan, None) of a model at a token count, or (None, why not): skipped above
    `habu_max_rows` routed rows, or the build's error."""
    from habu.bench.run import build

    shape = SHAPES[key]
    rows_n = tokens * shape.topk
    if rows_n > habu_max_rows:
        return None, f"skipped: {rows_n} rows > --habu-max-rows {habu_max_rows}"
    try:
        return build(str(EXAMPLES / shape.file), "MOE-FFN", {"T": tokens, "R": rows_n}, pins), None
    except Exception as exc:  # recorded: the table says why Habu has no number here
        return None, f"{type(exc).__name__}: {exc}"[:300]


def compile_all(compiled: list[Any], arch: str) -> None:
    """Compile every kernel of the built plans at once, on every core (NVRTC releases the GIL), into the
    compile cache the first calls then load from: on a bare machine the builds' compiles dominate a run."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from habu.emit_cuda.cache import compile_cached

    kernels = {k.source: (k, c) for c in compiled for _, plan in c.kernel_set.members for k in plan.kernels}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        jobs = [pool.submit(compile_cached, k.source, k.name, arch, c.include_dirs, (), c.cache_dir)
                for k, c in kernels.values()]
        for job in jobs:
            job.result()


def measure(key: str, tokens: int, habu_max_rows: int, seed: int, pins: dict[str, str] | None = None,
            profile: bool = False, built: tuple[Any, str | None] | None = None, triton: bool = False,
            alt: tuple[Any, str | None] | None = None, reps: int = 30) -> list[dict]:
    shape = SHAPES[key]
    w = weights(shape, seed)
    habu, build_error = built if built is not None else build_layer(key, tokens, habu_max_rows, pins)
    layer = None
    if triton:
        from habu.bench.moe_triton import TritonLayer

        layer = TritonLayer(w)  # tuned on the first routing's inputs, then kept for the others
    out = []
    for kind in ("uniform", "zipf"):
        row = measure_routing(shape, habu, w, tokens, kind, seed, profile, layer, alt[0] if alt else None, reps)
        if habu is None:
            row["habu_error"] = build_error
        if alt is not None and alt[0] is None:
            row["habu alt_error"] = alt[1]
        out.append(row)
    return out


def measure_routing(shape: Shape, built: Any, w: dict[str, Any], tokens: int, kind: str, seed: int,
                    profile: bool = False, layer: Any = None, alt: Any = None, reps: int = 30) -> dict:
    """One row of the table: every method checked against the float64 loop, then timed."""
    t = torch()
    rows_n = tokens * shape.topk
    ix, e, p, offsets = routing(tokens, shape.topk, shape.experts, kind, seed)
    x = t.randn((tokens, shape.d), device="cuda").bfloat16()
    y = t.randn((tokens, shape.d), device="cuda")
    ref = torch_loop(x, w, ix, p, offsets, y.double(), dtype=t.float64)
    empty = int((t.diff(t.cat([offsets.new_zeros(1), offsets])) == 0).sum())
    row: dict = {"model": shape.name, "tokens": tokens, "routing": kind, "rows": rows_n, "empty_experts": empty}
    methods = {"torch loop": lambda i: torch_loop(x, w, ix, p, offsets, y),
               "torch._grouped_mm": lambda i: grouped_mm(x, w, ix, p, offsets, y)}
    if layer is not None:  # the Triton grouped GEMM, autotuned (habu.bench.moe_triton)
        try:
            if layer.up_config is None:
                layer.tune(x, ix, p, offsets)
            row["triton_config"] = layer.describe()
            methods["triton"] = lambda i: layer(x, ix, p, offsets, y)
        except Exception as exc:  # recorded: the table says why Triton has no number
            row["triton_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for name, b in (("habu", built), ("habu alt", alt)):
        if b is not None:
            methods[name] = (lambda c: lambda i: c(X=x, W1=w["W1"], W3=w["W3"], W2=w["W2"], P=p, Y=y.clone(),
                                                   IX=ix, E=e))(b.compiled)
    for name, fn in methods.items():
        try:
            got = fn(0)
            t.cuda.synchronize()
        except Exception as exc:  # recorded: the table says why this method has no number
            row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        err = rel_error(got, ref)
        row[name + "_rel_error"] = err
        if not err <= TOL:
            row[name + "_error"] = f"wrong: relative error {err:.2e} > {TOL:.0e}"
            continue
        slow = name.startswith("habu") and rows_n * shape.h * shape.d > 2**36 and \
            (built if name == "habu" else alt).plan.kernels[-1].kind == "general"
        timing = time_cuda(fn, 1, warmup=1 if slow else min(5, reps), reps=3 if slow else reps)
        row[name + "_us"] = timing["median_us"]
        if profile and name != "torch loop":
            row[name + "_kernels"] = kernel_times(fn)
    return row


def kernel_times(fn, reps: int = 5) -> list[tuple[str, float]]:
    """(kernel name, µs per call) of the GPU kernels `fn` launches, by torch.profiler (CUPTI sees the driver
    API's launches too), the slowest first; [] where the profiler is not available."""
    t = torch()
    try:
        from torch.profiler import ProfilerActivity, profile

        fn(0)
        t.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn(0)
            t.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if total:
                rows.append((e.key, total / reps))
        return sorted(rows, key=lambda r: -r[1])
    except Exception:  # a profiler missing or refused: the table has the totals anyway
        return []


METHODS = ("habu", "habu alt", "torch loop", "torch._grouped_mm", "triton")
BASELINES = METHODS[2:]


def print_row(row: dict) -> bool:
    """Print one row of the table (and, profiled, its kernels); True when a method's output was wrong."""
    cells, failed = [], False
    for m in METHODS:
        if m + "_us" in row:
            cells.append(f"{row[m + '_us']:20.1f}")
        else:
            why = row.get(m + "_error", "-")
            failed |= why.startswith("wrong")
            cells.append(f"{why[:20]:>20}")
    base = [row[m + "_us"] for m in BASELINES if m + "_us" in row]
    ratio = " ".join(f"{min(base) / row[m + '_us']:.2f}x" if base and m + "_us" in row else "-"
                     for m in ("habu", "habu alt"))
    print(f"{row['model']:<15} {row['tokens']:>6} {row['routing']:<8} {row['empty_experts']:>5} "
          + " ".join(cells) + f"   {ratio}")
    if "triton_config" in row:
        print(f"  {row['model']} {row['tokens']} {row['routing']} triton: {row['triton_config']}")
    for m in ("habu", "habu alt", "torch._grouped_mm", "triton"):
        for kname, us in row.get(m + "_kernels", [])[:8]:
            print(f"  {row['model']} {row['tokens']} {row['routing']} {m}: {us:10.1f} µs  {kname[:90]}")
    sys.stdout.flush()
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--tokens", default="16,128,4096")
    ap.add_argument("--models", default="mixtral,qwen3,deepseek")
    ap.add_argument("--habu-max-rows", type=int, default=1024, help="time Habu only up to this many routed rows")
    ap.add_argument("--pin", action="append", default=[], help="a plan choice for Habu's build (family=grouped)")
    ap.add_argument("--reps", type=int, default=30, help="timed calls a method (the median is reported)")
    ap.add_argument("--alt-pin", action="append", default=[], help="a plan choice of a second Habu build timed "
                    "beside the first (column 'habu alt'; with the --pin choices)")
    ap.add_argument("--triton", action="store_true", help="also time the Triton grouped GEMM baseline "
                    "(habu.bench.moe_triton, autotuned over its configs in the run: ~20 Triton compiles a model)")
    ap.add_argument("--profile", action="store_true", help="also print each kernel's µs (torch.profiler) for Habu "
                    "and torch._grouped_mm")
    args = ap.parse_args(argv)
    from habu.search.space import parse_pins

    pins = parse_pins(args.pin)
    alt_pins = parse_pins(args.alt_pin)
    from habu.bench.run import device_target

    rows: list[dict] = []
    print(f"{'model':<15} {'tokens':>6} {'routing':<8} {'empty':>5} " +
          " ".join(f"{m + ' µs':>20}" for m in METHODS) + "   best baseline / habu, habu alt", flush=True)
    failed = False
    # token count by token count: every model's builds of one count, their kernels compiled at once, then their
    # rows (a run cut short keeps the first counts' rows of every model)
    for tokens in (int(n) for n in args.tokens.split(",")):
        keys = args.models.split(",")
        builds = {key: build_layer(key, tokens, args.habu_max_rows, pins) for key in keys}
        alts = {key: build_layer(key, tokens, args.habu_max_rows, {**pins, **alt_pins}) for key in keys} \
            if alt_pins else {}
        compile_all([b.compiled for b, _ in (*builds.values(), *alts.values()) if b is not None], device_target())
        for key in keys:
            measured = measure(key, tokens, args.habu_max_rows, seed=tokens, pins=pins, profile=args.profile,
                               built=builds.pop(key), triton=args.triton, alt=alts.pop(key, None), reps=args.reps)
            for row in measured:  # each row as soon as it is measured
                failed |= print_row(row)
            rows += measured
            torch().cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
