"""The persistent wgmma attention kernel (`--pin persistent=1`, habu/lower/attention_wgmma.py; not the default):
proven over Z_q × GF(p) at small odd shapes where the check's blocks walk several work tiles (causal with more keys
than queries, GQA, one and two consumer warpgroups); its rules (the walk, Q's handoff) pass and reject planted
bugs; built for sm_90a by NVRTC without spills; the default's source has none of it. (The planted bugs the field
check must kill are in the mutation suite: tests/bench/test_mutants.py, `persist-*`.)"""

from __future__ import annotations

import pytest

from habu.bench import mutants_persist as mp
from habu.lower import lower_plan
from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.paths.emit import emit_plan
from habu.prove.interp_attention_wgmma import check_blocks, walk
from habu.prove.q_handoff import handoff_problem, handoff_run
from habu.prove.rules import failures, obligations
from habu.prove.rules_attention_wgmma import walk_problem
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
WIDE = {"B": 1, "G": 2, "R": 2, "I": 1024, "J": 1024, "E": 128, "D": 128}


@pytest.fixture(scope="module")
def prefill():
    return load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]


def _lowered(model, sizes, pins):
    plan = default_plan(model, T, sizes, pins)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, AttentionWgmmaLowering)
    return plan, lw


@pytest.mark.parametrize(("sizes", "extra"), [
    (mp.SHAPE, {}),  # 3 query tiles × 4 heads (GQA: 2 KV heads), KV tiles of 32 keys, 2 stages
    ({"B": 1, "G": 1, "R": 3, "I": 190, "J": 130, "E": 64, "D": 64}, {"bn": "64", "stages": "3"}),  # fewer keys
    ({**mp.SHAPE, "I": 300, "J": 333}, {"bm": "128", "bn": "64", "pingpong": "1", "stages": "3"}),  # two consumers
])
def test_the_persistent_plan_is_proven_with_blocks_walking_several_tiles(prefill, sizes, extra):
    """Causal with queries ≠ keys (more keys, and fewer: the first rows of a tile see no key), GQA; the check's grid
    walks at least 2 work tiles a block, so the ring and Q's handoff run across tiles on the data."""
    model = prefill.with_sizes(sizes)
    plan, lw = _lowered(model, sizes, {**mp.PINS, **extra})
    assert lw.persistent and not failures(obligations(model, plan, sizes))
    cert = verify_plan(model, plan, sizes, trials=1, seeds=[11])
    assert cert.passed, cert.failure
    checked = {**sizes, **(cert.witness or {})}
    grid, work = check_blocks(lw, checked), int(lw.work_tiles(checked))
    assert all(len(walk(lw, b, grid, work)) >= 2 for b in range(grid)), (grid, work)
    assert "persistent blocks" in cert.blocks["kernel 0 (O)"]


def test_the_prefill_default_is_persistent_and_the_pin_turns_it_off(prefill):
    model = prefill.with_sizes(WIDE)
    pinned = emit_plan(model, default_plan(model, T, WIDE), T).kernels[0]
    default = emit_plan(model, default_plan(model, T, WIDE, {"persistent": "0"}), T).kernels[0]
    assert not default.lowering.persistent and "q_empty" not in default.source and "gridDim.x" not in default.source
    assert pinned.lowering.persistent and pinned.lowering.pingpong
    assert "habu::mbar_init(q_empty, 2);" in pinned.source and "w < work" in pinned.source
    # the grid: one block an SM, at most one a work tile (8 query tiles × 4 heads = 32 here)
    assert pinned.grid(WIDE, 132) == (32, 1, 1) and pinned.grid(WIDE, 7) == (7, 1, 1)
    assert default.grid(WIDE, 7) == (32, 1, 1)
    # the standalone export's launch contract: the grid from SLOTS, found as the device's SM count
    from habu.emit_cuda.standalone import grid_formula, slots_rule

    assert slots_rule(pinned) == "sm_count" and "SLOTS" in grid_formula(pinned, {})[0]
    assert slots_rule(default) is None and "SLOTS" not in grid_formula(default, {})[0]


