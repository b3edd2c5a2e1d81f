"""Session 61 (docs/PERF.md): where FFN-SKIP's 4096-token step loses to torch.compile. Profiled (H100), each Habu
product runs within 1% of cuBLAS's but one: the backward's dX (TrdX = dT2·W1, dX = dT6 + TrdX, dB2 = Σ_b dT6 in
its epilogue) takes ~690 µs against ~630 for the plain products. An experiment, not a bench: that kernel of the
default backward plan with its plan changed (persistent, the epilogue prefetch, the early loads, 128-wide tiles;
each proven and emitted) and edited by hand (dT6 read as bf16 pairs; no column sum; no dT6 read at all), each
timed alone (profiler, launches serialised) and in the step, its outputs compared with the default's bit for bit.
Then the forward's first product with GELU in its epilogue (the 128-token plan's partition at 4096 tokens: S1 and
S3 from one kernel) against the default (the product, then a general kernel). `PART=fuse`: the forward's and the
backward's GELU products fused at 4096 tokens (as the 128-token plans partition them), alone and in the step;
`PART=pairs`: the forms of the epilogue's pair loads (habu/lower/epilogue_pairs.py) in the dX product. Run on the
device machine:

    TOK=4096 OUT=/tmp [PART=fuse|pairs] python docs/experiments/epilogue_4096.py
"""
import json
import os
import re
from dataclasses import replace

import hand_edits
import torch

import habu.bench.train_step_speed as ts
from habu.bench.backward_speed import build
from habu.bench.kernel_times import kernel_device_times, serial_launches
from habu.compile import bind_shape
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.runtime import CompiledModel
from habu.paths.emit import emit
from habu.prove import prove
from habu.search.space import default_plan
from habu.target import target_named
from habu.timing.harness import time_cuda

TOK = int(os.environ.get("TOK", "4096"))
PART = os.environ.get("PART", "dx")  # "dx": the dX product's epilogue (the first walk); "fuse": the fused products
SIZES = {"B": TOK, **ts.SIZES}
TGT = target_named("sm_90a")

PAIR = re.compile(r"const float e0_0 = \(\(\(m\) < (\d+) && \(n\) < (\d+)\) \? habu::load_bf16\(p_td6 \+ \(([^;]*?)\)\) "
                  r": 0\.0f\);\n(\s*)const float e1_0 = [^\n]*\n")


def pairs(s: str) -> str:
    """dT6's two adjacent elements as one 4-byte load (n is even, the row's length too)."""
    def one(mt: re.Match) -> str:
        rows, cols, offset, pad = mt.groups()
        return (f"const habu::u32 pr = habu::load4_or_zero(p_td6 + ({offset}), (m) < {rows} && (n) < {cols});\n"
                f"{pad}const float e0_0 = __uint_as_float(pr << 16);\n"
                f"{pad}const float e1_0 = __uint_as_float(pr & 0xffff0000u);\n")
    out, n = PAIR.subn(one, s)
    assert n >= 1, "no pair of dT6 loads"
    return out


def no_load(s: str) -> str:
    """dT6 never read (zeros): the product's own epilogue cost."""
    s = re.sub(r"const float (e\d_0) = [^\n]*habu::load_bf16\(p_td6[^\n]*;", r"const float \1 = 0.0f;", s)
    assert "load_bf16(p_td6" not in s
    return s


def no_colsum(s: str) -> str:
    """Without dB2's reduction (the shuffles, the partials, the last block's sums): the per-element sums stay."""
    start = s.index("      {  // dB2: the column sum")
    end = s.index("    if (threadIdx.x % 128 == 0) habu::bulk_wait_group<0>();")
    body = s[start:end]
    close = body.rindex("      }\n")
    return s[:start] + body[close + len("      }\n"):] + s[end:]


def swap_in(kernels, new) -> list:
    """`kernels` with those computing any of `new`'s nodes replaced by `new`, where the first of them was."""
    out, placed = [], False
    for k in kernels:
        if not set(k.nodes) & set(new.nodes):
            out.append(k)
        elif not placed:
            out.append(new)
            placed = True
    return out


def _plans(which: str):
    """The model, the default plan at TOK tokens, the kernels a variant starts from and the index of the one it
    changes (`which`: "dx", the backward's dX product; "forward", the forward with S1 and S3 from one product, as
    the 128-token plan partitions it; "dt2", the backward with dT3·(GELU′) and dB1 from one product, likewise)."""
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program

    derived = derive_model(load_program(ts.EX / "ffn_skip.habu"), "FFN-SKIP")
    graph = derived.model if which in ("dx", "dt2") else derived.forward
    model = bind_shape(graph, SIZES)
    base = default_plan(model, TGT, {"B": TOK}, {})
    if which == "dx":
        return model, base, list(base.kernels), next(i for i, k in enumerate(base.kernels) if "dB2" in k.nodes)
    small = default_plan(bind_shape(graph, {**SIZES, "B": 128}), TGT, {"B": 128}, {})
    node = "S3" if which == "forward" else "%d2"
    fused = next(k for k in small.kernels if node in k.nodes and k.kind == "contraction")
    kernels = swap_in(base.kernels, fused)
    return model, base, kernels, kernels.index(fused)


