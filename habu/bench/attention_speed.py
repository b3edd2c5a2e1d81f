"""The fused attention kernel (issue 22, `--pin family=attention`) against torch's scaled_dot_product_attention
in the same run, bf16 inputs, head width 128: causal and not, multi-head and grouped-query.

    python -m habu.bench.attention_speed [--json OUT.json] [--only CASE[,CASE...]] [--quick] [--pins SETS]
                                         [--jobs N]

Each case builds the fused plan of examples/attention.habu (or of the same model without its mask) at the
case's sizes (build proves it: the rules and a trial over Z_q × GF(p) on the witness shape), checks it on the
GPU against SDPA's output on the same inputs (max |Δ| over max |O| ≤ 2e-2: a float64 reference at these sizes
would take minutes on the CPU; tests/gpu/test_attention_fused.py holds the float64 goldens), then times both
(habu.timing.harness.time_cuda: CUDA events, median of 30 calls). SDPA's backend is the one torch picks
(recorded from the names of the kernels one call launches, by the profiler). TFLOP/s count 4·B·H·S²·D for a
full and half of that for a causal mask (FlashAttention's convention), and their share of the H200's dense
bf16 peak (989 TFLOP/s; habu.bench.mma_ceiling measures the reachable one). Habu writes O in f32 (the
example's output type), SDPA in bf16; the `-bf16o` cases declare O bf16 (the comparison at equal bytes).
`--jobs N` proves the cases in N processes first (the proof's float reference at 4096 × 4096 takes most of
a case's time; each plan is still proven before it runs), then checks and times them one by one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"
PEAK_TFLOPS = 989.0  # H200 SXM, dense bf16 (datasheet)


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    kv_heads: int
    group: int  # query heads per KV head
    seq: int
    causal: bool
    width: int = 128
    pins: tuple[tuple[str, str], ...] = ()
    decode: bool = False  # examples/decode_attention.habu: one query row per sequence, `seq` cache entries
    out_dtype: str = "f32"  # O's declared element type (bf16: what SDPA returns)
    default: bool = False  # the model's default plan (no family pin): what `habu compile` takes


CASES = (
    Case("mha-causal-1k", 8, 16, 1, 1024, True),
    Case("mha-full-1k", 8, 16, 1, 1024, False),
    Case("gqa-causal-4k", 1, 8, 4, 4096, True),
    Case("mha-causal-4k-d64", 2, 16, 1, 4096, True, 64),
    Case("decode-gqa-4k", 16, 8, 4, 4096, False, decode=True),
    # the wgmma main loop (FA3-style, habu/lower/attention_wgmma.py): prefill of 4096 tokens, 16 heads (one
    # sequence: the proof's float reference over every head stays within the GPU feedback run's time)
    Case("fa3-causal-4k", 1, 16, 1, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-full-4k", 1, 16, 1, 4096, False, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-causal-4k-bf16o", 1, 16, 1, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"),), out_dtype="bf16"),
    Case("fa3-full-4k-bf16o", 1, 16, 1, 4096, False, pins=(("main_loop", "wgmma"), ("pingpong", "1"),), out_dtype="bf16"),
    Case("fa3-causal-4k-d64", 1, 16, 1, 4096, True, 64, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-gqa-causal-4k", 1, 8, 4, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-causal-4k-hm", 1, 16, 1, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("head_major", "1"))),
    Case("fa3-full-4k-hm", 1, 16, 1, 4096, False, pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("head_major", "1"))),
    Case("fa3-causal-4k-lw", 1, 16, 1, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("late_wait", "1"))),
    Case("fa3-full-4k-lw", 1, 16, 1, 4096, False, pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("late_wait", "1"))),
    # GQA's 32 query heads against 32 heads of plain MHA: whether GQA's lower rate is the heads' count or the map
    Case("fa3-causal-4k-32h", 1, 32, 1, 4096, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-gqa-causal-4k-hm", 1, 8, 4, 4096, True,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("head_major", "1"))),
    Case("fa3-causal-1k", 4, 16, 1, 1024, True, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    Case("fa3-full-1k", 4, 16, 1, 1024, False, pins=(("main_loop", "wgmma"), ("pingpong", "1"),)),
    # persistent blocks (`--pin persistent=1`): one an SM walking the work tiles, the next tile's Q and K/V loaded
    # while this one's last P·V and epilogue run (the 1k cases pay a block's fixed cost on 1 to 8 KV tiles)
    Case("fa3-causal-1k-persist", 4, 16, 1, 1024, True,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    Case("fa3-full-1k-persist", 4, 16, 1, 1024, False,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    Case("fa3-causal-4k-persist", 1, 16, 1, 4096, True,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    Case("fa3-full-4k-persist", 1, 16, 1, 4096, False,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    Case("fa3-gqa-causal-4k-persist", 1, 8, 4, 4096, True,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    Case("fa3-causal-4k-d64-persist", 1, 16, 1, 4096, True, 64,
         pins=(("main_loop", "wgmma"), ("pingpong", "1"), ("persistent", "1"))),
    # the default plan (no pins): the fused kernel on the wgmma loop for a prefill of ≥ 1024 queries on sm_90a
    Case("default-causal-4k", 1, 16, 1, 4096, True, default=True),
    Case("default-causal-1k", 4, 16, 1, 1024, True, default=True),
    Case("default-full-4k-bf16o", 1, 16, 1, 4096, False, default=True, out_dtype="bf16"),
    # a batch of 1k sequences with SDPA's output type (the f32 output stores twice the bytes)
    Case("default-full-1k-bf16o", 4, 16, 1, 1024, False, default=True, out_dtype="bf16"),
    Case("default-causal-1k-bf16o", 4, 16, 1, 1024, True, default=True, out_dtype="bf16"),
    # issue 22's matrix: 16 heads, ~16k tokens a batch (16 × 1k, 4 × 4k, 1 × 16k), head width 64 and 128, causal and
    # full, SDPA's output type; the defaults (`--only` a prefix: `m16k-`)
    *(Case(f"m16k-{'causal' if causal else 'full'}-{seq // 1024}k-d{width}", 16384 // seq, 16, 1, seq, causal, width,
           default=True, out_dtype="bf16")
      for seq in (1024, 4096, 16384) for width in (64, 128) for causal in (True, False)),
    Case("m16k-gqa-causal-4k-d128", 4, 8, 4, 4096, True, default=True, out_dtype="bf16"),
    # the 16 × 1k d64 full prefill's tail (`--only wave-,m16k-full-1k-d64`): its 2048 tiles of 128 queries are 15.5
    # waves of 132 blocks; 22 sequences × 12 heads are 2112 tiles, 16 whole waves
    Case("wave-full-1k-d64-22x12", 22, 12, 1, 1024, False, 64, default=True, out_dtype="bf16"),
    # short prefills (`--only short-`): the default (the persistent wgmma kernel from `WGMMA_PREFILL_ROWS` = 128
    # queries, session 37) against the unfused plan (the scores' product, mask and softmax kernels, P·V)
    *(Case(f"short-{'causal' if causal else 'full'}-{seq}{'-unfused' if unfused else ''}", 8192 // seq, 16, 1, seq,
           causal, 128, pins=(("rewrite", "attention:O"),) if unfused else (), default=True, out_dtype="bf16")
      for seq in (128, 256, 512) for causal in (True, False) for unfused in (False, True)),
)


def full_attention_source() -> str:
    """examples/attention.habu without its mask (every query sees every key)."""
    text = (EX / "attention.habu").read_text().replace("MODEL: ATTENTION-GQA", "MODEL: ATTENTION-FULL")
    return text.replace("softmax_j(where(j ≤ i + #J − #I, Σ e Q[b g r i e] · K[b g j e] · rsqrt(#E), −∞))",
                        "softmax_j(Σ e Q[b g r i e] · K[b g j e] · rsqrt(#E))")


def sdpa_backend(fn) -> str:
    """Which backend SDPA ran: from the names of the kernels one call launches."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events())
    for key, label in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"), ("efficient", "efficient")):
        if key in names:
            return label
    return "math"


