"""`gather:T` (habu/plan/gather_split.py): GGEMM's backward dB, `dB[n k] = Σ m dO[m n]·A[IX[m] k]`, as a gathered
copy of A's rows (the general kernel) and a plain wgmma contraction of two m-major operands, instead of the
staged contraction. Reached by `--pin rewrite=gather:dB` and the search; the default where the cost model
predicts it faster (4096³: the copy moving 16-byte vectors)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, GeneralLowering, lower_plan
from habu.lower.access import Position
from habu.plan.rewrite import applicable, apply_rewrites
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
SIZES = {"M": 200, "N": 136, "K": 72}  # ragged against every tile


def test_the_gathered_copy_then_a_plain_contraction_is_proven_and_a_wrong_gather_killed():
    model = load_program(ROOT / "tests" / "data" / "ggemm_backward.habu").models["GGEMM-DB"].with_sizes(SIZES)
    assert applicable(model) == ["gather:dB"]
    copy, product = apply_rewrites(model, ("gather:dB",)).nodes
    assert product.target == "dB" and "dB.g" in str(product.rhs)
    assert copy.target == "dB.g" and [v.name for v in copy.lhs] == ["m", "k"]
    plan = default_plan(model, TARGET, SIZES, {"rewrite": "gather:dB"})
    assert default_plan(model, TARGET, SIZES).rewrites == ()  # the staged contraction stays the default
    assert plan.storage == (("dB.g", "bf16"),)  # A's type: a copy rounds nothing
    k0, k1 = lower_plan(model, plan)
    assert isinstance(k0, GeneralLowering) and isinstance(k1, ContractionLowering)
    assert (plan.kernels[1].mma, plan.kernels[1].a_move, plan.kernels[1].b_move) == ("wgmma", "tma", "tma")
    assert not k1.pre  # no staging pass
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    (ld, acc), = k0.loads
    ungathered = replace(acc, positions=tuple(Position("axis", p.axis) if p.kind == "gather" else p
                                              for p in acc.positions), checks=())
    cert = verify_plan(model, plan, SIZES, trials=1, seeds=[3], lowerings=[replace(k0, loads=((ld, ungathered),)), k1])
    assert not cert.passed and "dB" in (cert.failure or "")


def test_the_gathered_copy_moving_16_byte_vectors_is_proven():
    """`--pin vector=8`: each thread copies 8 consecutive bf16 of a gathered row with one 16-byte load and
    store; the row index IX[m] is read once for the vector."""
    model = load_program(ROOT / "tests" / "data" / "ggemm_backward.habu").models["GGEMM-DB"].with_sizes(SIZES)
    plan = default_plan(model, TARGET, SIZES, {"rewrite": "gather:dB", "vector": "8"})
    assert plan.kernels[0].vector == 8
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    k0, _ = lower_plan(model, plan)
    assert [v.tensor for v in k0.vector_accesses()] == ["A", "dB.g"]


def test_the_default_gathers_by_a_vector_copy_where_the_cost_model_predicts_it_faster():
    """H200 08:00 run (exact): dB at 4096³ 180.7 µs gathered (the copy moving 16-byte vectors, 15.6 µs) against
    213.2 staged (its staging pass 47.9); small shapes keep the staged contraction (one kernel)."""
    path = ROOT / "tests" / "data" / "ggemm_backward.habu"
    big = {"M": 4096, "N": 4096, "K": 4096}
    plan = default_plan(load_program(path).models["GGEMM-DB"].with_sizes(big), TARGET, big)
    assert plan.rewrites == ("gather:dB",) and [k.kind for k in plan.kernels] == ["general", "contraction"]
    assert plan.kernels[0].vector == 8
    small = {"M": 1024, "N": 1024, "K": 1024}
    assert default_plan(load_program(path).models["GGEMM-DB"].with_sizes(small), TARGET, small).rewrites == ()
    pinned = default_plan(load_program(path).models["GGEMM-DB"].with_sizes(big), TARGET, big, {"family": "contraction"})
    assert pinned.rewrites == () and len(pinned.kernels) == 1  # the staged contraction, pinned
