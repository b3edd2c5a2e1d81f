"""Argument checks before a launch: shapes, extents, dtypes, devices, layout, alignment, index values."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from habu.emit_cuda.arrays import ArgumentError, array_info
from habu.emit_cuda.checks import (
    check_arguments,
    check_index_range,
    contract_of,
    converts_index,
    index_values_for_kernel,
)
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param
from habu.lower.access import Access, Position
from tests.emit_cuda.fakes import BASE, FakeCAI, gemm_arrays, gemm_model, gemm_plan, info


@pytest.fixture
def contract():
    return contract_of(gemm_model(), gemm_plan())


def fails(contract, arrays, match: str) -> str:
    with pytest.raises(ArgumentError) as exc:
        check_arguments(contract, arrays)
    msg = exc.value.message
    assert re.search(match, msg), msg
    assert "Traceback" not in exc.value.render()
    return msg


def test_sizes_are_bound_from_the_arrays(contract):
    assert check_arguments(contract, gemm_arrays(k=512, n=96, s=7)) == {"M": 4096, "K": 512, "N": 96, "S": 7}


def test_outputs_may_be_given(contract):
    arrays = {**gemm_arrays(n=64), "C": info((4096, 64), "f32", BASE + 0x400000)}
    assert check_arguments(contract, arrays)["N"] == 64


def test_contract_alignment_comes_from_the_params(contract):
    need = {t.name: (t.align, t.align_why) for t in contract.tensors}
    assert need["A"] == (16, "the plan loads A with TMA")
    assert need["B"] == (16, "the plan loads B with 8-element vectors")  # 8 × bf16
    assert need["IX"] == (4, "")
    assert need["C"] == (4, "")
    roles = {t.name: t.role for t in contract.tensors}
    assert roles == {"A": "input", "B": "input", "IX": "input", "C": "output", "T": "intermediate"}


def test_static_extent_mismatch(contract):
    arrays = {**gemm_arrays(), "A": info((4095, 512), "bf16")}
    msg = fails(contract, arrays, r"^A: expected shape \(4096, 512\) \( #M #K \), got \(4095, 512\)$")
    assert msg


def test_runtime_extent_must_agree_between_arrays(contract):
    arrays = {**gemm_arrays(k=512), "B": info((511, 64), "bf16", BASE + 0x100000)}
    fails(contract, arrays, r"^B: expected shape \(512, 64\) \( #K #N \), got \(511, 64\) \(#K = 512 from A\)$")


def test_runtime_extent_outside_its_range(contract):
    fails(contract, gemm_arrays(k=520), r"^A: size 520 along #K is outside its declared range "
                                        r"\(#K in 16\.\.65536, multiple of 16 \(runtime\)\)$")
    fails(contract, gemm_arrays(k=65536 + 16), r"outside its declared range")


def test_rank_mismatch(contract):
    fails(contract, {**gemm_arrays(), "IX": info((4, 8), "i32")}, r"^IX: expected 1 dimensions \( #S \)")


def test_dtype(contract):
    fails(contract, {**gemm_arrays(), "A": info((4096, 512), "f32")}, r"^A: expected bf16, got f32$")


def test_missing_input(contract):
    arrays = gemm_arrays()
    del arrays["B"]
    fails(contract, arrays, r"^B: missing \(an input of gemm: bf16 \( #K #N \)\)$")


def test_unknown_and_intermediate_names(contract):
    fails(contract, {**gemm_arrays(), "D": info((1,))}, r"^D: not a tensor of gemm \(pass: A, B, IX, C\)$")
    fails(contract, {**gemm_arrays(), "T": info((4096, 64))}, r"^T: an intermediate the runtime allocates")


def test_tma_alignment(contract):
    arrays = {**gemm_arrays(), "A": info((4096, 512), "bf16", BASE + 2)}
    fails(contract, arrays, r"^A: base address 0x7f0000000002 is not 16-byte aligned \(the plan loads A with TMA\)$")


def test_vector_alignment(contract):
    arrays = {**gemm_arrays(), "B": info((512, 64), "bf16", BASE + 8)}
    fails(contract, arrays, r"^B: base address 0x7f0000000008 is not 16-byte aligned "
                            r"\(the plan loads B with 8-element vectors\)$")


def test_element_alignment(contract):
    fails(contract, {**gemm_arrays(), "IX": info((32,), "i32", BASE + 2)}, r"^IX: base address .* 4-byte aligned$")


def test_alignment_can_be_left_out_for_kernel_sets(contract):
    arrays = {**gemm_arrays(), "A": info((4096, 512), "bf16", BASE + 2)}
    assert check_arguments(contract.without_alignment(), arrays)["K"] == 512


def test_strides_must_be_row_major(contract):
    transposed = info((4096, 512), "bf16", strides=(1, 4096))
    fails(contract, {**gemm_arrays(), "A": transposed},
          r"^A: expected contiguous row-major strides \(512, 1\), got \(1, 4096\)")
    padded = info((4096, 512), "bf16", strides=(520, 1))
    fails(contract, {**gemm_arrays(), "A": padded}, r"row-major")


def test_strides_of_unit_dimensions_do_not_matter(contract):
    model = replace(gemm_model(), extents=(*gemm_model().extents[:3], replace(gemm_model().extents[3], lo=1)))
    c = contract_of(model, gemm_plan())
    assert check_arguments(c, {**gemm_arrays(n=1), "B": info((512, 1), "bf16", BASE, strides=(1, 77))})["N"] == 1


def test_devices(contract):
    fails(contract, {**gemm_arrays(), "B": info((512, 64), "bf16", device=1)},
          r"^B: is on CUDA device 1, but A is on device 0; all arrays must be on one device$")
    host = array_info(np.zeros((4096, 512), np.float32))
    fails(contract, {**gemm_arrays(), "A": replace(host, dtype="bf16")}, r"^A: is in cpu memory, not on a CUDA device$")


def test_readonly_output(contract):
    fails(contract, {**gemm_arrays(), "C": info((4096, 64), readonly=True)}, r"^C: is read-only, but the plan writes it$")


def test_sizes_given_explicitly(contract):
    assert check_arguments(contract, gemm_arrays(), {"K": 512})["K"] == 512
    with pytest.raises(ArgumentError, match="outside its range"):
        check_arguments(contract, gemm_arrays(), {"K": 7})


def test_unbound_extent():
    plan = EmittedPlan((CudaKernel("k", "", (Param("p", "ptr", "A", "bf16"),), 32, 0, None),), ())
    arrays = gemm_arrays()
    del arrays["B"]  # unused by this plan, but the only array with #N, which the output C needs
    fails(contract_of(gemm_model(), plan), arrays, r"^cannot tell the size of #N from the arrays given")


def test_arrays_from_cuda_array_interface(contract):
    arrays = {"A": FakeCAI((4096, 512), "<V2"), "B": FakeCAI((512, 64), "<V2", BASE + 0x1000),
              "IX": FakeCAI((32,), "<i4", BASE + 0x2000)}
    infos = {k: replace(array_info(v, k), device=0) for k, v in arrays.items()}
    assert check_arguments(contract, infos)["K"] == 512
    infos["A"] = replace(array_info(FakeCAI((4096, 512), "<f2"), "A"), device=0)
    fails(contract, infos, r"^A: expected bf16, got f16$")


# ----------------------------------------------------------------------------- index values


def test_index_range_ok():
    check_index_range("IX", np.arange(4096, dtype=np.int32), 4096, "M")


def test_index_range_reports_the_first_bad_value():
    values = np.zeros(32, np.int32)
    values[17], values[20] = 5000, -1
    with pytest.raises(ArgumentError) as exc:
        check_index_range("IX", values, 4096, "M")
    assert exc.value.message == "IX: values must be in 0..4095 (an index into #M): found 5000 at IX[17]"


def test_index_range_negative_and_multidimensional():
    values = np.zeros((3, 4), np.int64)
    values[2, 1] = -3
    with pytest.raises(ArgumentError) as exc:
        check_index_range("IX", values, 10)
    assert exc.value.message == "IX: values must be in 0..9: found -3 at IX[2, 1]"


def test_regression_int64_index_tensor_is_accepted(contract):
    # torch's default integer type is int64; the kernel loads i32: the runtime converts a checked copy
    arrays = {**gemm_arrays(), "IX": info((32,), "i64", BASE + 0x200000)}
    assert check_arguments(contract, arrays)["S"] == 32
    assert converts_index(contract.tensor("IX"), arrays["IX"])
    assert not converts_index(contract.tensor("IX"), gemm_arrays()["IX"])
    # the converted copy is allocated afresh: the given array's alignment does not matter
    assert check_arguments(contract, {**arrays, "IX": info((32,), "i16", BASE + 2)})["S"] == 32


def test_index_tensor_of_a_float_type_is_still_refused(contract):
    fails(contract, {**gemm_arrays(), "IX": info((32,), "f32", BASE + 0x200000)},
          r"^IX: expected i32 \(or i16/i32/i64: index tensors are converted after their values are checked\), got f32$")
    fails(contract, {**gemm_arrays(), "A": info((4096, 512), "i64")}, r"^A: expected bf16, got i64$")


def test_int64_index_values_are_checked_before_narrowing(contract):
    ix = contract.tensor("IX")
    got = index_values_for_kernel(ix, np.array([0, 4095, 7], np.int64), 4096)
    assert got.dtype == np.int32 and got.tolist() == [0, 4095, 7]
    wraps = np.array([0, 2**32 + 5, 7], np.int64)  # int32(2**32 + 5) == 5 would pass a check made after narrowing
    with pytest.raises(ArgumentError) as exc:
        index_values_for_kernel(ix, wraps, 4096)
    assert exc.value.message == "IX: values must be in 0..4095 (an index into #M): found 4294967301 at IX[1]"


# ----------------------------------------------------------------------------- vectors of row and map kernels


def _access(tensor: str, axes: tuple[str, ...]) -> Access:
    return Access(tensor, "f16", axes, tuple(Position("axis", a) for a in axes), (), ())


def test_row_kernel_vectors_come_from_the_row_lowering():
    """A row kernel in vector mode reads its kept row and stores a 16-bit output row in 16-byte
    vectors: both tensors need 16-byte bases; the map kernel's lanes read element by element."""
    from habu.paths.emit import emit_plan
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    plan = default_plan(m, TARGETS["sm_90a"], None)
    emitted = emit_plan(m, plan, TARGETS["sm_90a"])
    (k,) = emitted.kernels
    assert k.lowering.vector_row() and "habu::load16_or_zero" in k.source
    need = {t.name: (t.align, t.align_why) for t in contract_of(m, emitted).tensors}
    assert need["X"] == (16, "the plan reads X's rows in 16-byte vectors")
    assert need["Y"][0] == (16 if k.lowering.vector_store() else 2)
    f = load_program(ROOT / "examples" / "fused.habu").models["AXPY-RELU"]
    fe = emit_plan(f, default_plan(f, TARGETS["sm_90a"], None), TARGETS["sm_90a"])
    assert fe.kernels[0].lowering.vector_accesses() == ()  # and its source makes no vector access:
    assert not any(v in fe.kernels[0].source for v in ("reinterpret_cast", "load16", "load8", "uint4", "float2"))