def case_source(case: Case, workdir: Path) -> tuple[str, str, dict[str, int]]:
    """(the .habu file, the model's name, the sizes) of a case; files it writes go to `workdir`."""
    if case.decode:
        path, model = EX / "decode_attention.habu", "DECODE-ATTENTION"
    elif case.causal:
        path, model = EX / "attention.habu", "ATTENTION-GQA"
    else:
        path, model = workdir / "full.habu", "ATTENTION-FULL"
        path.write_text(full_attention_source())
    if case.out_dtype != "f32":
        text = path.read_text()
        declared = "f32  TENSOR: O"
        assert declared in text, f"{path}: no `{declared}` to retype"
        path = workdir / f"{path.stem}-{case.out_dtype}o.habu"
        path.write_text(text.replace(declared, f"{case.out_dtype} TENSOR: O"))
    sizes = {"B": case.batch, "G": case.kv_heads, "R": case.group, "J": case.seq, "E": case.width, "D": case.width,
             **({"L": case.seq + 1} if case.decode else {"I": case.seq})}
    return str(path), model, sizes


def case_pins(case: Case) -> dict[str, str]:
    return dict(case.pins) if case.default else {"family": "attention", **dict(case.pins)}


def prove_case(case: Case, workdir: str, target_name: str) -> tuple[Any, Any]:
    """(plan, emitted kernels) of a case, proven (rules and a finite-field trial) and compiled (NVRTC, into the
    kernel cache) for `target_name`: a `--jobs` worker's task (no GPU used). Raises where the plan is not proven."""
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.prove import prove
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    path, name, sizes = case_source(case, Path(workdir))
    model = load_program(path).models[name].with_sizes(sizes)
    target = TARGETS[target_name]
    plan = default_plan(model, target, sizes, case_pins(case))
    proof = prove(model, plan, sizes, trials=1)
    if not proof.ok:
        why = [o.describe() + ": " + o.detail for o in proof.violations] or [proof.certificate.failure]  # type: ignore[union-attr]
        raise AssertionError(f"plan not proven: {why}")
    emitted = emit(proof, target)
    CompiledModel(model, emitted, check_indices=False).compile(target_name)  # into the cache the run loads from
    return plan, emitted


