"""A causal prefill's diagonal KV tile, half of it for the first consumer warpgroup (a hand edit of the default
kernel, never a plan). With 128-query tiles over 128-key tiles and queries = keys, the diagonal tile's keys 64..127
are masked for every row of consumer warpgroup 0 (the tile's rows 0..63): its S there is issued as m64n64 wgmma (the
first 32 accumulator registers: keys 0..63; the other 32 keep the last tile's values, which the masked branch
overwrites with −∞) and its P·V over 4 key steps instead of 8 (the others' P are exact zeros). The edit should give
the default's bits. The question it answers: is the skipped work worth a plan field (issue 22's 16 × 1k d64 causal
prefill, 0.98× SDPA on the H100 in sessions 67-68)?

    CASES=m16k-causal-1k-d64 ROUNDS=3 python docs/experiments/diagonal_half.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hand_edits import against_sdpa, run_cases, variant

from habu.emit_cuda.wgmma import wgmma_function, wgmma_name

S_ISSUE = re.compile(r"((?:[ \t]*habu_wgmma_m64n128_bf16\(s, [^\n]*\n){4})")
PV_ISSUE = re.compile(r"((?:[ \t]*habu_wgmma_rs_m64n64_bf16_bt\(o, pa\[\d\][^\n]*\n){8})")


def diagonal_half(src: str, s_half: bool = True, pv_half: bool = True) -> str:
    """Warpgroup 0's S of the diagonal tile (ks == qt) as m64n64 (`s_half`), its last P·V (the diagonal tile) over 4
    key steps (`pv_half`)."""
    if not s_half:
        return diagonal_pv_half(src)
    n64 = wgmma_function(64, "bf16")
    src = src.replace('#include "habu/habu.cuh"\n', '#include "habu/habu.cuh"\n' + n64, 1)
    issues = S_ISSUE.findall(src)
    assert len(issues) == 2, len(issues)
    for block, ks in zip(issues, ("0", "kt + 1"), strict=True):
        ind = re.match(r"[ \t]*", block).group(0)
        half = block.replace("habu_wgmma_m64n128_bf16(s,", f"{wgmma_name(64, 'bf16')}(*reinterpret_cast<float (*)[32]>(s),")
        src = src.replace(block, f"{ind}if (__shfl_sync(0xffffffffu, cw == 0 && ({ks}) == (long long)qt, 0)) {{  // keys 64.. masked for rows 0..63\n"
                                 f"{half}{ind}}} else {{\n{block}{ind}}}\n", 1)
    return diagonal_pv_half(src) if pv_half else src


def diagonal_pv_half(src: str) -> str:
    """Warpgroup 0's last P·V (the diagonal tile) over 4 key steps."""
    pvs = PV_ISSUE.findall(src)
    assert len(pvs) == 2, len(pvs)
    last = pvs[1]
    ind = re.match(r"[ \t]*", last).group(0)
    four = "".join(last.splitlines(keepends=True)[:4])
    head, tail = src.rsplit(last, 1)
    return head + (f"{ind}if (__shfl_sync(0xffffffffu, cw == 0 && tiles - 1 == (long long)qt, 0)) {{  // the diagonal tile's keys 64.. are P = 0\n"
                   f"{four}{ind}}} else {{\n{last}{ind}}}\n") + tail


def run(case, workdir: Path, rounds: int) -> None:
    from habu.bench.attention_speed import case_source, prove_case
    from habu.bench.run import device_target
    from habu.emit_cuda.runtime import CompiledModel
    from habu.spec.parser import load_program

    path, name, sizes = case_source(case, workdir)
    model = load_program(path).models[name].with_sizes(sizes)
    _plan, emitted = prove_case(case, str(workdir), device_target())
    built = {"base": CompiledModel(model, emitted, arch="sm_90a", check_indices=False)}
    built["pv"] = variant(built["base"], 0, diagonal_pv_half, "pv")
    against_sdpa(case, model, sizes, built, rounds)


def main() -> None:
    run_cases(run, "m16k-causal-1k-d64")


if __name__ == "__main__":
    sys.exit(main())
