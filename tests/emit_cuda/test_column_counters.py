"""A column kernel's last-block counters are a workspace of each launch, not a variable of the module.

Before, the count of finished blocks that finds the launch's last one (`habu::last_block_done`) was a
module-global `__device__` word: two streams running the same kernel at once counted on it together (a
launch's "last" block could finish its columns before its own splits were in), and a launch that died
midway left it non-zero for the next. Now each column tile counts on its own slot of a buffer the
runtime allocates for the call, in the stream's order, and zero-fills before the launch."""

from __future__ import annotations

import re

from habu.emit_cuda import driver, runtime
from habu.emit_cuda.launcher_c import _size
from habu.emit_cuda.runtime import CompiledModel
from habu.lower import ColumnLowering, lower_plan, lower_whole
from habu.lower.access import size_of, with_derived
from habu.paths.emit import emit_plan
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.emit_cuda.fakes import BASE, fake_gpu, info

TARGET = TARGETS["sm_90a"]
# a max split over row blocks into f32 (ordered keys, decoded by each tile's last block), runtime #N
TEXT = ("300 EXTENT: #R  8..4096%8 EXTENT: #N\nbf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
        "MODEL: COLS  G[n] = max r dY[r n] ;\n")
PINS = {"rows_per_split": "64", "threads": "64", "column_threads": "32", "vector": "4"}  # 128-column tiles


def _model():
    return parse_text(TEXT, "cols.habu").models["COLS"]


def test_regression_the_column_last_block_counter_is_not_a_module_global():
    model = _model()
    plan = default_plan(model, TARGET, {}, PINS)
    emitted = emit_plan(model, plan, TARGET)
    (kernel,) = emitted.kernels
    assert not re.search(r"^__device__", kernel.source, re.M), "a variable of the module"
    assert "retired_" not in kernel.source
    # the counters come in as a parameter: one slot per column tile, ⌈#N / 128⌉ of them, zero-filled first
    (param,) = [p for p in kernel.params if p.tensor == "$G"]
    assert (param.kind, param.dtype, param.writes) == ("ptr", "i32", True)
    assert "int* __restrict__ p_counters_G" in kernel.source
    assert "habu::last_block_done(p_counters_G + (tile), (int)(5))" in kernel.source  # 300 rows, 5 splits
    assert kernel.zero == ("G", "$G") and ("$G", "i32", ("N/128",)) in emitted.intermediates
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ColumnLowering) and lw.counter_tensor == "$G" and lw.counter_extents == ("N/128",)
    assert size_of("N/128", {"N": 1000}) == 8 and with_derived({"N": 1000}, ["N/128"])["N/128"] == 8
    assert _size("N/128", {}) == "((N + 127) / 128)" and _size("N/128", {"N": 1000}) == "((1000LL + 127) / 128)"


def test_the_tile_counters_rule_refuses_tiles_sharing_a_counter():
    from dataclasses import replace

    model = _model()
    plan = default_plan(model, TARGET, {}, PINS)
    lowered = lower_whole(model, plan)
    assert "tile-counters" not in {o.rule.name for o in failures(obligations(model, plan, lowered=lowered))}
    (lw,) = lowered.kernels
    shared = replace(lowered, kernels=(replace(lw, thread_map=replace(lw.thread_map, counter_stride=0)),))
    bad = [o for o in failures(obligations(model, plan, lowered=shared)) if o.rule.name == "tile-counters"]
    assert bad and "one counter" in bad[0].detail


def test_each_call_zero_fills_its_own_counters_before_the_launch(monkeypatch):
    """The packed call path: the counters are allocated with the call (as an intermediate is) and set to
    zero on the call's stream right before the kernel, and the kernel gets that buffer."""
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = _model()
    compiled = CompiledModel(model, emit_plan(model, default_plan(model, TARGET, {}, PINS), TARGET))
    args = {"dY": info((300, 1000), "bf16"), "G": info((1000,), "f32", BASE + 0x100000)}
    for stream in (7, 9):
        start = len(cuda.calls)
        compiled(stream=stream, **args)
        memsets = [c for c in cuda.calls[start:] if c[0] == "memset"]
        assert [c[0] for c in cuda.calls[start:]] == ["memset", "memset", "launch"]
        assert [m[2] for m in memsets] == [4000, 4 * 8]  # G, then ⌈1000 / 128⌉ counters
        assert all(m[3] == ("stream", stream) for m in memsets)
    (call,) = compiled._calls.values()
    (launch,) = call.launches
    counters = next(i for i, p in enumerate(launch.kernel.params) if p.tensor == "$G")
    assert launch.args.values[counters].value == memsets[1][1]  # the buffer zeroed is the one passed


def test_the_checked_call_path_zero_fills_the_counters_too(monkeypatch):
    """check_indices="host" takes the checked path (`_Prepared`, per stream): the counters are kept with
    its launches and zero-filled before every launch."""
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = _model()
    compiled = CompiledModel(model, emit_plan(model, default_plan(model, TARGET, {}, PINS), TARGET),
                             check_indices="host")
    args = {"dY": info((300, 1000), "bf16"), "G": info((1000,), "f32", BASE + 0x100000)}
    for _ in range(2):
        start = len(cuda.calls)
        compiled(stream=7, **args)
        assert [(c[0], c[2]) for c in cuda.calls[start:] if c[0] != "launch"] == [("memset", 4000), ("memset", 32)]
