"""`habu compile` of a model with a bucketed runtime extent: one plan per size bucket, each made for
its bucket's widths and proven for exactly those (its `ranges`), dispatched from the same grid."""

from __future__ import annotations

from pathlib import Path

import pytest

from habu.compile import compile_model, kernel_set
from habu.emit_cuda.buckets import BucketedKernelSet
from habu.plan.buckets import BucketGrid, cell_ranges
from habu.prove import prove
from habu.prove.obligation import context
from habu.spec.parser import load_program
from habu.target import target_named

ROOT = Path(__file__).resolve().parents[1]
RMSNORM = ROOT / "examples" / "rmsnorm.habu"


@pytest.fixture(scope="module")
def compiled():
    program = load_program(RMSNORM)
    return compile_model(program, "RMSNORM-ROWS", {}, target_named("sm_90a"), {}, trials=1)


def test_rmsnorm_compiles_to_one_proven_plan_per_bucket(compiled):
    grid = BucketGrid.of(compiled.model)
    assert compiled.grid == grid and len(grid) == 9
    assert [p.ranges for p in compiled.plans] == [cell_ranges(c) for c in grid.cells()]
    for plan, proof in zip(compiled.plans, compiled.proofs, strict=True):
        assert proof.ok and proof.plan is plan and not plan.guards
        assert "D" not in dict(plan.shape)  # the width stays a runtime extent, within the bucket
        lo, hi = plan.ranges[0][1:]
        assert proof.certificate is not None and proof.certificate.plan_key == plan.key
        # the rules were proven over the bucket's widths, no others
        domain = " ".join(d.sexpr() for d in context(compiled.model, plan).domain)
        assert f"(>= D {lo})" in domain and f"(<= D {hi})" in domain
    # the buckets' schedules differ: a warp per row for short rows, more threads for long ones
    threads = [p.kernels[0].threads for p in compiled.plans]
    assert threads[0] == 32 and threads[-1] >= 512 and len(set(threads)) >= 4


def test_kernel_set_files_each_plan_under_its_bucket(compiled):
    ks = kernel_set(compiled, [p.key for p in compiled.plans])
    assert isinstance(ks, BucketedKernelSet)
    for d, i in ((256, 0), (512, 1), (768, 2), (4096, 4), (4352, 5), (65536, 8)):
        assert ks.select({"R": 8192, "D": d}) == compiled.plans[i].key


def test_a_bucket_plan_is_proven_for_its_bucket_only(compiled):
    """The widest bucket's plan (512 threads) keeps its proof within 33024..65536; proven over the
    first bucket's widths instead, its ranges say so and the proof is another (the plan key differs)."""
    from dataclasses import replace

    wide = compiled.plans[-1]
    moved = replace(wide, ranges=(("D", 256, 256),))
    assert moved.key != wide.key
    proof = prove(compiled.model, moved, trials=1)
    assert proof.certificate is not None and proof.certificate.plan_key == moved.key
    with pytest.raises(ValueError, match="not within its declared range"):
        prove(compiled.model, replace(wide, ranges=(("D", 128, 256),)), trials=1)


def test_a_given_width_compiles_one_plan_without_buckets():
    program = load_program(RMSNORM)
    c = compile_model(program, "RMSNORM-ROWS", {"D": 4096}, target_named("sm_90a"), {}, trials=1)
    assert c.grid is None and len(c.plans) == 1 and not c.plans[0].ranges


def test_report_lists_the_buckets(compiled):
    from habu.compile import report

    text = report(compiled.model, compiled.plans, compiled.proofs)
    assert "## Size buckets" in text and "| #D in 4352..8192 | 6 |" in text
    assert "## Plan 9 of 9" in text and "for #D in 33024..65536" in text


def test_each_bucket_keeps_its_rows_in_registers_sized_for_its_widest(compiled):
    for plan, proof in zip(compiled.plans, compiled.proofs, strict=True):
        (_, lo, hi), = plan.ranges
        lw = proof.lowered.kernels[0]
        assert lw.width_range == (lo, hi)
        chunks = lw.register_chunks({"R": 8192, "D": lo})
        assert chunks > 0 and chunks == lw.register_chunks({"R": 8192, "D": hi})  # one count for the bucket
        assert chunks * plan.kernels[0].threads * plan.kernels[0].vector >= hi


