"""Row kernels on the CPU: what each pass computes per column and per row, and the default thread
counts (the emitted kernels run against the float64 reference in tests/gpu/test_golden.py)."""

from __future__ import annotations

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.lower.rows import register_row_chunks
from habu.paths.emit import emit_plan
from habu.search.space import default_plan, parse_pins
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


def rows_kernel(example: str, model: str, sizes: dict[str, int], pins: list[str] = ()):
    m = load_program(ROOT / "examples" / example).models[model].with_sizes(sizes)
    plan = default_plan(m, T, sizes, parse_pins(list(pins)))
    (kernel,) = emit_plan(m, plan, T).kernels
    return plan.kernels[0], kernel


def body_of(kernel) -> str:
    return kernel.source[kernel.source.index("__global__"):]


def test_softmax_with_its_row_in_registers_computes_each_exp_once():
    """The sum pass keeps exp(x - max) per column for the final pass, which multiplies it by the
    reciprocal of the sum (before: exp twice per column and a division)."""
    _plan_kernel, k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 4096})
    body = body_of(k)
    assert body.count("habu::f_exp(") == 1 and "held1[i][q] = v;" in body
    assert "(1.0f / red1)" in body and "/ red1)" not in body.replace("(1.0f / red1)", "")
    res = compile_cuda(k.source, k.name, "sm_90a").resources
    assert not res.spills, res.describe()


def test_softmax_through_shared_memory_computes_exp_in_both_passes():
    """Rows too long for registers keep nothing per column between passes."""
    _plan, k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 65536}, ["threads=1024"])
    body = body_of(k)
    assert "row_cache[" in body and "held" not in body and body.count("habu::f_exp(") == 2


def test_row_constants_are_computed_once_per_row():
    """RMSNorm's rsqrt of the mean square is a row constant: computed after the reduction, outside
    the column loop; LayerNorm's mean and inverse deviation too."""
    _plan, k = rows_kernel("rmsnorm.habu", "RMSNORM-ROWS", {"D": 4096})
    body = body_of(k)
    (line,) = [ln for ln in body.splitlines() if "habu::f_rsqrt(" in ln]
    assert line.strip().startswith("const float rc") and "once per row" in line


def test_layernorm_hoists_its_scale_and_divides_by_its_width_once(tmp_path):
    src = tmp_path / "ln.habu"
    src.write_text("8192 EXTENT: #R\n4096 EXTENT: #D\nbf16 TENSOR: X ( #R #D )\nbf16 TENSOR: Y ( #R #D )\n"
                   "MODEL: LN ( x -- y ) LAYERNORM ;\n")
    m = load_program(src).models["LN"]
    (k,) = emit_plan(m, default_plan(m, T), T).kernels
    body = body_of(k)
    (rsqrt,) = [ln for ln in body.splitlines() if "habu::f_rsqrt(" in ln]
    assert "once per row" in rsqrt
    assert "/ (float)(4096)" not in body.replace("(1.0f / (float)(4096))", "")  # 1/#D once, then products
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills


@pytest.mark.parametrize("cols, threads, rows", [(1024, 32, 4), (4096, 128, 1), (16384, 512, 1),
                                                 (32768, 1024, 1)])
def test_default_row_threads_keep_the_row_in_registers(cols, threads, rows):
    """About four 16-byte chunks per thread, fewer threads where that keeps the row in registers, a
    warp per row only for rows of at most 32 chunks (H200, 2026-12-01: softmax at 4096 columns
    59.5 µs with a warp per row, 37.6 with 128 threads)."""
    for example, model, key in (("softmax.habu", "SOFTMAX-ROWS", "C"), ("rmsnorm.habu", "RMSNORM-ROWS", "D")):
        kernel, _k = rows_kernel(example, model, {key: cols})
        assert (kernel.threads, kernel.rows_per_block) == (threads, rows)
        assert register_row_chunks(cols, kernel.threads, kernel.vector, kernel.rows_per_block, 2)


def test_rmsnorm_keeps_a_row_of_65536_in_registers_with_512_threads():
    """One pass over the row: 16 chunks per thread in registers (535 µs on the H200 at 8192 rows),
    not 1024 threads through shared memory (598 µs)."""
    kernel, k = rows_kernel("rmsnorm.habu", "RMSNORM-ROWS", {"D": 65536})
    assert (kernel.threads, kernel.cache_row) == (512, True) and "uint4 regs[16]" in body_of(k)


def test_regression_softmax_at_65536_columns_spilled_its_row_from_registers():
    """The default kept softmax's row of 65536 in registers, 16 chunks for each of 512 threads: ptxas
    keeps every chunk's 8 converted floats live between the passes, and the kernel used 128 registers
    and spilled 600 bytes (793.9 µs on the H200). A row read by several passes keeps at most 8 chunks
    per thread; here it goes through shared memory with 1024 threads (736.0 µs)."""
    kernel, k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 65536})
    assert (kernel.threads, kernel.prefetch) == (1024, False) and "row_cache[" in body_of(k)
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills
    assert register_row_chunks(65536, 512, 8, 1, 2, passes=1) == 16
    assert register_row_chunks(65536, 512, 8, 1, 2, passes=2) == 0


