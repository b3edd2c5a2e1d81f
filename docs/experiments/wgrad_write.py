"""Session 59 (docs/PERF.md): where FFN-SKIP's 128-token weight gradients (dW1 = Xᵀ·dT2, dW2 = S3ᵀ·dT6: K = 128,
each a 117 MB bf16 write) spend their time. An experiment, not a bench: the emitted dW kernels of the default
backward plan edited by hand (no wgmma: the store stream alone; no TMA store: loads and products alone), each timed
alone (profiler, launches serialised), beside the write and copy floors of the same bytes and cuBLAS's product
(torch.mm into bf16); then the default backward plan with its two dW kernels changed (clusters of two sharing the
dT tile by TMA multicast; 128 × 128 tiles), each proven and emitted, its outputs compared with the default's bit
for bit, timed alone and in the step. Run on the device machine:

    TOK=128 OUT=/tmp python docs/experiments/wgrad_write.py
"""
import json
import os
import re
from dataclasses import replace

import hand_edits
import torch
from hand_edits import sub

import habu.bench.train_step_speed as ts
from habu.bench.backward_speed import build
from habu.bench.kernel_times import kernel_device_times, serial_launches
from habu.compile import bind_shape
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.kernel import Param
from habu.emit_cuda.runtime import CompiledModel
from habu.paths.emit import emit
from habu.plan.fields import Move, Raster, Store
from habu.prove import prove
from habu.search.space import default_plan
from habu.target import target_named
from habu.timing.harness import time_cuda

TOK = int(os.environ.get("TOK", "128"))
# walks 1-7 took the plain-load dW kernels apart (before `keep_operands` became their default); 8 the default; 9-11
# hand-edit the products that stream their weights (before `stream_b` became the backward's default there)
WALK = os.environ.get("WALK", "")
PLAIN = {} if WALK == "8" else {"stream_b": "false"} if WALK in ("9", "10", "11") else {"keep_operands": "false"}
bw, fwd, back = build("ffn_skip.habu", "FFN-SKIP", {"B": TOK}, "sm_90a", PLAIN, {})


def out_pointer(k, src: str) -> tuple:
    """The output's pointer, for an edit whose threads store it (`thread_stores`)."""
    return (Param(name="p_out_threads", kind="ptr", tensor=k.stores[0], dtype="bf16", writes=True),) \
        if "p_out_threads" in src else ()


def variant(cm, idx: int, edit, tag: str):
    return hand_edits.variant(cm, idx, edit, tag, out_pointer)


def variants(store_map: str) -> dict:
    return {
        "base": lambda s: s,
        "no_mma": sub("  habu_wgmma_m64n256_bf16_at_bt(acc[0],", "  if (0) habu_wgmma_m64n256_bf16_at_bt(acc[0],"),
        "no_store": sub(f"habu::tma_store_2d(&{store_map},", f"if (0) habu::tma_store_2d(&{store_map},"),
    }


