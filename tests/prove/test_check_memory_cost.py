"""What the finite-field check spends on inputs, intermediates and offsets (the Mixtral MoE backward at 16
tokens took 345 s to prove: each trial drew its gathered weights element by element for every routed row's
loop, searched the written intermediates for every read, hashed poison for reads that had none, and the
out-of-range index run repeated a whole trial). Each shortcut gives the same values as the long way."""

from __future__ import annotations

import numpy as np

import habu.prove.verify as verify
from habu.prove.index_arith import wrap
from habu.prove.virtual import VirtualTensor, WrittenTensor, key_for
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT


def test_a_virtual_tensor_read_past_its_size_is_drawn_once_and_gives_the_same_values():
    for index, modulus in ((False, 2**31 - 1), (True, 37)):
        lazy = VirtualTensor("W", (7, 9, 11), modulus, key_for(3, "W"), index=index)
        cached = VirtualTensor("W", (7, 9, 11), modulus, key_for(3, "W"), index=index)
        rng = np.random.default_rng(1)
        reads = [rng.integers(0, lazy.numel, size=n) for n in (500, 400, 300)]  # 1200 > 693 elements
        for offsets in reads:
            assert np.array_equal(cached.at(offsets), lazy.draw(offsets))
        assert cached._cache is not None and cached.at(reads[0]).dtype == np.int64
        assert np.array_equal(cached.materialize(), lazy.draw(np.arange(lazy.numel)).reshape(lazy.shape))


def test_a_virtual_tensor_over_the_cache_limit_is_never_drawn_whole(monkeypatch):
    import habu.prove.virtual as virtual

    monkeypatch.setattr(virtual, "CACHE_ELEMENTS", 100)
    t = VirtualTensor("W", (20, 20), 2**31 - 1, key_for(3, "W"))
    offsets = np.arange(400)
    for _ in range(3):
        assert np.array_equal(t.at(offsets), t.draw(offsets))
    assert t._cache is None


def test_a_written_tensor_read_densely_gives_what_the_search_gives():
    p = 2**31 - 1
    rng = np.random.default_rng(2)
    for accumulate in (False, True):
        t = WrittenTensor("T", 1000, p, accumulate)
        offsets = rng.integers(0, 1000, size=300)
        t.write(offsets, rng.integers(0, p, size=300))
        uniq, sums, _ = t._build()  # what each written offset holds
        off = rng.integers(0, 1000, size=800)
        small_vals, small_found = t.read(off[:20])  # under a quarter of the elements: the search
        assert t._dense is None
        vals, found = t.read(off)  # at least a quarter: the dense copy
        assert t._dense is not None
        assert np.array_equal(vals[:20], small_vals) and np.array_equal(found[:20], small_found)
        assert np.array_equal(found, np.isin(off, uniq))
        assert np.array_equal(vals[found], sums[np.searchsorted(uniq, off[found])]) and not vals[~found].any()
        t.write(np.array([0]), np.array([5]))  # a later write drops the dense copy
        assert t._dense is None


def test_the_offsets_wrap_to_their_width_as_the_modulus_did():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(-(2**63), 2**63 - 1, size=2000, dtype=np.int64),
                        np.array([0, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, -(2**63)], np.int64)])
    for width in (16, 32, 48):
        half = 1 << (width - 1)
        want = [((int(v) + half) % (2 * half)) - half for v in x]
        assert wrap(x, width).tolist() == want
    assert wrap(x, 64) is x


SMALL_UNPERMUTE = {"R": 64, "T": 16, "N": 8}


def test_regression_the_thinned_out_of_range_run_still_catches_a_scatter_without_its_index_check(monkeypatch):
    """The out-of-range run computes a costly general kernel's block ends only (`MASKING_WORK`); forced on a
    small scatter, it still finds the store that lost its index check, and passes the right one."""
    from tests.prove.test_index_masks import _masking

    monkeypatch.setattr(verify, "MASKING_WORK", 0)
    model = load_program(ROOT / "examples" / "scatter_add.habu").models["UNPERMUTE"].with_sizes(SMALL_UNPERMUTE)
    plan = default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {})
    failure, _ = _masking(model, plan, SMALL_UNPERMUTE, drop_checks=True)
    assert failure is not None and "out of bounds" in failure and "Y" in failure
    failure, note = _masking(model, plan, SMALL_UNPERMUTE)
    assert failure is None and "masked" in note


def test_the_block_ends_of_a_general_kernel_are_each_checked_blocks_first_and_last_elements():
    from habu.lower import lower_plan
    from habu.prove.kinds import kind_proof

    model = load_program(ROOT / "examples" / "scatter_add.habu").models["UNPERMUTE"].with_sizes(SMALL_UNPERMUTE)
    (lw,) = lower_plan(model, default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {}))
    sel, _, _ = kind_proof(lw).final_selection(lw, SMALL_UNPERMUTE)
    keep = kind_proof(lw).final_keep(lw, SMALL_UNPERMUTE)
    assert verify._block_ends(lw, sel, keep, SMALL_UNPERMUTE) is keep  # cheap: every checked element
    per, numel = lw.per_block, int(lw.numel(SMALL_UNPERMUTE))
    last = (numel - 1) // per
    verify.MASKING_WORK, saved = 0, verify.MASKING_WORK
    try:
        ends = verify._block_ends(lw, np.array([0, last]), None, SMALL_UNPERMUTE)
        thinned = verify._block_ends(lw, sel, np.arange(numel), SMALL_UNPERMUTE)
    finally:
        verify.MASKING_WORK = saved
    want = sorted({0, min(per, numel) - 1, last * per, numel - 1})
    assert ends.tolist() == want and thinned.tolist() == want, (per, numel, ends, thinned)


