"""The unguarded fallback member of a checked kernel set (`habu.compile.fallback`) is derived from the
field table: every schedule field of every kernel kind says its unguarded value (or KEEP), so a field
added to the table cannot be left out of the fallback."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from habu.plan.fields import KEEP, FieldError, Reader, choice, kernel_fields, unguarded_changes
from habu.plan.plan import (
    KERNEL_KINDS,
    AttentionKernel,
    ColumnKernel,
    ContractionKernel,
    GeneralKernel,
    GroupedKernel,
    MapKernel,
    Plan,
    RowKernel,
)
from habu.unguarded import fallback

KERNELS = {
    "contraction": ContractionKernel(nodes=("Y",), tile_m=128, tile_n=128, tile_k=64, warps=12, stages=4, mma="wgmma",
                                     a_move="tma", b_move="staged", a_vector=8, b_vector=8, split_k=1, raster="row",
                                     group_m=8, persistent=True, warp_specialized=True, swizzle=128, store="tma",
                                     cluster_m=2),
    "rows": RowKernel(nodes=("Y",), rows_per_block=1, threads=512, vector=8, cache_row=True, cluster=4),
    "map": MapKernel(nodes=("Y",), threads=256, vector=4),
    "general": GeneralKernel(nodes=("Y",), threads=256),
    "columns": ColumnKernel(nodes=("Y",), threads=256, column_threads=32, vector=8, rows_per_split=960, unroll=8),
    "grouped": GroupedKernel(nodes=("Y",), bm=64, bn=64, bk=32, warps_m=2, warps_n=2),
    "attention": AttentionKernel(nodes=("Y",), bm=64, bn=64),
}


def test_every_field_of_every_kernel_kind_declares_its_unguarded_value():
    assert set(KERNELS) == set(KERNEL_KINDS)
    for kind, cls in KERNEL_KINDS.items():
        changes = unguarded_changes(cls)  # raises FieldError for a field that does not declare it
        for kf in kernel_fields(cls):
            if kf.spec is None:
                continue
            value = kf.spec.unguarded
            assert value is KEEP or kf.problem(value) is None, (kind, kf.name, value)
            assert (kf.name in changes) == (value is not KEEP)


def test_a_field_without_an_unguarded_value_is_refused_by_the_derivation():
    @dataclass(frozen=True)
    class NewKernel:
        nodes: tuple[str, ...]
        threads: int = choice("threads", Reader.PROOF, lo=1, unguarded=KEEP)
        tile_order: int = choice("a new field that forgot to say", Reader.PROOF, lo=1)

    with pytest.raises(FieldError, match=r"NewKernel.tile_order does not declare its unguarded value"):
        unguarded_changes(NewKernel)


def _plan(kernels) -> Plan:
    return Plan(model="M", model_hash="0" * 64, target="sm_90a", shape=(), kernels=tuple(kernels), guards=("K % 8 == 0",))


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_fallback_gives_a_guarded_kernel_every_unguarded_value_and_keeps_the_rest(kind):
    kernel = KERNELS[kind]
    other = KERNELS["map"] if kind != "map" else KERNELS["general"]
    plan = _plan([kernel, other])
    proof = SimpleNamespace(guards=[SimpleNamespace(kernel=f"kernel 0 ({'+'.join(kernel.nodes)})")])
    fb = fallback(plan, proof)  # type: ignore[arg-type]
    assert fb.guards == ()
    changes = unguarded_changes(type(kernel))
    if kind == "contraction":  # its staged B stays staged (rows aligned at every size): the rest as the table says
        changes.pop("b_move")
    assert fb.kernels[0] == replace(kernel, **changes)
    for kf in kernel_fields(type(kernel)):
        expect = changes.get(kf.name, getattr(kernel, kf.name))
        assert getattr(fb.kernels[0], kf.name) == expect, kf.name
    assert fb.kernels[1] == other  # no guard names it: it holds for every size already


def test_the_contraction_fallback_is_the_one_the_hand_list_gave():
    """The derived fallback of a guarded contraction is what `fallback` listed by hand: scalar ldg
    loads of an operand read in place, a staged operand still staged (its pass writes aligned rows at every size;
    session 69), scalar vectors; the rest (TMA stores, clusters, the tile) is kept."""
    kernel = KERNELS["contraction"]
    proof = SimpleNamespace(guards=[SimpleNamespace(kernel="kernel 0 (Y)")])
    (k,) = fallback(_plan([kernel]), proof).kernels  # type: ignore[arg-type]
    assert (k.a_move, k.b_move, k.a_vector, k.b_vector) == ("ldg", "staged", 1, 1)
    assert replace(k, a_move="tma", b_move="staged", a_vector=8, b_vector=8) == kernel


def test_regression_fallback_reset_the_vector_of_kernels_no_guard_names():
    """`fallback` set vector=1 on every row and map kernel of the plan, guarded or not: a kernel
    that holds for every size lost its vector accesses in the fallback member for nothing."""
    rows, contraction = KERNELS["rows"], KERNELS["contraction"]
    proof = SimpleNamespace(guards=[SimpleNamespace(kernel="kernel 0 (Y)")])
    fb = fallback(_plan([contraction, rows]), proof)  # type: ignore[arg-type]
    assert fb.kernels[1] == rows and fb.kernels[1].vector == 8
    guarded_rows = SimpleNamespace(guards=[SimpleNamespace(kernel="kernel 1 (Y)")])
    fb = fallback(_plan([contraction, rows]), guarded_rows)  # type: ignore[arg-type]
    assert fb.kernels[0] == contraction and fb.kernels[1].vector == 1
