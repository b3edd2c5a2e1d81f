"""The experiments' hand edits of emitted kernels (never plans): a compiled model with one kernel's source edited
and renamed (so the profiler tells it apart), and the string edits they are made of. Imported by the scripts beside
it (`python docs/experiments/NAME.py` puts this folder on the path)."""
import dataclasses
from collections.abc import Callable

from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.runtime import CompiledModel


def variant(cm, idx: int, edit: Callable[[str], str], tag: str, extra_params: Callable = lambda k, src: ()):
    """`cm` with kernel `idx` of each member edited by `edit` and named `<name>_<tag>`; `extra_params(kernel,
    source)` gives parameters the edit added to the kernel's signature (after its own)."""
    members = []
    for guards, ep in cm.kernel_set.members:
        ks = list(ep.kernels)
        k = ks[idx]
        src = edit(k.source)
        assert src != k.source or tag == "base", tag
        new_name = k.name + "_" + tag
        ks[idx] = dataclasses.replace(k, source=src.replace(k.name, new_name), name=new_name,
                                      params=(*k.params, *extra_params(k, src)))
        members.append((guards, dataclasses.replace(ep, kernels=tuple(ks))))
    return CompiledModel(cm.model, KernelSet(members), arch="sm_90a")


def step_inputs(bw, fwd, back, tokens: int):
    """FFN-SKIP's step inputs at `tokens` (habu.bench.train_step_speed's, seed 100) and a cotangent dY; the forward's
    inputs by name; the backward's arguments (the inputs, dY, the saved values of one forward run); and the
    backward's outputs on them: (tensors, named, dy, args, ref)."""
    import torch

    import habu.bench.train_step_speed as ts

    tensors = ts.inputs_for(tokens, 100)
    named = dict(zip([t.name for t in bw.forward.inputs], (t.detach() for t in tensors), strict=True))
    dy = torch.randn((tokens, ts.SIZES["D"]), device="cuda").to(torch.bfloat16)
    out = fwd(**named)
    avail = named | {dict(bw.cotangents)["Y"]: dy} | {s: out[s] for _, s in bw.saved}
    args = {t.name: avail[t.name] for t in back.model.inputs}
    return tensors, named, dy, args, back(**args)


def sub(old: str, new: str, count: int = 1) -> Callable[[str], str]:
    """Replace every `old` by `new`, which must occur at least `count` times."""
    def f(s: str) -> str:
        assert s.count(old) >= count, (old[:60], s.count(old))
        return s.replace(old, new)
    return f


def chain(*fs: Callable[[str], str]) -> Callable[[str], str]:
    def f(s: str) -> str:
        for g in fs:
            s = g(s)
        return s
    return f


def against_sdpa(case, model, sizes, built: dict, rounds: int) -> None:
    """Each compiled variant of attention case `case` (habu.bench.attention_speed's) against torch's SDPA: its error
    against SDPA's output and whether it gives the first variant's bits, then `rounds` interleaved rounds of CUDA-event
    medians, SDPA's among them."""
    import torch

    from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

    ins = make_inputs(model, sizes, 1)
    heads = case.kv_heads * case.group
    q = ins["Q"].view(case.batch, heads, case.seq, case.width)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, ins["K"], ins["V"], is_causal=case.causal)

    want = sdpa().float()
    outputs, ref = {}, None
    for tag, cm in built.items():
        outs = poisoned_outputs(model, sizes)
        cm(**ins, **outs)
        torch.cuda.synchronize()
        got = outs["O"].view(case.batch, heads, case.seq, case.width).float()
        ref = got if ref is None else ref
        print(f"{case.name} {tag}: max |Δ|/max|O| against SDPA {((got - want).abs().max() / want.abs().max()).item():.2e}, "
              f"the same bits as the first: {torch.equal(got, ref)}", flush=True)
        outputs[tag] = outs
    times: dict[str, list[float]] = {tag: [] for tag in [*built, "sdpa"]}
    for _ in range(rounds):
        for tag, cm in built.items():
            times[tag].append(time_cuda(lambda i, cm=cm, outs=outputs[tag]: cm(**ins, **outs), 1)["median_us"])
        times["sdpa"].append(time_cuda(lambda i: sdpa(), 1)["median_us"])
    for tag, ts in times.items():
        print(f"{case.name} {tag:6s} " + " ".join(f"{t:7.1f}" for t in ts) + f"   min {min(ts):7.1f} us", flush=True)


def run_cases(run: Callable, default: str) -> None:
    """`run(case, workdir, rounds)` for each attention case named in $CASES (else `default`), $ROUNDS rounds (3),
    each in a fresh temporary folder."""
    import os
    import tempfile
    from pathlib import Path

    from habu.bench.attention_speed import CASES

    by_name = {c.name: c for c in CASES}
    for n in os.environ.get("CASES", default).split(","):
        with tempfile.TemporaryDirectory() as tmp:
            run(by_name[n], Path(tmp), int(os.environ.get("ROUNDS", 3)))
