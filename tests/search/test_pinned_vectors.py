"""`--pin vector=...`: the width of an operand's ldg or cp.async reads. An operand read by TMA in whole boxes has
none (habu.search.space: `_boxed_vectors`, `_check_vector_pin`)."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
GEMM = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]


def test_regression_a_vector_pinned_on_tma_moves_was_recorded_and_never_used():
    """`--pin vector=4` on the wgmma default (A and B by TMA) gave a plan with a_vector = b_vector = 4 that read
    neither by vectors: a plan key unlike the default's for the same kernel. It is refused, naming the moves."""
    with pytest.raises(UsageError, match=r"vector=4: the contraction reads both operands by TMA .*A tma, B tma"):
        default_plan(GEMM, TARGET, {}, {"vector": "4"})


def test_a_pinned_vector_goes_to_the_operand_read_by_vectors_only():
    default = default_plan(GEMM, TARGET, {}, {}).kernels[0]
    (k,) = default_plan(GEMM, TARGET, {}, {"vector": "4", "A": "cp.async"}).kernels
    assert (k.a_move, k.a_vector) == ("cp.async", 4)
    assert (k.b_move, k.b_vector) == ("tma", default.b_vector)


def test_a_pinned_vector_on_mma_sync_sets_both_operands():
    (k,) = default_plan(GEMM, TARGET, {}, {"vector": "4", "mma": "mma.sync"}).kernels
    assert (k.a_move, k.a_vector, k.b_move, k.b_vector) == ("cp.async", 4, "cp.async", 4)
