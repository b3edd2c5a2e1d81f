"""wgmma.mma_async m64nNk16 wrappers, generated per N (the accumulator is N/2 registers per thread).

The instruction table is data: one entry per operand type; the wrapper for a given N is generated
here and placed in the kernel source, next to the calls of Habu's header.
"""

from __future__ import annotations

PTX_TYPE = {"bf16": "bf16", "f16": "f16"}
VALID_N = tuple(range(8, 257, 8))


def wgmma_name(n: int, dtype: str, b_mn_major: bool = False, a_mn_major: bool = False) -> str:
    return f"habu_wgmma_m64n{n}_{dtype}{'_at' if a_mn_major else ''}{'_bt' if b_mn_major else ''}"


def wgmma_function(n: int, dtype: str, b_mn_major: bool = False, a_mn_major: bool = False) -> str:
    """`habu_wgmma_m64n{n}_{dtype}[_at][_bt](float (&d)[n/2], u64 desc_a, u64 desc_b)`: d += A·B, each
    operand K-major, or MN-major with the instruction's transpose bit for it (16-bit types only)."""
    if n not in VALID_N:
        raise ValueError(f"wgmma has no m64n{n}k16")
    if (a_mn_major or b_mn_major) and dtype not in ("bf16", "f16"):
        raise ValueError("wgmma transposes only 16-bit operands")
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    constraints = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    t = PTX_TYPE[dtype]
    name = wgmma_name(n, dtype, b_mn_major, a_mn_major)
    guard = name.upper()  # kernels of one plan share a translation unit
    return f"""#ifndef {guard}
#define {guard}
__device__ __forceinline__ void {name}(float (&d)[{regs}], habu::u64 desc_a, habu::u64 desc_b, int accumulate) {{
  asm volatile(
      "{{\\n"
      ".reg .pred p;\\n"
      "setp.ne.b32 p, %{regs + 2}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} "
      "{{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, {int(a_mn_major)}, {int(b_mn_major)};\\n"
      "}}\\n"
      : {constraints}
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}}
#endif
"""