def test_an_index_table_is_read_once_a_coordinate_where_the_mask_is_wider():
    """A gathered row's index beside a loop over its columns: `NumpyIndex.table` reads IX once a row (where any
    of the row's lanes is unmasked) and broadcasts; the values where the mask holds, the out-of-bounds fault and
    `index_ok`'s masked lanes and error count are those of a read at every lane."""
    from habu.prove.index_arith import NumpyIndex
    from habu.prove.interp import Memory
    from habu.spec.field import PrimeField

    f = PrimeField(2**31 - 1, 1)
    ix = VirtualTensor("IX", (40,), 30, key_for(1, "IX"), index=True, out_of_range=True)
    rng = np.random.default_rng(4)
    for rows in (np.arange(40)[:, None], np.arange(44)[:, None]):  # rows 40..43 leave the table: a fault
        mask = rng.random((len(rows), 16)) < 0.7
        mask[3] = False  # a row no lane reads
        mem = Memory({"IX": ix}, f, {})
        got = NumpyIndex(32, mem, "k", mask).table("IX", rows)
        assert got.shape == mask.shape
        full = np.broadcast_to(rows, mask.shape)
        inside = mask & (full < 40)
        assert np.array_equal(got[inside], ix.draw(full[inside]))
        assert bool(mem.faults) == bool((mask & (full >= 40)).any())
        if len(rows) == 40:
            mem = Memory({"IX": ix}, f, {})
            ok = NumpyIndex(32, mem, "k").index_ok("IX", rows, 30, mask)
            values = ix.draw(full.ravel()).reshape(full.shape)
            assert np.array_equal(ok, mask & (values >= 0) & (values < 30))
            assert mem.index_error_count == int((mask & ~((values >= 0) & (values < 30))).sum())


def _seed_9978_backward():
    """The derived backward of the fuzz's model 9978 as session 55 derived it: no loop invariant hoisted, so the max
    and the sums are recomputed inside the outer sums (since session 60 the derivation hoists them and the field
    check is quick: tests/spec/test_grad_hoist_invariants.py)."""
    from unittest import mock

    import habu.spec.grad as grad
    from habu.cli_grad import backward_program
    from habu.search.space import enumerate_plans
    from habu.spec.parser import parse_text
    from tests.random_models import random_model

    with mock.patch.object(grad, "HOIST_INVARIANTS", False):
        program, name = backward_program(parse_text(random_model(9978), "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    return model, list(enumerate_plans(model, TARGETS["sm_90a"], {}))


def _general_64(plans):
    return next(p for p in plans if any(getattr(k, "kind", "") == "general" and k.threads == 64
                                          and k.nodes == ("dX1",) for k in p.kernels))


def test_a_field_merges_partial_reductions_into_the_whole_one():
    from habu.spec.field import PrimeField

    f = PrimeField(2**31 - 1, seed=5)
    x = np.random.default_rng(0).integers(0, f.p, size=(3, 10))
    for op in ("sum", "max"):
        left, right = f.reduce(op, x[:, :4], (1,)), f.reduce(op, x[:, 4:], (1,))
        assert np.array_equal(f.merge(op, left, right), f.reduce(op, x, (1,)))
    # a max of the partial maxes is not the model's max (the product Π (r − x) over every point)
    assert not np.array_equal(f.reduce("max", np.stack([left, right], axis=-1), (1,)), f.reduce("max", x, (1,)))


def test_a_general_kernels_reduction_in_slices_gives_the_whole_ones_values(monkeypatch):
    """A reduction over more iterations than a chunk runs its longest loop in slices, merged: the plan that
    passes whole passes sliced (nested max and sums of seed 9978's derived backward, slices of 8 elements)."""
    import habu.prove.interp_general as interp_general

    model, plans = _seed_9978_backward()
    whole = verify.verify_plan(model, plans[0], None, 1)
    monkeypatch.setattr(interp_general, "CHUNK_ELEMENTS", 8)
    monkeypatch.setattr(interp_general, "SLICE_ELEMENTS", 8)
    sliced = verify.verify_plan(model, plans[0], None, 1)
    assert whole.passed and sliced.passed


def test_regression_seed_9978_a_general_kernels_field_check_holds_a_chunk_not_its_loops_volume():
    """Session 55's fuzz: the derived backward of seed 9978 (a max of sums) has a general kernel of 64 threads whose
    witness keeps #Q = 130 whole; one lane's nested loops are 10^11 iterations, and the check asked for 798 GiB at
    once (an 11 GB run before it). It now holds a chunk at a time and gives up at the search's deadline."""
    import time
    import tracemalloc

    import pytest

    from habu.prove.deadline import DeadlinePassed, proof_deadline

    model, plans = _seed_9978_backward()
    tracemalloc.start()
    try:
        with proof_deadline(time.time() + 3), pytest.raises(DeadlinePassed):
            verify.verify_plan(model, _general_64(plans), None, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 30, peak
