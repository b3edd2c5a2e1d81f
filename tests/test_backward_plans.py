"""The kernels the derived backward models plan to (habu/spec/grad.py's node forms, the default plans) and the
shape their finite-field check runs at (habu/prove/witness.py)."""

from __future__ import annotations

import pytest

from habu.cli_grad import backward_program
from habu.compile import bind_shape
from habu.lower import (
    ColumnLowering,
    ContractionLowering,
    GeneralLowering,
    MapLowering,
    RowLowering,
    lower_plan,
)
from habu.plan.rewrite import planned_model
from habu.prove.witness import witness_sizes
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import target_named
from tests.conftest import EXAMPLES

FFN_SHAPE = {"B": 128, "D": 1024, "H": 2048}


def _ffn_backward():
    program, name = backward_program(load_program(EXAMPLES[0].parent / "ffn_skip.habu"), "FFN-SKIP", None, "auto")
    model = bind_shape(program.model(name), FFN_SHAPE)
    plan = default_plan(model, target_named("sm_90a"), FFN_SHAPE, {})
    return model, plan, lower_plan(model, plan)


def test_regression_ffn_backward_plans_no_general_kernel():
    # dX = dT6 + Σ h dT2·W1 was one general kernel (a thread per element looping over h), and each bias
    # gradient dB[one h] = Σ b dT[b h] another: the contraction is now its own node, with the addition in its
    # epilogue, and the bias gradient a column reduction and a copy
    _, plan, lowerings = _ffn_backward()
    kinds = {k.nodes: type(lw) for k, lw in zip(plan.kernels, lowerings, strict=True)}
    assert not [n for n, t in kinds.items() if t is GeneralLowering], kinds
    dx = next(n for n in kinds if "dX" in n)
    assert kinds[dx] is ContractionLowering and dx[:2] == ("%rdX", "dX")  # the sum, then dX = dT6 + sum
    # dB1's and dB2's Σ b: column reductions, each summed in the epilogue of the product beside it
    # (habu/plan/column_epilogue.py) where its kernel prints it, else a column kernel of its own
    summed = {t for n, kind in kinds.items() for t in n if t in ("dB1", "dB2")}
    assert summed == {"dB1", "dB2"} and sum(t is ColumnLowering for t in kinds.values()) + sum(
        kinds[n] is ContractionLowering and ("dB1" in n or "dB2" in n) for n in kinds) == 2


def test_regression_ffn_backward_contractions_run_on_tensor_cores_in_bf16():
    """The backward read its saved matrices (S1, S4) and row statistic (R1) in f32, so every intermediate
    was stored in f32 and each of the four contractions fell to the SIMT fma path; a saved matrix now keeps
    the forward's bf16 (as torch autograd saves it) and a vector does not decide the storage type."""
    model, plan, _ = _ffn_backward()
    assert {t.name: t.dtype.name for t in model.inputs if t.name in ("S1", "S4", "R1")} == \
        {"S1": "bf16", "S4": "bf16", "R1": "f32"}
    mmas = [k.mma.value for k in plan.kernels if k.kind == "contraction"]
    assert mmas == ["wgmma"] * 4, mmas
    assert {v for k, v in dict(plan.storage).items() if not k.startswith("%rdB")} == {"bf16"}, plan.storage


def test_regression_ffn_backward_is_checked_at_a_witness_shape():
    # the general kernels, and the column reductions' column tiles, froze D and H: the field check ran the
    # backward's contractions at full shape (77 s at this shape, 47 s of it contractions)
    model, plan, lowerings = _ffn_backward()
    graph = planned_model(model, plan)
    names = [f"kernel {i}" for i in range(len(lowerings))]
    w = witness_sizes(graph, names, lowerings, dict(FFN_SHAPE, ONE=1))
    assert w["D"] < FFN_SHAPE["D"] and w["H"] < FFN_SHAPE["H"], w


@pytest.mark.parametrize("path,name,extent", [("rmsnorm.habu", "RMSNORM-ROWS", "D"),
                                              ("softmax.habu", "SOFTMAX-ROWS", "C")])
def test_regression_row_backward_is_one_row_kernel(path, name, extent):
    # the row statistic's adjoint (Σ d dY·X) was a node of its own: a row kernel writing one number per row and
    # a second row kernel reading the rows again; it is now substituted into dX's node, as the forward's
    # rsqrt(Σ ...) is, and softmax's maximum (whose adjoint is zero) no longer adds two passes
    program, bw_name = backward_program(load_program(EXAMPLES[0].parent / path), name, None, "auto")
    shape = {"R": 8192, extent: 4096}
    model = bind_shape(program.model(bw_name), shape)
    plan = default_plan(model, target_named("sm_90a"), shape, {})
    assert [type(lw) for lw in lower_plan(model, plan)] == [RowLowering]


