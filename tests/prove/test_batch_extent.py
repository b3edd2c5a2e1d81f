"""A batched product whose batch index runs over the extent of its m or n axis (`O[s q s2] = Σ k A[s2 q k]·B[k s2 s]`:
the batch s2 and n both over #S). Found by the variant fuzz in session 59 (model 15488's derived backward): the field
check built its sample box by extent, so O's batch dim took the n tiles' columns, and a right plan was refused
("O[0, 0, 2] was never written"); `habu compile --backward` of that model failed. The box now takes each dim's own
axis wherever one extent stands for several of the kernel's axes."""

from __future__ import annotations

import pytest

from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
DATA = ROOT / "tests" / "data" / "batch_over_a_tile_extent.habu"


@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}, {"tile": "64x64x32", "mma": "mma.sync"}])
@pytest.mark.parametrize("name", ["BATCH-N", "BATCH-M"])
def test_a_batch_over_the_extent_of_m_or_n_is_proven(name, pins):
    model = load_program(DATA).models[name]
    plan = default_plan(model, T, {}, pins)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, ([v.describe() for v in proof.violations], proof.certificate and proof.certificate.failure)


def test_a_batch_dim_written_to_the_wrong_place_still_fails():
    """The box follows the dims' own axes where the extents are ambiguous: a kernel that writes O's batch dim and
    n's dim swapped (both over #S) is still refused by the field check."""
    from dataclasses import replace

    from habu.lower import lower_plan
    from habu.prove.verify import verify_plan

    model = load_program(DATA).models["BATCH-N"]
    plan = default_plan(model, T, {}, {})
    (lw,) = lower_plan(model, plan)
    first, second = lw.out.positions[0], lw.out.positions[2]
    swapped = replace(lw, out=replace(lw.out, positions=(second, lw.out.positions[1], first)))
    assert verify_plan(model, plan, {}, trials=1, lowerings=[lw]).passed
    assert not verify_plan(model, plan, {}, trials=1, lowerings=[swapped]).passed
