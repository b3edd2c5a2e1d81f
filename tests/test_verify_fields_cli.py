"""`habu verify FILE --plan PLAN.json` on hand-edited plans with bad fields: `error: ...` and exit
status 1, never a traceback. Each bad value is a field the table refuses on reading, or a rule
(pipeline-stages, grid-dims, int32-offsets) the plan breaks."""

from __future__ import annotations

import json
import sys

import pytest

from habu.compile import bind_shape
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.test_compile_cli import habu


def verify_in_process(monkeypatch, capsys, example: str, plan_path, model: str | None = None) -> tuple[int, str]:
    """Run `habu verify` through the CLI's own `main` (error rendering and exit status included)."""
    from habu.cli import main

    monkeypatch.setattr(sys, "argv", ["habu", "verify", str(ROOT / "examples" / example), "--plan", str(plan_path),
                                      "--trials", "1", *(["--model", model] if model else [])])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def plan_file(tmp_path, example: str, model: str, sizes: dict[str, int], pins: dict[str, str] | None = None,
              **changes) -> object:
    m = bind_shape(load_program(ROOT / "examples" / example).models[model], sizes)
    data = default_plan(m, TARGETS["sm_90a"], sizes, pins or {}).to_json()
    data["kernels"][0].update(changes)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


GGEMM = {"M": 300, "N": 200, "K": 511}

FIELD_VALUES = [
    ("stages", 0, "kernel 0: stages must be a whole number ≥ 1, got 0"),
    ("tile_k", 0, "kernel 0: tile_k must be a whole number ≥ 1, got 0"),
    ("tile_m", 0, "kernel 0: tile_m must be a whole number ≥ 1, got 0"),
    ("tile_n", -1, "kernel 0: tile_n must be a whole number ≥ 1, got -1"),
    ("warps", 0, "kernel 0: warps must be a whole number ≥ 1, got 0"),
    ("split_k", 0, "kernel 0: split_k must be a whole number ≥ 1, got 0"),
    ("group_m", 0, "kernel 0: group_m must be a whole number ≥ 1, got 0"),
    ("cluster_m", 0, "kernel 0: cluster_m must be one of 1, 2, got 0"),
    ("index_width", 16, "kernel 0: index_width must be one of 32, 64, got 16"),
    ("accumulator", "f16", "kernel 0: accumulator must be one of f32, got 'f16'"),
    ("mma", "tensorcore", "kernel 0: mma must be one of fma, mma.sync, wgmma, got 'tensorcore'"),
    ("a_move", "teleport", "kernel 0: a_move must be one of ldg, cp.async, tma, tma-gather4, staged, got 'teleport'"),
    ("raster", "spiral", "kernel 0: raster must be one of row, column, got 'spiral'"),
    ("store", "mail", "kernel 0: store must be one of direct, tma, got 'mail'"),
    ("persistent", "yes", "kernel 0: persistent must be true or false, got 'yes'"),
]


@pytest.mark.parametrize("name, value, message", FIELD_VALUES, ids=[f"{n}={v}" for n, v, _ in FIELD_VALUES])
def test_verify_refuses_a_contraction_field_outside_its_values(tmp_path, monkeypatch, capsys, name, value, message):
    path = plan_file(tmp_path, "ggemm.habu", "GGEMM", GGEMM, **{name: value})
    code, err = verify_in_process(monkeypatch, capsys, "ggemm.habu", path)
    assert code == 1 and "Traceback" not in err
    assert err.strip() == f"habu: error: {path}: not a valid Habu plan: {message}"


@pytest.mark.parametrize("example, model, sizes, threads", [
    ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 1000}, 48),
    ("rmsnorm.habu", "RMSNORM-ROWS", {"D": 1024}, 40),
])
def test_verify_refuses_a_row_kernel_of_a_partial_warp(tmp_path, monkeypatch, capsys, example, model, sizes, threads):
    path = plan_file(tmp_path, example, model, sizes, threads=threads)
    code, err = verify_in_process(monkeypatch, capsys, example, path, model)
    assert code == 1 and "Traceback" not in err
    assert f"kernel 0: threads must be a whole number in 32..1024, a multiple of 32, got {threads}" in err


