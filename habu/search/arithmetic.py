"""What an element's arithmetic costs: the instructions a thread issues to evaluate an expression once,
for the cost model's terms where arithmetic, not bytes, sets a kernel's time (a contraction epilogue that
runs after its main loop with the tensor cores idle; an elementwise kernel whose math outlasts its loads).

Weights are SASS instructions per float32 evaluation as habu/emit_cuda/include/habu/math.cuh prints each
function (`__expf` is a multiply and MUFU.EX2; `erff` a polynomial on each of two branches, a warp running
both; `tanhf` and IEEE division a dozen or so). A subexpression the expression repeats (GELU's derivative
reads `S1 + B1` five times) is counted once: nvcc computes it once. A load costs its load and its
conversion to float32.
"""

from __future__ import annotations

from functools import lru_cache

from habu.spec.ir import Expr, Load, Op, walk

# instructions per evaluation, by function (habu/spec/functions.py names them); others count 1
OP_INSTRUCTIONS: dict[str, float] = {
    "add": 1, "sub": 1, "mul": 1, "neg": 1, "abs": 1, "max": 1, "min": 1, "step": 2, "where": 1,
    "exp": 2, "log": 2, "rsqrt": 1, "sqrt": 4, "div": 9, "div0": 10, "sigmoid": 12, "tanh": 12, "erf": 22,
}
LOAD_INSTRUCTIONS = 2.0  # a global load and its conversion to float32


def element_instructions(*exprs: Expr, free: frozenset[str] = frozenset()) -> float:
    """The instructions one thread issues to evaluate `exprs` (the values one element stores) for one
    element: each distinct operation once, each distinct load of a tensor not in `free` once (`free`:
    values already in registers, such as a contraction's accumulator). Cached: the search costs every
    candidate of a region, whose epilogue is the same expression (115,120 GGEMM candidates)."""
    return _instructions(exprs, free)


@lru_cache(maxsize=4096)
def _instructions(exprs: tuple[Expr, ...], free: frozenset[str]) -> float:
    seen: set[Expr] = set()
    total = 0.0
    for x in (y for e in exprs for y in walk(e)):
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x, Op):
            total += OP_INSTRUCTIONS.get(x.fn, 1.0)
        elif isinstance(x, Load) and x.tensor not in free:
            total += LOAD_INSTRUCTIONS
    return total


__all__ = ["LOAD_INSTRUCTIONS", "OP_INSTRUCTIONS", "element_instructions"]
