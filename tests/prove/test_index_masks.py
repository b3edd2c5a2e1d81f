"""Index values checked on the device: a gather's or scatter's index validity (0 <= IX[r] < rows) is part
of the access's mask in the lowering (`Access.checks`), printed from there as `habu::index_ok` (which
raises the module's error words) and run by the finite-field interpreter, which checks that out-of-range
index values make no kernel read or write outside its tensors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from habu.lower import lower_plan
from habu.lower.access import IndexCheck
from habu.paths.emit import emit_plan
from habu.prove.index_arith import NumpyIndex
from habu.prove.interp import Memory
from habu.prove.kinds import kind_proof
from habu.prove.verify import check_index_masking, verify_plan, virtual_inputs
from habu.prove.virtual import VirtualTensor, key_for
from habu.search.space import default_plan
from habu.spec.field import DEFAULT_PRIME, PrimeField
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

SMALL_UNPERMUTE = {"R": 64, "T": 16, "N": 8}
SMALL_GGEMM = {"M": 128, "N": 128, "K": 64}


def _model(example: str, name: str, sizes):
    return load_program(ROOT / "examples" / example).models[name].with_sizes(sizes)


def test_a_gathered_operand_carries_the_index_check_of_its_gathered_axis():
    model = _model("ggemm.habu", "GGEMM", SMALL_GGEMM)
    (lw,) = lower_plan(model, default_plan(model, TARGETS["sm_90a"], SMALL_GGEMM, {}))
    assert lw.a.tensor == "A" and lw.a.checks == (IndexCheck("IX", "m", "M"),)
    assert lw.b.checks == () and lw.out.checks == ()  # B and O are not gathered


def test_a_scatter_store_carries_the_index_check_of_its_scattered_axis():
    model = _model("scatter_add.habu", "UNPERMUTE", SMALL_UNPERMUTE)
    (lw,) = lower_plan(model, default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {}))
    assert [(x.table, x.extent) for x in lw.out.checks] == [("IX", "T")]


def test_the_mask_reads_the_table_only_where_the_bounds_hold_and_records_bad_values():
    model = _model("scatter_add.habu", "UNPERMUTE", SMALL_UNPERMUTE)
    (lw,) = lower_plan(model, default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {}))
    f = PrimeField(DEFAULT_PRIME, 1)
    inputs = virtual_inputs(model, SMALL_UNPERMUTE, f, 1)
    ix = inputs["IX"]
    inputs["IX"] = VirtualTensor("IX", ix.shape, ix.modulus, key_for(1, "IX"), index=True, out_of_range=True)
    mem = Memory(inputs, f, SMALL_UNPERMUTE)
    axis = lw.out.checks[0].axis
    coords = {a: np.zeros(70, np.int64) for a in lw.out.axes} | {axis: np.arange(70, dtype=np.int64)}
    mask = lw.out.mask(coords, SMALL_UNPERMUTE, NumpyIndex(lw.index_width, mem, "k"))
    values = inputs["IX"].at(np.arange(64))
    expected = np.concatenate([(values >= 0) & (values < 16), np.zeros(6, bool)])  # rows 64..69: no table read
    assert np.array_equal(mask, expected)
    assert mem.faults == []  # IX is never read past its 64 rows
    assert mem.index_error_count == int(((values < 0) | (values >= 16)).sum()) > 0
    kernel, table, position, value = mem.index_errors[0]
    assert kernel == "k"
    assert table == "IX" and value == values[position] and not 0 <= value < 16


def _masking(model, plan, sizes, drop_checks: bool = False):
    lowerings = lower_plan(model, plan)
    if drop_checks:  # a planted bug: the lowering forgets the index checks of its accesses
        lowerings = [replace(lw, out=replace(lw.out, checks=())) if hasattr(lw, "node") else lw for lw in lowerings]
    names = [f"kernel {i}" for i in range(len(lowerings))]
    selections, keeps = {}, {}
    for i, lw in enumerate(lowerings):
        sel, _, _ = kind_proof(lw).final_selection(lw, sizes)
        selections[i], keeps[i] = sel, kind_proof(lw).final_keep(lw, sizes)
    return check_index_masking(model, lowerings, names, selections, keeps, sizes, DEFAULT_PRIME, 7)


def test_out_of_range_scatter_indices_write_nothing_outside_the_tensor():
    model = _model("scatter_add.habu", "UNPERMUTE", SMALL_UNPERMUTE)
    plan = default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {})
    failure, note = _masking(model, plan, SMALL_UNPERMUTE)
    assert failure is None and "masked" in note and "IX[" in note


def test_regression_a_scatter_without_its_index_check_is_caught_writing_out_of_bounds():
    model = _model("scatter_add.habu", "UNPERMUTE", SMALL_UNPERMUTE)
    plan = default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {})
    failure, _ = _masking(model, plan, SMALL_UNPERMUTE, drop_checks=True)
    assert failure is not None and "out of bounds" in failure and "Y" in failure


def test_the_field_check_notes_that_out_of_range_indices_stay_inside_the_tensors():
    model = _model("scatter_add.habu", "UNPERMUTE", SMALL_UNPERMUTE)
    cert = verify_plan(model, default_plan(model, TARGETS["sm_90a"], SMALL_UNPERMUTE, {}), trials=1)
    assert cert.passed, cert.failure
    assert any(n.startswith("out-of-range index values stay inside every tensor") for n in cert.notes)


def test_the_gathered_gemm_masks_out_of_range_rows_in_the_field_check():
    model = _model("ggemm.habu", "GGEMM", SMALL_GGEMM)
    for arch in ("sm_90a", "sm_80"):
        plan = default_plan(model, TARGETS[arch], SMALL_GGEMM, {})
        failure, note = _masking(model, plan, SMALL_GGEMM)
        assert failure is None and "IX[" in note, (arch, failure, note)


def test_the_emitted_gather_prints_the_index_check_from_the_lowering():
    for example, name, sizes in (("ggemm.habu", "GGEMM", None), ("scatter_add.habu", "UNPERMUTE", None)):
        model = load_program(ROOT / "examples" / example).models[name]
        for arch in ("sm_90a", "sm_80"):
            source = "".join(k.source for k in emit_plan(model, default_plan(model, TARGETS[arch], sizes),
                                                         TARGETS[arch]).kernels)
            assert "habu::index_ok((long long)p_IX[" in source, (name, arch)


GATHERED_BIAS = r"""
256 EXTENT: #M  256 EXTENT: #N  256 EXTENT: #K  64 EXTENT: #E
bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  f32 TENSOR: S ( #E #N )  f32 TENSOR: O ( #M #N )
ITENSOR: IX ( #M #E )
MODEL: GB  O[m n] = Σ k A[m k] · B[n k] + S[IX[m] n] ;
"""


def test_a_gathered_load_beside_a_reduction_is_masked_and_stays_inside_its_tensor():
    from habu.spec.parser import parse_text

    model = parse_text(GATHERED_BIAS).models["GB"]
    plan = default_plan(model, TARGETS["sm_90a"], None)
    source = "".join(k.source for k in emit_plan(model, plan, TARGETS["sm_90a"]).kernels)
    assert "habu::index_ok((long long)p_IX[e0], (long long)(64)" in source
    failure, note = _masking(model, plan, dict(plan.shape))
    assert failure is None and "IX[" in note