def test_verify_refuses_a_one_stage_wgmma_ring_by_rule(tmp_path, monkeypatch, capsys):
    path = plan_file(tmp_path, "ggemm.habu", "GGEMM", GGEMM, stages=1)
    code, err = verify_in_process(monkeypatch, capsys, "ggemm.habu", path)
    assert code == 1 and "Traceback" not in err
    assert "error: the plan for GGEMM breaks rule pipeline-stages in kernel 0 (O): stages = 1" in err


def test_verify_refuses_a_staging_grid_y_beyond_65535_by_rule(tmp_path, monkeypatch, capsys):
    path = plan_file(tmp_path, "ggemm.habu", "GGEMM", {"M": 100000, "K": 511}, {"A": "staged"})
    code, err = verify_in_process(monkeypatch, capsys, "ggemm.habu", path)
    assert code == 1 and "Traceback" not in err
    assert "breaks rule grid-dims in kernel 0 (O) staging: grid.y = 100000" in err


def test_verify_refuses_a_map_lane_index_that_wraps_by_rule(tmp_path, monkeypatch, capsys):
    path = plan_file(tmp_path, "fused.habu", "AXPY-RELU", {"N": 2147483644}, threads=96)
    code, err = verify_in_process(monkeypatch, capsys, "fused.habu", path)
    assert code == 1 and "Traceback" not in err
    assert "breaks rule int32-offsets" in err and "(blockIdx.x·96 + threadIdx.x)·4" in err


@pytest.mark.parametrize(("kernel", "message"), [
    ({"kind": "map", "threads": 256, "vector": 1, "index_width": 32},
     "O is not elementwise (a reduction or a scatter-add): the map family computes one element a lane"),
    ({"kind": "columns", "threads": 256, "column_threads": 16, "vector": 1, "rows_per_split": 64, "unroll": 8,
      "index_width": 32}, "O is not a reduction over the leading axis of its inputs"),
    ({"kind": "rows", "rows_per_block": 4, "threads": 32, "vector": 1, "cache_row": True, "index_width": 32},
     "O is not row-local"),
], ids=["map", "columns", "rows"])
def test_regression_a_hand_edited_plan_giving_a_product_another_familys_kernel_is_refused_in_one_line(
        tmp_path, monkeypatch, capsys, kernel, message):
    """Session 55: a map kernel on GGEMM's product ended in `the plan does not fit GGEMM: 'k'` (a KeyError's text:
    the map lowering looked up the reduction's axis as one of its own). Each family's lowering now names why the
    node is not its."""
    m = bind_shape(load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"], GGEMM)
    data = default_plan(m, TARGETS["sm_90a"], GGEMM).to_json()
    data["kernels"] = [{"nodes": data["kernels"][0]["nodes"], **kernel}]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, err = verify_in_process(monkeypatch, capsys, "ggemm.habu", path)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"the plan does not fit GGEMM: {message}" in err


def test_regression_a_column_kernel_over_a_softmaxs_nodes_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Session 55: a column kernel given SOFTMAX-NODES' first kernel (a row max, then nodes that are not along its
    columns) ended in an AssertionError's traceback inside the column lowering."""
    m = load_program(ROOT / "examples" / "families.habu").models["SOFTMAX-NODES"]
    data = default_plan(m, TARGETS["sm_90a"], {}).to_json()
    data["kernels"][0] = {"nodes": data["kernels"][0]["nodes"], "kind": "columns", "threads": 256,
                          "column_threads": 16, "vector": 1, "rows_per_split": 64, "unroll": 8, "index_width": 32}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, err = verify_in_process(monkeypatch, capsys, "families.habu", path, "SOFTMAX-NODES")
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "the plan does not fit SOFTMAX-NODES" in err and "is no epilogue the column family runs" in err