def test_regression_a_runtime_width_over_more_than_a_factor_of_two_is_not_kept_in_registers_at_any_size():
    """The finite-field check (a concrete witness width) once lowered such a row into registers where the
    witness split evenly, while the emitter (the width a symbol) printed the shared-memory row."""
    from habu.lower.rows import lower_rows

    m = load_program(RMSNORM).model("RMSNORM-ROWS")  # 256..65536: no bound
    kernel = compile_model(load_program(RMSNORM), "RMSNORM-ROWS", {"D": 4096}, target_named("sm_90a"), {},
                           trials=1).plans[0].kernels[0]
    lw = lower_rows(m, kernel)
    assert lw.width_range == (256, 65536) and lw.register_chunks({"R": 8192, "D": 4096}) == 0


def test_a_register_row_sized_below_its_bucket_fails_the_field_check(compiled):
    """The finite-field check reads the bound the registers are sized for: a row one chunk-block short
    of its bucket's widest leaves columns of a wide row unread and unwritten."""
    from dataclasses import replace

    from habu.lower import lower_whole
    from habu.prove.verify import verify_plan

    plan = compiled.plans[5]  # 4352..8192, 256 threads × 8: 4 chunks a thread
    lowered = lower_whole(compiled.model, plan)
    short = [replace(lw, width_range=(4352, 8192 - 2048)) for lw in lowered.kernels]
    good = verify_plan(compiled.model, plan, {"R": 64, "D": 8192}, trials=1, lowerings=list(lowered.kernels))
    bad = verify_plan(compiled.model, plan, {"R": 64, "D": 8192}, trials=1, lowerings=short)
    assert good.passed and not bad.passed


def test_regression_the_exact_check_reaches_every_bucket_not_only_those_near_512(compiled):
    """`habu.build`'s exact check looked for shapes near 512 only: six of nine buckets were reached."""
    from habu.timing.exact import witness_sizes

    ks = kernel_set(compiled, list(range(len(compiled.plans))))
    starts = {axis[0].extent: [b.lo for b in axis] for axis in compiled.grid.axes}
    found = witness_sizes(compiled.model, ks.index, len(ks.members), buckets=starts)
    assert sorted(found) == list(range(9))
    assert [found[i]["D"] for i in range(9)] == [p.ranges[0][1] for p in compiled.plans]
    assert len(witness_sizes(compiled.model, ks.index, len(ks.members))) < 9


def test_export_guards_each_bucket_member_by_its_range(compiled):
    from habu.emit_cuda.launcher_c import guard_c
    from habu.export import _members

    members = _members(compiled, target_named("sm_90a"))
    assert [m[0] for m in members] == [(f"{lo} <= D", f"D <= {hi}") for (_, lo, hi), in (p.ranges for p in compiled.plans)]
    assert guard_c(members[5][0][0], {}) == "((4352 <= D))"


