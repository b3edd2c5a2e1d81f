"""The call-time choice of a bucketed kernel set (habu/emit_cuda/buckets.py), with stand-in kernels:
the member of the bucket the call's width falls in, at every bucket edge, and a clear refusal for a
width no bucket holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.buckets import BucketedKernelSet
from habu.emit_cuda.guards import GuardError
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param
from habu.emit_cuda.runtime import CompiledModel
from habu.plan.buckets import Bucket, BucketGrid, cell_ranges
from habu.spec.parser import load_program
from tests.emit_cuda.fakes import BASE, info

ROOT = Path(__file__).resolve().parents[2]


def rmsnorm():
    return load_program(ROOT / "examples" / "rmsnorm.habu").model("RMSNORM-ROWS")


def fake_plan(name: str) -> EmittedPlan:
    k = CudaKernel(name, "", (Param("s_D", "size", extent="D"), Param("p_X", "ptr", "X", "bf16"),
                              Param("p_Y", "ptr", "Y", "bf16", writes=True)), 128, 0, None)
    return EmittedPlan((k,), ())


def arrays(d: int) -> dict:
    return {"X": info((8192, d), "bf16"), "Y": info((8192, d), "bf16", BASE + 0x4000_0000)}


def chosen(model: CompiledModel, d: int) -> str:
    member, sizes = model.check(arrays(d))
    assert sizes["D"] == d
    return model.kernel_set.members[member][1].kernels[0].name


def test_each_width_runs_the_kernel_of_its_bucket_at_every_edge():
    m = rmsnorm()
    grid = BucketGrid.of(m)
    cells = grid.cells()
    members = [(cell_ranges(c), (), fake_plan(f"b{c[0].lo}_{c[0].hi}")) for c in reversed(cells)]  # any order
    built = CompiledModel(m, BucketedKernelSet(grid, members))
    for c in cells:
        b = c[0]
        for d in {b.lo, b.hi, b.lo + 256 if b.lo + 256 <= b.hi else b.lo}:
            assert chosen(built, d) == f"b{b.lo}_{b.hi}", d


def test_guarded_members_of_a_bucket_are_chosen_by_their_guards():
    m = rmsnorm()
    grid = BucketGrid(((Bucket("D", 256, 4096, 256), Bucket("D", 4352, 65536, 256)),))
    lo, hi = (cell_ranges(c) for c in grid.cells())
    built = CompiledModel(m, BucketedKernelSet(grid, [
        (lo, ("D%1024 == 0",), fake_plan("lo_guarded")), (lo, (), fake_plan("lo_fallback")),
        (hi, (), fake_plan("hi"))]))
    assert [chosen(built, d) for d in (1024, 768, 4096, 4352, 65536)] == \
        ["lo_guarded", "lo_fallback", "lo_guarded", "hi", "hi"]


def test_regression_a_width_outside_every_bucket_is_refused_with_a_clear_error():
    m = rmsnorm()
    grid = BucketGrid(((Bucket("D", 256, 4096, 256), Bucket("D", 8192, 65536, 256)),))
    built = CompiledModel(m, BucketedKernelSet(grid, [(cell_ranges(c), (), fake_plan(f"k{i}"))
                                                      for i, c in enumerate(grid.cells())]))
    with pytest.raises(ArgumentError, match=r"#D = 6144 is in no bucket of the kernel set \(its buckets: "
                                            r"256..4096, 8192..65536, multiples of 256\)"):
        built.check(arrays(6144))
    with pytest.raises(ArgumentError, match="outside its declared range"):  # the declared range is checked first
        built.check(arrays(65536 + 256))


def test_a_set_with_a_bucket_left_empty_or_a_member_of_no_bucket_is_refused():
    grid = BucketGrid(((Bucket("D", 256, 4096, 256), Bucket("D", 4352, 65536, 256)),))
    first = cell_ranges(grid.cells()[0])
    with pytest.raises(GuardError, match="no member for the bucket"):
        BucketedKernelSet(grid, [(first, (), fake_plan("a"))])
    with pytest.raises(GuardError, match="is no bucket of the set"):
        BucketedKernelSet(grid, [(first, (), fake_plan("a")), ((("D", 4352, 8192),), (), fake_plan("b"))])
