"""The grouped weight gradient's persistent blocks (`wgrad_persistent`, habu/lower/grouped_wgrad.py): one block a
resident slot walking every group's output tiles (`walk`, `work_item`), the ring and the index ring running on
from one work item to the next, every group's offsets found once a block. Executed over GF(p) for the hand-made
groupings, planted walks and decodes the check kills, its rules, and NVRTC where it is available."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower import lower
from habu.lower.grouped_wgrad import PERSISTENT_PRODUCER_REGS, GroupedWgradLowering, WgradLoop
from habu.prove.interp_grouped_wgrad import index_faults, walk_faults
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from tests.prove.test_grouped_wgrad import GROUPINGS, KERNEL, SIZES, TARGET, _loop_with, _model, _run

PERSISTENT = replace(KERNEL, stages=3, wgrad_copy="staged", wgrad_persistent=True)


def _persistent(name: str = "WGRAD") -> GroupedWgradLowering:
    lw = lower(_model(name), PERSISTENT)
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None and lw.loop.persistent
    return lw


@pytest.mark.parametrize("name", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_every_groups_product_is_added_into_its_slab_by_the_persistent_walk(name, grouping):
    lw = _persistent(name)
    assert not walk_faults(lw, SIZES) and not index_faults(lw)
    faults, got, ref = _run(GROUPINGS[grouping], name, lw)
    assert not faults, faults
    assert (got == ref).all()


@pytest.mark.parametrize("name", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
def test_the_persistent_kernel_walks_its_items_and_compiles_without_spills(name):
    """The pin `wgrad_persistent=true`: a grid of the resident blocks (at most one a work item), each walking items
    blockIdx.x, + gridDim.x, ..., decoding each into its group and tile; every group's offsets by the block's warps
    in turn; the producer at 112 registers (`setmaxnreg`) and the consumers at 192 or more, since at the launch's 168
    the walk's state beside an f32 A's chunks spilled. NVRTC compiles it without spills."""
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _model(name)
    plan = default_plan(m, TARGET, SIZES, {"wgrad_persistent": "true"})
    (k,) = plan.kernels
    assert k.wgrad_persistent and k.wgrad_copy == "staged" and not failures(obligations(m, plan, SIZES))
    (kernel,) = emit_plan(m, plan, TARGET).kernels
    src = kernel.source
    assert "for (long long w = blockIdx.x; w < items; w += gridDim.x) {" in src and src.count("w < items") == 2
    assert "const int g = (int)((w / tiles));" in src and "if (k_tiles <= 0) continue;" in src
    assert "habu::group_offsets_warps<int, 2>(p_E, (int)(200), 8, offs);" in src and "group_offsets_warp<" not in src
    assert f"habu::setmaxnreg_dec<{PERSISTENT_PRODUCER_REGS}>();" in src and "habu::setmaxnreg_inc<192>();" in src
    assert "if ((tile < k_tiles)) {" in src  # no index copy past an item's k tiles
    tiles = 2 * 2  # #M 136 and #N 200 in 128-wide tiles
    assert kernel.grid(SIZES, 132) == (tiles * 8, 1, 1) and kernel.grid(SIZES, 5) == (5, 1, 1)
    assert_compiles_without_spills(kernel)


def test_the_default_walks_and_the_search_tries_a_block_per_tile_too():
    """The walk became the default after its GPU run (H100, session 54: dW1 7.11 → 6.50 ms, with a bf16 A 4.76 →
    4.12, dW2 8.06 → 7.79); the search still times the block-per-tile kernels beside it."""
    from habu.paths.grouped import GroupedPath
    from habu.plan.patterns import Region

    m = _model()
    (k,) = default_plan(m, TARGET, SIZES, {}).kernels
    assert k.wgrad_persistent and k.wgrad_copy == "staged" and lower(m, k).loop.persistent
    variants = list(GroupedPath().region_variants(m, Region("grouped", ("O",)), k, TARGET, SIZES))
    walking = [v for v in variants if v.wgrad_persistent]
    assert walking and all(v.wgrad_copy == "staged" for v in walking)
    assert any(not v.wgrad_persistent for v in variants)
    assert all(not v.wgrad_persistent or v.bn <= 128 or v.bm == 64 for v in variants)


@pytest.mark.parametrize("pins", [{"wgrad_copy": "cp.async"}, {"wgrad_copy": "registers"},
                                  {"bn": "256", "stages": "3", "wgrad_copy": "staged"}])
def test_regression_a_pin_the_walk_cannot_run_takes_the_block_per_tile_back(pins):
    """With the walk the default, `--pin wgrad_copy=cp.async` (or a 256-column tile) left a kernel the rules refuse
    (persistent blocks copy every operand by cp.async; two warpgroups' 256 columns beside the walk spill): the pin
    now brings the block-per-tile with it, unless the walk is pinned too, which the rules then refuse by name."""
    m = _model("WGRAD-BF16")
    plan = default_plan(m, TARGET, SIZES, pins)
    (k,) = plan.kernels
    assert not k.wgrad_persistent and not failures(obligations(m, plan, SIZES))
    both = default_plan(m, TARGET, SIZES, {**pins, "wgrad_persistent": "true"})
    assert both.kernels[0].wgrad_persistent and failures(obligations(m, both, SIZES))


@pytest.mark.parametrize(("change", "why"), [
    ({"wgrad_copy": "registers"}, "wgrad_copy=staged"),
    ({"wgrad_copy": "cp.async"}, "wgrad_copy=staged"),
    ({"bn": 256, "stages": 3, "wgrad_copy": "staged"}, "at most 128 columns"),
])
def test_the_rules_refuse_a_walk_the_loop_cannot_run(change, why):
    m = _model("WGRAD-BF16")
    plan = replace(default_plan(m, TARGET, SIZES, {}), kernels=(replace(PERSISTENT, **change),))
    bad = failures(obligations(m, plan, SIZES))
    assert any(why in o.detail for o in bad), [o.detail for o in bad]


@pytest.mark.parametrize("planted", [
    # every block starts one item further: item 0 is never visited, the last by two blocks
    {"walk": lambda self, block, blocks, items: (block + 1, items + 1, blocks)},
    # the item's group rounded down to an even one: the even groups' tiles added twice, the odd ones' never
    {"work_item": lambda self, w, tiles: (w % tiles, w // tiles // 2 * 2)},
])
def test_regression_a_planted_walk_is_killed(planted):
    """The walk and its decode (`walk`, `work_item`: what the emitter prints), each planted wrong, are faults of the
    check: an output tile no block adds, or one two blocks add."""
    base = _persistent()
    cls = type("Planted_walk", (GroupedWgradLowering,), planted)
    lw = cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    faults, _, _ = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=lw)
    assert any("work item" in f for f in faults), faults


def test_regression_an_index_copy_past_an_items_k_tiles_could_land_over_the_next_items():
    """Without the guard `index_staged` the producer copies the indices of the k tiles past an item's last (rows past
    the group's end, zeros) into the slots the next item's first tiles take, and nothing orders the two copies of one
    slot: the next item could gather through zeros. The check runs persistent walks and finds the overlap; a block of
    one item (no next item) has none."""
    base = _persistent()
    planted = _loop_with(base, index_staged=lambda self, tile, k_tiles: True)
    faults = index_faults(planted)
    assert faults and "may still be in flight" in faults[0], faults
    one = replace(planted, loop=replace(planted.loop, persistent=False))
    assert isinstance(one.loop, WgradLoop) and not index_faults(one)


def test_the_index_ring_is_a_choice_and_without_it_the_copies_load_their_indices():
    """`wgrad_index_ring=false` (searched beside the ring, and the pin that turns it off): the staged producer loads
    each chunk's IX[r] as it copies the chunk, with no ring in shared memory and no cp.async group of its own."""
    from habu.paths.emit import emit_plan

    m = _model()
    plan = default_plan(m, TARGET, SIZES, {"wgrad_index_ring": "false"})
    lw = lower(m, plan.kernels[0])
    assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
    assert not plan.kernels[0].wgrad_index_ring and lw.loop.index_depth == 0 and lw.smem_bytes() == lw.loop.layout.total
    src = emit_plan(m, plan, TARGET).kernels[0].source
    assert "p_IX[r]" in src and "load_shared_index" not in src and "cp_async_commit" not in src
    faults, got, ref = _run(GROUPINGS["empty-first-inner-last-one-of-three-k-tiles"], lw=lw)
    assert not faults and (got == ref).all()


def test_regression_a_weight_gradients_pins_leave_other_grouped_kernels_alone():
    """`--pin wgrad_persistent=true` (and wgrad_copy, wgrad_index_ring) set the field on every grouped kernel of a
    plan, the grouped GEMMs too, which ignore it (their plan JSON and key changed); on a plan with no weight gradient
    it changed nothing and said nothing. The pin now reaches the weight gradients only, and where there is none it
    is an error."""
    from habu.errors import UsageError
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    moe = ROOT / "examples" / "moe_mixtral.habu"
    sizes = {"T": 64, "R": 128}
    backward = derive_model(load_program(moe), "MOE-FFN").model.with_sizes(sizes)
    plan = default_plan(backward, TARGET, sizes, {"wgrad_persistent": "true"})
    grouped = [k for k in plan.kernels if k.kind == "grouped"]
    walking = {k.nodes[0] for k in grouped if k.wgrad_persistent}
    assert walking == {"dW1", "dW3", "dW2"} and len(grouped) > len(walking)
    forward = load_program(moe).models["MOE-FFN"].with_sizes(sizes)
    with pytest.raises(UsageError, match="wgrad_persistent: no kernel of this plan is a grouped weight gradient"):
        default_plan(forward, TARGET, sizes, {"wgrad_persistent": "true"})
