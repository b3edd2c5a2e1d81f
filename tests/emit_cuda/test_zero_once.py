"""Workspaces a launch leaves zero (`CudaKernel.zero_once`: split-KV's query tile counters, reset by the block
that combines) are zero-filled once a stream, when the packed call path first allocates them, and kept for
that stream's later calls: no memset (and its gap, ~3 µs of an 11 µs decode on the H200) before each launch.
A workspace of `zero` that is not in `zero_once` is still allocated and zero-filled per call."""

from __future__ import annotations

from habu.emit_cuda import driver, runtime
from habu.emit_cuda.runtime import CompiledModel
from habu.paths.emit import emit_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.emit_cuda.fakes import BASE, fake_gpu, info

SHAPE = {"B": 2, "G": 2, "R": 2, "J": 300, "L": 301, "E": 16, "D": 16}


def test_split_kv_counters_are_zero_filled_once_a_stream_and_kept(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(SHAPE)
    emitted = emit_plan(model, default_plan(model, TARGETS["sm_90a"], SHAPE, {"kv_split": "128"}), TARGETS["sm_90a"])
    (kernel,) = emitted.kernels
    assert kernel.zero == kernel.zero_once == ("$O.n",)
    compiled = CompiledModel(model, emitted, check_indices=False)
    args = {"Q": info((2, 2, 2, 16), "bf16"), "K": info((2, 2, 300, 16), "bf16", BASE + 0x100000),
            "V": info((2, 2, 300, 16), "bf16", BASE + 0x200000), "LEN": info((2,), "i32", BASE + 0x300000),
            "O": info((2, 2, 2, 16), "f32", BASE + 0x400000)}
    seen = {}
    for stream in (7, 7, 9, 7, 9):
        start = len(cuda.calls)
        compiled(stream=stream, **args)
        kinds = [c[0] for c in cuda.calls[start:] if c[0] in ("memset", "launch")]
        assert kinds == (["memset", "launch"] if stream not in seen else ["launch"]), (stream, kinds)
        (call,) = compiled._calls.values()
        (launch,) = call.launches
        counters = next(i for i, p in enumerate(launch.kernel.params) if p.tensor == "$O.n")
        ptr = launch.args.values[counters].value
        if stream in seen:
            assert ptr == seen[stream]  # the stream's kept counters
        else:
            memset = next(c for c in cuda.calls[start:] if c[0] == "memset")
            assert memset[1] == ptr and memset[2] == 4 * 2 * 2  # B × G query tiles, i32
            seen[stream] = ptr
    (call,) = compiled._calls.values()
    assert call._kept[7][0] is not call._kept[9][0]  # two streams never share counters (the fake reuses addresses)