def test_regression_a_column_kernel_of_fewer_threads_than_its_column_threads_breaks_a_rule(
        tmp_path, monkeypatch, capsys):
    """Session 55 (a probe of hand-edited fields): `threads: 2` on BIAS-GRAD's column kernel (32 column threads)
    ended in a ZeroDivisionError inside the lowering (no row group); the supported-path rule refuses it now, as it
    refused 48."""
    path = plan_file(tmp_path, "bias_grad.habu", "BIAS-GRAD", {}, threads=2)
    code, err = verify_in_process(monkeypatch, capsys, "bias_grad.habu", path)
    assert code == 1 and "Traceback" not in err
    assert "breaks rule supported-path" in err and "the block's 2 threads are whole row groups of 32 column" in err


def test_regression_a_split_k_beyond_the_k_tiles_is_refused_before_the_field_check(tmp_path, monkeypatch, capsys):
    """Session 55 (a probe of hand-edited fields): `split_k: 4096` on MOE-UP's sm_80 kernel (128 k tiles of 32)
    passed every rule, and the field check, holding every split's partials, went past 4.5 GiB. Rule
    split-k-tiles refuses it now; a split of exactly the k tiles stays a plan (checked at 1.6 GB)."""
    m = load_program(ROOT / "examples" / "moe_gather.habu").models["MOE-UP"]
    data = default_plan(m, TARGETS["sm_80"], {}, {}).to_json()
    data["kernels"][0]["split_k"] = 4096
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, err = verify_in_process(monkeypatch, capsys, "moe_gather.habu", path, model="MOE-UP")
    assert code == 1 and "Traceback" not in err
    assert "breaks rule split-k-tiles" in err and "split_k 4096 but #K = 4096 holds 128 k tiles of 32" in err


def test_regression_fused_n2147483644_threads96_is_refused_by_habu_compile(tmp_path):
    """The reproduction as a user types it: certified before, refused now (before the finite-field
    check, which at this size also needed 16 GiB per box lookup table then)."""
    r = habu("compile", "examples/fused.habu", "--shape", "N=2147483644", "--pin", "threads=96", "-o", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "breaks rule int32-offsets" in r.stderr and "--pin index=64" in r.stderr


def test_verify_by_subprocess_prints_error_and_exits_1_for_a_bad_field(tmp_path):
    path = plan_file(tmp_path, "ggemm.habu", "GGEMM", GGEMM, tile_k=0)
    r = habu("verify", "examples/ggemm.habu", "--plan", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("habu: error: ") and "tile_k must be a whole number ≥ 1, got 0" in r.stderr


@pytest.mark.parametrize("split, broken", [(128, False), (129, True), (2, False)])
def test_split_k_tiles_holds_up_to_the_k_tiles_and_no_further(split, broken):
    """MOE-UP on sm_80 has 128 k tiles of 32: a split of 128 (one k tile each) keeps to the rule, 129 breaks it."""
    from habu.plan.plan import Plan
    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "moe_gather.habu").models["MOE-UP"]
    data = default_plan(m, TARGETS["sm_80"], {}, {}).to_json()
    data["kernels"][0]["split_k"] = split
    obs = [o for o in obligations(m, Plan.from_json(data)) if o.rule.name == "split-k-tiles"]
    assert len(obs) == 1 and (obs[0] in failures(obs)) == broken


def test_split_k_tiles_leaves_a_runtime_k_unguarded():
    """A runtime #K (1..65536: a weight gradient's tokens) may hold fewer k tiles than the splits at some sizes; its
    empty splits add zeros, so the rule neither refuses the plan nor guards it off at those sizes."""
    from dataclasses import replace

    from habu.prove.rules import guards, obligations
    from habu.spec.parser import parse_text

    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    model = parse_text(src).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_80"], None, {})
    plan = replace(plan, kernels=(replace(plan.kernels[0], split_k=8),))
    obs = [o for o in obligations(model, plan) if o.rule.name == "split-k-tiles"]
    assert len(obs) == 1 and obs[0].status == "proved" and obs[0] not in guards(obs)
