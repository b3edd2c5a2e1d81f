"""Staging passes' thread maps (session 71): every pass's blocks, the element each thread moves and a tile pass's
shared slots are the lowering's (`StageLowering.origin`, `element`, `StageTile`), printed by the emitter and run
block by block by the field check; an operand whose innermost index is a batch axis is staged in (batch, k) tiles."""

from __future__ import annotations

import numpy as np
import pytest

from habu.lower import lower_plan
from habu.lower.staging import BATCH_TILE, TRANSPOSE_TILE, StageTile
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "batched_staged.habu")


@pytest.mark.parametrize("tile", [StageTile("n", TRANSPOSE_TILE, TRANSPOSE_TILE), StageTile("batch0", *BATCH_TILE)])
def test_a_tiles_loads_and_stores_each_take_every_element_once_through_distinct_slots(tile):
    e = np.arange(tile.elements)
    for lanes in (tile.load_lane(e), tile.store_lane(e)):
        c, kk = lanes
        assert ((c >= 0) & (c < tile.across) & (kk >= 0) & (kk < tile.along_k)).all()
        assert len(set(zip(c.tolist(), kk.tolist(), strict=True))) == tile.elements
    slots = tile.slot(*tile.load_lane(e))
    assert len(set(slots.tolist())) == tile.elements and slots.max() < tile.slots


def _innermost(batches: int):
    model = PROGRAM.models["BATCH-INNERMOST"].with_sizes({"S": batches})
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    return model, plan, lw


def test_regression_an_operand_whose_innermost_index_is_a_batch_axis_was_staged_at_a_stride_of_s():
    """Session 70 staged A[m k s] (s batched) a row per block, thread t reading k = t at a stride of #S elements
    (2048 × 256 × 128 × 8 ran 0.59× torch.einsum on an H100). Now a block moves an 8-batch × 128-k tile: at #S = 8
    its loads read one contiguous run (consecutive threads, consecutive source offsets), its stores 128-element
    runs of the buffer."""
    _model, _plan, lw = _innermost(8)
    sizes = {"M": 200, "N": 136, "KI": 128, "S": 8}
    for stage in lw.pre:
        assert stage.tile == StageTile("batch0", 8, 128) and stage.batch_slabs() == ("S/8",)
        origin = stage.origin(0, 3, 0, sizes)
        e = np.arange(stage.tile.elements)
        loads = stage.element(origin, *stage.tile.load_lane(e))
        src = stage.src.offset(loads, sizes, _Plain())
        assert (np.diff(src) == 1).all()
        stores = stage.element(origin, *stage.tile.store_lane(e))
        dst = stage.dst.offset(stores, sizes, _Plain())
        assert (np.diff(dst.reshape(8, 128), axis=1) == 1).all()


class _Plain:
    """Index arithmetic on int64 arrays (`Access.offset`'s)."""

    def cast(self, x):
        return np.asarray(x, dtype=np.int64)

    def mul(self, a, b):
        return a * b

    def add(self, a, b):
        return a + b


@pytest.mark.parametrize("batches", [5, 8, 13])
def test_the_batch_tile_pass_is_proven_over_ragged_and_whole_slabs(batches):
    model, plan, lw = _innermost(batches)
    assert [st.grid({"M": 200, "N": 136, "KI": 64}) for st in lw.pre] == [(1, 200), (1, 136)]
    assert [st.batches({"S": batches}) for st in lw.pre] == [-(-batches // 8)] * 2
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate


def test_the_tile_pass_prints_its_lanes_and_slots_from_the_lowering():
    model, plan, _lw = _innermost(13)
    source = emit_plan(model, plan, TARGET).kernels[0].source
    assert "const int batch0 = (batch0_0 + (e % 8));" in source and "tile[(((e / 8) * 9) + (e % 8))]" in source
    assert "const int batch0 = (batch0_0 + (e / 128));" in source and "tile[(((e % 128) * 9) + (e / 128))]" in source
    assert "(batch0) < 13" in source  # the last slab's batches past #S
    loads = next(line for line in source.splitlines() if "] = p_AI[" in line)
    assert loads.count("(batch0) < 13") == 1, loads  # the source's mask is the store's: printed once, as the `if`


def test_the_tile_pass_prints_the_element_each_thread_takes_from_the_lowering(monkeypatch):
    """A pass printing its own element index (say `j * 128 + threadIdx.x`) instead of `StageTile.element_index`
    would run other elements than the field check ran; with the lowering's map changed (thread-major: each
    thread's elements consecutive), the printed loops change with it."""
    model, plan, _lw = _innermost(13)
    monkeypatch.setattr(StageTile, "element_index", lambda self, j, thread, threads: thread * self.steps(threads) + j)
    source = emit_plan(model, plan, TARGET).kernels[0].source
    assert source.count("const int e = (((int)threadIdx.x * 4) + j);") == 2, source
    assert "(j * 256)" not in source


def test_regression_the_field_check_sampled_three_batches_of_a_tiled_batch_axis():
    """The check ran the contraction's first, second and last batch only; along a batch axis a staging pass tiles by
    8, batches 2..6 of a slab are lanes of the pass no sampled tile read, so a pass leaving batches 5..7 uncopied
    (mutant `stage-tile-steps-overlap`) passed. Now every batch of the first, second and last slab is sampled."""
    from dataclasses import replace

    from habu.bench.mutants import MUTANTS, run_mutant

    (mutant,) = [m for m in MUTANTS if m.name == "stage-tile-steps-overlap"]
    assert run_mutant(mutant).killed and run_mutant(mutant, trials=1, witness=True).killed
    assert not run_mutant(replace(mutant, mutate=lambda lw: lw)).killed
