"""The grouped weight gradient (habu/lower/grouped_wgrad.py): `O[E[r] m n] += A[r m] · B[IX[r] n]`, each group's
product over its own rows on wgmma, executed over GF(p) for hand-made groupings (empty groups, a group of
several k tiles, one group holding every row), planted bugs the check kills, its rules, the default plans of
the derived MoE backward, and NVRTC where it is available."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.lower import lower
from habu.lower.grouped_wgrad import GroupedWgradLowering, WgradLoop
from habu.plan.plan import GroupedKernel
from habu.prove.interp import Memory
from habu.prove.interp_grouped_wgrad import run_grouped_wgrad
from habu.prove.rules import failures, obligations
from habu.prove.verify import virtual_inputs
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.prove.test_grouped import FixedGrouping

TARGET = TARGETS["sm_90a"]
FILE = ROOT / "tests" / "data" / "grouped_wgrad.habu"
SIZES = {"R": 200, "T": 30, "G": 8, "M": 136, "N": 200}
KERNEL = GroupedKernel(nodes=("O",), bm=128, bn=128, bk=64, warps_m=2, warps_n=4, main_loop="wgmma", stages=3)
GROUPINGS = {  # 200 rows into 8 groups; k tiles of 64 rows
    "empty-first-inner-last-one-of-three-k-tiles": [1] * 10 + [2] * 150 + [4] * 1 + [6] * 39,
    "one-group-holds-every-row": [5] * 200,
}


def _model(name: str = "WGRAD"):
    return load_program(FILE).models[name].with_sizes({"T": SIZES["T"], "R": SIZES["R"]})


def _run(values: list[int], name: str = "WGRAD", lw: GroupedWgradLowering | None = None):
    """Every block over GF(p): (faults, got, reference) of O after the kernel adds into its prior contents."""
    model = _model(name)
    lw = lw or lower(model, replace(KERNEL, stages=3))
    assert isinstance(lw, GroupedWgradLowering)
    field = PrimeField(seed=7)
    inputs = virtual_inputs(model, SIZES, field, 7)
    inputs["E"] = FixedGrouping(values, SIZES["G"])
    mem = Memory(inputs, field, SIZES)
    gx, gy = (int(x) for x in lw.grid(SIZES))
    run_grouped_wgrad("k0", lw, SIZES, mem, [(bx, g) for g in range(gy) for bx in range(gx)])
    R, G, M, N = (SIZES[x] for x in "RGMN")
    ix = inputs["IX"].at(np.arange(R))
    b = inputs["X"][ix[:, None], np.arange(N)[None, :]].astype(object)
    if name in ("WGRAD-P", "WGRAD-P-BF16"):
        a = inputs["DY" if name == "WGRAD-P" else "DYB"][ix[:, None], np.arange(M)[None, :]].astype(object) * \
            inputs["P"].at(np.arange(R)).astype(object)[:, None]
    else:
        a = inputs["A" if name == "WGRAD" else "AB"][np.arange(R)[:, None], np.arange(M)[None, :]].astype(object)
    prior = inputs["O"][np.arange(G)[:, None, None], np.arange(M)[None, :, None], np.arange(N)[None, None, :]]
    ref = prior.astype(object)
    e = np.asarray(values)
    for g in range(G):
        rows = e == g
        ref[g] = (ref[g] + a[rows].T.dot(b[rows])) % field.p
    got, _ = mem.written["O"].read(np.arange(G * M * N))
    return mem.faults, got.reshape(G, M, N), ref.astype(np.int64)


def _loop_with(base: GroupedWgradLowering, **methods) -> GroupedWgradLowering:
    assert base.loop is not None
    cls = type("Planted", (WgradLoop,), methods)
    return replace(base, loop=cls(**{f: getattr(base.loop, f) for f in base.loop.__dataclass_fields__}))


@pytest.mark.parametrize("name", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_every_groups_product_is_added_into_its_slab(name, grouping):
    faults, got, ref = _run(GROUPINGS[grouping], name)
    assert not faults, faults
    np.testing.assert_array_equal(got, ref)


def test_the_f32_operand_is_two_parts_read_by_two_slabs_into_one_accumulator():
    lw = lower(_model(), KERNEL)
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    loop = lw.loop
    assert loop.parts == 2 and loop.operands.a_desc.mn_major and loop.operands.b_desc.mn_major
    assert [loop.a_stored_column(m, p) for m, p in ((0, 0), (0, 1), (64, 0), (64, 1))] == [0, 64, 128, 192]
    assert [loop.part_slab(0, p) for p in (0, 1)] == [0, 1]


@pytest.mark.parametrize("planted", [
    # both parts' instructions read the hi block: every product counted twice
    {"part_slab": lambda self, q, part: q * self.parts},
    # the lo part kept over the hi part's columns: a part overwrites another
    {"a_stored_column": lambda self, m, part: m},
    # a chunk stored one k row below where it was loaded from
    {"a_store_offset": lambda self, m, k, part: self.operands.a_copy.byte_offset(self.a_stored_column(m, part),
                                                                                 (k + 1) % 64)},
    # B's chunks stored over the next 64-column block
    {"b_store_offset": lambda self, n, k: self.operands.b_copy.byte_offset((n + 64) % self.bn, k)},
    # the second consumer warpgroup decoded as a third
    {"consumer": lambda self, wg: wg - 1 + (wg == 2)},
    # two producer threads on one thread's chunks
    {"producer_thread": lambda self, tid: tid // 2},
    # the accumulators' rows 8 below their slab
    {"acc_row": lambda self, cw, q: (cw * self.slabs + q) * 64 + 8},
    # chunks strided by half a warpgroup: some twice, some never
    {"chunk": lambda self, ptid, j: ptid + 64 * j},
    # B's fourth row's chunks one chunk to the right
    {"b_source": lambda self, c: (c // (self.bn // 8), (c % (self.bn // 8)) * 8 + 8 * ((c // (self.bn // 8)) == 3))},
])
def test_regression_a_planted_map_is_killed(planted):
    """(A chunk's row as the producer numbers it, `a_source`, is not among them: it loads and stores the same row,
    so a permutation of the chunks is the same kernel.)"""
    base = lower(_model(), KERNEL)
    assert isinstance(base, GroupedWgradLowering)
    faults, got, ref = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=_loop_with(base, **planted))
    assert faults or (got != ref).any()


@pytest.mark.parametrize("planted", [
    # the held registers load the tile after the next: each stage gets A's rows of the wrong k tile
    {"load_tile": lambda self, step: step + self.register_depth},
    # the registers stored as they were loaded at depth 2, without the step between: A's tile one behind B's
    {"load_tile": lambda self, step: step},
    # every epilogue round's reads start over at group 0: groups 16 .. 31 never added, 0 .. 15 twice
    {"epilogue_group": lambda self, rnd, b: b},
])
def test_regression_a_planted_producer_step_or_epilogue_round_is_killed(planted):
    """The two-deep producer's tile (`load_tile`) and the epilogue's rounds (`epilogue_group`), which the emitter prints
    and the check runs, one off: a scaled bf16 A two k tiles deep, 256-column tiles (two epilogue rounds)."""
    base = lower(_model("WGRAD-P-BF16"), replace(KERNEL, bn=128 if "load_tile" in planted else 256,
                                                   wgrad_copy="cp.async"))
    assert isinstance(base, GroupedWgradLowering) and base.loop is not None
    assert base.loop.register_depth == (2 if "load_tile" in planted else 1) and base.loop.epilogue_rounds() >= 1
    faults, got, ref = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], "WGRAD-P-BF16",
                            lw=_loop_with(base, **planted))
    assert faults or (got != ref).any()


def test_regression_64_column_tiles_read_their_8_column_groups_in_one_round():
    """A 64-column tile has 8 column groups: the epilogue read 16 a round (`epilogue_batch` fixed at 16), groups 8 ..
    15 past the tile's accumulators and into the next tile's columns of O. The batch is the tile's groups at most."""
    lw = lower(_model(), replace(KERNEL, bn=64, wgrad_copy="cp.async"))
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    assert (lw.loop.epilogue_batch, lw.loop.epilogue_rounds()) == (8, 1)
    faults, got, ref = _run(GROUPINGS["one-group-holds-every-row"], lw=lw)
    assert not faults and (got == ref).all()
    from habu.paths.emit import emit_plan

    m = _model()
    plan = replace(default_plan(m, TARGET, SIZES, {}), kernels=(replace(KERNEL, bn=64, wgrad_copy="cp.async"),))
    src = emit_plan(m, plan, TARGET).kernels[0].source
    assert "float2 prior[8];" in src and "for (int rnd = 0; rnd < 1; ++rnd)" in src