def floors(rows: int, cols: int) -> dict:
    """A write (fill) and a copy of a rows × cols bf16 tensor, µs (medians of CUDA events, 4 buffers in turn)."""
    bufs = [torch.empty((rows, cols), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    src = [torch.randn((rows, cols), device="cuda").to(torch.bfloat16) for _ in range(4)]
    fill = time_cuda(lambda i: bufs[i].fill_(1.0), 4)["median_us"]
    copy = time_cuda(lambda i: bufs[i].copy_(src[(i + 1) % 4]), 4)["median_us"]
    return {"fill_us": fill, "copy_us": copy, "bytes": rows * cols * 2}


def no_loads(s: str) -> str:
    """The producer completes each full stage without loading it: the consumers read whatever the stage holds."""
    out = re.sub(r"habu::mbar_arrive_expect_tx\(full, \d+\);\n[^\n]*\n", "habu::mbar_arrive(full);\n", s)
    assert out != s
    return out


def thread_stores(s: str) -> str:
    """Each staged box written by the warpgroup's threads (16-byte loads of the swizzled box, 16-byte global stores,
    8 threads a 128-byte row) instead of a TMA store: the TMA unit left to the operands' loads."""
    m = re.search(r"if \(threadIdx.x % 128 == 0\) \{\n\s*habu::tma_store_2d\(&(tm_\w+), buf, (\(int\)\(n0 \+ b \* 64\)), "
                  r"(\(int\)\(m0 \+ \(cw \* 1 \+ s\) \* 64\))\);\n\s*habu::bulk_commit_group\(\);\n\s*\}", s)
    assert m, "no TMA store"
    stride = {"tm_dW2": 4096, "tm_dW1": 14336}[m.group(1)]
    body = (f"{{ const int t = threadIdx.x % 128; const int x0 = {m.group(2)}; const int y0 = {m.group(3)};\n"
            "#pragma unroll\n"
            "            for (int i = 0; i < 4; ++i) { const int row = t / 8 + 16 * i; const int ch = t % 8;\n"
            "              const uint4 v = *reinterpret_cast<const uint4*>(smem + (buf - smem_base) + "
            "habu::swizzle128((habu::u32)row, (habu::u32)ch));\n"
            f"              *reinterpret_cast<uint4*>(p_out_threads + (long long)(y0 + row) * {stride} + x0 + ch * 8) = v; }} }}")
    s = s[:m.start()] + body + s[m.end():]
    sig = f"const __grid_constant__ habu::TensorMap {m.group(1)})"
    assert sig in s
    return s.replace(sig, sig[:-1] + ", habu::bf16* __restrict__ p_out_threads)", 1)


EVICT_FIRST = """#include "habu/habu.cuh"
__device__ __forceinline__ habu::u64 xp_policy_evict_first() {
  habu::u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void xp_store_2d_first(const habu::TensorMap* map, habu::u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], %4;"
               :: "l"((habu::u64)map), "r"(src), "r"(c0), "r"(c1), "l"(xp_policy_evict_first()) : "memory");
}
__device__ __forceinline__ void xp_load_2d_first(habu::u32 dst, const habu::TensorMap* map, habu::u32 bar, int c0,
                                                 int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"((habu::u64)map), "r"(bar), "r"(c0), "r"(c1), "l"(xp_policy_evict_first()) : "memory");
}
__device__ __forceinline__ void xp_load_2d_last(habu::u32 dst, const habu::TensorMap* map, habu::u32 bar, int c0,
                                                int c1) {
  habu::tma_load_2d_hinted(dst, map, bar, c0, c1, habu::l2_policy_evict_last());
}
"""
LAST = "xp_load_2d_last("  # the project's form since session 60: habu::tma_load_2d_hinted(..., l2_policy_evict_last())


def streamed(s: str) -> str:
    """A weight-streaming product: A's (the activations') loads evict-last, B's (the weights') evict-first."""
    s = s.replace('#include "habu/habu.cuh"\n', EVICT_FIRST, 1)
    s = sub("habu::tma_load_2d(a_stage", LAST + "a_stage")(s)
    return sub("habu::tma_load_2d(b_stage", "xp_load_2d_first(b_stage")(s)


def no_colsum(s: str) -> str:
    """dT2's product without its dB1 column sum's reduction (the shuffles, the partials through the staging buffers,
    the wait for the boxes to leave them, the sums' stores): the per-element accumulation stays."""
    start = s.index("      {  // dB1: the column sum")
    end = s.index("    if (threadIdx.x % 128 == 0) habu::bulk_wait_group<0>();  // the last boxes leave")
    body = s[start:end]
    close = body.rindex("      }\n")  # the block's closing brace (the tile loop's follows it)
    return s[:start] + body[close + len("      }\n"):] + s[end:]


def dt2_parts(named, args, tensors, dy) -> None:
    """dT2's product (GELU's derivative and dB1 in its epilogue) taken apart, alone and in the step."""
    idx = next(i for i, k in enumerate(back.kernel_set.members[0][1].kernels) if "dB1" in k.stores)
    rows = {}
    for tag, edit in {"base": lambda s: s, "no_colsum": no_colsum, "streamed": streamed,
                      "no_colsum_streamed": lambda s: streamed(no_colsum(s))}.items():
        v = variant(back, idx, edit, tag)
        got, ref = v(**args), back(**args)
        with serial_launches():
            t = kernel_device_times(lambda v=v: v(**args))
        alone = [us for n, us in t.items() if n.endswith(tag)]
        step = time_cuda(lambda i, v=v: ts.habu_step(bw, fwd, v, tensors, dy), 1)["median_us"]
        rows[tag] = dict(alone=alone[0] if alone else None, step=step,
                         exact={n: torch.equal(got[n], ref[n]) for n in ref})
        print("dT2", tag, rows[tag], flush=True)
    print("eager step", time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"], flush=True)


def hinted(stores: bool, loads: bool):
    """L2 eviction hints: the output's boxes evict first (written once, never read here), the operands' last."""
    def edit(s: str) -> str:
        s = s.replace('#include "habu/habu.cuh"\n', EVICT_FIRST, 1)
        if stores:
            s = sub("habu::tma_store_2d(&tm_dW", "xp_store_2d_first(&tm_dW")(s)
        if loads:
            s = sub("habu::tma_load_2d(", LAST)(s)
        return s
    return edit




BASE = {"base": lambda s: s}
WAIT = "if (boxes_stored >= 2 && threadIdx.x % 128 == 0) habu::bulk_wait_group_read<1>();"


def no_mma(s: str) -> str:
    return variants("")["no_mma"](s)


# WALK: (the dW kernels' hand edits, or None for `variants`; the backward plan's dW kernels changed)
WALKS = {
    "": (None, {"cluster2": dict(cluster_m=2), "t128": dict(tile_n=128, stages=5),
                "cluster2_t128": dict(cluster_m=2, tile_n=128, stages=5), "not_persistent": dict(persistent=False)}),
    # the walk's order: which tiles the blocks store at once
    "1": (BASE, {f"group_m={g}": dict(group_m=g) for g in (1, 2, 4, 8, 32, 112)} | {
        "column": dict(raster=Raster.COLUMN), "column_group_m=1": dict(raster=Raster.COLUMN, group_m=1),
        "t128_group_m=1": dict(tile_n=128, stages=5, group_m=1)}),
    # the store round's own costs: its wait for the staging buffer, a direct store
    "2": (BASE | {"no_wait": sub(WAIT, ""), "no_wait_no_mma": lambda s: sub(WAIT, "")(no_mma(s))},
          {"store=direct": dict(store=Store.DIRECT)}),
    # the store stream without the L2 reads of the operands
    "3": (BASE | {"no_loads": no_loads, "no_loads_no_mma": lambda s: no_loads(no_mma(s))}, {}),
    # a deeper ring: the next tile's k tiles loaded during this tile's epilogue
    "4": (BASE, {"stages=4": dict(stages=4), "t128_stages=6": dict(tile_n=128, stages=6),
                 "t128_stages=7": dict(tile_n=128, stages=7), "t128_stages=4": dict(tile_n=128, stages=4)}),
    # the operands by cp.async: the TMA unit left to the stores
    "5": (BASE, {"cp.async": dict(a_move=Move.CP_ASYNC, b_move=Move.CP_ASYNC), "B cp.async": dict(b_move=Move.CP_ASYNC),
                 "A cp.async": dict(a_move=Move.CP_ASYNC),
                 "cp.async stages=4": dict(a_move=Move.CP_ASYNC, b_move=Move.CP_ASYNC, stages=4)}),
    # the stores by the threads: the TMA unit left to the loads
    "6": (BASE | {"thread_stores": thread_stores}, {}),
    # L2 eviction hints
    "7": (BASE | {"store_evict_first": hinted(True, False), "load_evict_last": hinted(False, True),
                  "both_hints": hinted(True, True)}, {}),
    # the default (`keep_operands` on the dW kernels) against the plain loads
    "8": (BASE, {"keep_operands=false": dict(keep_operands=False)}),
}


def plan_variant(changes: dict) -> CompiledModel:
    """The default backward plan with its dW kernels changed, proven and emitted."""
    tgt = target_named("sm_90a")
    model = bind_shape(bw.model, {"B": TOK})
    base = default_plan(model, tgt, {"B": TOK}, PLAIN)
    plan = replace(base, kernels=tuple(replace(k, **changes) if {"dW1", "dW2"} & set(k.nodes) else k
                                       for k in base.kernels))
    proof = prove(model, plan, {"B": TOK}, trials=1)
    assert proof.ok and not proof.violations, proof.violations[:1]
    return CompiledModel(back.model, KernelSet([(plan.guards, emit(proof, tgt))]), arch="sm_90a")


def streaming(named, args, tensors, dy) -> None:
    rows = {"step_default_us": time_cuda(lambda i: ts.habu_step(bw, fwd, back, tensors, dy), 1)["median_us"]}
    f_all, b_all = fwd, back
    for label, plan, idx in (("fwd1", fwd, 0), ("fwd2", fwd, 1), ("dT2", back, 1), ("dX", back, 2)):
        v = variant(plan, idx, streamed, "streamed")
        plan_args = named if plan is fwd else args
        got, ref = v(**plan_args), plan(**plan_args)
        exact = all(torch.equal(got[n], ref[n]) for n in ref)
        with serial_launches():
            t = kernel_device_times(lambda v=v, a=plan_args: v(**a))
            t0 = kernel_device_times(lambda p=plan, a=plan_args: p(**a))
        name = plan.kernel_set.members[0][1].kernels[idx].name
        rows[label] = dict(exact=exact, alone=t.get(name + "_streamed"), before=t0.get(name))
        print(label, rows[label], flush=True)
        if plan is fwd:
            f_all = variant(f_all, idx, streamed, "streamed")
        else:
            b_all = variant(b_all, idx, streamed, "streamed")
    rows["step_all_streamed_us"] = time_cuda(lambda i: ts.habu_step(bw, f_all, b_all, tensors, dy), 1)["median_us"]
    rows["step_default_again_us"] = time_cuda(lambda i: ts.habu_step(bw, fwd, back, tensors, dy), 1)["median_us"]
    rows["eager_step_us"] = time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"]
    print(rows, flush=True)


def streaming_alone(tensors, dy) -> None:
    """The step with one of the four weight-streaming products (or a pair) hinted, in two interleaved rounds."""
    one = {"fwd1": [(fwd, 0)], "fwd2": [(fwd, 1)], "dT2": [(back, 1)], "dX": [(back, 2)],
           "dT2+dX": [(back, 1), (back, 2)], "fwd1+fwd2": [(fwd, 0), (fwd, 1)],
           "all four": [(fwd, 0), (fwd, 1), (back, 1), (back, 2)], "fwd2+dT2+dX": [(fwd, 1), (back, 1), (back, 2)]}
    steps = {"default": (fwd, back)}
    for label, where in one.items():
        f, b = fwd, back
        for plan, idx in where:
            if plan is fwd:
                f = variant(f, idx, streamed, "streamed")
            else:
                b = variant(b, idx, streamed, "streamed")
        steps[label] = (f, b)
    rows = {k: [] for k in steps} | {"eager": []}
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        for label, (f, b) in steps.items():
            rows[label].append(time_cuda(lambda i, f=f, b=b: ts.habu_step(bw, f, b, tensors, dy), 1)["median_us"])
        rows["eager"].append(time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"])
    for label, ts_ in rows.items():
        print(f"{label:10s}", " ".join(f"{t:7.1f}" for t in ts_), flush=True)


def main():
    tensors, named, dy, args, ref = hand_edits.step_inputs(bw, fwd, back, TOK)
    if os.environ.get("WALK") == "9":  # the weight-streaming products: activations kept, weights streamed
        streaming(named, args, tensors, dy)
        return
    if os.environ.get("WALK") == "11":  # the step with each weight-streaming product hinted alone, twice
        streaming_alone(tensors, dy)
        return
    if os.environ.get("WALK") == "10":  # dT2's epilogue: its column sum, and the L2 hints
        dt2_parts(named, args, tensors, dy)
        return
    if os.environ.get("NCU_ONLY") == "1":  # under ncu: dW2 as emitted, then without its operands' loads
        idx = next(i for i, k in enumerate(back.kernel_set.members[0][1].kernels) if "dW2" in k.stores)
        variant(back, idx, no_loads, "no_loads")(**args)
        torch.cuda.synchronize()
        return
    edits, plan_variants = WALKS[os.environ.get("WALK", "")]
    rows = {"gpu": torch.cuda.get_device_name()}
    kernels = back.kernel_set.members[0][1].kernels
    for idx, k in enumerate(kernels):
        if not ("dW1" in k.stores or "dW2" in k.stores):
            continue
        tm = "tm_" + k.stores[0]
        for tag, edit in (edits or variants(tm)).items():
            v = variant(back, idx, edit, tag)
            got = v(**args)
            exact = all(torch.equal(got[n], ref[n]) for n in ref)
            with serial_launches():
                t = kernel_device_times(lambda v=v: v(**args))
            alone = [us for n, us in t.items() if n.endswith(tag)]
            rows[f"{k.stores[0]} {tag}"] = dict(kernel_us=alone[0] if alone else None, exact=exact)
            print(k.stores[0], tag, rows[f"{k.stores[0]} {tag}"], flush=True)
    rows["step_default_us"] = time_cuda(lambda i: ts.habu_step(bw, fwd, back, tensors, dy), 1)["median_us"]
    with serial_launches():
        rows["default_kernels"] = kernel_device_times(lambda: back(**args))
    for tag, changes in plan_variants.items():
        try:
            v = plan_variant(changes)
        except Exception as err:
            rows[tag] = {"error": repr(err)[:300]}
            print(tag, rows[tag], flush=True)
            continue
        got = v(**args)
        with serial_launches():
            t = kernel_device_times(lambda v=v: v(**args))
        step = time_cuda(lambda i, v=v: ts.habu_step(bw, fwd, v, tensors, dy), 1)["median_us"]
        rows[tag] = dict(exact=all(torch.equal(got[n], ref[n]) for n in ref), kernels=t, step_us=step)
        print(tag, rows[tag], flush=True)
    print("default step", rows["step_default_us"], "kernels", rows["default_kernels"], flush=True)
    h, d = ts.SIZES["H"], ts.SIZES["D"]
    rows["floors"] = floors(h, d)
    if os.environ.get("WALK") == "1":
        rows["floors_f32"] = floors(h, 2 * d)  # twice the bytes: the fill's rate at another size
    s3 = [torch.randn((TOK, h), device="cuda").to(torch.bfloat16) for _ in range(4)]
    g = [torch.randn((TOK, d), device="cuda").to(torch.bfloat16) for _ in range(4)]
    rows["cublas_dW2_us"] = time_cuda(lambda i: torch.mm(s3[i].t(), g[i]), 4)["median_us"]
    rows["eager_step_us"] = time_cuda(lambda i: ts.grads(ts.torch_block, tensors, dy), 1)["median_us"]
    print("floors", rows["floors"], "cublas dW2", rows["cublas_dW2_us"], "eager step", rows["eager_step_us"], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"wgrad_write_{TOK}.json"), "w") as f:
        json.dump(rows, f, indent=1)


main()
