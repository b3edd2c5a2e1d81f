"""Transposed products (`ContractionKernel.swap_ab`): the kernel's m runs along the output's columns and A is the
factor that carries them. The orientation is the lowering's (its accesses), so every path's plans prove — rules and
the finite-field check, ragged tiles each way — and the wgmma ones compile; the default takes it for products of
at most SWAP_ROWS tokens; a pin flips a kernel's orientation with its tiles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.emit_cuda.nvrtc import compile_cuda, resources_of
from habu.lower import lower_plan
from habu.lower.contraction import ContractionLowering, with_kernel
from habu.paths.emit import emit
from habu.plan.plan import ContractionKernel
from habu.prove import prove
from habu.search.space import apply_pins, default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT, parse

H100 = TARGETS["sm_90a"]

LINEAR_KN = """
16 EXTENT: #M  4096 EXTENT: #N  4096 EXTENT: #K
bf16 TENSOR: X ( #M #K )
bf16 TENSOR: W ( #K #N )
bf16 TENSOR: Y ( #M #N )
MODEL: LINEAR-KN  Y[m n] = Σ k X[m k] · W[k n] ;
"""


def _model(example: str, name: str, sizes: dict[str, int]):
    program = parse(LINEAR_KN) if example == "kn" else load_program(ROOT / "examples" / example)
    return program.models[name].with_sizes(sizes)


SWAPPED = [  # (example, model, sizes, pins): ragged tiles along both axes
    ("gemm.habu", "GEMM", {"M": 13, "N": 1000, "K": 520}, {"swap_ab": "1", "mma": "wgmma", "tile": "64x16x64"}),
    ("gemm.habu", "GEMM", {"M": 16, "N": 1000, "K": 4096},
     {"swap_ab": "1", "tile": "128x16x64", "warps": "12", "split_k": "2", "split_reduce": "cluster"}),
    ("gemm.habu", "GEMM", {"M": 30, "N": 1000, "K": 4096},
     {"swap_ab": "1", "tile": "64x32x64", "split_k": "4", "split_reduce": "cluster"}),
    ("gemm.habu", "GEMM", {"M": 5, "N": 1000, "K": 520}, {"swap_ab": "1", "mma": "mma.sync"}),
    ("gemm.habu", "GEMM", {"M": 13, "N": 300, "K": 520}, {"swap_ab": "1", "mma": "fma"}),
    ("ggemm.habu", "GGEMM", {"M": 13, "N": 1000, "K": 520}, {"swap_ab": "1", "tile": "64x16x64"}),  # tokens gathered
    ("kn", "LINEAR-KN", {"M": 16, "N": 1000, "K": 520}, {"swap_ab": "1", "tile": "64x16x64"}),  # W read MN-major
    # the weights' (A's) boxes ahead: beside the gathered tokens' copies, and beside TMA tokens in a cluster split
    ("ggemm.habu", "GGEMM", {"M": 13, "N": 1000, "K": 520}, {"swap_ab": "1", "tile": "64x16x64", "a_ahead": "1"}),
    ("gemm.habu", "GEMM", {"M": 16, "N": 1000, "K": 4096},
     {"swap_ab": "1", "tile": "64x16x64", "stages": "22", "split_k": "2", "split_reduce": "cluster", "a_ahead": "1"}),
]


@pytest.mark.parametrize("example,name,sizes,pins", SWAPPED, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_transposed_plans_prove_and_compile(example, name, sizes, pins):
    model = _model(example, name, sizes)
    plan = default_plan(model, H100, sizes, pins)
    (kernel,) = [k for k in plan.kernels if isinstance(k, ContractionKernel)]
    assert kernel.swap_ab
    (lw,) = [lw for lw in lower_plan(model, plan) if isinstance(lw, ContractionLowering)]
    # the tile's rows run along the output's columns: the output is stored at (n, m) of the kernel
    assert [p.axis for p in lw.out.positions if p.kind == "axis"] == ["n", "m"]
    proof = prove(model, plan, sizes, trials=1)
    assert proof.ok, [o.describe() + ": " + o.detail for o in proof.violations] or proof.certificate
    if kernel.mma == "wgmma":
        kernels = emit(proof, H100).kernels
        compiled = compile_cuda("\n".join(k.source for k in kernels), kernels[0].name, H100.name)
        assert not resources_of(compiled.log, kernels[0].name).spills


def test_the_default_transposes_products_of_few_tokens_only():
    for tokens, swapped in ((1, True), (16, True), (32, True), (33, False), (64, False)):
        sizes = {"M": tokens, "N": 4096, "K": 4096}
        plan = default_plan(_model("ggemm.habu", "GGEMM", sizes), H100, sizes)
        assert plan.kernels[0].swap_ab is swapped, tokens
    sizes = {"M": 16, "N": 512, "K": 4096}  # not a layer's weights: as written
    assert not default_plan(_model("gemm.habu", "GEMM", sizes), H100, sizes).kernels[0].swap_ab
    assert not default_plan(_model("gemm.habu", "GEMM", {"M": 16}), TARGETS["sm_80"], {"M": 16}).kernels[0].swap_ab


def test_a_pinned_orientation_transposes_the_tiles_and_an_operand_pin_names_the_tensor():
    sizes = {"M": 16, "N": 4096, "K": 4096}
    model = _model("ggemm.habu", "GGEMM", sizes)
    k = default_plan(model, H100, sizes).kernels[0]
    assert isinstance(k, ContractionKernel) and k.swap_ab and k.transposed().transposed() == k
    back = apply_pins(model, k, {"swap_ab": "false"})
    assert not back.swap_ab and (back.tile_m, back.tile_n) == (k.tile_n, k.tile_m)
    assert (back.a_move, back.b_move) == (k.b_move, k.a_move)  # A (gathered tokens) returns to side A
    pinned = apply_pins(model, k, {"B": "cp.async"})  # B the weights: kernel A of the transposed product
    assert pinned.a_move == "cp.async" and pinned.b_move == k.b_move


def test_with_kernel_keeps_the_orientation_it_was_lowered_in():
    sizes = {"M": 16, "N": 4096, "K": 4096}
    model = _model("ggemm.habu", "GGEMM", sizes)
    plan = default_plan(model, H100, sizes)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering)
    with pytest.raises(ValueError, match="orientation"):
        with_kernel(lw, replace(lw.kernel, swap_ab=False))


def test_regression_a_transposed_cluster_split_stored_each_output_element_in_its_own_sector():
    """ncu, H200 2026-12-04 (GGEMM 64 tokens, transposed 64x64 cluster split 2): 263k L2 sectors written for a
    1 MB output, one an element (the unswapped plan: 33k). The reduced pairs ran along the tile's n, the tokens
    once transposed, so each thread's pair sat in two output rows and consecutive threads in others. A
    transposed cluster split now reduces pairs along m (the output's columns): consecutive threads take
    consecutive pairs of one output row, stored as one vector; its column-major partials take the fragment's
    stores on 32 distinct banks a warp."""
    sizes = {"M": 16, "N": 4096, "K": 4096}
    model = _model("ggemm.habu", "GGEMM", sizes)
    plan = default_plan(model, H100, sizes)
    (k,) = plan.kernels
    assert k.swap_ab and k.split_k > 1 and k.split_reduce == "cluster"
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering) and lw.reduction is not None and lw.reduction.pair_axis == "m"
    red = lw.reduction
    rows, cols, _ = red.reduced_pair(0, np.arange(32), 0)
    assert list(np.asarray(cols)) == [0] * 16 + [1] * 16 and list(np.asarray(rows)) == [2 * i for i in range(16)] * 2
    assert red.second(4, 3) == (5, 3) and red.partial_word(5, 3) == red.partial_word(4, 3) + 1
    lane = np.arange(32)
    for j, h, second in ((0, 0, 0), (1, 1, 1)):  # a warp's fragment stores: rows lane/4 (+8h), columns 8j + 2(lane%4)
        words = np.asarray(red.partial_word(lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + second))
        assert len(set((words % 32).tolist())) == 32
    source = emit(prove(model, plan, sizes, trials=1), H100).kernels[0].source
    assert "make_float2(v0, v1)" in source and "(m + 1)" in source