@pytest.mark.parametrize("k", [17, 1])
def test_regression_an_mma_sync_ggemm_whose_o_is_4_bytes_off_8_byte_alignment_is_refused(k):
    """The K = 17 and K = 1 mma.sync GGEMM plans store O's column pairs as one float2 but declared 4-byte
    alignment for O (the check counted only A and B's vectors): an O 4 bytes off 8-byte alignment
    passed and the kernel died with 'misaligned address', losing the CUDA context. The lowering lists
    the pair stores (vector_accesses), and the launch check is generated from that list."""
    from habu.paths.emit import emit_plan
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"].with_sizes({"K": k})
    plan = default_plan(m, TARGETS["sm_80"], {"K": k}, {"mma": "mma.sync"})
    assert plan.kernels[0].mma == "mma.sync"
    emitted = emit_plan(m, plan, TARGETS["sm_80"])
    assert "reinterpret_cast<float2*>" in emitted.kernels[-1].source
    c = contract_of(m, emitted)
    assert (c.tensor("O").align, c.tensor("O").align_why) == (8, "the epilogue stores pairs of adjacent O elements as one vector")
    M, N = m.extent("M").size, m.extent("N").size
    arrays = {"A": info((M, k), "bf16", BASE), "B": info((N, k), "bf16", BASE + 0x4000000),
              "IX": info((M,), "i32", BASE + 0x8000000), "O": info((M, N), "f32", BASE + 0xC000004)}
    fails(c, arrays, r"^O: base address 0x[0-9a-f]+ is not 8-byte aligned \(the epilogue stores pairs")
    check_arguments(c, {**arrays, "O": info((M, N), "f32", BASE + 0xC000008)})
