"""One small plan per emitter path under compute-sanitizer's memcheck, racecheck and synccheck.

    python -m habu.bench.sanitize_paths                  # every path, every tool: a table; exit 1 on any error
    python -m habu.bench.sanitize_paths --case fma       # one path, once (what the sanitizer runs)

Each case is built (proved, emitted, compiled), run once in red-zoned buffers and checked exactly
(habu.timing.exact) where the model is integer-exact, else against the float64 reference with the
tolerance golden. The driver first runs every case without a sanitizer (compiling the kernels into
the cache), then once per case and tool under `compute-sanitizer --tool TOOL`, and counts the
errors the sanitizer reports ("ERROR SUMMARY: N errors").
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EX = Path(__file__).resolve().parents[2] / "examples"

# an integer-exact row model: a row reduction and an elementwise epilogue in one row kernel
ROWS_SOURCE = """64 EXTENT: #R
1000 EXTENT: #C
bf16 TENSOR: X ( #R #C )
bf16 TENSOR: Y ( #R #C )
MODEL: ROW-SUM  Y[r c] = X[r c] + Σ c2 X[r c2] ;
MODEL: ROW-MAX  Y[r c] = X[r c] - max c2 X[r c2] ;
"""

GG = {"M": 300, "N": 200, "K": 512}
CASES: dict[str, tuple[str, str, dict[str, int], dict[str, str]]] = {
    "fma": ("ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma"}),
    "fma-split-k": ("ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma", "split_k": "2"}),
    "mma.sync": ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 520}, {"mma": "mma.sync"}),
    "wgmma-tma": ("gemm.habu", "GEMM", {"M": 256, "N": 384, "K": 512}, {"A": "tma", "B": "tma"}),
    "wgmma-cp.async": ("ggemm.habu", "GGEMM", GG, {"B": "cp.async"}),
    "wgmma-tma-store-f32": ("ggemm.habu", "GGEMM", GG, {"store": "tma"}),  # 32-column boxes of f32
    "wgmma-staged": ("ggemm.habu", "GGEMM", GG, {"A": "staged", "B": "staged"}),
    "wgmma-ragged-k": ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {}),
    # the saved product staged beside the chain's end, both by TMA (session 48): buffers shared per round
    "wgmma-tma-two-outputs": ("../tests/data/two_outputs.habu", "LINEAR-RELU-SAVED", {"B": 200, "D": 256, "H": 520},
                              {}),
    # a column sum in the epilogue (session 49): partials in the TMA-store buffers, a barrier of the consumers;
    # persistent, each block's next tile refills those buffers after the finishing threads read them
    "wgmma-column-sum": ("../tests/data/column_epilogue.habu", "BIASED-COLSUM", {}, {}),
    "wgmma-column-sum-persistent": ("../tests/data/column_epilogue.habu", "BIASED-COLSUM", {"N": 4000},
                                    {"persistent": "true", "tile": "64x128x64"}),
    # several tiles of m: the tile rows' sums in a workspace, the column tile's last block finishing
    "wgmma-column-sum-tile-rows": ("../tests/data/column_epilogue.habu", "BIASED-COLSUM", {"M": 300}, {}),
    # the second consumer warpgroup a named barrier behind the first (`consumer_lag`, session 49)
    "wgmma-consumer-lag": ("gemm.habu", "GEMM", {"M": 256, "N": 384, "K": 512}, {"tile": "128x128x64", "lag": "2"}),
    "wgmma-consumer-lag-persistent": ("gemm.habu", "GEMM", {"M": 1000, "N": 1300, "K": 1024},
                                      {"tile": "128x128x64", "lag": "2", "persistent": "true"}),
    "rows-sum": ("<rows>", "ROW-SUM", {}, {}),
    # a row read through an index tensor, kept in registers (session 48)
    "rows-gathered": ("../tests/data/row_gather.habu", "GATHERED-RMSNORM", {"D": 4096, "R": 40}, {}),
    "rows-max": ("<rows>", "ROW-MAX", {}, {}),
    "rows-softmax": ("softmax.habu", "SOFTMAX-ROWS", {"R": 16, "C": 1000}, {}),
    "map": ("fused.habu", "AXPY-RELU", {"N": 4100}, {}),
    "columns-splits": ("bias_grad.habu", "BIAS-GRAD", {"R": 300, "N": 200}, {}),
    "columns-one-split": ("bias_grad.habu", "BIAS-GRAD", {"R": 300, "N": 1001}, {"rows_per_split": "300"}),
    "general": ("../tests/data/general_corpus/gather_expert.habu", "EXPERTS", {}, {}),
    "wgmma-batched": ("bmm.habu", "SCORES", {"B": 3, "I": 130, "J": 200, "D": 64}, {}),
    "wgmma-batched-persistent": ("bmm.habu", "SCORES", {"B": 3, "I": 130, "J": 200, "D": 64},
                                 {"persistent": "true"}),
    "wgmma-cluster2": ("ggemm.habu", "GGEMM", {"M": 512, "N": 512, "K": 512},
                       {"cluster": "2", "tile": "128x256x64", "stages": "3"}),
    "wgmma-cluster-split": ("ggemm.habu", "GGEMM", {"M": 100, "N": 300, "K": 1000},  # DSMEM partials (issue 20)
                            {"tile": "64x128x64", "stages": "4", "split_k": "4", "split_reduce": "cluster"}),
    "wgmma-swap-ab": ("ggemm.habu", "GGEMM", {"M": 13, "N": 300, "K": 1000},  # transposed, tokens gathered (s43)
                      {"swap_ab": "true", "tile": "64x16x64", "stages": "4", "split_k": "2", "split_reduce": "cluster"}),
    "wgmma-swap-a-ahead": ("ffn_skip.habu", "FFN-SKIP", {"B": 13, "D": 256, "H": 320},  # weights before the wait
                           {"swap_ab": "true", "tile": "64x16x64", "stages": "4", "a_ahead": "true"}),
    "rows-cluster": ("softmax.habu", "SOFTMAX-ROWS", {"R": 4, "C": 16384}, {"row_cluster": "2", "threads": "512"}),
    "scatter": ("scatter_add.habu", "UNPERMUTE", {"R": 300, "T": 100, "N": 200}, {}),
    "grouped": ("../tests/data/grouped_gemm.habu", "GROUPED-GATHER", {"T": 50, "R": 300}, {}),
    # the grouped weight gradient's producer copying its bf16 operands by cp.async (session 50): a stage's copies
    # still landing while the producer runs ahead; an f32 A beside them through registers
    "grouped-wgrad-async": ("../tests/data/grouped_wgrad.habu", "WGRAD-BF16", {"T": 300, "R": 1000},
                            {"wgrad_copy": "cp.async"}),
    "grouped-wgrad-async-f32": ("../tests/data/grouped_wgrad.habu", "WGRAD-P", {"T": 300, "R": 1000},
                                {"wgrad_copy": "cp.async"}),
    "grouped-wgrad-async-scaled": ("../tests/data/grouped_wgrad.habu", "WGRAD-P-BF16", {"T": 300, "R": 1000},
                                   {"wgrad_copy": "cp.async"}),  # the scaled bf16 A two k tiles deep in registers
    "grouped-wgrad-registers": ("../tests/data/grouped_wgrad.habu", "WGRAD-BF16", {"T": 300, "R": 1000},
                                {"wgrad_copy": "registers"}),
    # session 51's staged A (a block a tile, not the walk): every operand by cp.async, the consumers' in-place pass
    # over their slab (an f32 A split where it landed raw, a row factor applied there): the warpgroup's reads before
    # its writes (racecheck)
    "grouped-wgrad-staged": ("../tests/data/grouped_wgrad.habu", "WGRAD", {"T": 300, "R": 1000},
                             {"wgrad_copy": "staged", "wgrad_persistent": "false"}),
    "grouped-wgrad-staged-scaled": ("../tests/data/grouped_wgrad.habu", "WGRAD-P", {"T": 300, "R": 1000},
                                    {"wgrad_copy": "staged", "wgrad_persistent": "false"}),
    "grouped-wgrad-staged-bf16-scaled": ("../tests/data/grouped_wgrad.habu", "WGRAD-P-BF16", {"T": 300, "R": 1000},
                                         {"wgrad_copy": "staged", "wgrad_persistent": "false"}),
    # session 52's persistent walk: the ring and the index ring running on across work items (an item's last
    # stages still in flight while the next item's indices and tiles land): 80 groups' 320 items over 132 blocks
    "grouped-wgrad-persistent": ("../tests/data/grouped_wgrad.habu", "WGRAD", {"T": 300, "R": 2000, "G": 80},
                                 {"wgrad_copy": "staged", "wgrad_persistent": "true"}),
    "grouped-wgrad-persistent-bf16-scaled": ("../tests/data/grouped_wgrad.habu", "WGRAD-P-BF16",
                                             {"T": 300, "R": 2000, "G": 80},
                                             {"wgrad_copy": "staged", "wgrad_persistent": "true"}),
    "grouped-combine": ("../tests/data/grouped_scatter.habu", "COMBINE-BF16", {"T": 50, "R": 300},
                        {"family": "grouped"}),
    "attention": ("attention.habu", "ATTENTION-GQA", {}, {}),
    "attention-fused": ("attention.habu", "ATTENTION-GQA", {}, {"family": "attention"}),
    "attention-split-kv": ("decode_attention.habu", "DECODE-ATTENTION", {"J": 300, "L": 301},
                           {"family": "attention", "bm": "16", "kv_split": "128"}),
    "attention-sliced-kv": ("decode_attention.habu", "DECODE-ATTENTION", {"J": 300, "L": 301},  # kv_warps (s31)
                            {"family": "attention", "bm": "16", "bn": "64", "kv_split": "128", "kv_warps": "4",
                             "stages": "3"}),
    # the decode's default since session 55: 8 warps over 128-key tiles, 3 buffers, a ragged last split
    "attention-wide-decode": ("decode_attention.habu", "DECODE-ATTENTION", {"J": 700, "L": 701},
                              {"family": "attention", "bm": "16", "bn": "128", "kv_split": "256", "kv_warps": "8",
                               "stages": "3"}),
    # the first K/V tiles copied before LEN is read (kv_ahead, s45): masked splits' copies still in flight at the merge
    "attention-kv-ahead": ("decode_attention.habu", "DECODE-ATTENTION", {"J": 300, "L": 301},
                           {"family": "attention", "bm": "16", "bn": "64", "kv_split": "128", "kv_warps": "4",
                            "stages": "3", "kv_ahead": "true"}),
    "attention-wgmma": ("attention.habu", "ATTENTION-GQA", {"E": 64, "D": 64, "I": 100, "J": 150},
                        {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "64"}),
    "attention-wgmma-pingpong": ("attention.habu", "ATTENTION-GQA", {"E": 128, "D": 128, "I": 200, "J": 260},
                                 {"family": "attention", "main_loop": "wgmma", "pingpong": "1"}),  # the default (s31)
    # persistent blocks (s32): 10 query tiles × 16 heads = 160 work tiles, more than an H200's 132 SMs (blocks walk
    # one or two), fewer keys than queries (tiles with no KV tile free Q at once)
    "attention-wgmma-persistent": ("attention.habu", "ATTENTION-GQA",
                                   {"B": 1, "G": 8, "R": 2, "E": 64, "D": 64, "I": 600, "J": 450},
                                   {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "64",
                                    "persistent": "1"}),
    # the prefill default since session 33: two consumers in ping-pong, persistent, 128-row query tiles, causal GQA
    # with more keys than queries (4 query tiles × 16 heads over 132 SMs and over the check's small grids)
    "attention-wgmma-default": ("attention.habu", "ATTENTION-GQA",
                                {"B": 1, "G": 8, "R": 2, "E": 128, "D": 128, "I": 500, "J": 620},
                                {"family": "attention", "main_loop": "wgmma", "pingpong": "1", "persistent": "1"}),
    # the same, head-major (session 36: the default where the heaviest-first order would re-read K and V from DRAM)
    "attention-wgmma-head-major": ("attention.habu", "ATTENTION-GQA",
                                   {"B": 1, "G": 8, "R": 2, "E": 128, "D": 128, "I": 500, "J": 620},
                                   {"family": "attention", "main_loop": "wgmma", "pingpong": "1", "persistent": "1",
                                    "head_major": "1"}),
    # a decode on the wgmma loop split over its keys (session 35): 8 sequences of 1000 keys in splits of 256, the
    # consumers' partials, their combine on a named barrier, the counters reset
    "attention-wgmma-decode-split": ("decode_attention.habu", "DECODE-ATTENTION",
                                     {"B": 8, "G": 2, "R": 2, "E": 128, "D": 128, "J": 1000, "L": 1001},
                                     {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "64",
                                      "stages": "3", "kv_split": "256", "kv_warps": "1"}),
    "grouped-wgmma": ("../tests/data/grouped_gemm.habu", "GROUPED-GATHER", {"T": 50, "R": 300},
                      {"family": "grouped", "main_loop": "wgmma"}),
    # session 51: an f32 A copied raw and split by the consumers in place (`a_split` consumers)
    "grouped-wgmma-f32-split": ("../tests/data/grouped_scatter.habu", "COMBINE-F32", {"T": 50, "R": 300},
                                {"family": "grouped", "main_loop": "wgmma", "a_split": "consumers"}),
    "wgmma-scatter-add": ("../tests/data/ggemm_backward.habu", "GGEMM-DA", {"M": 300, "N": 200, "K": 136}, {}),
    "wgmma-k-gathered": ("../tests/data/ggemm_backward.habu", "GGEMM-DB", {"M": 300, "N": 200, "K": 136}, {}),
    # the scatter taken out of the epilogue (an f32 product, then the general scatter, 4 elements a thread)
    # and the gathered copy before a plain contraction of two m-major operands (session 30)
    "scatter-split": ("../tests/data/ggemm_backward.habu", "GGEMM-DA", {"M": 300, "N": 200, "K": 136},
                      {"rewrite": "scatter:dA", "elements": "4"}),
    "gather-split": ("../tests/data/ggemm_backward.habu", "GGEMM-DB", {"M": 300, "N": 200, "K": 136},
                     {"rewrite": "gather:dB"}),
    # the same, moving vectors: red.global.add.v4.f32, 16-byte copies (session 31)
    "scatter-split-vector": ("../tests/data/ggemm_backward.habu", "GGEMM-DA", {"M": 300, "N": 200, "K": 136},
                             {"rewrite": "scatter:dA", "vector": "4", "elements": "2"}),
    "gather-split-vector": ("../tests/data/ggemm_backward.habu", "GGEMM-DB", {"M": 300, "N": 200, "K": 136},
                            {"rewrite": "gather:dB", "vector": "8"}),
    "mma.sync-trans": ("../tests/data/general_corpus/bmm_pv_transposed.habu", "PV-T", {}, {"mma": "mma.sync"}),
}
TOOLS = ("memcheck", "racecheck", "synccheck")


def example_path(name: str) -> str:
    if name != "<rows>":
        return str(EX / name)
    path = Path(tempfile.gettempdir()) / "habu_sanitize_rows.habu"
    path.write_text(ROWS_SOURCE)
    return str(path)


def run_case(name: str) -> str:
    """Build and run one case once; a line saying how it was checked. Raises when it is wrong."""
    from habu.bench.run import build
    from habu.timing.exact import kept_types
    from habu.timing.exact_gpu import ExactChecker
    from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference, torch

    path, model, sizes, pins = CASES[name]
    built = build(example_path(path), model, sizes, pins)
    result = ExactChecker(built.model, built.sizes).check(built.compiled, kept_types(built.plan))
    if not result.ok:
        raise AssertionError(f"{name}: {result.reason()}")
    if result.applicable:
        return f"{name}: {result.summary}"
    inputs = make_inputs(built.model, built.sizes, 5)
    outs = poisoned_outputs(built.model, built.sizes)
    ref = reference(built.model, inputs, built.sizes)
    res = built.compiled(**inputs, **outs)
    torch().cuda.synchronize()
    res = res if isinstance(res, dict) else {built.model.outputs[0].name: res}
    tol = plan_tolerance(built.model, built.plan)
    for k, v in res.items():
        g = compare(v, ref[k], tol)
        if not g.ok:
            raise AssertionError(f"{name}: {k} relative error {g.rel_error:.1e} > {tol:.0e}, {g.unwritten} unwritten")
    return f"{name}: {result.summary}; golden within {tol:.0e}"


ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, \d+ warnings?\)")


def sanitizer_errors(output: str) -> int | None:
    """The error count compute-sanitizer printed (its ERROR SUMMARY, else racecheck's summary), or
    None when it printed no summary."""
    found = ERROR_SUMMARY.findall(output) or RACECHECK_SUMMARY.findall(output)
    return sum(int(n) for n in found) if found else None


def sanitize(name: str, tool: str, sanitizer: str = "compute-sanitizer", timeout_s: float = 900.0) -> tuple[int, str]:
    """Run one case under one tool: (errors, the sanitizer's output). A run that fails without a
    summary counts as one error."""
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "3", sys.executable, "-m", "habu.bench.sanitize_paths",
           "--case", name]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                           cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired as exc:
        return 1, f"timed out after {timeout_s:.0f} s: {exc}"
    text = r.stdout + r.stderr
    errors = sanitizer_errors(text)
    if errors is None or (errors == 0 and r.returncode != 0):
        return max(1, errors or 0), text
    return errors, text


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit's usual place."""
    for candidate in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
                      *sorted(map(str, Path("/usr/local").glob("cuda-*/bin/compute-sanitizer")), reverse=True)):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--tool", action="append", choices=TOOLS, help="default: all three")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="cases to sanitize (default: all)")
    args = ap.parse_args(argv)
    if args.case:
        print(run_case(args.case), flush=True)
        return 0
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("habu: error: compute-sanitizer is not on PATH nor in /usr/local/cuda*/bin (it ships with the CUDA "
              "toolkit)", file=sys.stderr)
        return 1
    cases = args.only or list(CASES)
    for name in cases:  # compile into the cache, and check, outside the sanitizer
        print(run_case(name), flush=True)
    failed = 0
    for name in cases:
        for tool in args.tool or TOOLS:
            errors, text = sanitize(name, tool, sanitizer)
            print(f"{'ok  ' if errors == 0 else 'FAIL'} {tool:9s} {name}: {errors} errors", flush=True)
            if errors:
                failed += 1
                print(text[-4000:], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