def prove_variant(which: str, changes: dict):
    """(guards, emitted program) of the variant, proven (rules and one finite-field trial); or why not."""
    try:
        model, base, kernels, idx = _plans(which)
        kernels[idx] = replace(kernels[idx], **changes)
        plan = replace(base, kernels=tuple(kernels))
        proof = prove(model, plan, {"B": TOK}, trials=1)
        if not proof.ok or proof.violations:
            return f"not proven: {proof.violations[:1]}"
        return plan.guards, emit(proof, TGT)
    except Exception as err:  # a change the lowering refuses: reported
        return repr(err)[:300]


DX_PLANS = {"persistent": dict(persistent=True), "prefetch": dict(epilogue_prefetch=True),
            "early": dict(epilogue_early=True), "n128": dict(tile_n=128),
            "persistent_prefetch": dict(persistent=True, epilogue_prefetch=True),
            "n128_early": dict(tile_n=128, epilogue_early=True)}
FORWARD_PLANS = {"as_128": {}, "n256": dict(tile_n=256, stages=4, epilogue_early=False),
                 "n256_persistent": dict(tile_n=256, stages=4, epilogue_early=False, persistent=True),
                 "persistent": dict(persistent=True)}
# the second walk (PART=fuse): the fused products at 4096 tokens, and the step with them
N256P = dict(tile_n=256, stages=4, epilogue_early=False, persistent=True, stream_b=False)
FUSE_PLANS = {("forward", "n256_persistent"): N256P,
              ("dt2", "n256_persistent"): N256P,
              ("dt2", "n256"): {**N256P, "persistent": False},
              ("dt2", "n128_persistent_early"): dict(persistent=True, stream_b=False),
              ("dt2", "n128_early"): dict(stream_b=False)}


PAIR_FORMS = {  # the device function's alternatives, for PART=pairs (each replaces habu::load_pair16 by name)
    "scalar": """__device__ __forceinline__ habu::u32 xp_pair(const void* p, bool f, bool s) {
  const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
  return (f ? (habu::u32)__ldg(q) : 0u) | ((s ? (habu::u32)__ldg(q + 1) : 0u) << 16);
}
""",
    "runtime": """__device__ __forceinline__ habu::u32 xp_pair(const void* p, bool f, bool s) {
  if (f && s && (reinterpret_cast<unsigned long long>(p) & 3ull) == 0ull) return __ldg(reinterpret_cast<const habu::u32*>(p));
  const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
  return (f ? (habu::u32)__ldg(q) : 0u) | ((s ? (habu::u32)__ldg(q + 1) : 0u) << 16);
}
""",
}


def pair_form(form: str):
    def edit(s: str) -> str:
        s = s.replace('#include "habu/habu.cuh"\n', '#include "habu/habu.cuh"\n' + PAIR_FORMS[form], 1)
        assert "habu::load_pair16(" in s
        return s.replace("habu::load_pair16(", "xp_pair(")
    return edit


def pairs_walk(back, args, ref) -> None:
    """The dX product's pair loads in three forms (as emitted: one 4-byte load and a select; two 2-byte loads; one
    load where the address is aligned, checked at run time, else two), alone, in interleaved rounds."""
    idx = next(i for i, k in enumerate(back.kernel_set.members[0][1].kernels) if "dB2" in k.stores)
    forms = {"emitted": back} | {f: hand_edits.variant(back, idx, pair_form(f), f) for f in PAIR_FORMS}
    for f, v in forms.items():
        got = v(**args)
        print(f, "exact", all(torch.equal(got[n], ref[n]) for n in ref), flush=True)
    times = {f: [] for f in forms}
    for _ in range(int(os.environ.get("ROUNDS", "4"))):
        for f, v in forms.items():
            with serial_launches():
                t = kernel_device_times(lambda v=v: v(**args))
            times[f].append(next(us for n, us in t.items() if n.endswith(f"_k{idx}") or n.endswith(f)))
    for f, t in times.items():
        print(f"{f:10s}", " ".join(f"{x:7.1f}" for x in t), flush=True)


