"""The epilogues' accumulator fragment map (printed by the emitters) against the PTX ISA's layouts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower.fragments import ACCUMULATOR
from habu.prove.fragments import fragment_mismatch


@pytest.mark.parametrize("instruction", ["mma.sync", "wgmma"])
def test_the_epilogues_fragment_map_is_the_instructions_layout(instruction):
    assert fragment_mismatch(instruction, ACCUMULATOR, 32) is None


@pytest.mark.parametrize("change", [{"row_step": 4}, {"lanes_per_row": 8}, {"pair": 1}, {"warp_rows": 8},
                                    {"col_step": 16}])
def test_a_fragment_map_off_the_layout_is_caught_naming_the_register(change):
    bad = fragment_mismatch("wgmma", replace(ACCUMULATOR, **change), 32)
    assert bad is not None and "accumulator register" in bad and "tile[" in bad


@pytest.mark.parametrize("instruction,change", [("wgmma", {"warp_size": 16}), ("wgmma", {"group_warps": 2}),
                                                ("mma.sync", {"warp_size": 16})])
def test_an_epilogue_thread_decode_off_the_ptx_lanes_is_caught(instruction, change):
    """The thread decode (`lane = threadIdx.x % 32`, wgmma's `warp = (threadIdx.x % 128) / 32`) is the
    fragment's, run thread by thread against the instruction's layout: a thread that takes another
    lane's or warp's rows is named."""
    bad = fragment_mismatch(instruction, replace(ACCUMULATOR, **change), 8)
    assert bad is not None and "accumulator register" in bad and "tile[" in bad


@pytest.mark.parametrize("instruction", ["mma.sync", "wgmma"])
def test_an_epilogue_holding_one_row_half_declares_too_few_registers_and_is_caught(instruction):
    """halves = 1: every register the epilogue stores is where the instruction put it, but the array it
    declares (`AccumulatorFragment.registers`, printed as acc[..][registers]) lacks the second row half's."""
    bad = fragment_mismatch(instruction, replace(ACCUMULATOR, halves=1), 8)
    assert bad is not None and "declares" in bad and "the instruction writes" in bad, bad


def test_the_emitters_print_the_thread_decode_from_the_lowering():
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    for arch, pins, line in (("sm_90a", {}, "const int warp = (threadIdx.x % 64) / 16;"),
                             ("sm_80", {"mma": "mma.sync"}, "const int lane = threadIdx.x % 16;")):
        plan = default_plan(m, TARGETS[arch], None, pins)
        lowered = lower_whole(m, plan)
        moved = replace(lowered, kernels=tuple(replace(k, fragment=replace(k.fragment, warp_size=16))
                                               for k in lowered.kernels))
        assert line in emit_lowered(moved, plan, TARGETS[arch]).kernels[-1].source, arch


def test_the_emitters_print_the_fragment_map_from_the_lowering():
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    for arch, pins in (("sm_90a", {"store": "tma"}), ("sm_90a", {"store": "direct"}), ("sm_80", {"mma": "mma.sync"})):
        plan = default_plan(m, TARGETS[arch], None, pins)
        lowered = lower_whole(m, plan)
        moved = replace(lowered, kernels=tuple(replace(k, fragment=replace(k.fragment, row_step=4))
                                               for k in lowered.kernels))
        a = emit_lowered(lowered, plan, TARGETS[arch]).kernels[-1].source
        b = emit_lowered(moved, plan, TARGETS[arch]).kernels[-1].source
        assert "+ 8 * h" in a and "+ 4 * h" in b and "+ 8 * h" not in b, (arch, pins)


def test_a_tma_box_of_an_n_contiguous_operand_lands_where_the_transposed_wgmma_read_looks():
    """Two trusted transcriptions checked against each other: the 128-byte-swizzled TMA box of 64 columns
    by the k tile (`tma_box_bytes`, as cuTensorMapEncodeTiled lays it out), boxes one after another, is
    what wgmma's MN-major descriptor (LBO: one box, SBO: 8 k rows) addresses at each k step."""
    import numpy as np

    from habu.prove.fragments import tma_box_bytes, wgmma_mnmajor_addresses

    bk, bn, e = 64, 256, 2
    box = tma_box_bytes(bk, 64, e, 128)  # [k, n within the box]
    written = np.array([[j * box.size * e + box[k, n % 64] for k in range(bk)] for j in range(bn // 64)
                        for n in range(64 * j, 64 * j + 64)])  # [n, k]
    for kk in range(bk // 16):
        read = wgmma_mnmajor_addresses(kk * 16 * 128, bn, 16, bk * 128, 1024, 128, e)
        assert np.array_equal(read, written[:, kk * 16:(kk + 1) * 16])
    # a wrong leading byte offset reads another block's rows
    assert not np.array_equal(wgmma_mnmajor_addresses(0, bn, 16, bk * 64, 1024, 128, e), written[:, :16])
