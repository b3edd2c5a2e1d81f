"""`warm_next`: after its last TMA load a wgmma producer prefetches into the L2 the plan's next kernel's first boxes
of the operand that kernel streams from a model input (habu/lower/warm_next.py), through that kernel's own tensor
map. A hint: the field check is the same with or without it; the `warm-next` rule runs the printed decode against
the next kernel's boxes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_whole
from habu.lower.warm_next import WarmNext
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.rules_warm import next_kernel_boxes, warm_mismatch
from habu.prove.verify import field_key
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
SIZES = {"B": 128, "D": 4096, "H": 14336}


def _ffn(backward: bool, tokens: int = 128):
    bw = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP")
    return (bw.model if backward else bw.forward).with_sizes({"B": tokens})


def test_the_forward_product_warms_w2s_first_k_rows_through_the_down_projections_own_map():
    model = _ffn(False)
    plan = default_plan(model, T, {}, {"warm_next": "8"})
    assert [getattr(k, "warm_next", None) for k in plan.kernels] == [8, 0, None]  # k1 is followed by a row kernel
    lowered = lower_whole(model, plan).kernels
    warm = lowered[0].warm
    assert warm.side == "B" and warm.map.tensor == "W2" and warm.count(SIZES) == 64 * 8  # 64 tiles of 64 columns
    emitted = emit_plan(model, plan, T).kernels
    src = emitted[0].source
    assert ("for (int i = ((((gridDim.x - 1) - blockIdx.x) * 128) + ptid); i < 512; i += (gridDim.x * 128))\n"
            "      habu::tma_prefetch_2d(&tm_W2, (int)(((i / 8) * 64)), (int)(((i % 8) * 64)));") in src
    # the map is the down projection's own: same tensor, box and swizzle
    (mine,) = [p for p in emitted[0].params if p.tensor == "W2"]
    (theirs,) = [p for p in emitted[1].params if p.tensor == "W2"]
    assert mine.kind == theirs.kind == "tensormap" and mine.tma == theirs.tma
    assert "tma_prefetch_2d" not in emitted[1].source
    base = default_plan(model, T, {})
    assert field_key(model, plan, {}) == field_key(model, base, {})  # no value depends on it
    if _nvrtc() is not None:
        res = compile_cuda(src, emitted[0].name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_the_gelu_derivative_product_warms_the_prefix_of_each_w1_row_that_dx_reads_first():
    model = _ffn(True)
    plan = default_plan(model, T, {}, {"warm_next": "4"})
    i = next(j for j, k in enumerate(plan.kernels) if "%d2" in k.nodes)
    warm = lower_whole(model, plan).kernels[i].warm
    assert warm.map.tensor == "W1" and not warm.load.mn_major  # k-major: the box's inner coordinate is k
    assert warm.count(SIZES) == 64 * 4
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    statuses = [(o.status, o.statement) for o in proof.obligations if o.rule.name == "warm-next"]
    assert statuses and all(s == "proved" for s, _ in statuses), statuses


def test_a_plan_whose_kernels_warm_nothing_keeps_no_warm_next():
    model = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    plan = default_plan(model, T, {"M": 256, "N": 256, "K": 256}, {"warm_next": "8"})
    assert [getattr(k, "warm_next", 0) for k in plan.kernels] == [0]  # one kernel: nothing comes next


class _SwappedDecode(WarmNext):
    def decode(self, i, s):  # k tile and row tile exchanged
        r, q, j, b = super().decode(i, s)
        return j, q, r, b


class _HalfDecode(WarmNext):
    def decode(self, i, s):  # every other box, twice
        r, q, j, b = super().decode(i, s)
        return r, q, j - j % 2, b


@pytest.mark.parametrize("mutant, says", [(_SwappedDecode, "the next kernel does not load it"),
                                          (_HalfDecode, "warmed 2 times")])
def test_the_rule_refuses_a_decode_that_warms_other_boxes(mutant, says):
    model = _ffn(False)
    plan = default_plan(model, T, {}, {"warm_next": "8"})
    warm = lower_whole(model, plan).kernels[0].warm
    assert warm_mismatch(warm, SIZES) is None
    bad = mutant(**{f: getattr(warm, f) for f in warm.__dataclass_fields__})
    found = warm_mismatch(bad, SIZES)
    assert found is not None and says in found, found


def test_a_runtime_extent_is_checked_at_witness_sizes():
    model = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").forward  # B at run time
    plan = default_plan(model, T, {}, {"warm_next": "8"})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    warm = proof.lowered.kernels[0].warm
    assert warm is not None
    # a split of fewer k tiles than warmed: only those are warmed, each once
    short = replace(warm, tiles=64)
    assert warm_mismatch(short, {"B": 5, "D": 640, "H": 512}) is None


class _ThreadsOffByOne(WarmNext):
    def first(self, block, grid, thread):  # box index 0 left to no thread
        return super().first(block, grid, thread) + 1


class _ShortStride(WarmNext):
    def stride(self, grid):  # threads' indices overlap
        return super().stride(grid) - 1


@pytest.mark.parametrize("mutant, says", [(_ThreadsOffByOne, "warmed by no thread"), (_ShortStride, "times")])
def test_the_rule_refuses_threads_that_miss_or_repeat_a_box_index(mutant, says):
    model = _ffn(False)
    warm = lower_whole(model, default_plan(model, T, {}, {"warm_next": "8"})).kernels[0].warm
    bad = mutant(**{f: getattr(warm, f) for f in warm.__dataclass_fields__})
    found = warm_mismatch(bad, SIZES)
    assert found is not None and says in found, found


def test_a_shorter_last_split_warms_boxes_past_k_which_the_tma_unit_clips():
    model = _ffn(False)
    warm = lower_whole(model, default_plan(model, T, {}, {"warm_next": "8"})).kernels[0].warm
    nxt = warm.next_kernel
    three = replace(warm, next_kernel=replace(nxt, kernel=replace(nxt.kernel, split_k=3)), tiles=4)
    sizes = {**SIZES, "H": 640}  # 10 k tiles: splits of 4, 4 and 2
    assert any(three.past_k(tuple(three.origin(i, sizes)), sizes) for i in range(three.count(sizes)))
    assert warm_mismatch(three, sizes) is None


class _HalfKStep(WarmNext):
    def origin(self, i, s):  # the k coordinate advanced by half a k tile
        r, q, j, b = self.decode(i, s)
        return self.load.origin(r * self.rows_per_tile, self.load.k_coordinate(q * self.k_tiles_per_split(s), j) // 2, b)


def test_the_rule_reads_the_next_kernels_boxes_from_its_own_lowering():
    model = _ffn(False)
    warm = lower_whole(model, default_plan(model, T, {}, {"warm_next": "8"})).kernels[0].warm
    assert next_kernel_boxes(warm, SIZES) == {tuple(warm.origin(i, SIZES)) for i in range(warm.count(SIZES))}
    bad = _HalfKStep(**{f: getattr(warm, f) for f in warm.__dataclass_fields__})
    found = warm_mismatch(bad, SIZES)
    assert found is not None and "does not load it" in found, found
