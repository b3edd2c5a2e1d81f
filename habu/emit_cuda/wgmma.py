"""wgmma.mma_async m64nNk16 wrappers, generated per N (the accumulator is N/2 registers per thread).

The instruction table is data: one entry per operand type; the wrapper for a given N is generated
here and placed in the kernel source, next to the calls of Habu's header.
"""

from __future__ import annotations

PTX_TYPE = {"bf16": "bf16", "f16": "f16"}
VALID_N = tuple(range(8, 257, 8))


def wgmma_function(n: int, dtype: str) -> str:
    """`habu_wgmma_m64n{n}_{dtype}(float (&d)[n/2], u64 desc_a, u64 desc_b)`: d += A·B (K-major A and B)."""
    if n not in VALID_N:
        raise ValueError(f"wgmma has no m64n{n}k16")
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    constraints = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    t = PTX_TYPE[dtype]
    return f"""__device__ __forceinline__ void habu_wgmma_m64n{n}_{dtype}(float (&d)[{regs}], habu::u64 desc_a, habu::u64 desc_b, int accumulate) {{
  asm volatile(
      "{{\\n"
      ".reg .pred p;\\n"
      "setp.ne.b32 p, %{regs + 2}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} "
      "{{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;\\n"
      "}}\\n"
      : {constraints}
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}}
"""
