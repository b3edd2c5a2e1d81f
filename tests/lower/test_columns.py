"""The column family (`G[n] = Σ r dY[r n]`, max, elementwise bodies): the patterns send leading-axis
reductions to it, its default proves and passes the finite-field check over odd, one-element and
runtime shapes, every rule of its own refuses what it must (named), and NVRTC compiles what it prints."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from habu.errors import HabuError
from habu.lower import ColumnLowering, lower_plan, lower_whole
from habu.paths import path_for
from habu.paths.emit import emit_plan
from habu.plan.patterns import as_column_reduction, default_regions
from habu.plan.plan import ColumnKernel, Plan
from habu.prove import prove
from habu.prove.rules import failures, guards, obligations
from habu.prove.verify import verify_plan
from habu.search.cost import plan_cost
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]


def column_model(r: str, n: str, rhs: str = "Σ r dY[r n]", dtype: str = "bf16", out: str = "f32",
                 extra: str = ""):
    text = (f"{r} EXTENT: #R  {n} EXTENT: #N\n{dtype} TENSOR: dY ( #R #N )  f32 TENSOR: X ( #R #N )\n"
            f"f32 TENSOR: S ( #N )  f32 TENSOR: W ( #R )  {out} TENSOR: G ( #N )\n{extra}"
            f"MODEL: COLS  G[n] = {rhs} ;\n")
    return parse_text(text, "cols.habu").models["COLS"]


def plan_of(model, pins=None, sizes=None) -> Plan:
    return default_plan(model, TARGET, sizes or {}, pins or {})


def test_bias_grad_example_compiles_to_the_column_path_by_default():
    model = load_program(ROOT / "examples" / "bias_grad.habu").models["BIAS-GRAD"]
    assert [r.kind for r in default_regions(model)] == ["columns"]
    plan = plan_of(model)
    (k,) = plan.kernels
    assert isinstance(k, ColumnKernel) and path_for(k).name == "columns"
    assert (k.vector, k.column_threads, k.threads) == (8, 32, 256)
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "habu::load_packed<16>(p_dY" in kernel.source and "habu::atomic_add_f(p_G" in kernel.source
    assert kernel.zero == ("G",)  # the splits add into a zeroed output
    assert Plan.from_json(json.loads(plan.dumps())) == plan


def test_the_default_for_the_speed_shape_fills_one_wave_with_16_byte_loads():
    """8192 × 14336 bf16 → f32: 56 column tiles of 256 columns × 9 row splits (504 blocks, under 4 an SM of
    the H200's 132), 8 rows of 16-byte loads in flight a thread."""
    model = column_model("8192", "14336")
    (k,) = plan_of(model).kernels
    (lw,) = lower_plan(model, plan_of(model))
    assert isinstance(lw, ColumnLowering)
    tiles, splits = lw.grid(dict(R=8192, N=14336))
    assert (tiles, splits) == (56, 9) and tiles * splits <= 4 * TARGET.sm_count
    assert k.unroll * 16 * k.threads * 3 >= 32 * 1024  # bytes in flight an SM at 3 blocks
    (cost,) = plan_cost(model, plan_of(model), TARGET)
    assert cost.bytes >= 8192 * 14336 * 2
    # the cost model: no faster than the copy bandwidth, and the default within 20% of it (an estimate;
    # habu/bench/columns_speed.py measures it)
    assert cost.bytes / TARGET.ceilings.bandwidth <= cost.seconds <= 1.2 * cost.bytes / TARGET.ceilings.bandwidth


SHAPES = [("37", "300"), ("300", "1001"), ("5", "1"), ("1", "64"), ("1", "1"), ("129", "8")]


@pytest.mark.parametrize(("r", "n"), SHAPES, ids=lambda x: x)
def test_default_plans_prove_and_pass_the_finite_field_check(r, n):
    model = column_model(r, n)
    plan = plan_of(model)
    assert [k.kind for k in plan.kernels] == ["columns"]
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok, [o.describe() for o in proof.violations]
    assert proof.certificate is not None and proof.certificate.passed, proof.certificate.failure


def test_odd_column_counts_load_element_by_element():
    model = column_model("300", "1001")
    (k,) = plan_of(model).kernels
    (lw,) = lower_plan(model, plan_of(model))
    assert k.vector == 1 and lw.vector_accesses() == ()


@pytest.mark.parametrize("pins", [{"vector": "1"}, {"unroll": "1"}, {"rows_per_split": "33"},
                                  {"threads": "96", "column_threads": "32"}, {"column_threads": "8"},
                                  {"threads": "64", "column_threads": "64", "unroll": "8"}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_pinned_variants_pass(pins):
    model = column_model("300", "200")
    plan = plan_of(model, pins)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate


BODIES = {
    "max": ("max r dY[r n]", "f32"),
    "product": ("Σ r dY[r n] · X[r n]", "f32"),
    "per-column-and-row": ("Σ r ( dY[r n] · S[n] + W[r] )", "f32"),
    "bf16-output": ("Σ r dY[r n]", "bf16"),
    "abs-max": ("max r abs(dY[r n]) · 2", "f32"),
}


@pytest.mark.parametrize("name", BODIES)
def test_bodies_and_outputs(name):
    rhs, out = BODIES[name]
    model = column_model("700", "48", rhs, out=out)
    assert as_column_reduction(model.nodes[0]) is not None
    plan = plan_of(model)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ColumnLowering)
    # into f32 a Σ's splits add, a max's take the max of ordered keys; a 16-bit output keeps one split, which stores
    assert lw.combine == ("store" if out != "f32" else "atomic" if rhs.startswith("Σ") else "atomic-max")
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate


def test_f16_and_f32_inputs_move_in_16_byte_vectors():
    for dtype, vec in (("f16", 8), ("f32", 4)):
        model = column_model("40", "96", dtype=dtype)
        (lw,) = lower_plan(model, plan_of(model))
        assert lw.kernel.vector == vec and [v.elements for v in lw.vector_accesses()] == [vec]
        assert verify_plan(model, plan_of(model), trials=1).passed


@pytest.mark.parametrize("columns", ["8..2048%8", "1..2048"])
def test_runtime_extents(columns):
    text = (f"1..4096 EXTENT: #R  {columns} EXTENT: #N\nbf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
            "MODEL: RT  G[n] = Σ r dY[r n] ;\n")
    model = parse_text(text, "rt.habu").models["RT"]
    plan = plan_of(model)
    (lw,) = lower_plan(model, plan)
    assert lw.combine == "atomic"  # the number of splits is known only at run time
    # a multiple of 8 columns moves in 16-byte vectors; any other count element by element
    assert lw.kernel.vector == (8 if "%8" in columns else 1)
    for sizes in ({"R": 777, "N": 40}, {"R": 1, "N": 8}, {"R": 4096, "N": 2048}):
        cert = verify_plan(model, plan, sizes, trials=1)
        assert cert.passed, (sizes, cert.failure)
    assert not failures(obligations(model, plan))
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "s_R" in kernel.source and "s_N" in kernel.source


def test_packed_loads_over_a_free_column_count_are_guarded():
    text = ("1..4096 EXTENT: #R  1..2048 EXTENT: #N\nbf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
            "MODEL: RT  G[n] = Σ r dY[r n] ;\n")
    model = parse_text(text, "rt.habu").models["RT"]
    plan = plan_of(model, {"vector": "8"})
    assert any(o.rule.name == "vector-align" for o in guards(obligations(model, plan)))
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "s_R" in kernel.source and "s_N" in kernel.source


def test_the_search_space_walks_vectors_threads_unrolls_and_splits():
    model = column_model("8192", "4096")
    kernels = {p.kernels[0] for p in enumerate_plans(model, TARGET)}
    assert {k.vector for k in kernels} == {1, 8}
    assert {k.threads for k in kernels} == {128, 256, 512}
    assert {k.unroll for k in kernels} == {2, 4, 8}
    assert len({k.rows_per_split for k in kernels}) >= 5


# ----------------------------------------------------------------------------- refusals


def _violated(model, plan) -> set[str]:
    return {o.rule.name for o in failures(obligations(model, plan))}


def test_several_splits_of_a_max_into_f32_take_the_max_of_ordered_keys():
    """A column max split over row blocks: each split's partial max goes into the zero-filled output as an
    order-preserving integer key (atomicMax), and the launch's last block decodes the keys (issue 19)."""
    model = column_model("300", "64", "max r dY[r n]")
    plan = plan_of(model, {"rows_per_split": "64"})
    (lw,) = lower_plan(model, plan)
    assert lw.combine == "atomic-max" and int(lw.splits({"R": 300, "N": 64})) == 5
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "habu::atomic_max_ordered(" in kernel.source
    assert "habu::last_block_done(p_counters_G + (tile), (int)(5))" in kernel.source  # the tile's 5 splits
    assert kernel.zero == ("G", "$G") and kernel.workspace == (("$G", "i32", ("N/64",)),)


def test_several_splits_of_a_max_into_bf16_are_refused_by_name():
    model = column_model("300", "64", "max r dY[r n]", out="bf16")
    bad = failures(obligations(model, plan_of(model, {"rows_per_split": "64"})))
    (ob,) = [o for o in bad if o.rule.name == "row-split-combine"]
    assert "no split overwrites another's partial" in ob.describe() and "where they must add" in ob.detail


def test_a_sum_combined_by_atomic_max_is_refused():
    model = column_model("300", "64")
    plan = plan_of(model, {"rows_per_split": "64"})
    lowered = lower_whole(model, plan)
    maxing = replace(lowered, kernels=(replace(lowered.kernels[0], combine="atomic-max"),))
    bad = failures(obligations(model, plan, lowered=maxing))
    assert [o.rule.name for o in bad] == ["row-split-combine"] and "a sum into f32" in bad[0].detail


def test_several_splits_into_a_bf16_output_are_refused():
    model = column_model("300", "64", out="bf16")
    assert "row-split-combine" in _violated(model, plan_of(model, {"rows_per_split": "64"}))


def test_regression_a_lowering_that_stores_its_splits_is_refused_by_the_rules_and_the_check():
    """A split that stores where it must add (the last split wins): the rules name it, and the field
    check names the race."""
    model = column_model("300", "64")
    plan = plan_of(model, {"rows_per_split": "64"})
    lowered = lower_whole(model, plan)
    storing = replace(lowered, kernels=(replace(lowered.kernels[0], combine="store"),))
    bad = failures(obligations(model, plan, lowered=storing))
    assert [o.rule.name for o in bad] == ["row-split-combine"]
    cert = verify_plan(model, plan, trials=1, lowerings=list(storing.kernels))
    assert not cert.passed and "a race between blocks" in (cert.failure or "")


def test_a_max_combined_atomically_is_refused():
    model = column_model("300", "64", "max r dY[r n]")
    plan = plan_of(model)
    lowered = lower_whole(model, plan)
    adding = replace(lowered, kernels=(replace(lowered.kernels[0], combine="atomic"),))
    assert "row-split-combine" in {o.rule.name for o in failures(obligations(model, plan, lowered=adding))}


def test_misaligned_vectors_are_refused():
    model = column_model("64", "300")  # 300 is a multiple of 4, not of 8
    assert plan_of(model).kernels[0].vector == 4
    assert "vector-align" in _violated(model, plan_of(model, {"vector": "8"}))


def test_int32_offsets_are_refused_past_two_to_the_31():
    model = column_model("600000", "4096")
    plan = plan_of(model)
    assert plan.kernels[0].index_width == 64
    narrow = replace(plan, kernels=(replace(plan.kernels[0], index_width=32),))
    assert "int32-offsets" in _violated(model, narrow)
    assert not failures(obligations(model, plan))


def test_shared_partials_past_48_kb_are_refused():
    model = column_model("64", "4096")
    assert "smem-budget" in _violated(model, plan_of(model, {"threads": "1024", "column_threads": "1",
                                                             "vector": "16"}))


def test_partial_row_groups_are_refused():
    model = column_model("64", "4096")
    assert "supported-path" in _violated(model, plan_of(model, {"threads": "256", "column_threads": "48"}))


def test_a_grid_of_more_than_65535_row_splits_is_refused():
    model = column_model("100000", "8")
    assert "grid-dims" in _violated(model, plan_of(model, {"rows_per_split": "1"}))


def test_in_place_updates_and_transposed_loads_stay_general():
    """`G[n] = Σ r G[n] · dY[r n]` reads what its splits would add into; `Σ r Y[n r]` reads a row's
    columns across rows (a reduction within each row is the row family's)."""
    assert [r.kind for r in default_regions(column_model("8", "8", "Σ r G[n] · dY[r n]"))] == ["general"]
    text = ("8 EXTENT: #R  6 EXTENT: #N\nf32 TENSOR: X ( #R #N )  f32 TENSOR: Y ( #N #R )  f32 TENSOR: G ( #N )\n"
            "MODEL: MIXED  G[n] = Σ r X[r n] · Y[n r] ;\n")
    assert [r.kind for r in default_regions(parse_text(text, "mixed.habu").models["MIXED"])] == ["general"]


def test_a_bad_column_kernel_field_in_json_is_a_habu_error():
    model = column_model("64", "64")
    data = plan_of(model).to_json()
    data["kernels"][0]["vector"] = 0
    with pytest.raises(HabuError, match="vector"):
        Plan.from_json(data)


# ----------------------------------------------------------------------------- NVRTC


@pytest.mark.parametrize(("rhs", "dtype", "out", "r", "n"), [
    ("Σ r dY[r n]", "bf16", "f32", "8192", "14336"),
    ("max r dY[r n]", "f16", "f32", "300", "200"),
    ("max r dY[r n]", "bf16", "f32", "8192", "4096"),  # split: atomicMax on ordered keys, the last block decodes
    ("Σ r ( dY[r n] · X[r n] · S[n] + W[r] )", "f32", "bf16", "77", "1001"),
])
def test_nvrtc_compiles_the_emitted_source(rhs, dtype, out, r, n):
    from habu.emit_cuda.nvrtc import compile_cuda

    model = column_model(r, n, rhs, dtype=dtype, out=out)
    (kernel,) = emit_plan(model, plan_of(model), TARGET).kernels
    compiled = compile_cuda(kernel.source, kernel.name, "sm_90a")
    assert compiled.resources.registers > 0 and not compiled.resources.spills
    assert compiled.resources.smem == kernel.lowering.smem_bytes


def test_regression_the_exported_grid_of_column_and_general_kernels():
    """`grid_formula` (the standalone export's launch geometry) asserted a map kernel for anything not a
    contraction or row kernel: a general kernel's export failed, and a column kernel needs its 2-D grid."""
    from habu.emit_cuda.standalone import grid_formula

    text = ("1..8192 EXTENT: #R  64 EXTENT: #N\nbf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
            "MODEL: RT  G[n] = Σ r dY[r n] ;\n")
    model = parse_text(text, "rt.habu").models["RT"]
    (kernel,) = emit_plan(model, plan_of(model), TARGET).kernels
    gx, gy, gz = grid_formula(kernel, {"N": 64})
    lw = kernel.lowering
    assert gx == "1" and "R" in gy and gz == "1"  # one column tile; the row splits follow #R
    assert kernel.grid({"R": 1000, "N": 64}, 132) == (1, -(-1000 // lw.kernel.rows_per_split), 1)
    scores = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    (general,) = emit_plan(scores, plan_of(scores), TARGET).kernels
    assert grid_formula(general, {e.name: e.size for e in scores.extents})[1:] == ("1", "1")


def test_regression_the_search_report_names_column_and_general_kernels():
    """`plan_summary` (the search's table of best plans) read a `vector` every kernel but a contraction
    or row kernel has: a general kernel's plan raised KeyError."""
    from habu.search.report import plan_summary

    model = column_model("8192", "14336")
    assert plan_summary(plan_of(model).to_json()) == "columns 256t/32c v8 split960 u8"
    scores = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    assert plan_summary(plan_of(scores).to_json()) == "general 256"


PROLOGUE = """300 EXTENT: #R  200 EXTENT: #N
bf16 TENSOR: A ( #R #N )  bf16 TENSOR: B ( #R #N )  f32 TENSOR: G ( #N )  f32 TENSOR: P ( #R #N )
WORD: MUL ( a[r n] b[r n] -- y[r n] )  y[r n] = a[r n] · b[r n] ;
WORD: COLSUM ( x[r n] -- y[n] )  y[n] = Σ r x[r n] ;
MODEL: PRO ( a b -- g )  MUL COLSUM ;
MODEL: PRO-KEPT ( a b -- p g )  MUL DUP COLSUM ;
"""


def test_an_elementwise_prologue_node_is_fused_into_the_column_kernel():
    """`%1[r n] = A·B` then `G[n] = Σ r %1[r n]`: one column kernel reads A and B (the product is never
    stored); cutting it gives a row kernel and a column kernel, and both plans pass."""
    from habu.plan.partitions import partitions
    from habu.search.space import default_kernels, make_plan

    model = parse_text(PROLOGUE, "pro.habu").models["PRO"]
    (region,) = default_regions(model)
    assert region.kind == "columns" and len(region.nodes) == 2
    plan = plan_of(model)
    assert plan.storage == ()
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "habu::packed_bf16(raw0[u], v) * habu::packed_bf16(raw1[u], v)" in kernel.source
    kinds = []
    for regions in partitions(model):
        cut = make_plan(model, TARGET, default_kernels(model, TARGET, {"R": 300, "N": 200}, regions), {})
        proof = prove(model, cut, {}, trials=1)
        assert proof.ok and proof.certificate is not None and proof.certificate.passed, proof.certificate
        kinds.append([k.kind for k in cut.kernels])
    assert kinds == [["columns"], ["rows", "columns"]]


def test_regression_an_output_a_later_kernel_reads_is_checked_where_that_kernel_reads_it():
    """A prologue the model outputs (P) is not fused, and the column kernel reads all its rows. The check
    ran P's kernel on its sampled row blocks only and the reference raised KeyError ("read outside the
    evaluated box"; the witness shape had hidden it, which a column kernel does not reduce): the blocks of
    an output that a later kernel reads now cover what it reads."""
    model = parse_text(PROLOGUE, "pro.habu").models["PRO-KEPT"]
    assert [r.kind for r in default_regions(model)] == ["rows", "columns"]
    assert prove(model, plan_of(model), {}, trials=1).ok


def test_the_launch_checks_the_alignment_of_packed_loads():
    """The runtime's contract takes each tensor's alignment from the lowering's `vector_accesses`: 16 bytes
    for dY's packed loads, nothing beyond its element for an element-by-element plan."""
    from habu.emit_cuda.checks import contract_of

    model = column_model("64", "4096")
    packed = contract_of(model, emit_plan(model, plan_of(model), TARGET)).tensor("dY")
    assert packed is not None and packed.align == 16 and "8 adjacent columns" in packed.align_why
    single = contract_of(model, emit_plan(model, plan_of(model, {"vector": "1"}), TARGET)).tensor("dY")
    assert single is not None and single.align == 2


def test_int32_rule_covers_the_rows_a_thread_computes_past_its_split():
    """Every access is in bounds and its masked offsets fit 32 bits (#R·#N < 2^31), but a split's row loop
    runs 2048 rows for 1000 (its rows past the split are masked, their offsets still computed): the last
    split's padded rows pass 2^31 − 1, and the thread-arithmetic obligation names it."""
    model = column_model("268435000", "8")
    plan = plan_of(model, {"rows_per_split": "1000", "index": "32"})
    (lw,) = lower_plan(model, plan)
    assert lw.steps * lw.row_groups * lw.kernel.unroll == 2048
    bad = failures(obligations(model, plan))
    assert any(o.rule.name == "int32-offsets" and "row·#N" in o.statement for o in bad), [o.statement for o in bad]
    assert not any(o.rule.name == "bounds" for o in bad)
    assert not any(o.rule.name == "int32-offsets" and o.tensor == "dY" for o in bad)


# the derived backward of fuzz seed 9668's model (`Y[p] = Σ q X0[IX0[p]]·X1[p q] − …`): X0's gradient is a row
# reduction scatter-added through IX0
SCATTERED_ROW_SUM = ("7 EXTENT: #P 130 EXTENT: #Q\nf32 TENSOR: dY ( #P )  f32 TENSOR: X1 ( #P #Q )\n"
                     "f32 TENSOR: dX0 ( #P )\nITENSOR: IX0 ( #P #P )\n"
                     "MODEL: FZ  dX0[IX0[p]] += Σ q dY[p] · X1[p q] ;\n")


def test_regression_a_scatter_added_reduction_is_no_column_reduction():
    """Fuzz (session 55, seeds 9668 and 9628, the search's variants of each default kernel): the search offered a
    general region's scatter-add `dX0[IX0[p]] += Σ q …` the column family's kernels, as the transposed column
    reduction of its trailing axis. Those kernels drop the scatter: each stores its column at p, not at IX0[p].
    The finite-field check refused them (`dX0[0] differs`; seed 9628's, where IX1 maps onto another extent, ended in
    an IndexError inside the check). The column family now takes no scatter-add, the search offers it none, and a
    plan that gives one a column kernel is refused by the rules, naming the node."""
    model = parse_text(SCATTERED_ROW_SUM, "fz.habu").models["FZ"]
    eq = model.nodes[0]
    assert eq.scatter is not None and as_column_reduction(eq) is None
    plan = plan_of(model)
    (region,) = default_regions(model)
    from habu.paths import region_space
    from habu.search.space import concrete_sizes

    sizes = concrete_sizes(model, {})
    assert not any(isinstance(k, ColumnKernel) for k in region_space(model, region, TARGET, sizes))
    column = ColumnKernel(nodes=("dX0",), threads=256, column_threads=16, vector=1, rows_per_split=64, unroll=8,
                          index_width=32)
    bad = replace(plan, kernels=(column,))
    (refusal,) = failures(obligations(model, bad, {}))
    assert refusal.rule.name == "supported-path" and "scatter-add" in refusal.detail and "dX0" in refusal.describe()
    assert not failures(obligations(model, plan, {}))


NESTED_MAX = ("130 EXTENT: #P\nf32 TENSOR: X0 ( #P #P #P )\nf32 TENSOR: Y ( #P )\n"
              "MODEL: FZ  Y[p2] = (max p3 (max p4 X0[p2 p4 p3])) ;\n")


def test_regression_a_max_of_maxes_is_no_column_reduction():
    """Fuzz (session 56, seed 11629, the default plan): the column family merged `max p3 (max p4 …)` into one max
    over (p3, p4), as it merges nested sums. Over GF(p) a max is the product Π (r − x) over its points, so the max of
    maxes the model states is another value, and `habu compile` refused the default plan as computing something
    else. Nested maxes are no column reduction now (nested sums still are); a hand-edited column kernel for one is
    refused by the rules, and the default compiles."""
    model = parse_text(NESTED_MAX, "fz.habu").models["FZ"]
    assert as_column_reduction(model.nodes[0]) is None
    plan = default_plan(model, TARGET, {}, {})
    assert not any(isinstance(k, ColumnKernel) for k in plan.kernels)
    assert verify_plan(model, plan, None, 1).passed
    column = ColumnKernel(nodes=("Y",), threads=256, column_threads=32, vector=2, rows_per_split=128, unroll=8,
                          index_width=32)
    (refusal,) = failures(obligations(model, replace(plan, kernels=(column,)), {}))
    assert refusal.rule.name == "supported-path"
    summed = parse_text(NESTED_MAX.replace("max", "Σ"), "fz.habu").models["FZ"]
    merged = as_column_reduction(summed.nodes[0])
    assert merged is not None and len(merged.node.rhs.vars) == 2
