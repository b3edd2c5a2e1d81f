"""Certificates bound to their plan, model and Habu version; guards that are the rules' own; re-proofs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.prove import prove, trust
from habu.prove.trust import PlanRefused, check_certificate, guard_mismatch, reprove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.version import __version__
from tests.conftest import ROOT

SHAPE = {"M": 512, "N": 512, "K": 256}


def ggemm(**sizes):
    return load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"].with_sizes(sizes or SHAPE)


def runtime_k_ggemm():
    text = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    from habu.spec.parser import parse_text

    return parse_text(text, "runtime_k.habu").models["GGEMM"]


@pytest.fixture(scope="module")
def proven():
    m = ggemm()
    plan = default_plan(m, TARGETS["sm_90a"], SHAPE)
    proof = prove(m, plan, SHAPE, trials=1)
    assert proof.ok
    return m, plan, proof


def test_a_certificate_records_the_plan_key_the_model_hash_and_the_habu_version(proven):
    m, plan, proof = proven
    c = proof.certificate
    assert (c.plan_key, c.model_hash, c.habu_version) == (plan.key, m.canonical_hash(), __version__)
    check_certificate(c.to_json(), plan, m)  # its own plan, model and version: accepted


@pytest.mark.parametrize("what", ["plan", "model", "version", "unbound", "failed"])
def test_a_certificate_presented_with_another_plan_model_or_version_is_refused(proven, what):
    m, plan, proof = proven
    cert = proof.certificate.to_json()
    other_plan, other_model, version = plan, m, __version__
    if what == "plan":
        k0 = plan.kernels[-1]
        other_plan = replace(plan, kernels=(*plan.kernels[:-1], replace(k0, stages=k0.stages + 1)))
    elif what == "model":
        other_model = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    elif what == "version":
        version = "0.0.9"
    elif what == "unbound":
        cert = {k: v for k, v in cert.items() if k not in trust.BINDING_FIELDS}
    else:
        cert = {**cert, "passed": False}
    with pytest.raises(PlanRefused, match="certificate"):
        check_certificate(cert, other_plan, other_model, version)


def test_reprove_names_the_rule_and_the_kernel_and_caches_a_passing_plan(proven, monkeypatch):
    m, plan, _ = proven
    calls = []
    monkeypatch.setattr(trust, "prove", lambda *a, **k: calls.append(1) or prove(*a, **k))
    trust._REPROVEN.clear()
    reprove(m, plan, SHAPE)
    reprove(m, plan, SHAPE)
    assert len(calls) == 1
    big = ggemm(M=600000, N=512, K=4096)
    wide = default_plan(big, TARGETS["sm_90a"], {"M": 600000, "N": 512})
    narrow = replace(wide, kernels=tuple(replace(k, index_width=32) if hasattr(k, "index_width") else k
                                         for k in wide.kernels))
    with pytest.raises(PlanRefused, match=r"breaks rule int32-offsets in kernel \d"):
        reprove(big, narrow, {"M": 600000, "N": 512, "K": 4096})


def test_guards_must_be_the_ones_the_rules_produce():
    m = runtime_k_ggemm()
    plan = default_plan(m, TARGETS["sm_90a"], {}, {"B": "tma"})
    proof = prove(m, plan, {}, trials=1)
    wanted = trust.guard_texts(proof.obligations)
    assert wanted  # a TMA operand with a runtime row length: valid only where K keeps it aligned
    assert guard_mismatch(replace(plan, guards=wanted), proof) is None
    assert "do not say" in guard_mismatch(plan, proof)  # deleted
    altered = replace(plan, guards=tuple(g.replace("8", "4") for g in wanted))
    assert "no rule produces" in guard_mismatch(altered, proof)
    # proven at a fixed K, the rules produce no guard; a declared guard that holds there is fine
    fixed = prove(m.with_sizes({"K": 512}), plan, {"K": 512}, trials=1)
    assert guard_mismatch(replace(plan, guards=wanted), fixed, lambda g: True) is None
    assert guard_mismatch(replace(plan, guards=wanted), fixed, lambda g: False) is not None
