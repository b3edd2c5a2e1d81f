"""Shared helpers: parse text, expect an error, check the error format."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from habu.errors import HabuError
from habu.spec.parser import parse_text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.habu"))
SEEDS = ROOT / "tests" / "seed"
SHARED_SEED = ROOT.parent / "shared" / "seeds" / "000_b86b16e3bdc72b89.txt"

# The tests never read or write the user's plan database: each test process (each xdist worker) has its own,
# which the `habu` subprocesses the tests start inherit; a test that needs an empty one sets its own.
os.environ["HABU_DB"] = str(Path(tempfile.mkdtemp(prefix="habu-tests-")) / "plans.sqlite")

# No per-example deadline: on CI's loaded 2-core machine a z3 simplification took over hypothesis's default
# 200 ms (test_guards.py::test_agrees_with_z3 failed with DeadlineExceeded, session 32). The examples still run.
settings.register_profile("habu", deadline=None)
settings.load_profile("habu")

ERROR_HEAD = re.compile(r"^(?P<path>[^\n]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.+)$")


def parse(text: str, path: str = "t.habu"):
    return parse_text(text, path)


def error_of(text: str, path: str = "t.habu") -> HabuError:
    with pytest.raises(HabuError) as info:
        parse_text(text, path)
    return info.value


def assert_error_format(err: HabuError, path: str = "t.habu") -> re.Match:
    """`FILE:LINE:COL: error: message`, then the source line, then a caret under the column."""
    lines = err.render().split("\n")
    m = ERROR_HEAD.match(lines[0])
    assert m, f"bad first line: {lines[0]!r}"
    assert m.group("path") == path
    assert len(lines) >= 3, err.render()
    col = int(m.group("col"))
    caret = lines[2]
    assert caret.lstrip(" \t").startswith("^"), err.render()
    pad = len(caret) - len(caret.lstrip(" \t"))
    if lines[1].startswith("…"):  # a long line, shown around the column: the caret is under the same character
        assert err.span is not None and lines[1][pad] == err.span.source.text[err.span.offset], err.render()
    else:
        assert pad == col - 1, err.render()
    assert "Traceback" not in err.render()
    return m


def where(err: HabuError) -> tuple[int, int]:
    assert err.span is not None
    return err.span.line, err.span.col


# The long tests (`slow`), in one place: CI runs everything; `pytest -m "not slow"` is the inner loop.
# Whole files (Ray clusters, searches and process pools, NVRTC/nvcc builds of many plans, fuzzing), and
# single tests by name.
SLOW_FILES = ("tests/cluster/test_ray.py", "tests/cluster/test_ray_node_loss.py", "tests/cluster/test_ray_connect.py",
              "tests/search/test_pool.py", "tests/search/test_tasks.py", "tests/search/test_prune.py",
              "tests/search/test_limits.py", "tests/spec/test_fuzz.py", "tests/test_export.py",
              "tests/test_export_launcher.py", "tests/lower/test_general.py", "tests/test_plans.py",
              "tests/lower/test_batched.py", "tests/lower/test_transposed.py",
              "tests/test_plan_import.py", "tests/search/test_search.py", "tests/test_tune_buckets.py",
              "tests/test_compile_buckets.py", "tests/test_backward_plans.py", "tests/gpu/test_moe_examples.py")
SLOW_TESTS = ("test_default_plan_of_every_example_compiles", "test_a_search_without_a_gpu_stores_no_candidate_ptxas", "test_regression_a_full_prefill_of_few_kv_tiles",
              "test_the_fused_kernels_compile_without_spills",
              "test_the_moe_examples_prove_through_grouped_kernels",
              "test_the_wgmma_plan_at_head_width_128_is_proven_and_builds_without_spills",
              "test_every_path_prints_some_of_its_index_arithmetic_from_the_lowering",
              "test_the_wgmma_kernel_compiles_with_nvrtc_without_spills",
              "test_a_seeded_sample_of_legal_plans_compiles",
              "test_regression_a_plans_kernels_compile_as_one_translation_unit",
              "test_mutant_is_killed_with_the_element_it_spoils", "test_a_search_", "test_habu_search",
              "test_the_readme_recipe", "test_k511_every_sampled_legal_plan", "test_the_search_on_cpu_picks",
              "test_regression_many_processes_opening", "test_search_writes_results_to_stdout",
              "test_regression_a_movement_pin_failed", "test_every_partition_of_the_rewritten_model",
              "test_regression_cpu_search_top5_tied", "test_habu_tune_stores",
              "test_the_torch_baseline_scatters_with_accumulation", "test_compile_backward_proves_the_derived_model",
              "test_grad_prints_the_backward_and_habu_check", "test_grad_refusals_are_errors_with_a_place",
              "test_grad_saves_a_value_the_user_names", "test_skinny_defaults_are_proven_and_compile",
              "test_the_search_space_of_a_skinny_contraction_holds",
              "test_regression_row_kernels_caching_different_words")


# Under pytest-xdist (`-n auto`, the README's test command) each file's tests run in one worker (a module-scoped
# fixture is built once), and the files that start Ray clusters on this machine all in one worker, one after
# another (two local clusters at once took each other down: "Owner's node has crashed", a worker lost).
RAY_FILES = ("tests/cluster/test_ray.py", "tests/cluster/test_ray_node_loss.py", "tests/cluster/test_ray_connect.py",
             "tests/cluster/test_cluster_files.py")


def xdist_scope(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's file, or "ray" for the Ray files."""
    path = nodeid.split("::", 1)[0]
    return "ray" if path in RAY_FILES else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the dev extra); unknown, and unused, without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """`--dist loadfile`, with the Ray files as one file. (xdist_group marks cannot do it: pytest 9
        no longer lets xdist's `loadgroup` rename a test's id, so the marks are silently ignored.)"""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark the long tests `slow`; skip tests marked `gpu` when this machine has no CUDA device."""
    slow = pytest.mark.slow
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in SLOW_FILES or any(item.name.startswith(t) for t in SLOW_TESTS):
            item.add_marker(slow)
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    from habu.emit_cuda.driver import device_count

    if device_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device (cuInit/cuDeviceGetCount found none)")
        for item in gpu:
            item.add_marker(skip)


# the winner of `habu search examples/rmsnorm_linear.habu --budget 3m` on the H200 (2026-11-30)
RMSNORM_LINEAR_WINNER = {"kind": "contraction", "nodes": ["Y.sum", "Y"], "tile_m": 128, "tile_n": 256, "tile_k": 64,
                         "warps": 12, "stages": 4, "mma": "wgmma", "a_move": "tma", "b_move": "staged",
                         "a_vector": 8, "b_vector": 8, "split_k": 1, "raster": "row", "group_m": 8,
                         "persistent": True, "warp_specialized": True, "swizzle": 128, "accumulator": "f32",
                         "index_width": 32}


def winner_plan(model, target, sizes):
    """RMSNorm + Linear as the search's winner computes it: factor:Y, a row-statistic kernel, then
    wgmma with W staged K-major, at the given shape."""
    from habu.plan.plan import Plan
    from habu.plan.rewrite import apply_rewrites
    from habu.search.space import default_kernels, make_plan

    g = apply_rewrites(model, ("factor:Y",))
    plan = make_plan(model, target, default_kernels(g, target, sizes), sizes, ("factor:Y",)).to_json()
    plan["kernels"] = [RMSNORM_LINEAR_WINNER if k["kind"] == "contraction" else k for k in plan["kernels"]]
    return Plan.from_json(plan)


def gemm_kn_source(m: int = 1000, n: int = 776, k: int = 511) -> str:
    """A GEMM whose B is stored (K, N), contiguous along n (a weight as x @ W reads it), f32 out."""
    return f"""
{m} EXTENT: #M
{n} EXTENT: #N
{k} EXTENT: #K
bf16 TENSOR: A ( #M #K )
bf16 TENSOR: B ( #K #N )
f32  TENSOR: C ( #M #N )
MODEL: GEMM-KN  C[m n] = Σ k A[m k] · B[k n] ;
"""


@pytest.fixture
def every_field_check_fails(monkeypatch):
    """Every finite-field check fails (its certificate says a planted wrong element), and the
    checks kept from earlier tests are forgotten: a search that verifies nothing."""
    from habu.prove import verify
    from habu.search import tasks

    real = verify.verify_plan

    def wrong(*args, **kwargs):
        cert = real(*args, **kwargs)
        cert.passed, cert.failure = False, "O[0, 0] differs (planted)"
        return cert

    monkeypatch.setattr(verify, "verify_plan", wrong)
    tasks.FIELD_CHECKS.clear()


@contextlib.contextmanager
def python_handles_ctrl_c():
    """Python's own SIGINT handler (KeyboardInterrupt) for the block, whatever the test process had: a
    full parallel run once left an xdist worker where neither a z3 check nor a `habu search` child saw a
    Ctrl-C (the Ctrl-C tests passed alone and in every other run)."""
    previous = signal.getsignal(signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def child_default_sigint() -> None:
    """A `preexec_fn`: the child starts with SIGINT at its default and unblocked (an ignored SIGINT is
    inherited across exec, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
