"""The exponential the fused attention kernels print for a score: the SFU's `habu::exp2_fast`, or with the plan
field `exp_fma` > 0, `habu::exp2_split<exp_fma>` (that many score groups of every 8 on the FMA pipes; a float-only
choice the finite-field check does not see: exp is exp there)."""

from __future__ import annotations

from collections.abc import Callable


def exp2_call(exp_fma: int) -> Callable[[str, str], str]:
    """A printer of 2^`x` for score group `group` (a C expression each)."""
    if exp_fma == 0:
        return lambda x, group: f"habu::exp2_fast({x})"
    return lambda x, group: f"habu::exp2_split<{exp_fma}>({x}, {group})"