def test_a_block_that_fills_the_sm_prefetches_its_next_row():
    """Softmax at 32768 columns: 1024 threads keep the row in registers and fill the SM's registers,
    so the default makes the blocks persistent, each copying its next row into shared memory
    (cp.async) while it computes this one. Each thread copies and later reads only its own chunks,
    and issues the copy once the first pass has used them."""
    from habu.prove.verify import verify_plan

    kernel, k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 32768})
    assert (kernel.threads, kernel.prefetch) == (1024, True)
    body = body_of(k)
    assert body.count("habu::cp_async<16>(habu::smem_addr(&next_row[g])") == 2  # the first row, then each next
    first_pass_end = body.index("part = fmaxf(part, v);")
    assert first_pass_end < body.index("r_next = r + row_step") < body.index("habu::block_reduce<")  # before the reduction's barriers
    assert "for (; r < 8192; r += row_step)" in body and k.smem == 2 * 32768
    # the grid is what the GPU holds at once, at most one block per row
    assert k.grid({"R": 8192, "C": 32768}, 132) == (132, 1, 1) and k.grid({"R": 100, "C": 32768}, 132) == (100, 1, 1)
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills
    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"R": 64, "C": 32768})
    plan = default_plan(m, T, {"R": 64, "C": 32768})
    assert plan.kernels[0].prefetch and verify_plan(m, plan, {"R": 64}, trials=1).passed


@pytest.mark.parametrize("example, model, key, cols", [("softmax.habu", "SOFTMAX-ROWS", "C", 16384),
                                                       ("rmsnorm.habu", "RMSNORM-ROWS", "D", 32768),
                                                       ("softmax.habu", "SOFTMAX-ROWS", "C", 65536),
                                                       ("softmax.habu", "SOFTMAX-ROWS", "C", 131072)])
def test_prefetch_is_not_the_default_where_it_lost(example, model, key, cols):
    """Two blocks to an SM overlap by themselves (softmax at 16384: 138.1 µs without, 151.9 with);
    RMSNorm's single pass reaches 95% of copy without it at 32768 (264.5 against 284.0); a row not in
    registers cannot; clusters lost (softmax 2048x131072: 433.7 against 720.0)."""
    kernel, _k = rows_kernel(example, model, {key: cols})
    assert not kernel.prefetch


def test_prefetch_rules_need_the_row_in_registers_and_one_row_per_block():
    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]

    def failed(cols: int, pins: list[str]) -> set[str]:
        mm = m.with_sizes({"C": cols})
        plan = default_plan(mm, T, {"C": cols}, parse_pins(pins))
        return {o.rule.name for o in failures(obligations(mm, plan))}

    assert failed(16384, ["threads=512", "row_prefetch=true"]) == set()
    assert "supported-path" in failed(65536, ["threads=1024", "row_prefetch=true"])  # 8 chunks, 64 registers
    assert "supported-path" in failed(1000, ["threads=128", "row_prefetch=true"])  # a ragged row
    assert "supported-path" in failed(16384, ["threads=512", "row_prefetch=true", "cache_row=false"])
    assert "supported-path" in failed(4096, ["threads=32", "rows=4", "row_prefetch=true"])


def test_layernorm_does_not_prefetch_softmax_does():
    """Both reduce the row twice; only softmax computes a special function per column (exp), which
    leaves the memory idle unless the next row is in flight (H200, 8192x32768: softmax 322.9 -> 296.4
    µs with the prefetch, LayerNorm 284.6 -> 287.2)."""
    from habu.lower import lower_plan
    from habu.lower.rows import column_functions
    from habu.spec.parser import parse_text

    for word, prefetch, functions in (("LAYERNORM", False, 0), ("SOFTMAX", True, 2), ("RMSNORM", False, 0)):
        m = parse_text("64 EXTENT: #R\n32768 EXTENT: #D\nbf16 TENSOR: X ( #R #D )\nbf16 TENSOR: Y ( #R #D )\n"
                       f"MODEL: M ( x -- y ) {word} ;\n").models["M"]
        plan = default_plan(m, T)
        assert plan.kernels[0].prefetch is prefetch, word
        assert column_functions(lower_plan(m, plan)[0].expression()) == functions, word


def test_a_runtime_width_never_prefetches():
    """RMSNorm's width is known at run time (256..65536): the row is not in registers, so no prefetch."""
    m = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    assert not default_plan(m, T).kernels[0].prefetch


def test_register_row_chunks_needs_whole_16_byte_chunks_and_room():
    assert register_row_chunks(4096, 128, 8, 1, 2) == 4
    assert register_row_chunks(4000, 128, 8, 1, 2) == 0  # a ragged row
    assert register_row_chunks(4096, 128, 4, 1, 2) == 0  # 8-byte vectors
    assert register_row_chunks(65536, 1024, 8, 1, 2) == 0  # 8 chunks, but 64 registers a thread
    assert register_row_chunks(65536, 256, 8, 1, 2) == 0  # 32 chunks
    assert register_row_chunks(None, 128, 8, 1, 2) == 0  # a runtime width


