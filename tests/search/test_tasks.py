"""One finite-field check per lowering: plans that differ only in emission share it."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from habu.plan.plan import ContractionKernel
from habu.prove.verify import FIELD_CHECK_FIELDS, field_key
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


def ggemm(**sizes):
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    return m.with_sizes(sizes) if sizes else m


def with_kernel(plan, **changes):
    return replace(plan, kernels=(replace(plan.kernels[0], **changes),))


def key(plan, model=None, sizes=None):
    return field_key(model or ggemm(), plan, sizes or {})


@pytest.mark.parametrize("change", [{"stages": 3}, {"warps": 8}, {"store": "direct"}, {"a_move": "ldg"},
                                    {"b_move": "cp.async"}, {"swizzle": 0}, {"mma": "mma.sync"}])
def test_emission_choices_share_one_check(change):
    base = default_plan(ggemm(), T, None, {})
    assert key(with_kernel(base, **change)) == key(base)


@pytest.mark.parametrize("change", [{"tile_m": 64}, {"tile_n": 128}, {"tile_k": 32}, {"split_k": 2},
                                    {"raster": "column"}, {"group_m": 1}, {"index_width": 64},
                                    {"a_move": "staged"}, {"persistent": True}, {"cluster_m": 2}])
def test_what_the_check_reads_gives_another_check(change):
    base = default_plan(ggemm(), T, None, {})
    assert key(with_kernel(base, **change)) != key(base)


def test_another_shape_or_model_gives_another_check():
    base = default_plan(ggemm(), T, None, {})
    assert key(base, ggemm(K=511), {"K": 511}) != key(base)


def test_the_field_check_reads_no_other_schedule_field():
    """The modules the check runs (and the lowering's methods it calls) read only the fields the
    field table marks as read by the proof (FIELD_CHECK_FIELDS) or as changing the lowering, which
    the key compares whole (staging: a_move/b_move = staged); warps only in the SIMT path's thread
    grid (emission), and warps, mma and warp_specialized where the lowering builds a cluster split's
    reduction maps (`ContractionLowering.reduction`, part of the lowering the key compares whole). A new
    field read there must be marked so, and then joins the key."""
    from habu.plan.fields import Reader, fields_read_by

    read: set[str] = set()
    for path in ("habu/prove/interp.py", "habu/prove/verify.py", "habu/prove/witness.py", "habu/prove/virtual.py",
                 "habu/lower/contraction.py"):
        read |= set(re.findall(r"kernel\.([a-z_]+)", (ROOT / path).read_text()))
    contraction_fields = {f for f in ContractionKernel.__dataclass_fields__}
    marked = set(FIELD_CHECK_FIELDS) | set(fields_read_by(ContractionKernel, Reader.LOWERING))
    assert (read & contraction_fields) - marked == {"warps", "mma", "warp_specialized"}


def test_every_field_the_proof_reads_keys_the_check():
    """FIELD_CHECK_FIELDS is derived from the field table: a field marked as read by the proof
    cannot be missing from the key (two plans differing in it would share one certificate)."""
    from habu.plan.fields import Reader, fields_read_by, kernel_fields

    assert set(FIELD_CHECK_FIELDS) == set(fields_read_by(ContractionKernel, Reader.PROOF))
    base = default_plan(ggemm(), T, None, {})
    k = base.kernels[0]
    for kf in kernel_fields(ContractionKernel):
        if kf.spec is None or kf.spec.reader is not Reader.PROOF:
            continue
        value = getattr(k, kf.name)
        others = [v for v in kf.spec.allowed_values(kf.kind) if v != value] or \
            ([not value] if kf.kind is bool else [value // 2 if value > 1 else 2])
        assert key(with_kernel(base, **{kf.name: others[0]})) != key(base), kf.name


def test_a_search_task_checks_a_lowering_once(monkeypatch):
    import habu.prove.verify as verify
    from habu.search import tasks

    calls = []
    real = verify.verify_plan
    monkeypatch.setattr(verify, "verify_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(tasks, "FIELD_CHECKS", {})
    m = ggemm(M=256, N=256, K=128)
    sizes = {"M": 256, "N": 256, "K": 128}
    job = tasks.Job.of(str(ROOT / "examples" / "ggemm.habu"), m, sizes, "sm_90a")
    base = default_plan(m, T, sizes, {})
    first = tasks.check_candidate(job, base.to_json(), seed=1)
    again = tasks.check_candidate(job, with_kernel(base, stages=3).to_json(), seed=2)
    other = tasks.check_candidate(job, with_kernel(base, tile_n=base.kernels[0].tile_n // 2).to_json(), seed=3)
    assert [r["status"] for r in (first, again, other)] == ["verified"] * 3
    assert len(calls) == 2
    assert "the same check as an earlier plan" in again["certificate"]["notes"][-1]


def test_regression_compile_failure_after_a_shared_field_check_is_reported(monkeypatch):
    """A plan whose field check was shared with an earlier one, then refused by NVRTC, named a
    certificate it never made (UnboundLocalError) instead of reporting the compile failure."""
    from habu.search import tasks

    monkeypatch.setattr(tasks, "FIELD_CHECKS", {})
    m = ggemm(M=256, N=256, K=128)
    sizes = {"M": 256, "N": 256, "K": 128}
    job = tasks.Job.of(str(ROOT / "examples" / "ggemm.habu"), m, sizes, "sm_90a")
    base = default_plan(m, T, sizes, {})
    assert tasks.check_candidate(job, base.to_json(), seed=1)["status"] == "verified"

    def refuse(model, plan, lowered=None):
        raise RuntimeError("NVRTC: error: something the compiler refused")

    monkeypatch.setattr(tasks, "compile_plan", refuse)
    for plan, seed in ((with_kernel(base, stages=3), 2), (with_kernel(base, tile_n=base.kernels[0].tile_n // 2), 3)):
        out = tasks.check_candidate(job, plan.to_json(), seed=seed, compile_kernels=True)
        assert out["status"] == "compile" and "something the compiler refused" in out["reason"]
        assert out["certificate"]["passed"] and "compile" in out["seconds"]


def test_a_defect_while_checking_one_plan_is_reported_not_raised(monkeypatch):
    """An exception inside Habu while checking a candidate fails that candidate with the reason
    (the search records it and goes on) instead of ending the search."""
    import habu.lower as lower
    from habu.search import tasks

    def broken(model, plan):
        raise KeyError("an axis the lowering forgot")

    monkeypatch.setattr(tasks, "FIELD_CHECKS", {})
    monkeypatch.setattr(lower, "lower_whole", broken)
    m = ggemm(M=256, N=256, K=128)
    sizes = {"M": 256, "N": 256, "K": 128}
    job = tasks.Job.of(str(ROOT / "examples" / "ggemm.habu"), m, sizes, "sm_90a")
    out = tasks.check_candidate(job, default_plan(m, T, sizes, {}).to_json(), seed=1)
    assert out["status"] == "lost"
    assert "internal error while checking this plan: KeyError" in out["reason"]
    assert "an axis the lowering forgot" in out["reason"] and "test_tasks.py" in out["reason"]