def rel(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def fuse_walk(bw, fwd, back, compiled, named, args, ref, tensors, dy, rows) -> None:
    """The fused products' kernels alone (against the default's) and the step with them, in interleaved rounds."""
    fref = fwd(**named)
    with serial_launches():
        rows["forward_default_kernels"] = kernel_device_times(lambda: fwd(**named))
        rows["backward_default_kernels"] = kernel_device_times(lambda: back(**args))
    print("default kernels", rows["forward_default_kernels"], rows["backward_default_kernels"], flush=True)
    forwards, backwards = {"default": fwd}, {"default": back}
    for (which, tag), _ in FUSE_PLANS.items():
        v = compiled((which, tag), fwd.model if which == "forward" else back.model)
        key = f"{which}_{tag}"
        if isinstance(v, str):
            rows[key] = {"error": v}
            print(key, v, flush=True)
            continue
        call, inputs, want = (v, named, fref) if which == "forward" else (v, args, ref)
        got = call(**inputs)
        with serial_launches():
            t = kernel_device_times(lambda c=call, i=inputs: c(**i))
        rows[key] = dict(rel_err={n: rel(got[n], want[n]) for n in want}, kernels=t, total_us=sum(t.values()))
        print(key, rows[key], flush=True)
        (forwards if which == "forward" else backwards)[tag] = v
    steps = {f"{f}+{b}": (forwards[f], backwards[b]) for f in forwards for b in backwards}
    times = {k: [] for k in steps} | {"eager": []}
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        for label, (f, b) in steps.items():
            times[label].append(time_cuda(lambda i, f=f, b=b: ts.habu_step(bw, f, b, tensors, dy), 1)["median_us"])
        times["eager"].append(time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"])
    rows["step_rounds_us"] = times
    for label, t in times.items():
        print(f"{label:45s}", " ".join(f"{x:8.1f}" for x in t), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"fuse_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


def main():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(12, mp_context=multiprocessing.get_context("forkserver"))
    if PART == "pairs":
        jobs = {}
    elif PART == "fuse":
        jobs = {key: pool.submit(prove_variant, key[0], c) for key, c in FUSE_PLANS.items()}
    else:
        jobs = {("dx", t): pool.submit(prove_variant, "dx", c) for t, c in DX_PLANS.items()}
        jobs |= {("forward", t): pool.submit(prove_variant, "forward", c) for t, c in FORWARD_PLANS.items()}
    bw, fwd, back = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", {}, {})
    built = {k: f.result() for k, f in jobs.items()}

    def compiled(key, member_model):
        got = built[key]
        return got if isinstance(got, str) else CompiledModel(member_model, KernelSet([got]), arch="sm_90a")

    tensors, named, dy, args, ref = hand_edits.step_inputs(bw, fwd, back, TOK)
    rows = {"gpu": torch.cuda.get_device_name(), "tokens": TOK}
    if PART == "pairs":
        pairs_walk(back, args, ref)
        return
    if PART == "fuse":
        fuse_walk(bw, fwd, back, compiled, named, args, ref, tensors, dy, rows)
        return
    step = lambda f, b: time_cuda(lambda i: ts.habu_step(bw, f, b, tensors, dy), 1)["median_us"]  # noqa: E731
    rows["step_default_us"] = step(fwd, back)
    with serial_launches():
        rows["default_kernels"] = kernel_device_times(lambda: back(**args))
    print("default", rows["step_default_us"], rows["default_kernels"], flush=True)
    idx = next(i for i, k in enumerate(back.kernel_set.members[0][1].kernels) if "dB2" in k.stores)
    plans = {t: compiled(("dx", t), back.model) for t in DX_PLANS}
    variants = {tag: hand_edits.variant(back, idx, edit, tag)
                for tag, edit in {"pairs": pairs, "no_colsum": no_colsum, "no_load": no_load,
                                  "pairs_no_colsum": lambda s: no_colsum(pairs(s)),
                                  "plain": lambda s: no_colsum(no_load(s))}.items()}
    for tag, v in {**variants, **plans}.items():
        if isinstance(v, str):
            rows[tag] = {"error": v}
            print(tag, v, flush=True)
            continue
        got = v(**args)
        with serial_launches():
            t = kernel_device_times(lambda v=v: v(**args))
        rows[tag] = dict(exact={n: torch.equal(got[n], ref[n]) for n in ref}, step_us=step(fwd, v),
                         dx_kernel_us=[us for n, us in t.items() if n.endswith(f"_k{idx}") or n.endswith(tag)])
        print(tag, rows[tag], flush=True)
    fref = fwd(**named)
    with serial_launches():
        rows["forward_default_kernels"] = kernel_device_times(lambda: fwd(**named))
    for tag, v in {t: compiled(("forward", t), fwd.model) for t in FORWARD_PLANS}.items():
        key = f"forward_{tag}"
        if isinstance(v, str):
            rows[key] = {"error": v}
            print(key, v, flush=True)
            continue
        got = v(**named)
        err = {n: float((got[n].float() - fref[n].float()).norm() / fref[n].float().norm()) for n in fref}
        with serial_launches():
            t = kernel_device_times(lambda v=v: v(**named))
        rows[key] = dict(rel_err=err, kernels=t, step_us=step(v, back))
        print(key, rows[key], flush=True)
    rows["step_default_again_us"] = step(fwd, back)
    rows["eager_step_us"] = time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"]
    print("default again", rows["step_default_again_us"], "eager", rows["eager_step_us"], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"epilogue_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