def test_regression_rmsnorm_backward_compiles_without_shape():
    # `habu compile examples/rmsnorm.habu --backward` refused the widest size bucket (#D in 33024..65536): the
    # default cached dX's row, sized by the bf16 row tensors (2·#D bytes), but the smem-budget rule counts the
    # widest element any load reads (the f32 rstd: 4·#D bytes, over the 232448 an H200 block has at 65536)
    from habu.compile import compile_set
    from habu.plan.buckets import BucketGrid, cell_ranges

    program, name = backward_program(load_program(EXAMPLES[0].parent / "rmsnorm.habu"), "RMSNORM-EQ", None, "auto")
    model = program.model(name)
    grid = BucketGrid.of(model)
    assert grid.extents == ("D",)
    plans, proofs = compile_set(program, model, cell_ranges(grid.cells()[-1]), {}, target_named("sm_90a"), {}, 1,
                                None)
    assert all(p.ok for p in proofs) and not plans[-1].guards
    # the rule counts the element type of the rows kept (test_regression_rows_smem_rule_counts_the_kept_row_not_
    # the_widest_load): both of dY and X at 65536 columns (2 · 2·65536 bytes) overflow the block's shared memory,
    # so this bucket's default reads them from memory (narrower buckets keep both: test_row_backward_keeps_dy_and_x_on_chip)
    assert not plans[0].kernels[0].cache_row


def test_moe_ffn_backward_compiles_and_proves_at_small_sizes():
    # the derived MoE backward: dX[IX[r] d] += ... (both gathered reads of X), dW[E[r] h d] += ... and dP, with the
    # general family for the scatter-adds; its runtime extents (#T, #R) take witness sizes
    from habu.compile import compile_model

    program, name = backward_program(load_program(EXAMPLES[0].parent.parent / "tests" / "data" / "moe_small.habu"),
                                     "MOE-FFN", None, "auto")
    compiled = compile_model(program, name, {}, target_named("sm_90a"), {}, 1)
    assert all(p.ok for p in compiled.proofs)
    scatters = {eq.target for eq in compiled.model.nodes if eq.scatter is not None}
    assert scatters == {"dX", "dW1", "dW3", "dW2"}
    written = {n for p in compiled.plans for k in p.kernels for n in k.nodes}
    assert scatters <= written


def test_regression_column_max_backward_hoists_the_maximum_and_its_ties():
    # COL-MAX's arg-max indicator recomputed `max r dY[r n]` and the tie count Σ r (...) inside every element of
    # ddY: one general kernel doing R² work per element (`habu compile --backward` ran past 5 minutes); both are now
    # column statistics of their own (column reductions), and ddY an elementwise kernel (a general kernel moving
    # vectors since session 34: `elementwise_vectors`)
    program, name = backward_program(load_program(EXAMPLES[0].parent / "column_reductions.habu"), "COL-MAX", None,
                                     "auto")
    model = program.model(name)
    plan = default_plan(model, target_named("sm_90a"), {}, {})
    assert [type(lw) for lw in lower_plan(model, plan)] == [ColumnLowering, ColumnLowering, GeneralLowering]


def test_regression_an_elementwise_node_reading_through_a_gather_is_a_general_kernel():
    # UNPERMUTE's backward `dX[r n] = dY[IX[r] n] · W[r]` was planned as a map kernel, which proved (the lowering
    # reads the gather) but whose emitter reads no index tensor: `habu compile --backward` ended in a traceback
    from habu.compile import compile_model
    from habu.paths.emit import emit

    program, name = backward_program(load_program(EXAMPLES[0].parent / "scatter_add.habu"), "UNPERMUTE", None,
                                     "auto")
    target = target_named("sm_90a")
    compiled = compile_model(program, name, {"R": 64, "T": 32, "N": 128}, target, {}, 1)
    (plan,) = compiled.plans
    assert {k.nodes: k.kind for k in plan.kernels}[("dX",)] == "general"
    assert any("p_IX" in k.source for k in emit(compiled.proofs[0], target).kernels)


