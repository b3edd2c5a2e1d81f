"""The k loops' pipelines as lowering data, executed with the mbarrier and cp.async-group semantics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower.pipeline import CpAsyncRing, MbarrierRing, cp_async_ring, wgmma_ring
from habu.prove.pipeline import Barrier, delivered, pipeline_problem, run_cp_async, run_ring
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TMA = {"A": "tma", "B": "tma"}


def ring(stages=4, consumers=2, cluster=1, bn=256, b_mn=False, moves=None) -> MbarrierRing:
    return wgmma_ring(stages, consumers, cluster, 128, bn, 64, 64, moves or TMA, b_mn, 2)


def test_a_wait_on_a_fresh_barrier_passes_for_parity_one_only():
    bar = Barrier(1)
    assert bar.completed(1) and not bar.completed(0)
    bar.pending -= 1
    bar.settle()  # phase 0 completes
    assert bar.completed(0) and not bar.completed(1) and bar.pending == 1


@pytest.mark.parametrize("r", [
    ring(), ring(stages=2), ring(consumers=1), ring(cluster=2), ring(cluster=2, b_mn=True), ring(b_mn=True),
    ring(moves={"A": "cp.async", "B": "tma"}), ring(moves={"A": "ldg", "B": "ldg"}), ring(cluster=4, stages=3)],
    ids=str)
def test_the_rings_the_wgmma_path_prints_deliver_every_tile(r):
    assert pipeline_problem(r) is None
    assert delivered(r, 2 * r.stages + 3) == (list(range(2 * r.stages + 3)), None)


def test_regression_a_one_stage_wgmma_ring_deadlocks_and_the_pipeline_rule_names_it():
    """`habu compile examples/ggemm.habu --shape M=300,N=200,K=511 --pin stages=1` was certified; the
    producer waits empty[0] for a phase the consumers complete only after full[0]'s next phase."""
    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    shape = {"M": 300, "N": 200, "K": 511}
    plan = default_plan(model, TARGETS["sm_90a"], shape, {"stages": "1"})
    broken = {o.rule.name: o for o in failures(obligations(model, plan, shape))}
    assert "pipeline-schedule" in broken, sorted(broken)
    assert "deadlocks" in broken["pipeline-schedule"].detail
    assert "the producer of block 0 waits empty[0]" in broken["pipeline-schedule"].detail


def test_a_consumer_reading_the_next_stage_multiplies_another_tile():
    class NextStage(MbarrierRing):
        def read_slot(self, stage):
            return (stage + 1) % self.stages

    bad = NextStage(**{k: getattr(ring(), k) for k in ring().__dataclass_fields__})
    tiles, fault = delivered(bad, 6)
    assert tiles != list(range(6)) and "from stage 1" in fault


@pytest.mark.parametrize("change", [{"barrier_stride": 8}, {"empty_offset": 0}, {"barrier_stride": 32}])
def test_barriers_used_elsewhere_than_ring_init_initialised_them_are_refused(change):
    """The kernel waits and arrives at `full_barrier`/`empty_barrier` (bars + 16·stage [+ 8], printed
    from the ring): slots off habu::ring_init's layout (shared, or never initialised) are named."""
    problem = pipeline_problem(replace(ring(), **change))
    assert problem is not None and "habu::ring_init initialised them at" in problem, problem


def test_expected_bytes_must_be_the_boxes_bytes():
    r = ring()
    assert "expects 24576 bytes, but the TMA boxes of a k tile bring 49152" in pipeline_problem(
        replace(r, expect_tx=r.expect_tx // 2))


def test_an_empty_barrier_short_of_one_consumer_lets_the_producer_overwrite_a_stage():
    r = ring()
    problem = pipeline_problem(replace(r, empty_arrivals=r.empty_arrivals - 1))
    assert problem is not None and "holds tiles" in problem


def test_a_multicast_that_misses_a_block_is_refused():
    r = ring(cluster=2)
    loads = tuple(replace(ld, mask=1) if ld.mask else ld for ld in r.loads)
    assert "block 1 expects" in pipeline_problem(replace(r, loads=loads))


def test_inverted_parities_deadlock():
    r = ring()
    assert "deadlocks" in pipeline_problem(replace(r, consumer_parity=1))
    assert "deadlocks" in pipeline_problem(replace(r, producer_parity=0))


def test_the_cp_async_ring_waits_for_its_tile_and_never_refills_the_stage_it_reads():
    assert pipeline_problem(cp_async_ring(3)) is None and pipeline_problem(cp_async_ring(2)) is None
    assert "has not landed" in pipeline_problem(replace(cp_async_ring(3), wait_groups=2))
    assert "while the block still reads" in pipeline_problem(replace(cp_async_ring(3), prologue=3))
    assert run_cp_async(CpAsyncRing(4, 3, 2), (5, 0, 2)).reads[(0, 0)] == [0, 1, 2, 3, 4, 0, 1]


def test_a_persistent_block_continues_the_ring_across_its_tiles():
    (first, *_) = run_ring(ring(stages=3), (3, 0, 1, 4, 2))
    assert not first.faults
    assert first.reads[(0, 0)] == list(range(10))
