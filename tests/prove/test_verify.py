"""The finite-field check: golden at K = 511 for many plans, witness shapes, certificates."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from habu.bench.mutants import MUTANTS, run_mutant
from habu.lower import lower_plan
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.prove.virtual import VirtualTensor, key_for
from habu.prove.witness import prove_coverage, split_classes, split_coverage, tiled_axes, witness_sizes
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import EXAMPLES, ROOT


def model_of(path: str, name: str, **sizes):
    m = load_program(ROOT / "examples" / path).models[name]
    return m.with_sizes(sizes) if sizes else m


def test_k511_every_sampled_legal_plan_passes_the_finite_field_check():
    """The golden half of the K = 511 case: legal plans (a seeded sample across the space) compute it
    (30 of them: 110 took two minutes of CI)."""
    m = model_of("ggemm.habu", "GGEMM", K=511)
    plans = list(itertools.islice(enumerate_plans(m, TARGETS["sm_90a"], {"K": 511}), 0, 250_000, 41))
    rng = random.Random(511)
    rng.shuffle(plans)
    legal = checked = 0
    for plan in plans:
        if failures(obligations(m, plan, {"K": 511})):
            continue
        legal += 1
        cert = verify_plan(m, plan, {"K": 511}, trials=1, seeds=[rng.randrange(2**62)])
        assert cert.passed, (plan.kernels[0], cert.failure)
        checked += 1
        if checked >= 30:
            break
    assert checked >= 30, f"only {checked} legal plans in the sample"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_default_plan_of_every_example_is_proven(path):
    for m in load_program(path).models.values():
        proof = prove(m, default_plan(m, TARGETS["sm_90a"]), trials=2)
        assert proof.ok, (m.name, [o.describe() for o in proof.violations], proof.certificate and proof.certificate.failure)


def test_certificate_records_seeds_and_bound():
    m = model_of("ggemm.habu", "GGEMM", M=300, N=200, K=511)
    plan = default_plan(m, TARGETS["sm_90a"], {"M": 300, "N": 200, "K": 511}, {"tile": "128x128x64"})
    cert = verify_plan(m, plan, {"M": 300, "N": 200, "K": 511}, trials=3, seeds=[11, 12, 13])
    assert cert.passed and cert.seeds == [11, 12, 13] and cert.prime == 2**31 - 1
    assert cert.degree == 2 and cert.bound <= (2 / (2**31 - 1)) ** 3
    assert cert.checked["O"] == 300 * 200  # every tile class of a 3x2 grid: all of it


def test_seeds_make_the_check_reproducible_and_fresh_seeds_differ():
    m = model_of("ggemm.habu", "GGEMM", M=64, N=64, K=64)
    plan = default_plan(m, TARGETS["sm_90a"], {"M": 64, "N": 64, "K": 64})
    a = verify_plan(m, plan, {"M": 64, "N": 64, "K": 64}, trials=2)
    b = verify_plan(m, plan, {"M": 64, "N": 64, "K": 64}, trials=2)
    assert a.passed and b.passed and a.seeds != b.seeds


def test_virtual_tensors_are_random_access_and_in_range():
    t = VirtualTensor("A", (1 << 20, 1 << 12), 2**31 - 1, key_for(5, "A"))
    offs = np.array([0, 1, (1 << 32) - 1, 12345678901])  # beyond 2^32 elements: no memory is used
    v = t.at(offs)
    assert ((v >= 0) & (v < 2**31 - 1)).all() and len(set(v.tolist())) == 4
    assert (t.at(offs) == v).all()
    idx = VirtualTensor("IX", (1000,), 37, key_for(5, "IX"), index=True).materialize()
    assert idx.min() >= 0 and idx.max() < 37 and len(np.unique(idx)) < 1000  # duplicates occur
    # the ends of the range are drawn often (1 in 16 each), the rest uniformly
    assert 30 < (idx == 36).sum() < 110 and 30 < (idx == 0).sum() < 110 and len(np.unique(idx)) == 37


def test_one_sided_k_mask_is_caught_in_every_trial():
    """Regression: A's unmasked k tail reads the next row, times B's masked zero: over GF(p) only
    the last row's read (past the tensor's end) shows, and a uniform random IX pointed at the last
    row of A in about 63% of trials, so the mutant survived seed 1."""
    mutant = next(x for x in MUTANTS if x.name == "k-tail-mask-on-one-operand")
    for seed in range(1, 9):
        out = run_mutant(mutant, trials=1, seeds=[seed])
        assert out.killed, (seed, out.message)
        assert "out of bounds" in out.message


def test_witness_keeps_tile_classes_and_z3_proves_it():
    m = model_of("ffn_skip.habu", "FFN-SKIP")
    plan = default_plan(m, TARGETS["sm_90a"])
    lws = lower_plan(m, plan)
    names = [f"k{i}" for i in range(len(lws))]
    full = dict(plan.shape)
    w = witness_sizes(m, names, lws, full)
    assert w["H"] < full["H"] and w["H"] % 128 == full["H"] % 128
    lines = prove_coverage(tiled_axes(names, lws), full, w)
    assert lines and all("unsat" in ln for ln in lines)


def test_witness_keeps_distinct_sizes_distinct():
    m = model_of("ggemm.habu", "GGEMM", M=4096, N=4000, K=511)
    plan = default_plan(m, TARGETS["sm_90a"], {"M": 4096, "N": 4000, "K": 511})
    lws = lower_plan(m, plan)
    w = witness_sizes(m, ["k0"], lws, {"M": 4096, "N": 4000, "K": 511})
    assert len({w["M"], w["N"], w["K"]}) == 3


def test_regression_a_runtime_extent_the_plan_fixes_reduces_in_the_witness():
    """A plan made for one size of a runtime extent (`default_plan(model, target, {"T": 4096, ...})` on the
    unbound model) narrows the extent to 4096..4096 (`planned_model`); the witness refused to reduce it as
    outside that range, so the MoE FFN was checked at R = 4096 in full: a 1.75 TiB reference evaluation
    (CI: MemoryError in test_regression_a_plans_kernels_compile_as_one_translation_unit[moe_mixtral])."""
    from habu.plan.rewrite import planned_model

    m = model_of("moe_mixtral.habu", "MOE-FFN")
    sizes = {"T": 4096, "R": 4096}
    plan = default_plan(m, TARGETS["sm_90a"], sizes)
    lws = lower_plan(m, plan)
    graph = planned_model(m, plan)
    assert graph.extent("R").lo == graph.extent("R").hi == 4096
    w = witness_sizes(graph, [f"k{i}" for i in range(len(lws))], lws, dict(plan.shape) | sizes)
    assert w["T"] < 4096 and w["R"] < 4096 and w["D"] < 4096, w


def test_split_k_witness_reduces_k_and_keeps_every_split_class():
    """Regression: split-K froze k at its full size, so each split-K candidate of the MoE search
    was checked over all of K = 4096 (about 1 s of the driver's proofs each, against 30 ms)."""
    m = model_of("ggemm.habu", "GGEMM", M=256, N=256, K=4160)
    shape = {"M": 256, "N": 256, "K": 4160}
    plan = default_plan(m, TARGETS["sm_90a"], shape, {"split_k": "4"})
    lws = lower_plan(m, plan)
    w = witness_sizes(m, ["k0"], lws, shape)
    assert w["K"] < 4160
    # 65 k tiles in splits of 17, 17, 17, 14: the last sums fewer; the witness keeps that class
    assert split_classes(4160, 64, 4) <= split_classes(w["K"], 64, 4)
    assert "split classes" in split_coverage(["k0"], lws, shape, w)[0]
    with pytest.raises(AssertionError, match="split of k"):  # 4 k tiles, one per split: none sums fewer
        split_coverage(["k0"], lws, shape, w | {"K": 256})
    cert = verify_plan(m, plan, shape, trials=1, seeds=[3], witness=True)
    assert cert.passed and cert.witness["K"] == w["K"], cert.failure
    assert any("split-K" in note for note in cert.notes)


def test_split_k_mutant_is_killed_at_the_witness_shape():
    mutant = next(x for x in MUTANTS if x.name == "split-k-partial-lost")
    out = run_mutant(mutant, trials=1, witness=True)
    assert out.killed, out.message


def test_a_wrong_witness_fails_the_coverage_proof():
    m = model_of("ggemm.habu", "GGEMM", M=300, N=200, K=511)
    plan = default_plan(m, TARGETS["sm_90a"], {"M": 300, "N": 200, "K": 511})
    lws = lower_plan(m, plan)
    with pytest.raises(AssertionError, match="class the witness lacks"):
        prove_coverage(tiled_axes(["k0"], lws), {"M": 300, "N": 200, "K": 511}, {"M": 256, "N": 200, "K": 511})


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_witness_keeps_an_even_count_of_tile_rows_for_a_cluster():
    """RMSNorm + Linear with clusters of 2 along m: T = 2048 was reduced to 384 (3 tiles of 128), where
    the raster check failed a correct plan; the cluster's 256 rows join the witness's lcm."""
    m = model_of("rmsnorm_linear.habu", "RMSNORM-LINEAR")
    plan = default_plan(m, TARGETS["sm_90a"], None, {"tile": "128x256x64", "stages": "3", "cluster": "2"})
    cert = verify_plan(m, plan, trials=1, seeds=[5])
    assert cert.passed, cert.failure
    assert cert.witness and -(-cert.witness["T"] // 128) % 2 == 0


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_habu_verify_accepts_a_kernel_set_member_with_its_guards_deleted(tmp_path):
    """A member of a checked kernel set (runtime #K, B by TMA: valid only where K keeps B's rows
    16-byte aligned) verified with its guards deleted or altered: refused, naming the guards."""
    import json
    import subprocess
    import sys

    from habu.compile import compile_model
    from habu.spec.parser import load_program as load

    src = tmp_path / "runtime_k.habu"
    src.write_text((ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K"))
    compiled = compile_model(load(src), "GGEMM", {}, TARGETS["sm_90a"], {"B": "tma"}, trials=1)
    member = compiled.plans[0].to_json()
    assert member["guards"]
    cases = {"intact": member["guards"], "deleted": [], "altered": [g.replace("8", "4") for g in member["guards"]]}
    for name, guards in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**member, "guards": guards}))
        r = subprocess.run([sys.executable, "-m", "habu", "verify", str(src), "--plan", str(path), "--trials", "1"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        if name == "intact":
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode == 1 and "error:" in r.stderr and "guards are not the ones its rules produce" in r.stderr
            assert "Traceback" not in r.stderr


def test_regression_a_rows_kernels_spare_row_slots_divided_by_unwritten_values():
    """`habu compile examples/families.habu --model SOFTMAX-NODES --shape R=17,C=17` failed: "the reference
    could not be evaluated: division by zero ... rerun with another seed", at every seed. The last rows
    kernel (Ps = %2 / %3, 4 rows a block) ran its last block's spare row slots 17..19, which the kernel leaves
    at once, and divided by %3 there, never written. The interpreter now runs only the rows the kernel does."""
    from habu.plan.plan import Plan
    from habu.prove import prove
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    model = load_program(ROOT / "examples" / "families.habu").models["SOFTMAX-NODES"]
    for n in (1, 17, 33):
        sizes = {"R": n, "C": n}
        m = model.with_sizes(sizes)
        data = default_plan(m, TARGETS["sm_90a"], sizes, {}).to_json()
        # one row kernel a node, as the default was then (it now keeps the max and the sum on chip)
        first = data["kernels"][0]
        data["kernels"] = [{**first, "nodes": [t]} for t in ("%1", "%2", "%3", "Ps")]
        data["storage"] = {"%1": "f32", "%2": "f32", "%3": "f32"}
        plan = Plan.from_json(data)
        proof = prove(m, plan, sizes, trials=1)
        assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]


DIVIDED_EPILOGUE = """
100 EXTENT: #M
128 EXTENT: #N
64 EXTENT: #K
bf16 TENSOR: A ( #M #K )
bf16 TENSOR: B ( #N #K )
f32 TENSOR: S ( #M )
f32 TENSOR: O ( #M #N )
MODEL: DIVEPI  O[m n] = (Σ k A[m k] · B[n k]) / S[m] ;
"""


@pytest.mark.parametrize("pins", [{}, {"mma": "mma.sync"}, {"mma": "fma"}])
def test_regression_an_epilogue_dividing_by_a_masked_load_aborted_the_check(pins):
    """`O[m n] = (Σ k A·B) / S[m]` at #M = 100 failed every proof with "division by zero ... rerun with another
    seed": the last row tile's lanes past row 99 read S as 0 (masked) and the interpreter's field division
    raised. The kernels' lanes now divide totally (0 for x/0, habu.prove.lane_arithmetic.LaneArithmetic); a lane that
    stores such a value still differs from the reference."""
    from habu.prove import prove
    from habu.search.space import default_plan
    from habu.target import TARGETS
    from tests.conftest import parse

    model = parse(DIVIDED_EPILOGUE).models["DIVEPI"]
    plan = default_plan(model, TARGETS["sm_90a"], None, pins)
    proof = prove(model, plan, None, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]


def test_a_lane_dividing_by_zero_where_it_stores_is_still_caught():
    """The total division does not hide a plan that divides by an unwritten or masked value at an element it
    stores: the stored 0 differs from the reference's quotient."""
    import numpy as np

    from habu.prove.lane_arithmetic import LaneArithmetic
    from habu.spec.field import PrimeField

    f = PrimeField(2147483647, 3)
    lanes = LaneArithmetic(f)
    a, b = np.array([5, 7]), np.array([0, 2])
    assert lanes.op("div", [a, b])[0] == 0 and lanes.op("div", [a, b])[1] == f.op("div", [a[1:], b[1:]])[0]
    assert lanes.p == f.p and lanes.max_point == f.max_point  # everything else is the field's


def test_regression_an_output_compared_over_a_widened_box_read_outside_the_reference():
    """`habu search examples/families.habu --model RMSNORM --backward --shape R=70,C=3` lost 53 candidates to
    "internal error ... read outside the evaluated box": the row kernel computing %s1 and dX ran every row
    (dW's Σ over rows reads all of %s1), dX was then compared over every row, but the reference had been
    evaluated over dX's sampled rows only. The reference's boxes are now taken after the widening."""
    from habu.cli_grad import backward_program
    from habu.plan.plan import Plan
    from habu.prove import prove
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    grad, name = backward_program(load_program(ROOT / "examples" / "families.habu"), "RMSNORM", None, "recompute")
    sizes = {"R": 70, "C": 3}
    model = grad.model(name).with_sizes(sizes)
    assert [eq.target for eq in model.nodes] == ["%s1", "dX", "dW"]
    plan = Plan.from_json({
        "format": 1, "model": name, "model_hash": model.canonical_hash(), "target": "sm_90a", "shape": sizes,
        "storage": {"%s1": "f32"}, "guards": [],
        "kernels": [
            {"kind": "rows", "nodes": ["%s1", "dX"], "rows_per_block": 4, "threads": 32, "vector": 1,
             "cache_row": True, "index_width": 32},
            {"kind": "columns", "nodes": ["dW"], "threads": 256, "column_threads": 4, "vector": 1,
             "rows_per_split": 70, "unroll": 8, "index_width": 32}]})
    proof = prove(model, plan, sizes, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else [v.describe() for v in proof.violations]


def _fuzz_backward(text: str):
    from habu.cli_grad import backward_program
    from habu.spec.parser import parse_text

    program, name = backward_program(parse_text(text, "fuzz.habu"), "FZ", None, "auto")
    model = program.model(name)
    return model, default_plan(model, TARGETS["sm_90a"], {}, {})


def test_regression_a_row_blocks_rows_outside_the_checked_box_read_per_row_values_the_check_had_not_computed():
    """Fuzz seed 9140: the backward of `Y[p] = max p3 max q4 Σ p5 X0[p3 q4 p5]` ends in a row kernel over rows (p, q),
    13 × 13 in blocks of 4, reading per-row values %h1[p]..%h3[p] of earlier kernels. The sampled box p ∈ {0, 12}
    put row (0, 12) in block 3, which also computes rows (1, 0)..(1, 2): they read %h1[1], which the check had not
    computed ("reads %h1[1], which no earlier kernel wrote"), and `habu compile --backward` refused a correct plan.
    The demand now covers every row of each block that holds a demanded row (`row_blocks_box`)."""
    from habu.prove.demand import row_blocks_box

    model, plan = _fuzz_backward("13 EXTENT: #P 13 EXTENT: #Q\nbf16 TENSOR: X0 ( #P #Q #P )\nf32 TENSOR: Y ( #P )\n"
                                 "MODEL: FZ  Y[p2] = (max p3 (max q4 (Σ p5 X0[p3 q4 p5]))) ;\n")
    assert plan.kernels[-1].kind == "rows" and plan.kernels[-1].rows_per_block == 4
    cert = verify_plan(model, plan, trials=1)
    assert cert.passed, cert.failure
    box = row_blocks_box((np.array([0, 12]), np.array([0, 12])), (13, 13), 4)
    assert {0, 1, 12} <= set(box[0].tolist()) and {0, 1, 2, 12} <= set(box[1].tolist())  # (0, 12)'s block: (1, 0)..
    flat = {p * 13 + q for p in box[0].tolist() for q in box[1].tolist()}
    assert all(r in flat for f in flat for r in range(f // 4 * 4, min(f // 4 * 4 + 4, 169)))  # closed under blocks
    assert [b.tolist() for b in row_blocks_box((np.array([2, 12]),), (13,), 4)] == [[0, 1, 2, 3, 12]]  # one axis too


def test_regression_the_witness_keeps_a_general_kernels_vectors_inside_rows():
    """Fuzz seed 9088: the backward's scatter `dX0[IX0[q] u q2] += dY[q2]·Th1[q2]` at #Q 100 moves vectors of 4
    along q2 (100 a multiple of 4: the `vector-align` size fact). The check ran it at a witness #Q of 33, where
    vectors crossed rows, and found the correct plan wrong. The witness now keeps the last extent's class modulo
    the vector."""
    from unittest import mock

    import habu.spec.grad as grad

    with mock.patch.object(grad, "HOIST_INVARIANTS", False):  # the backward as derived then (since session 60
        # its loop invariants are nodes and the witness keeps the whole #Q)
        model, plan = _fuzz_backward(
            "1 EXTENT: #P 100 EXTENT: #Q 100 EXTENT: #S 130 EXTENT: #U\nf32 TENSOR: X0 ( #U #U #Q )\n"
            "f32 TENSOR: X1 ( #Q #Q )\nf32 TENSOR: Y ( #Q )\nITENSOR: IX0 ( #Q #U )\nITENSOR: IX1 ( #Q #Q )\n"
            "MODEL: FZ  Y[q2] = tanh((Σ q3 ((Σ u4 X0[IX0[q3] u4 q2]) + (Σ u5 X1[q3 IX1[q2]])))) ;\n")
    vectored = [k for k in plan.kernels if k.kind == "general" and k.vector > 1]
    assert vectored
    lowerings = lower_plan(model, plan)
    names = [f"kernel {i}" for i in range(len(plan.kernels))]
    w = witness_sizes(model, names, lowerings, dict(plan.shape))
    assert w["Q"] < 100 and w["Q"] % vectored[0].vector == 0, w
    cert = verify_plan(model, plan, trials=1)
    assert cert.passed, cert.failure


def test_regression_a_column_kernels_whole_tiles_read_columns_a_sampled_earlier_column_kernel_left_out():
    """Fuzz (session 56, seed 13843's derived backward, a sampled variant): %h1 = max u X1[u p] on a column kernel
    of 16-column tiles, then %h2 = Σ u (1 − step(%h1[p] − X1[u p])) on one of a single 64-column tile. The check
    sampled %h1's tiles 0, 2 and 3, and %h2's tile read %h1 at columns 16..31: "kernel 2 (%h2) reads %h1[16],
    which no earlier kernel wrote", a correct plan refused. The demand now covers every column of each column tile
    that holds a demanded column."""
    from dataclasses import replace

    from habu.cli_grad import backward_program
    from habu.plan.plan import ColumnKernel
    from habu.spec.parser import parse_text
    from tests.random_models import random_model

    program, name = backward_program(parse_text(random_model(13843), "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    plan = default_plan(model, TARGETS["sm_90a"], {}, {})
    narrow = ColumnKernel(nodes=("%h1",), threads=256, column_threads=16, vector=1, rows_per_split=32, unroll=2,
                          index_width=32)
    wide = ColumnKernel(nodes=("%h2",), threads=256, column_threads=8, vector=8, rows_per_split=256, unroll=8,
                        index_width=32)
    kernels = tuple(narrow if k.nodes == ("%h1",) else wide if k.nodes == ("%h2",) else k for k in plan.kernels)
    assert narrow in kernels and wide in kernels
    variant = replace(plan, kernels=kernels)
    assert not failures(obligations(model, variant))
    cert = verify_plan(model, variant, None, 1)
    assert cert.passed, cert.failure
    assert cert.blocks["kernel 1 (%h1)"].startswith("column tiles [0, 1, 2, 3] of 4")


def test_regression_a_guarded_plan_was_field_checked_at_sizes_its_guards_exclude():
    """GGEMM over a runtime K with A by 16-byte cp.async vectors along k holds only where K is a multiple of 8 (a
    guard: the kernel set sends other sizes to its unguarded member). The field check ran it at the witness K = 401,
    where it never runs; its per-element masks hid what the kernel does there (the vector from k = 400 reads past
    A's end). Session 70: the interpreter reads vectors under their first element's mask, as the kernels do, and a
    guarded plan is checked at the nearest sizes its guards allow (K = 400)."""
    from habu.prove import field_check_sizes, prove
    from habu.search.space import default_plan
    from habu.spec.parser import parse_text
    from habu.target import TARGETS

    text = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    model = parse_text(text, "runtime_k.habu").models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_90a"], {}, {"B": "tma"})
    assert (plan.kernels[0].a_move, plan.kernels[0].a_vector) == ("cp.async", 8)
    proof = prove(model, plan, {}, trials=1)
    assert proof.guards and proof.ok, proof.certificate
    assert field_check_sizes(model, plan, {})["K"] == 401
    assert field_check_sizes(model, plan, {}, proof.guards)["K"] == 400