def test_regression_the_group_offsets_are_the_models_groups_not_the_tiles_column_groups():
    """The epilogue's column-group count was named `groups` in the emitter and shadowed #G below it: the kernel found
    offsets for bn / 8 groups (16), so with more experts than that the blocks of groups past 16 read offsets no
    thread wrote. The offsets are #G + 1, for any #G."""
    from habu.paths.emit import emit_plan

    m = _model().with_sizes({"G": 40})
    sizes = {**SIZES, "G": 40}
    plan = default_plan(m, TARGET, sizes, {})
    (walk,) = plan.kernels
    searches = {False: "habu::group_offsets_warp<int, 2>(p_E, (int)(200), blockIdx.y, (blockIdx.y + 1), 0, 40, offs);",
                True: "habu::group_offsets_warps<int, 2>(p_E, (int)(200), 40, offs);"}
    for persistent, search in searches.items():
        one = replace(plan, kernels=(replace(walk, wgrad_persistent=persistent),))
        src = emit_plan(m, one, TARGET).kernels[0].source
        assert "__shared__ int offs[41];" in src and search in src
        assert "if (tid == 0 && offs[40] < (int)(" in src and "over #G = 40 groups" in src


@pytest.mark.parametrize("rows", [0, 1, 32, 33, 200, 1025, 8192, 100000])
def test_the_warps_search_of_the_offsets_is_the_first_row_of_each_group(rows):
    """Each block finds its group's offsets, the next group's, the first's and the last's by one warp each
    (`habu::group_offsets_warp`: 32 reads of E a round, three rounds for 8192 rows where a binary search makes 14
    dependent reads). The lowering's model of it (`lower_bound`, which the field check runs) against numpy's
    searchsorted on sorted groupings with runs and empty groups."""
    lw = lower(_model(), replace(KERNEL, stages=3))
    assert isinstance(lw, GroupedWgradLowering)
    rng = np.random.default_rng(rows)
    for groups in (1, 8, 40, 256):
        e = np.sort(rng.integers(0, groups, rows))
        e[: rows // 3] = e[rows // 3] if rows else 0
        e = np.sort(e)
        got = lw.lower_bound(lambda p, e=e: e[np.clip(p, 0, max(rows - 1, 0))] if rows else np.zeros_like(p),
                             np.arange(groups + 1), rows, np.where)
        np.testing.assert_array_equal(got, np.searchsorted(e, np.arange(groups + 1), side="left"))
    assert lw.search_rounds(8192) == 3 and lw.search_rounds(100000) == 4


@pytest.mark.parametrize("planted", [
    # the block's tiles decoded m for n (4 n tiles of 64 against 2 m tiles: not a permutation of the tiles)
    {"block_tile": lambda self, bx, n: (bx % n, bx // n)},
    {"column_m": lambda self, mt, i: mt * self.kernel.bm + i + 1},
    {"column_n": lambda self, nt, j: nt * (self.kernel.bn - 8) + j},
    {"k_tiles": lambda self, lo, hi: (hi - lo) // self.kernel.bk},  # the group's ragged last k tile dropped
    {"row": lambda self, begin, kt, i: begin + kt * (self.kernel.bk - 1) + i},
    # the offsets' warp search stopped after one round (200 rows take two): a group's rows start mid-part
    {"search_rounds": lambda self, rows: 1},
])
def test_regression_a_planted_decode_is_killed(planted):
    """Each map the emitter prints the block's tile, columns, rows and k tiles from, one off."""
    base = lower(_model(), replace(KERNEL, bn=64))
    cls = type("Planted", (GroupedWgradLowering,), planted)
    lw = cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    faults, got, ref = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=lw)
    assert faults or (got != ref).any()


def test_regression_the_groups_end_unmasked_adds_the_next_groups_rows():
    base = lower(_model(), KERNEL)
    cls = type("Planted", (GroupedWgradLowering,), {"row_inside": lambda self, row, end: row < row + 1})
    planted = cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    faults, got, ref = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=planted)
    assert faults or (got != ref).any()


@pytest.mark.parametrize(("change", "why"), [
    ({"bk": 32}, "k tile is 64"),
    ({"bn": 32}, "whole blocks of 64"),
    ({"main_loop": "mma.sync", "stages": 1}, "wgmma loop only"),
    ({"stages": 6}, "bytes of shared memory"),  # 6 × 48 KiB with an f32 A
    # the consumers' in-place pass beside 256 columns' accumulators spilled in NVRTC
    ({"bn": 256, "stages": 3, "wgrad_copy": "staged"}, "at most 128 columns a tile"),
])
def test_the_rules_refuse_what_the_loop_cannot_run(change, why):
    m = _model()
    plan = replace(default_plan(m, TARGET, SIZES, {}), kernels=(replace(KERNEL, **change),))
    bad = failures(obligations(m, plan, SIZES))
    assert any(why in o.detail for o in bad), [o.detail for o in bad]


def test_the_default_takes_the_wgrad_loop_and_sm_80_the_general_family():
    m = _model()
    (k,) = default_plan(m, TARGET, SIZES, {}).kernels
    assert (k.kind, k.main_loop, k.bm, k.bn, k.stages) == ("grouped", "wgmma", 128, 128, 4)
    assert [k.kind for k in default_plan(m, TARGETS["sm_80"], SIZES, {}).kernels] == ["general"]


def test_the_kernel_compiles_with_nvrtc_without_spills():
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    for name in ("WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"):
        m = _model(name)
        (kernel,) = emit_plan(m, default_plan(m, TARGET, SIZES, {}), TARGET).kernels
        assert "_bf16_at_bt(" in kernel.source and "habu::read_owned(" in kernel.source
        # a bf16 A's row factor: each product rounded to bf16 in the chunk (one part), by the consumers in place
        assert ("habu::scale_chunk(cv[j], cf[j]); " in kernel.source) == (name == "WGRAD-P-BF16")
        assert_compiles_without_spills(kernel)


@pytest.mark.parametrize("name,async_sides", [("WGRAD", "B"), ("WGRAD-BF16", "AB"), ("WGRAD-P", "B"),
                                               ("WGRAD-P-BF16", "B")])
def test_the_cp_async_producer_copies_the_bf16_operands_it_does_not_scale(name, async_sides):
    """`wgrad_copy` cp.async: B, and a bf16 A without a row factor, go by cp.async into the slots the
    register stores take; an f32 A (two parts) and a scaled one through registers. The emitter prints each
    side's route from the lowering's `copied_async`, and the stage's arrival follows: a plain arrival after
    register stores, a noinc cp.async arrival after copies, the proxy fence first where both."""
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _model(name)
    plan = default_plan(m, TARGET, SIZES, {"wgrad_copy": "cp.async"})
    assert plan.kernels[0].wgrad_copy == "cp.async"
    lw = lower(m, plan.kernels[0])
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    assert "".join(side for side in "AB" if lw.loop.copied_async(side)) == async_sides
    src = emit_plan(m, plan, TARGET).kernels[0].source
    for side in "AB":
        assert (f"habu::cp_async<16>({side.lower()}_stage" in src) == (side in async_sides)
        assert (f"habu::store_shared16({side.lower()}_stage" in src or ("store_split_bf16x8(a_stage" in src
                and side == "A")) == (side not in async_sides)
    arrival = "habu::cp_async_arrive(full);" if async_sides == "AB" else \
        "habu::fence_proxy_async(); habu::cp_async_arrive(full);"
    assert arrival in src and "mbar_arrive(full)" not in src
    assert_compiles_without_spills(emit_plan(m, plan, TARGET).kernels[0])
    registers = lower(m, replace(plan.kernels[0], wgrad_copy="registers"))
    assert registers.loop is not None and not registers.loop.any_async


@pytest.mark.parametrize("name,depth", [("WGRAD", 1), ("WGRAD-P", 1), ("WGRAD-P-BF16", 2)])
def test_a_scaled_bf16_a_is_held_two_k_tiles_deep(name, depth):
    """Under cp.async, a bf16 A the producer scales keeps the next k tile's chunks (and their row factors) loading in
    registers while it stores this one's (`register_depth` 2), then scales them; an f32 A's two parts would spill
    there, and keep one k tile. Both compile without spills."""
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _model(name)
    plan = default_plan(m, TARGET, SIZES, {"wgrad_copy": "cp.async"})
    lw = lower(m, plan.kernels[0])
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None and lw.loop.register_depth == depth
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    assert ("habu::scale_chunk(av_n[j], af_n[j]); av[j] = av_n[j];" in kernel.source) == (depth == 2)
    assert ("< k_tiles) {  // the next k tile's loads, issued before this one's stores" in kernel.source) == (depth == 2)
    assert_compiles_without_spills(kernel)
    wide = lower(m, replace(plan.kernels[0], bn=256, stages=3))
    assert wide.loop is not None and wide.loop.register_depth == 1  # 256 columns: one k tile held


@pytest.mark.parametrize("name", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
def test_the_default_copies_every_operand_and_the_consumers_convert_a_in_place(name):
    """`wgrad_copy` staged (the default): both operands by cp.async, every k tile of the ring in flight; an f32 A
    lands raw in the bytes its parts take and each consumer warpgroup splits its slab there (`a_convert`,
    `a_staged_offset`), a row factor applied in the same pass (a bf16 A's products rounded to bf16 in place).
    Nothing goes through the producer's registers, and the kernel compiles without spills."""
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _model(name)
    plan = default_plan(m, TARGET, SIZES, {})
    assert plan.kernels[0].wgrad_copy == "staged"
    lw = lower(m, plan.kernels[0])
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    loop = lw.loop
    assert loop.a_async and loop.b_async and not loop.any_registers
    assert loop.a_convert == (name != "WGRAD-BF16")
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    src = kernel.source
    assert "habu::cp_async_arrive(full);  // as the thread's copies land" in src and "ldg" not in src
    assert ("habu::slab_pass_sync(1 + cw);" in src) == loop.a_convert
    assert ("habu::store_split_bf16x8(a_stage" in src) == (loop.parts == 2)
    assert ("cf[j] = " in src) == ("-P" in name)
    assert src.count("habu::cp_async<16>(a_stage") == loop.parts  # an f32 chunk's two halves
    assert_compiles_without_spills(kernel)


@pytest.mark.parametrize("name,sides,depth", [("WGRAD", "b", 4), ("WGRAD-P", "ab", 3)])
def test_the_staged_producer_copies_the_gathers_indices_ahead_into_the_index_ring(name, sides, depth):
    """ncu of the staged dW3 on the H200 (session 51): 15% of the stall samples at the producer's chunk checks, each
    waiting on its own load of IX[r] before its cp.async, and 31% at the consumers' wait for a full stage. The staged
    producer copies IX[r] of its chunks' rows by cp.async into its own entries of the index ring, as many k tiles
    ahead as the ring has stages where the shared memory allows (WGRAD-P gathers both sides: one fewer), and reads a
    tile's indices from there after a wait that leaves the later tiles' groups in flight."""
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _model(name)
    plan = default_plan(m, TARGET, SIZES, {})
    lw = lower(m, plan.kernels[0])
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    loop = lw.loop
    assert "".join(loop.index_sides).lower() == sides and loop.index_depth == depth
    assert loop.index_slots == depth + 1 and loop.index_wait() == depth - 1
    assert lw.smem_bytes() + 8 * 9 <= TARGET.smem_per_block  # (the rule's sum: 8 bytes an offset)
    assert depth == plan.kernels[0].stages or TARGET.smem_per_block < lw.smem_bytes() + 8 * 9 + 4096 * len(sides)
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    src = kernel.source
    loop_body = src.split("for (long long kt = 0; kt < k_tiles; ++kt)")[1].split("habu::ring_advance")[0]
    for side in sides:
        assert f"int {side}ix[8];" in src
        assert f"habu::index_ok((long long){side}ix[j], (long long)(30), 0u, (long long)(r))" in src
        assert f"{side}ix[j] = (int)habu::load_shared_index<int>(smem_base" in loop_body
    assert f"habu::cp_async_wait<{depth - 1}>();" in loop_body and "p_IX[r]" not in loop_body
    assert src.count("habu::cp_async<4>(smem_base") == 2 * len(sides)  # before the loop and a step's
    assert src.count("habu::cp_async_commit();") == 2
    assert f"const long long tile = (kt + {depth});" in loop_body
    assert kernel.smem == lw.smem_bytes()
    assert_compiles_without_spills(kernel)


def test_regression_the_index_ring_fits_the_shared_memory_or_is_shallower_or_absent():
    """The ring's depth is the deepest that fits beside the stage tiles (`WGMMA_SMEM`, less the offsets): 8-byte
    indices stage fewer tiles, 2-byte ones (cp.async copies 4, 8 or 16 bytes) none, gathering through loads as the
    copies need them; a producer that holds a side in registers stages none either."""
    from habu.lower.grouped_wgrad import WGMMA_SMEM, index_ring

    assert TARGET.smem_per_block == WGMMA_SMEM
    lw = lower(_model("WGRAD-BF16"), replace(KERNEL, stages=6, wgrad_copy="staged"))  # 6 stages of 32 KiB
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    bare = replace(lw.loop, index_sides=(), index_widths=(), index_counts=(), index_depth=0, index_base=0)
    wide, narrow = index_ring(bare, {"B": 8}, WGMMA_SMEM - 72), index_ring(bare, {"B": 2}, WGMMA_SMEM - 72)
    assert lw.loop.index_depth == 6 and 0 < wide.index_depth < 6 and wide.smem_total <= WGMMA_SMEM - 72
    assert narrow.index_depth == 0 and narrow.smem_total == bare.layout.total
    assert index_ring(bare, {"B": 4}, bare.layout.total + 16).index_depth == 0  # no room for one slot
    registers = lower(_model(), replace(KERNEL, stages=3, wgrad_copy="cp.async"))
    assert registers.loop is not None and registers.loop.index_depth == 0  # A's f32 chunks through registers


@pytest.mark.parametrize("planted", [
    # the indices staged one k tile further than the ring's depth: tile 0's slot is never filled
    {"index_tile": lambda self, step: step + self.index_depth + 1},
    # one group more left in flight: each tile's indices read before their copy surely landed
    {"index_wait": lambda self: self.index_depth},
    # as many slots as tiles ahead: a tile's copy lands in the slot the step reads
    {"index_slot": lambda self, tile: tile % self.index_depth},
    # the entries of slot s and s + 1 overlap (a slot's stride is one thread's count, not the warpgroup's)
    {"index_entry": lambda self, side, slot, ptid, j: self.index_base + ((slot * 8 + j) * 8 + ptid % 8) * 4},
])
def test_regression_a_planted_index_ring_is_killed(planted):
    """The index ring's maps (`index_tile`, `index_wait`, `index_slot`, `index_entry`: what the emitter prints),
    each planted wrong, are faults of the check: a copy would gather through another k tile's indices, or through
    indices not yet landed."""
    base = lower(_model(), replace(KERNEL, stages=3, wgrad_copy="staged"))
    assert isinstance(base, GroupedWgradLowering) and base.loop is not None and base.loop.index_depth == 3
    faults, _, _ = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=_loop_with(base, **planted))
    assert any("indices" in f for f in faults), faults


@pytest.mark.parametrize("planted", [
    # the producer copies an f32 chunk's halves into each other's units: the consumers split them swapped
    {"a_landed_offset": lambda self, m, k, half=0: WgradLoop.a_landed_offset(self, m, k, 1 - half)},
    # consumer threads on rows of k strided by 32: half the slab's rows converted twice, half never
    {"convert_source": lambda self, t, j: ((t + 128 * j) % 32, ((t + 128 * j) // 64) * 8)},
    # each slab's raw floats staged in the other slab's bytes: a warpgroup writes parts where the other reads
    {"a_staged_offset": lambda self, m, k, half: WgradLoop.a_staged_offset(self, (m + 64) % self.bm, k, half)},
    # the raw halves' units not swizzled by the row of k, but the consumers' reads still are
    {"a_landed_offset": lambda self, m, k, half=0: self.slab_base(m // 64) + k * 256 + (2 * ((m % 64) // 8) + half) * 16},
    # both halves copy the chunk's first 4 floats
    {"half_source": lambda self, half: 0},
])
def test_regression_a_planted_in_place_pass_is_killed(planted):
    """The staged A's maps (`a_landed_offset` the producer prints, `a_staged_offset` and `convert_source` the
    consumers print), each planted wrong, are faults of the check: every one would feed wgmma other values than
    the chunks the producer copied."""
    base = lower(_model(), replace(KERNEL, stages=3, wgrad_copy="staged"))
    assert isinstance(base, GroupedWgradLowering) and base.loop is not None and base.loop.a_convert
    faults, _, _ = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=_loop_with(base, **planted))
    assert faults


def test_the_moe_backwards_weight_gradients_take_the_wgrad_loop_and_are_proven():
    from habu.lower import lower_plan
    from habu.prove.verify import verify_plan
    from habu.spec.grad_program import derive_model

    bw = derive_model(load_program(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN")
    shape = {"T": 13, "R": 26}
    model = bw.model.with_sizes(shape)
    plan = default_plan(model, TARGET, shape, {})
    kinds = {" ".join(k.nodes): k.kind for k in plan.kernels}
    assert kinds["dW1"] == kinds["dW3"] == kinds["dW2"] == "grouped"
    lowered = lower_plan(model, plan)
    assert sum(isinstance(lw, GroupedWgradLowering) for lw in lowered) == 3
    assert verify_plan(model, plan, shape, trials=1, lowerings=lowered).passed


def test_regression_the_wgrad_kernel_has_a_launch_geometry():
    """Its first GPU run raised "no launch geometry is registered for GroupedWgradLowering": one block per output
    tile of a group (x) and group (y)."""
    from habu.emit_cuda.geometry import geometry_for

    lw = lower(_model(), KERNEL)
    assert geometry_for(lw).blocks(lw, SIZES, 132) == (2 * 2, SIZES["G"], 1)


def test_the_search_space_of_a_weight_gradient_is_its_loops_tiles():
    from habu.paths import grouped
    from habu.plan.patterns import Region

    m = _model()
    base = default_plan(m, TARGET, SIZES, {}).kernels[0]
    ks = list(grouped.PATH.region_variants(m, Region("general", ("O",)), base, TARGET, SIZES))
    assert {(k.bm, k.bn, k.stages, k.wgrad_copy) for k in ks} == \
        {(*tile, copy) for tile in grouped.WGRAD_TILES for copy in grouped.WGRAD_COPIES}
    assert all(k.main_loop == "wgmma" and k.bk == 64 for k in ks)