def test_regression_a_scalar_column_reduction_takes_no_broadcasting_epilogue():
    """A fuzz model (seed 9015, `Y = Σ p Σ s X0[s]·X1[p]` with #P = 1): its backward `TrdX1 = Σ s dY·X0[s]` (a
    scalar, the column family's reduction of one column) then `dX1[p] = TrdX1`. The column epilogue compared dX1's column
    with the reduction's, which a scalar has not: `habu compile --backward` ended in an internal error
    (AttributeError at patterns.py). A scalar's epilogue would broadcast it: it is a kernel of its own now."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text

    text = ("1 EXTENT: #P 7 EXTENT: #Q 2 EXTENT: #S 7 EXTENT: #U\nf32 TENSOR: X0 ( #S )\nbf16 TENSOR: X1 ( #P )\n"
            "f32 TENSOR: Y (  )\nMODEL: FZ  Y = (Σ p2 (Σ s3 (X0[s3] · X1[p2]))) ;\n")
    program, name = backward_program(parse_text(text, "fuzz.habu"), "FZ", None, "auto")
    compiled = compile_model(program, name, {}, target_named("sm_90a"), {}, 1)
    assert all(p.ok for p in compiled.proofs)
    kernels = [k for p in compiled.plans for k in p.kernels]
    assert [k.nodes for k in kernels] == [("dX0",), ("%rdX1",), ("dX1",)]  # the scalar, then its broadcast


@pytest.mark.parametrize("path,name,extent,width", [("rmsnorm.habu", "RMSNORM-ROWS", "D", 4096),
                                                    ("softmax.habu", "SOFTMAX-ROWS", "C", 16384)])
def test_row_backward_keeps_dy_and_x_on_chip(path, name, extent, width):
    # the backward's one row kernel read dY and X twice, once in the pass Σ dY·X (Σ dY·softmax) and once to
    # store dX (RMSNorm 67% of copy bandwidth on the H200, softmax 36%): the row cache kept one tensor's row
    # only; it now keeps both, loaded together before the pass, in registers at these widths
    program, bw_name = backward_program(load_program(EXAMPLES[0].parent / path), name, None, "auto")
    shape = {"R": 8192, extent: width}
    model = bind_shape(program.model(bw_name), shape)
    (lw,) = lower_plan(model, default_plan(model, target_named("sm_90a"), shape, {}))
    assert [a.tensor for a in lw.kept_rows()] == ["dY", "X"] and lw.loaded_before == (0, 0)
    assert lw.register_chunks(shape) > 0


def test_regression_qwen3_moe_backward_picks_64_bit_indices_where_32_cannot_hold():
    # the weight gradients dW1[E[r] h d] += dTgate[r h]·X[IX[r] d] were general kernels over R·H·D = 262144·768·2048
    # elements (each tensor is below 2^31): their 32-bit thread index passed 2^31 − 1, and the backward was refused
    # ("no plan ... is valid for every size of its runtime extents"); the default took 64-bit indices there. They are
    # grouped weight gradients now (a block per output tile and group: no index over R·H·D), proven in 32 bits
    from habu.lower import GeneralLowering, GroupedWgradLowering
    from habu.prove.rules import failures, guards, obligations

    program, name = backward_program(load_program(EXAMPLES[0].parent / "moe_qwen3_30b_a3b.habu"), "MOE-FFN", None,
                                     "auto")
    model = bind_shape(program.model(name), {})
    plan = default_plan(model, target_named("sm_90a"), {}, {})
    lowered = dict(zip((k.nodes[0] for k in plan.kernels), lower_plan(model, plan), strict=True))
    assert all(isinstance(lowered[w], GroupedWgradLowering) for w in ("dW1", "dW3", "dW2")), lowered.keys()
    assert isinstance(lowered["dX"], GeneralLowering) and lowered["dX"].index_width == 32
    obs = obligations(model, plan)
    assert not failures(obs) and not guards(obs), [o.detail for o in failures(obs) + guards(obs)]


CORPUS = EXAMPLES[0].parent.parent / "tests" / "data" / "general_corpus"


def _compile_backward(path, name: str):
    from habu.compile import compile_model

    program, bw = backward_program(load_program(path), name, None, "auto")
    return compile_model(program, bw, {}, target_named("sm_90a"), {}, 1)


def test_regression_a_scalar_maximum_read_by_a_later_kernel_is_checked():
    """`habu compile tests/data/general_corpus/max_abs_all.habu --backward` (M = max r c abs(X[r c])) ended in
    IndexError: its first kernel is a column reduction to a scalar (the maximum, hoisted), and the finite-field
    check chose the column tiles a later kernel reads from the box's first axis, which a scalar has not. A
    scalar's box is its one column tile now (found by a sweep of the corpus's backward models)."""
    compiled = _compile_backward(CORPUS / "max_abs_all.habu", "AMAX")
    (plan,), (proof,) = compiled.plans, compiled.proofs
    assert proof.ok and proof.certificate.passed
    lowerings = lower_plan(compiled.model, plan)
    assert isinstance(lowerings[0], ColumnLowering) and len(lowerings) > 1


def test_regression_a_row_broadcast_with_no_input_along_the_row_gets_a_rows_kernel():
    """The backward of a row sum, dX[b i] = dO[b], ended in `max() arg is an empty sequence`: the rows path took
    its vector width from the inputs along the row, and none runs along it. It takes the output's width there;
    the same broadcast written as a model compiles too."""
    from habu.compile import compile_model
    from habu.spec.parser import parse_text

    compiled = _compile_backward(CORPUS / "rows_tiny_sum.habu", "TINY-ROWS")
    assert compiled.proofs[0].ok and isinstance(lower_plan(compiled.model, compiled.plans[0])[0], RowLowering)
    text = "3 EXTENT: #B 2000 EXTENT: #I bf16 TENSOR: X ( #B ) bf16 TENSOR: Y ( #B #I )\nMODEL: BC  Y[b i] = X[b] ;\n"
    compiled = compile_model(parse_text(text, "bc.habu"), "BC", {}, target_named("sm_90a"), {}, 1)
    assert compiled.proofs[0].ok


def _compile_text(text: str, name: str = "FZ", backward: bool = True):
    from habu.compile import compile_model
    from habu.spec.parser import parse_text

    program = parse_text(text, "fuzz.habu")
    if backward:
        program, name = backward_program(program, name, None, "auto")
    return compile_model(program, name, {}, target_named("sm_90a"), {}, 1)


def test_regression_two_row_statistics_along_different_columns_get_two_kernels():
    """The backward of `Y[p] = max q tanh(X0[q])` has Th1[q] (a maximum over #Q) and dX0[q] = Σ p dY[p]·...: the
    same shape, so the two row nodes were fused, and the row kernel ran the maximum along dX0's columns (#P = 100)
    reading X0 (#Q = 2) past its end; the bounds rule refused the default plan. Row nodes share a kernel only
    along the same columns now (found by a fuzz of random models' backward)."""
    compiled = _compile_text("100 EXTENT: #P 2 EXTENT: #Q\nbf16 TENSOR: X0 ( #Q )\nf32 TENSOR: Y ( #P )\n"
                             "MODEL: FZ  Y[p] = max q tanh(X0[q]) ;\n")
    (plan,), (proof,) = compiled.plans, compiled.proofs
    # since session 60 the maximum inside Th1's count is a node of its own (a loop invariant): three kernels
    assert proof.ok and all(len(k.nodes) == 1 for k in plan.kernels) and "dX0" in plan.kernels[-1].nodes, plan.kernels


def test_regression_a_3d_map_after_a_general_kernel_is_checked_on_its_box():
    """The backward of `Y[q p] = max q2 X0[q q2 p]` (#P = #Q = 17): general kernels compute Th1[q p] and Th2[q p]
    on the box the check demands, then a 3-D map kernel computes dX0[q q2 p] over whole blocks of 256 flat elements,
    whose elements outside its box read Th1 where no kernel wrote ("reads %h1[2, 0], which no earlier kernel
    wrote": the plan refused as computing something else). The map's check runs the elements of its box, as a
    general kernel's does (found by a fuzz of random models' backward)."""
    compiled = _compile_text("17 EXTENT: #P 17 EXTENT: #Q\nbf16 TENSOR: X0 ( #Q #Q #P )\nf32 TENSOR: Y ( #Q #P )\n"
                             "MODEL: FZ  Y[q p] = max q2 X0[q q2 p] ;\n")
    (plan,), (proof,) = compiled.plans, compiled.proofs
    assert proof.ok and proof.certificate.passed
    assert isinstance(lower_plan(compiled.model, plan)[-1], MapLowering)


def test_regression_a_scalar_value_stays_0_d_in_the_evaluators():
    """`habu grad` on `Y = Σ s2 X0[s2]·X1[s2]·(Σ s3 X2[s3])` ended in "zip() argument 2 is longer than argument 1":
    the evaluators stored a node's value with np.ascontiguousarray, which gives a scalar one axis, and a later
    contraction took that axis for one of its subscripts (found by a fuzz of random models' backward)."""
    import numpy as np

    from habu.spec.parser import parse_text
    from habu.spec.reference import evaluate

    text = ("5 EXTENT: #P 64 EXTENT: #S\nf32 TENSOR: X0 ( #S )\nf32 TENSOR: X1 ( #S )\nf32 TENSOR: X2 ( #S )\n"
            "bf16 TENSOR: Y ( )\nMODEL: FZ  Y = Σ s2 X0[s2] · X1[s2] · (Σ s3 X2[s3]) ;\n")
    model = parse_text(text, "fuzz.habu").models["FZ"]
    assert np.shape(evaluate(model, {t.name: np.ones(64) for t in model.inputs})["Y"]) == ()
    compiled = _compile_text(text)
    assert all(p.ok for p in compiled.proofs)


@pytest.mark.parametrize("equation", ["Y[p q] = Σ q2 X[p q]", "Y[p q] = X[p q] · Σ q2 X[p q]",
                                      "Z[b p q] = Σ q2 W[b p q]",
                                      # a row statistic over two variables (`dX0[p] = Σ s s2 dY[p s]`, the backward
                                      # of a sum over an unused variable): the row kernel reduced once, #Q too little
                                      "V[p] = Σ q q2 X[p q]", "V[p] = max q q2 X[p q]",
                                      # an inner reduction reading the outer one's variable (a max's backward)
                                      "V[p] = Σ q X[p q] · (max q2 X[p q] · X[p q2])"])
def test_regression_a_reduction_a_row_kernel_cannot_run_is_no_row_kernel(equation):
    """`Y[p q] = Σ q2 X[p q]` (#Q·X[p q]: the body is constant along q2) was planned as a row kernel, which reduces
    along the row's columns and computed Σ q X[p q]: the field check refused the default plan (found by a fuzz of
    random models, in the backward of a sum over an unused variable). Such a node is no row's: a general kernel."""
    text = ("6 EXTENT: #B 64 EXTENT: #P 13 EXTENT: #Q\nf32 TENSOR: X ( #P #Q )\nf32 TENSOR: Y ( #P #Q )\n"
            "f32 TENSOR: W ( #B #P #Q )\nf32 TENSOR: Z ( #B #P #Q )\nf32 TENSOR: V ( #P )\n"
            f"MODEL: FZ  {equation} ;\n")
    compiled = _compile_text(text, backward=False)
    (plan,), (proof,) = compiled.plans, compiled.proofs
    assert proof.ok and not isinstance(lower_plan(compiled.model, plan)[0], RowLowering)


def test_regression_attentions_forward_with_saved_statistics_was_three_scalar_general_kernels():
    """The forward that also outputs the row max R1 and sum R2 for the backward (`Backward.forward`: what
    `habu.build(..., grad=True)` and the backward benchmarks run) computed R1, R2 and O each as a general kernel
    recomputing the scores `Σ e Q·K` inside its loops: 23 ms and 175 ms for two of them at 16 × 1k under ncu
    (session 64). The scores they share are now one node, and P another (the invariant hoist, as the backward's):
    the scores and the value product are wgmma contractions and the plan is proven. Since session 65 the default
    at these sizes is one fused attention kernel storing R1 and R2 (`fused:O`, tests/plan/test_attention_fused.py):
    the unfused plan is pinned here."""
    from habu.prove import prove
    from habu.spec.grad import derive

    model = load_program(EXAMPLES[0].parent / "attention.habu").models["ATTENTION-GQA"]
    sizes = {"B": 1, "G": 8, "I": 1024, "J": 1024}
    unfused = {"rewrite": "split:%f2"}
    forward = bind_shape(derive(model).forward, sizes)
    plan = default_plan(forward, target_named("sm_90a"), sizes, unfused)
    products = [k for k in plan.kernels if k.kind == "contraction"]
    assert len(products) == 2 and all(k.mma == "wgmma" for k in products), plan.kernels
    assert [k.kind for k in default_plan(forward, target_named("sm_90a"), sizes, {}).kernels] == ["attention"]
    small = {"B": 1, "G": 2, "I": 256, "J": 256}  # (the proof at a smaller size: seconds)
    forward = bind_shape(derive(model).forward, small)
    assert prove(forward, default_plan(forward, target_named("sm_90a"), small, unfused), small, trials=1).ok