def test_the_persistent_plan_at_head_width_128_builds_without_spills(prefill, tmp_path):
    """The default prefill tiles (bm 128 ping-pong, bn 128, 3 stages) with the pin: NVRTC's sm_90a cubin within
    the registers setmaxnreg gives the consumers, no spill, no serialised wgmma."""
    from habu.emit_cuda.runtime import CompiledModel

    model = prefill.with_sizes(WIDE)
    plan = default_plan(model, T, WIDE, {"persistent": "1"})
    ((cubin,),) = CompiledModel(model, emit_plan(model, plan, T), cache_dir=tmp_path).compile("sm_90a")
    assert cubin.cubin.startswith(b"\x7fELF") and not cubin.resources.spills, cubin.resources.describe()
    assert "C7515" not in cubin.log and "serialized" not in cubin.log, cubin.log


def test_the_rules_refuse_the_pin_on_the_mma_sync_loop(prefill):
    model = prefill.with_sizes(mp.SHAPE)
    plan = default_plan(model, T, mp.SHAPE, {**mp.PINS, "main_loop": "mma.sync"})
    bad = failures(obligations(model, plan, mp.SHAPE))
    assert any(o.rule.name == "supported-path" and "persistent" in o.detail for o in bad), bad


@pytest.mark.parametrize(("mutant", "rule"), [
    (mp.walk_stride_one_more, "attention-persistent-walk"),
    (mp.q_freed_before_last_s, "attention-q-handoff"),
    (mp.q_free_parity_of_this_tile, "attention-q-handoff"),
    (mp.q_full_parity_always_zero, "attention-q-handoff"),
])
def test_the_rules_reject_a_planted_walk_or_handoff(prefill, mutant, rule):
    """The planted bugs of mutants_persist.py break a rule too (the field check's kill is the mutation suite's)."""
    _, lw = _lowered(prefill.with_sizes(mp.SHAPE), mp.SHAPE, mp.PINS)
    assert walk_problem(lw) is None and handoff_problem(lw) is None
    bad = mutant(lw)
    problem = walk_problem(bad) if rule == "attention-persistent-walk" else handoff_problem(bad)
    assert problem is not None


def test_the_handoff_frees_q_after_the_last_s_even_of_a_tile_without_kv_tiles(prefill):
    """A tile with no KV tile (rows that see no key) frees Q as soon as it has landed: the next tile's Q can load;
    without that arrival the producer would wait forever."""
    _, lw = _lowered(prefill.with_sizes(mp.SHAPE), mp.SHAPE, mp.PINS)
    assert handoff_run(lw, (0, 0, 1), "the consumers ahead") == []
    never = type("NeverAtStart", (type(lw),), {"q_released": lambda self, done, tiles: done >= max(tiles, 1)})
    stuck = never(**{f: getattr(lw, f) for f in lw.__dataclass_fields__})
    assert any("deadlock" in x for x in handoff_run(stuck, (0, 2), "the producer ahead"))