def run_case(case: Case, workdir: Path, proven: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """One case's row; `proven`: its (plan, emitted kernels) from `prove_case` (else proven here)."""
    import torch

    from habu.bench.run import Built, build, device_target
    from habu.emit_cuda.runtime import CompiledModel
    from habu.spec.parser import load_program
    from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

    row: dict[str, Any] = {"case": case.name, "causal": case.causal, "batch": case.batch, "kv_heads": case.kv_heads,
                           "heads": case.kv_heads * case.group, "seq": case.seq, "width": case.width,
                           "out_dtype": case.out_dtype}
    path, model, sizes = case_source(case, workdir)
    queries = 1 if case.decode else case.seq
    if proven is None:
        built = build(path, model, sizes, case_pins(case), check_indices=False)
    else:
        m = load_program(path).models[model].with_sizes(sizes)
        built = Built(m, proven[0], CompiledModel(m, proven[1], arch=device_target(), check_indices=False),
                      {e.name: e.size for e in m.extents})
    row["plan"] = built.plan.to_json()["kernels"]
    row["plan_short"] = " + ".join(
        f"{k.kind}/{getattr(k, 'main_loop', '')} {getattr(k, 'bm', '')}x{getattr(k, 'bn', '')} s{getattr(k, 'stages', '')}"
        if k.kind == "attention" else k.kind for k in built.plan.kernels)
    ins = make_inputs(built.model, built.sizes, 1)
    outs = poisoned_outputs(built.model, built.sizes)
    heads = case.kv_heads * case.group
    if case.decode:  # every cache entry valid
        ins["LEN"].fill_(case.seq)
    q = ins["Q"].view(case.batch, heads, queries, case.width)
    k, v = ins["K"], ins["V"]

    gqa = {"enable_gqa": True} if case.group > 1 else {}  # (torch ≥ 2.5)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **gqa)

    built.compiled(**ins, **outs)
    want = sdpa()
    torch.cuda.synchronize()
    got = outs["O"].view(case.batch, heads, queries, case.width)
    err = ((got - want.float()).abs().max() / want.float().abs().max()).item()
    row["check_max_rel"] = err
    if not err <= 2e-2:
        row["error"] = f"differs from SDPA: max |Δ| / max |O| = {err:.3e}"
        return row
    row["sdpa_backend"] = sdpa_backend(sdpa)
    row["habu"] = time_cuda(lambda i: built.compiled(**ins, **outs), 1)
    row["sdpa"] = time_cuda(lambda i: sdpa(), 1)
    for key in ("habu", "sdpa"):
        row[key].pop("samples", None)
    flops = 4.0 * case.batch * heads * queries * case.seq * case.width * (0.5 if case.causal else 1.0)
    if case.decode:  # decode reads the cache: its bandwidth is the measure
        cache = 2.0 * 2 * case.batch * case.kv_heads * case.seq * case.width
        for key in ("habu", "sdpa"):
            row[f"{key}_cache_tbps"] = cache / (row[key]["median_us"] * 1e-6) / 1e12
    for key in ("habu", "sdpa"):
        tf = flops / (row[key]["median_us"] * 1e-6) / 1e12
        row[f"{key}_tflops"] = tf
        row[f"{key}_peak_share"] = tf / PEAK_TFLOPS
    row["speedup_vs_sdpa"] = row["sdpa"]["median_us"] / row["habu"]["median_us"]
    return row


def prove_all(cases: list[Case], workdir: str, jobs: int) -> dict[int, Any]:
    """Case index -> its `prove_case` result or the exception it raised, proven in `jobs` spawned processes
    (each on its own copy of the case's files) before this process touches the GPU."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from habu.bench.run import device_target

    target = device_target()
    dirs = [Path(workdir) / f"case{n}" for n in range(len(cases))]
    for d in dirs:
        d.mkdir()
    out: dict[int, Any] = {}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {n: pool.submit(prove_case, case, str(d), target) for n, (case, d) in enumerate(zip(cases, dirs, strict=True))}
        for n, fut in futures.items():
            try:
                out[n] = fut.result()
            except Exception as exc:  # reported on the case's row
                out[n] = exc
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="comma-separated case names (one ending in - names every case it begins)")
    ap.add_argument("--quick", action="store_true", help="the first case only")
    ap.add_argument("--jobs", type=int, default=1, help="prove the cases in this many processes first")
    ap.add_argument("--pins", default="", help="kernel pins for every case, e.g. bm=128,bn=32; several pin sets "
                    "separated by ';' time each case once per set (the same SDPA baseline re-timed)")
    args = ap.parse_args()
    sets = [tuple(tuple(p.split("=", 1)) for p in one.split(",") if p) for one in args.pins.split(";")] or [()]
    cases = [replace(c, pins=c.pins + extra) for extra in sets for c in CASES
             if not args.only or any(c.name == o or (o.endswith("-") and c.name.startswith(o))
                                     for o in args.only.split(","))]  # a pin set's cases together, in its order
    if args.quick:
        cases = cases[:1]
    rows = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        proven = prove_all(cases, tmp, args.jobs) if args.jobs > 1 else {}
        for n, case in enumerate(cases):
            try:
                if isinstance(proven.get(n), BaseException):
                    raise proven[n]
                row = run_case(case, Path(tmp), proven.get(n))
            except Exception as exc:  # one case's failure is reported on its row
                row = {"case": case.name, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            failed |= "error" in row
            rows.append(row)
            name = case.name + "".join(f" {k}={v}" for k, v in case.pins)
            if "error" in row:
                print(f"{name:20s} ERROR {row['error'][:300]}", flush=True)
            else:
                print((f"[{row['plan_short']}] " if case.default else "") +
                      f"{name:20s} habu {row['habu']['median_us']:9.1f} us {row['habu_tflops']:6.1f} TFLOP/s "
                      f"({100 * row['habu_peak_share']:4.1f}% of peak) | SDPA[{row['sdpa_backend']}] "
                      f"{row['sdpa']['median_us']:9.1f} us {row['sdpa_tflops']:6.1f} TFLOP/s | "
                      f"{row['speedup_vs_sdpa']:.2f}x | check {row['check_max_rel']:.1e}"
                      + (f" | KV cache read {row['habu_cache_tbps']:.2f} TB/s (SDPA {row['sdpa_cache_tbps']:.2f})"
                         if "habu_cache_tbps" in row else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
