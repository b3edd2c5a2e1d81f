"""The weight-gradient bench's models and its torch baseline agree on the CPU: each form parses, its float64
meaning equals the baseline's per-expert products of the same arrays, and its default plan is the grouped
weight-gradient kind (the GPU run is the bench itself)."""

from __future__ import annotations

import numpy as np
import pytest

from habu.bench.wgrad_speed import FORMS, TOPK, torch_loop
from habu.lower import GroupedWgradLowering, lower
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.spec.reference import evaluate
from habu.target import TARGETS


class _Rows(np.ndarray):
    """A float64 array whose `.bfloat16()` and `.float()` are itself (torch's casts, for the baseline's loop)."""

    def bfloat16(self):
        return self

    def float(self):
        return self


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_each_form_means_what_the_expert_loop_computes(form):
    tokens, d, h, experts = 6, 16, 24, 3
    model = parse_text(form.model_text(tokens, d, h, experts), "wgrad.habu").models[form.name.upper()]
    rng = np.random.default_rng(0)
    rows = tokens * TOPK
    ext = {"D": d, "H": h}
    a = rng.integers(-3, 4, (tokens if form.a_gathered else rows, ext[form.m])).astype(np.float64)
    b = rng.integers(-3, 4, (rows if form.a_gathered else tokens, ext[form.n])).astype(np.float64)
    ix = rng.integers(0, tokens, rows)
    e = np.sort(rng.integers(0, experts, rows))
    p = rng.integers(1, 4, rows).astype(np.float64)
    o = rng.integers(-3, 4, (experts, ext[form.m], ext[form.n])).astype(np.float64)
    want = evaluate(model, {**form.inputs(a, b, ix, e, p), "O": o.copy()})["O"]
    bounds = [0, *np.cumsum(np.bincount(e, minlength=experts)).tolist()]
    got = torch_loop(form, a.view(_Rows), b.view(_Rows), ix, p, bounds, o.copy().view(_Rows))
    np.testing.assert_array_equal(np.asarray(got), want)
    plan = default_plan(model, TARGETS["sm_90a"], {})
    (k,) = plan.kernels
    assert k.kind == "grouped" and k.main_loop == "wgmma"
    assert isinstance(lower(model, k), GroupedWgradLowering)