def test_the_check_grid_keeps_a_few_tiles_a_block(prefill):
    """At most `CHECK_TILES` work tiles a block at a larger witness (the check's cost), at least 3 blocks."""
    from habu.prove.interp_attention_wgmma import CHECK_SLOTS, CHECK_TILES

    sizes = {**mp.SHAPE, "R": 16}
    _, lw = _lowered(prefill.with_sizes(sizes), sizes, mp.PINS)
    work = int(lw.work_tiles(sizes))
    grid = check_blocks(lw, sizes)
    assert work == 96 and grid == max(CHECK_SLOTS, work // CHECK_TILES)
    assert all(len(walk(lw, b, grid, work)) <= CHECK_TILES for b in range(grid))


def test_the_q_empty_barrier_sits_in_the_q_barriers_padding(prefill):
    """Q-empty takes the second 8 bytes of the Q barrier's 16 (the layout of the default is unchanged); a barrier
    placed over the ring's first is refused."""
    model = prefill.with_sizes(mp.SHAPE)
    plan, lw = _lowered(model, mp.SHAPE, mp.PINS)
    assert lw.q_empty == lw.q_bar + 8 and lw.q_empty + 8 == lw.ring.base
    moved = type("Moved", (type(lw),), {"q_empty": property(lambda self: self.ring.base)})
    bad = moved(**{f: getattr(lw, f) for f in lw.__dataclass_fields__})
    from habu.prove.obligation import context
    from habu.prove.rules_attention_wgmma import wgmma_obligations

    fails = [o for o in wgmma_obligations("k", bad, context(model, plan, mp.SHAPE)) if o.rule.name ==
             "attention-q-handoff" and o.detail]
    assert fails and "Q-empty barrier" in fails[0].detail


def test_regression_the_walk_is_a_snake_that_balances_a_causal_grid(prefill):
    """The round robin (block b took w = b, b + G, ...) gave causal 16 × 4096 d128's 132 blocks unequal sums of KV
    tiles and ran 146.9 µs against the one-tile-a-block kernel's 138.8 on the H200 (2026-12-02). The snake takes
    rounds left to right, then right to left: every tile once, and the busiest block's KV tiles within one of
    the mean (here all 64; the round robin's busiest: 80)."""
    sizes = {"B": 1, "G": 16, "R": 1, "I": 4096, "J": 4096, "E": 128, "D": 128}
    model = prefill.with_sizes(sizes)
    _, lw = _lowered(model, sizes, {**mp.PINS, "bm": "128", "bn": "128", "stages": "3", "pingpong": "1"})
    work, grid = int(lw.work_tiles(sizes)), 132
    walks = [walk(lw, b, grid, work) for b in range(grid)]
    assert sorted(w for ws in walks for w in ws) == list(range(work))
    assert walks[0][:3] == [0, 2 * grid - 1, 2 * grid] and walks[grid - 1][:3] == [grid - 1, grid, 3 * grid - 1]

    def kv_tiles(w: int) -> int:
        qt = int(lw.query_tile(w, sizes))
        return -(-min(4096, (qt + 1) * 128) // 128)

    sums = [sum(kv_tiles(w) for w in ws) for ws in walks]
    robin = [sum(kv_tiles(w) for w in range(b, work, grid)) for b in range(grid)]
    mean = sum(sums) / grid
    assert max(sums) - mean < 2 and max(robin) - mean > 10, (max(sums), max(robin), mean)


@pytest.mark.parametrize("keys", [128, 256, 384, 512])
def test_regression_a_full_prefill_of_few_kv_tiles_keeps_its_wgmma_overlapped(tmp_path, keys):
    """A full attention over 256 keys (2 KV tiles of 128, a count known at compile time): nvcc peeled the KV loop
    into straight code, ptxas serialized every wgmma (C7512) and the H200 ran 8192 tokens × 16 heads in 80 µs,
    0.54× cuDNN SDPA (67 µs with ping-pong off; session 38's ncu: 24% of the warps' samples at the turn barrier
    behind a serialized wgmma). The count now passes through `habu::unfolded`: a loop at every count."""
    from habu.bench.attention_speed import full_attention_source
    from habu.emit_cuda.runtime import CompiledModel

    path = tmp_path / "full.habu"
    path.write_text(full_attention_source())
    sizes = {"B": 2, "G": 2, "R": 1, "I": keys, "J": keys, "E": 128, "D": 128}
    model = load_program(path).models["ATTENTION-FULL"].with_sizes(sizes)
    plan = default_plan(model, T, sizes)
    assert plan.kernels[0].main_loop == "wgmma" and plan.kernels[0].persistent
    ((cubin,),) = CompiledModel(model, emit_plan(model, plan, T), cache_dir=tmp_path).compile("sm_90a")
    assert not cubin.resources.wgmma_serialized and "C7512" not in cubin.log, cubin.resources.describe()
