"""The decode benchmark's CPU side: every variant is a plan of its case that differs from the default,
the floor is the weights' bytes over the copy bandwidth, and a failing variant is a row of the table
(only a failing default fails the run)."""

from __future__ import annotations

import pytest

from habu.bench.decode_speed import CASES, Case, floor_us, report, variant_plan, weight_bytes


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_variant_is_another_plan_of_its_case(case):
    default = variant_plan(case, {})
    plans = {name: variant_plan(case, pins) for name, pins in case.variants.items()}
    assert all(p.kernels != default.kernels for p in plans.values())
    assert len({p.kernels for p in plans.values()}) == len(plans)  # no two variants alike


def test_the_floor_is_the_weights_over_the_copy_bandwidth():
    ffn = next(c for c in CASES if c.name == "ffn-skip-16")
    assert weight_bytes(ffn) == 2 * 4096 * 14336 * 2
    assert floor_us(weight_bytes(ffn)) == pytest.approx(55.66, abs=0.01)  # the 55 µs
    ggemm = next(c for c in CASES if c.name.startswith("ggemm"))
    assert floor_us(weight_bytes(ggemm)) == pytest.approx(7.95, abs=0.01)


def test_a_failing_variant_is_a_row_and_only_a_failing_default_fails_the_run():
    case = Case("ggemm-64x4096x4096", "ggemm.habu", "GGEMM", {"M": 64, "N": 4096, "K": 4096}, ("B",))
    good = {"case": case.name, "variant": "default", "plan": "wgmma 64x64 s14 k4", "us": 10.0,
            "exact": "bit-exact", "golden": {"rel_error": 1e-7}}
    bad = {"case": case.name, "variant": "split 8", "plan": "wgmma 64x64 s14 k8", "error": "not proven: smem"}
    base = {(case.name, "cuBLAS pre-gathered"): {"us": 12.0}, (case.name, "torch.compile"): {"error": "no"}}
    text, ok = report([case], [good, bad], base, 4.2e12)
    assert ok
    assert "FAILED: not proven: smem" in text and "1.20" in text and "79.5%" in text
    text, ok = report([case], [dict(bad, variant="default")], base, 4.2e12)
    assert not ok


def test_variants_are_selected_by_parts_of_their_names_and_the_default_always_runs():
    from habu.bench.decode_speed import select_variants

    ggemm = next(c for c in CASES if c.name.startswith("ggemm"))
    picked = select_variants(ggemm, ["cluster", "default before"])
    assert picked.variants and set(picked.variants) <= set(ggemm.variants)
    assert all("cluster" in k or "default before" in k for k in picked.variants)
    assert select_variants(ggemm, ["no such variant"]).variants == {}


def test_profiling_an_unknown_variant_is_an_error_line_not_a_traceback(capsys):
    from habu.bench.decode_speed import main

    assert main(["--profile", "ggemm-64x4096x4096:no such variant"]) == 1
    assert "error: no variant" in capsys.readouterr().err
