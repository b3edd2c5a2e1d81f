"""The general-vs-specialised benchmark (habu.bench.general_vs_specialised): on the CPU, its five models
take five different specialised families, the pinned general plans are what they say and both plans of
every model are proven (rules and the finite-field check); its table marks a failed check. The timing
itself is a GPU run: `python -m habu.bench.general_vs_specialised` (and the gpu test below)."""

from __future__ import annotations

import pytest

from habu.bench.general_vs_specialised import MODELS, checked, plans, table
from habu.prove import prove


def test_each_model_is_one_family_and_its_general_plan_is_the_fallback():
    kinds = {}
    for name in MODELS:
        (_, _, _, specialised), (family, _, model, general) = plans(name, "sm_90a")
        kinds[name] = tuple(k.kind for k in specialised.kernels)
        assert family == "general" and [k.kind for k in general.kernels] == ["general"] * len(model.nodes)
        assert [k.nodes for k in general.kernels] == [(eq.target,) for eq in model.nodes]
    assert set(kinds.values()) == {("contraction",), ("rows",), ("columns",), ("map",)}


@pytest.mark.parametrize("name", MODELS)
def test_both_plans_of_the_model_are_proven(name):
    for _, _, model, plan in plans(name, "sm_90a"):
        proof = prove(model, plan, {}, trials=1)
        assert proof.ok, (name, plan.kernels, proof.violations[:1], proof.certificate)


def test_the_table_prints_the_ratio_and_marks_a_failed_check():
    ok = {"exact": {"ok": True, "applicable": True}, "golden": {"O": {"ok": True, "rel_error": 1e-6}}}
    rows = [{"model": "GGEMM", "family": "specialised", "kernels": ["contraction"], "bytes": 10**9, "us": 20.0, **ok},
            {"model": "GGEMM", "family": "general", "kernels": ["general"], "bytes": 10**9, "us": 500.0, **ok},
            {"model": "RMSNORM", "family": "specialised", "kernels": ["rows"], "bytes": 10**9, "us": 30.0, **ok},
            {"model": "RMSNORM", "family": "general", "kernels": ["general"], "bytes": 10**9,
             "exact": {"ok": False, "applicable": True, "summary": "Y[3, 4] is 2.0, the reference 1.0"}}]
    text = table(rows)
    assert "25.0x" in text and "FAILED" in text.splitlines()[2] and "Y[3, 4]" in text
    assert not checked(rows[3]) and checked(rows[0])


@pytest.mark.gpu
def test_the_benchmark_checks_and_times_both_plans_of_a_model(tmp_path):
    """On the device: the bias gradient's two plans pass the exact check and the golden, and are timed."""
    pytest.importorskip("torch")
    from habu.bench.general_vs_specialised import main

    assert main(["--models", "BIAS-GRAD", "--json", str(tmp_path / "out.json")]) == 0