def test_regression_a_pinned_block_size_on_a_short_row_brings_one_row_per_block():
    """Softmax at 1000 columns defaults to a warp per row, four rows per block; `--pin threads=128`
    kept the four rows and the emitter raised ValueError (found by the GPU row-variant tests)."""
    kernel, _k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 1000}, ["threads=128"])
    assert (kernel.threads, kernel.rows_per_block) == (128, 1)
    from habu.errors import UsageError

    with pytest.raises(UsageError, match="rows=4 needs threads=32"):
        rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": 1000}, ["threads=128", "rows=4"])


def test_a_plan_file_with_several_rows_of_a_block_each_fails_its_rules():
    from dataclasses import replace

    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    plan = default_plan(m, T)
    bad = replace(plan, kernels=(replace(plan.kernels[0], threads=128, rows_per_block=4),))
    assert any("several rows per block" in o.statement for o in failures(obligations(m, bad)))


CHAINED_ROWS = """64 EXTENT: #M
{cols} EXTENT: #K
bf16 TENSOR: A ( #M #K )
bf16 TENSOR: Y ( #M #K )
MODEL: X ( a -- y ) RMSNORM RMSNORM SOFTMAX ;
"""


@pytest.mark.parametrize("cols", [64, 4096])
def test_regression_row_words_in_a_row_inline_each_others_loads(tmp_path, cols):
    """RMSNORM RMSNORM SOFTMAX in one row kernel: the second RMSNORM reads the first's x[r d'] under
    its own reduction variable, a load the lowering had recorded under another name, and emission
    raised KeyError (`habu compile` printed a traceback)."""
    src = tmp_path / "chain.habu"
    src.write_text(CHAINED_ROWS.format(cols=cols))
    m = load_program(src).models["X"]
    (k,) = emit_plan(m, default_plan(m, T), T).kernels
    body = body_of(k)
    assert body.count("-reduction over the row") == 4
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills


def test_a_cluster_of_blocks_shares_a_long_row():
    """A row of 65536 columns split over a cluster of 2 blocks: each owns half, keeps it in
    registers, and the blocks combine their partial max and sum through distributed shared memory."""
    from habu.prove.verify import verify_plan

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"R": 64})
    plan = default_plan(m, T, {"R": 64}, parse_pins(["row_cluster=2", "threads=512"]))
    (k,) = emit_plan(m, plan, T).kernels
    body = body_of(k)
    assert k.cluster == 2 and "__cluster_dims__(2, 1, 1)" in body and body.count("habu::cluster_combine<") == 2
    assert k.grid({"R": 64, "C": 16384}, 132) == (128, 1, 1)  # two blocks per row
    assert "uint4 regs[" in body  # 8192 columns per block, 2 chunks per thread
    assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills
    assert verify_plan(m, plan, {"R": 64}, trials=1).passed


def test_a_clusters_part_of_a_row_must_be_whole_vectors():
    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"C": 1000})
    plan = default_plan(m, T, {"C": 1000}, parse_pins(["row_cluster=2", "threads=128"]))
    assert any(o.rule.name == "vector-align" and "part of a row" in o.statement
               for o in failures(obligations(m, plan)))
    sm80 = default_plan(m, TARGETS["sm_80"], {"C": 1000}, parse_pins(["row_cluster=2", "threads=128"]))
    assert any(o.rule.name == "target-feature" for o in failures(obligations(m, sm80)))


@pytest.mark.parametrize("cols, share", [(65536, 1), (131072, 4), (262144, 8)])
def test_a_row_too_long_for_one_block_defaults_to_a_cluster(cols, share):
    """Rows past a block's 200 KB were read three times, uncached: 2048 x 131072 softmax ran 659.5 µs
    against torch's 557.5 on the H200; a cluster of 4 blocks (32768 columns each) ran 433.1."""
    kernel, k = rows_kernel("softmax.habu", "SOFTMAX-ROWS", {"C": cols})
    assert (kernel.cluster, kernel.cache_row) == (share, True) and k.cluster == share
    sm80 = default_plan(load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes(
        {"C": cols}), TARGETS["sm_80"], {"C": cols}).kernels[0]
    assert sm80.cluster == 1  # no clusters before Hopper


@pytest.mark.parametrize("cols, pins, why", [
    (65536, ["threads=1024"], "8 chunks a thread need about 72 registers; 1024 threads have 64 each"),
    (65536, ["threads=512"], "16 chunks of 16 bytes a thread, more than 8 (several passes read the row)"),
    (1000, ["threads=128"], "1000 columns are not whole chunks of 128 threads × 8 elements"),
    (16384, ["threads=512", "cache_row=false"], "no row is kept on chip"),
])
def test_a_refused_prefetch_says_why_the_row_is_not_in_registers(cols, pins, why):
    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"C": cols})
    plan = default_plan(m, T, {"C": cols}, parse_pins([*pins, "row_prefetch=true"]))
    (bad,) = [o for o in failures(obligations(m, plan)) if o.rule.name == "supported-path"]
    assert why in bad.detail