def test_regression_an_m_major_a_over_a_runtime_m_falls_back_to_mma_sync():
    """`A[k m]` with `1..192 EXTENT: #M`: the default reads A m-major by TMA on wgmma, valid where M·2 bytes is a
    multiple of 16 (a guard); its unguarded member (TMA off) broke `supported-path` (wgmma reads an m-major A only by
    TMA), and compile refused the model ("no plan ... is valid for every size"; session 68's fuzz of products with a
    runtime M, a seventh of them). The unguarded member is now the mma.sync default (ldmatrix.trans), proven."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text
    from habu.target import target_named

    text = ("1..192 EXTENT: #M 128 EXTENT: #N 64 EXTENT: #K\nbf16 TENSOR: A ( #K #M )  bf16 TENSOR: W ( #N #K )\n"
            "f32 TENSOR: P ( #M )  bf16 TENSOR: Y ( #M #N )\nMODEL: FZ  Y[m n] = (abs(Σ k A[k m] · W[n k])) · P[m] ;\n")
    compiled = compile_model(parse_text(text, "fz.habu"), "FZ", {}, target_named("sm_90a"), {}, 1)
    guarded, unguarded = compiled.plans
    assert guarded.guards and guarded.kernels[0].mma == "wgmma"
    assert not unguarded.guards and unguarded.kernels[0].mma == "mma.sync"
    assert all(p.ok for p in compiled.proofs)


def test_regression_a_scatter_product_over_a_runtime_n_has_an_unguarded_member():
    """`Y[IS[m] n] += Σ k A[m k] · W[k n]` with `1..256 EXTENT: #N` (session 68's fuzz, product 147): the wgmma plan
    reads W n-major by TMA under a guard; the alternative that `--pin mma=mma.sync` gave kept the wgmma kernel's
    swizzle and movement (a scatter's region is not a "contraction" region, so the pin only renamed the
    instruction), a plan `supported-path` refused. The pin now makes the path's own default kernel there."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text
    from habu.target import target_named

    text = ("64 EXTENT: #M 1..256 EXTENT: #N 511 EXTENT: #K 256 EXTENT: #S\nbf16 TENSOR: A ( #M #K )\n"
            "bf16 TENSOR: W ( #K #N )  f32 TENSOR: Y ( #S #N )  ITENSOR: IS ( #M #S )\n"
            "MODEL: FZ  Y[IS[m] n] += Σ k A[m k] · W[k n] ;\n")
    compiled = compile_model(parse_text(text, "fz.habu"), "FZ", {}, target_named("sm_90a"), {}, 1)
    assert len(compiled.plans) == 2 and not compiled.plans[1].guards and all(p.ok for p in compiled.proofs)
    assert compiled.plans[1].kernels[0].mma != "wgmma"


def test_regression_a_product_gathered_on_its_reduction_over_a_runtime_n_has_an_unguarded_member():
    """`DW[k n] = Σ m A[IX[m] k] · DY[m n]` over `1..64 EXTENT: #N` (session 68's fuzz: the derived backwards of
    random products 5, 47, 50, 93 over a runtime N): the default stages A (a pass gathers its rows) and reads DY by
    TMA where N·2 bytes is a multiple of 16. Neither the fallback (wgmma reads an n-major B only by TMA) nor the
    mma.sync default (which read no staged operand) held for every N: compile refused the model. The mma.sync path
    now reads a staged operand's buffer (cp.async, or ldg at vector 1), and the fallback keeps the staging."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text
    from habu.target import target_named

    path = ROOT / "tests" / "data" / "k_gathered_runtime.habu"
    compiled = compile_model(parse_text(path.read_text(), str(path)), "K-GATHERED-RUNTIME", {},
                             target_named("sm_90a"), {}, 1)
    guarded, unguarded = compiled.plans
    assert guarded.guards and guarded.kernels[0].mma == "wgmma" and guarded.kernels[0].a_move == "staged"
    (k,) = unguarded.kernels
    # (only DY's movement falls back, the guards naming DY alone: the staged A keeps its 16-byte cp.async vectors at
    # M = 190, its buffer's padding zeros since session 70; session 69's pairs ended at M)
    assert not unguarded.guards and (k.mma, k.a_move, k.b_move, k.a_vector) == ("mma.sync", "staged", "ldg", 8)
    assert all(p.ok for p in compiled.proofs)


def test_the_operand_fallback_resets_only_the_operands_its_guards_name():
    """`operand_fallback` (session 69): the mma.sync plan of tests/data/k_gathered_runtime.habu is guarded on DY's
    rows alone (cp.async of 16 bytes where N is a multiple of 8), so only B falls back to scalar loads; `fallback`
    resets both operands."""
    from habu.search.space import default_plan
    from habu.unguarded import fallback, operand_fallback

    path = ROOT / "tests" / "data" / "k_gathered_runtime.habu"
    model = load_program(path).models["K-GATHERED-RUNTIME"]
    plan = default_plan(model, target_named("sm_90a"), {}, {"mma": "mma.sync"})
    proof = prove(model, plan, {}, trials=1)
    assert {o.tensor for o in proof.guards} == {"DY"}, [o.detail for o in proof.guards]
    (k,) = plan.kernels
    (finer,), (coarse,) = operand_fallback(model, plan, proof).kernels, fallback(plan, proof).kernels
    assert (finer.a_move, finer.a_vector, finer.b_move, finer.b_vector) == (k.a_move, k.a_vector, "ldg", 1)
    assert (coarse.a_vector, coarse.b_move, coarse.b_vector) == (1, "ldg", 1)


def test_regression_an_unguarded_member_takes_each_failing_kernel_from_another_path():
    """Random product 106's derived backward over a runtime N (session 68's fuzz): dW's wgmma kernel needs a guard
    (DY's TMA rows) and its fallback breaks `supported-path`; the whole mma.sync plan breaks it in another kernel
    (an A gathered along its contiguous axis), and the SIMT plan then broke it in dW (no staged operand: it reads one
    now, and holds whole, every product on the SIMT path). The unguarded member is the default plan with dW's
    kernel from the mma.sync plan (`_per_kernel`), the other kernels as they were, proven whole."""
    from habu.cli_grad import backward_program
    from habu.compile import compile_model
    from habu.spec.parser import parse_text
    from habu.target import target_named

    text = ("511 EXTENT: #M 1..16 EXTENT: #N 511 EXTENT: #K 511 EXTENT: #T\nbf16 TENSOR: A ( #K #T )\n"
            "bf16 TENSOR: W ( #N #K )  bf16 TENSOR: Y ( #M #N )  ITENSOR: IX ( #M #T )\n"
            "MODEL: FZ  Y[m n] = sigmoid(Σ k A[k IX[m]] · W[n k]) ;\n")
    program, name = backward_program(parse_text(text, "fz.habu"), "FZ", None, "auto")
    compiled = compile_model(program, name, {}, target_named("sm_90a"), {}, 1)
    guarded, unguarded = compiled.plans
    assert all(p.ok for p in compiled.proofs) and not unguarded.guards
    assert [k.nodes for k in unguarded.kernels] == [k.nodes for k in guarded.kernels]
    for g, u in zip(guarded.kernels, unguarded.kernels, strict=True):
        if u.nodes == ("dW",):
            assert (g.mma, u.mma) == ("wgmma", "mma.sync") and "staged" in (u.a_move, u.b_move)
        else:
            assert u == g  # (the first, a SIMT kernel, the mma.sync plan could not have given)


def test_regression_a_staged_product_over_a_runtime_n_keeps_its_wgmma_kernel_unguarded():
    """GGEMM at K = 511 over `1..200 EXTENT: #N`: the default stages both operands and stores by TMA where N·4 bytes
    is a multiple of 16. Its fallback kept the TMA store (still guarded) and dropped the staging, so the unguarded
    member was the mma.sync plan loading one element at a time; it is now the same wgmma kernel, still staged,
    storing from its registers (`_direct_stores`, session 69)."""
    path = ROOT / "tests" / "data" / "staged_runtime_n.habu"
    compiled = compile_model(load_program(path), "STAGED-RUNTIME-N", {}, target_named("sm_90a"), {}, 1)
    guarded, unguarded = compiled.plans
    (g,), (u,) = guarded.kernels, unguarded.kernels
    assert guarded.guards and (g.mma, g.a_move, g.b_move, g.store) == ("wgmma", "staged", "staged", "tma")
    assert not unguarded.guards and (u.mma, u.a_move, u.b_move, u.store) == ("wgmma", "staged", "staged", "direct")
    assert all(p.ok for p in compiled.proofs)


def test_regression_a_guard_on_the_output_alone_reset_both_operands_to_element_loads():
    """tests/data/output_guard_runtime_n.habu: the default's one guard is on Y (a TMA store's rows, N·4 bytes a
    multiple of 16). `operand_fallback` took a guard on neither operand for one on both, and the unguarded member
    read A and B by ldg one element at a time (session 70: 4096² × 4096 at a ragged N would have run ~10x slower).
    Now its operands keep their TMA loads and Y is stored from the registers; proven for every N."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text
    from habu.target import target_named

    path = ROOT / "tests" / "data" / "output_guard_runtime_n.habu"
    compiled = compile_model(parse_text(path.read_text(), str(path)), "OUTPUT-GUARD", {}, target_named("sm_90a"),
                             {}, 1)
    guarded, unguarded = compiled.plans
    assert guarded.guards and guarded.kernels[0].store == "tma"
    (k,) = unguarded.kernels
    assert not unguarded.guards and (k.mma, k.a_move, k.b_move, k.store) == ("wgmma", "tma", "tma", "direct"), k
    assert all(p.ok for p in compiled.proofs)
