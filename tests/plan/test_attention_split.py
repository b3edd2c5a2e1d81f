"""The unfused attention plan (rewrite attention:O, habu/plan/attention_split.py) of the examples:
scores (a batched contraction, then its scale and mask), the row statistics, the weights, the value
contraction; proven against the model as written, fully masked rows (zeros) included."""

from __future__ import annotations

import numpy as np

from habu.paths.emit import emit_plan
from habu.plan.rewrite import apply_rewrites, default_rewrites
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.field import PrimeField, evaluate_field
from habu.spec.parser import load_program
from habu.spec.reference import evaluate
from habu.target import TARGETS
from tests.conftest import ROOT

EX = ROOT / "examples"
SM90 = TARGETS["sm_90a"]
# more queries than keys: the first #I − #J queries see no key (fully masked rows)
PREFILL = {"B": 1, "G": 2, "R": 2, "I": 9, "J": 5, "E": 4, "D": 3}
DECODE = {"B": 3, "G": 1, "R": 2, "J": 7, "L": 8, "E": 4, "D": 3}


def prefill(sizes=PREFILL):
    return load_program(EX / "attention.habu").models["ATTENTION-GQA"].with_sizes(sizes)


def decode(sizes=DECODE):
    return load_program(EX / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(sizes)


def attention_ref(q, k, v, allowed):
    """numpy GQA attention on (b g r i e) queries and (b g j ·) keys/values; allowed: (b i j)."""
    s = np.einsum("bgrie,bgje->bgrij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(allowed[:, None, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = p.sum(-1, keepdims=True)
    return np.einsum("bgrij,bgjd->bgrid", p / np.where(den > 0, den, 1), v)


def test_the_prefill_example_takes_the_unfused_plan_and_it_is_proven_with_fully_masked_rows():
    model = prefill()
    plan = default_plan(model, SM90, PREFILL)
    assert plan.rewrites == ("attention:O", "split:O.s")
    kinds = [(k.kind, k.nodes) for k in plan.kernels]
    # (since session 63 the scores' mask and scale are the product's epilogue: habu/lower/conditions.py; since
    # session 64 the row kernel computes the mask of the row's sum and weights: habu/lower/rows.py)
    assert kinds == [("contraction", ("O.s.mm", "O.s")), ("rows", ("O.m", "O.l", "O.p")), ("contraction", ("O",))]
    proof = prove(model, plan, PREFILL, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate.failure
    src = "\n".join(k.source for k in emit_plan(model, plan, SM90).kernels)
    assert "habu::f_rcp0(" in src  # a fully masked row's weights are 0, not 0/0 (div0 as a · rcp0(b))


def test_regression_three_batch_indices_load_through_5d_tensor_maps():
    """The scores Q[b g r i e]·K[b g j e] of the example (wgmma, TMA): NVRTC refused its kernel, which
    called habu::tma_load_5d and tma_store_5d, missing from habu/memory/tma.cuh."""
    from habu.emit_cuda.nvrtc import compile_cuda

    model = load_program(EX / "attention.habu").models["ATTENTION-GQA"]
    plan = default_plan(model, SM90)
    assert plan.kernels[0].mma == "wgmma"
    scores = emit_plan(model, plan, SM90).kernels[0]
    assert "habu::tma_load_5d(" in scores.source
    compile_cuda(scores.source, scores.name, "sm_90a")


def test_regression_decode_with_empty_sequences_is_proven():
    """LEN[b] = 0 made the softmax divide 0 by 0: PrimeField refused the reference (issue 22). At
    #L = 1 every drawn length is 0, so every row of the check is fully masked."""
    for sizes in (DECODE, {**DECODE, "L": 1}):
        model = decode(sizes)
        plan = default_plan(model, SM90, sizes)
        cert = verify_plan(model, plan, sizes, trials=2, seeds=[11, 12])
        assert cert.passed, cert.failure


def test_a_rewrite_that_forgets_the_mask_on_the_weights_is_rejected():
    """The weights must keep the mask: over GF(p) exp(−∞ − m) is no 0 (the row max T.m of a masked row
    is the same either way, so only the check of the weights can see it)."""
    from dataclasses import replace

    from habu.lower import lower_plan
    from habu.spec.ir import Compare, Op, Reduce

    model = prefill()
    plan = default_plan(model, SM90, PREFILL)
    lowerings = lower_plan(model, plan)

    def unmask(e):
        if isinstance(e, Reduce):
            return Reduce(e.op, e.vars, unmask(e.body))
        if not isinstance(e, Op):
            return e
        if e.fn == "where" and isinstance(e.args[0], Compare):
            return unmask(e.args[1])
        return Op(e.fn, tuple(unmask(a) for a in e.args))

    at = next(i for i, k in enumerate(plan.kernels) if "O.l" in k.nodes)  # the row kernel of O.m, O.l, O.p
    lw = lowerings[at]
    lowerings[at] = replace(lw, nodes=tuple(replace(n, rhs=unmask(n.rhs)) if n.target == "O.l" else n
                                            for n in lw.nodes),
                            passes=tuple(unmask(p) for p in lw.passes))
    cert = verify_plan(model, plan, PREFILL, trials=1, seeds=[5], lowerings=lowerings)
    assert not cert.passed and "O[" in (cert.failure or "")


def test_float64_the_rewritten_model_and_numpy_agree_and_fully_masked_rows_are_zeros():
    rng = np.random.default_rng(3)
    model = prefill()
    b, g, r, i, j, e, d = (PREFILL[x] for x in "BGRIJED")
    q, k, v = rng.standard_normal((b, g, r, i, e)), rng.standard_normal((b, g, j, e)), rng.standard_normal((b, g, j, d))
    ii, jj = np.meshgrid(np.arange(i), np.arange(j), indexing="ij")
    allowed = np.broadcast_to(jj <= ii + j - i, (b, i, j))
    ins = {"Q": q, "K": k, "V": v}
    got = evaluate(model, ins)["O"]
    rewritten = apply_rewrites(model, default_rewrites(model))
    np.testing.assert_allclose(evaluate(rewritten, ins)["O"], got, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, attention_ref(q, k, v, allowed), rtol=1e-12, atol=1e-12)
    assert np.all(got[..., : i - j, :] == 0) and not np.isnan(got).any()

    dm = decode()
    lens = np.array([7, 0, 3])
    q, k, v = rng.standard_normal((3, 1, 2, 4)), rng.standard_normal((3, 1, 7, 4)), rng.standard_normal((3, 1, 7, 3))
    out = evaluate(dm, {"Q": q, "K": k, "V": v, "LEN": lens})["O"]
    want = attention_ref(q[:, :, :, None], k, v, np.arange(7)[None, None, :] < lens[:, None, None])[:, :, :, 0]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    assert np.all(out[1] == 0)


def test_gf_p_a_fully_masked_row_is_zero_not_a_division_error():
    f = PrimeField(2147483647, 1)
    model = decode({**DECODE, "B": 1, "L": 1})  # LEN[0] = 0: every key masked
    rng = np.random.default_rng(0)
    ins = {t.name: (np.zeros(1, np.int64) if t.is_index else f.random(rng, tuple(DECODE[x] if x != "B" else 1
                                                                              for x in t.extents)))
           for t in model.inputs}
    assert np.all(evaluate_field(model, ins, f)["O"] == 0)


def test_div0_is_callable_and_zero_where_the_divisor_is_zero():
    from habu.spec.parser import parse_text

    text = "3 EXTENT: #N TENSOR: A ( #N ) TENSOR: B ( #N ) TENSOR: Y ( #N ) MODEL: T Y[n] = div0(A[n], B[n]) ;"
    m = next(iter(parse_text(text, "t.habu").models.values()))
    got = evaluate(m, {"A": np.array([1.0, 2.0, 3.0]), "B": np.array([2.0, 0.0, 3.0])})["Y"]
    np.testing.assert_array_equal(got, [0.5, 0.0, 1.0])
    f = PrimeField(2147483647, 1)
    y = evaluate_field(m, {"A": np.array([1, 2, 3]), "B": np.array([2, 0, 3])}, f)["Y"]
    assert y[1] == 0 and y[2] == 1 and y[0] * 2 % f.p == 1


def test_regression_a_pinned_attention_rewrite_left_the_scores_a_scalar_general_kernel():
    """`--pin rewrite=attention:O` (the unfused plan, `attention_speed`'s `short-…-unfused` cases) took that
    rewrite alone: the scores `where(…, Σ e Q·K·s, −∞)` stayed one node no contraction family takes, a general
    kernel with a loop over e for each score (session 64). The pinned rewrites are followed by the splits that
    apply after them, as a default's are."""
    model = prefill()
    plan = default_plan(model, SM90, PREFILL, {"rewrite": "attention:O"})
    assert plan.rewrites == ("attention:O", "split:O.s")
    assert plan.kernels[0].kind == "contraction" and plan.kernels[0].nodes[0] == "O.s.mm"
