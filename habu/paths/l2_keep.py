"""`keep_operands`: where a wgmma product's operand loads ask the L2 to evict their lines last.

A product whose output is larger than the L2 streams all of it through the L2 (stores allocate lines there),
and the loads of small operands that every tile re-reads compete with that stream. FFN-SKIP's 128-token weight
gradients (dW = Xᵀ·dT: a 117 MB bf16 output from 1–4 MB operands, K = 128) ran 8–9 µs slower than their store
stream alone on an H100, though 93% of their operand reads hit the L2 (ncu: what exactly they waited on is not
settled). With the operands' TMA loads marked evict-last they went from 47.8 to 41.7 and from 49.1 to 42.6 µs,
outputs bitwise the same (2026-12-06, docs/PERF.md, session 59). The hint changes no value: the lowering marks
the loads (`TmaOperandLoad.evict_last`), and the emitter prints the `_evict_last` form of each
(include/habu/memory/tma.cuh).

The default takes it where the output holds at least the L2's bytes and the operands the loads bring by TMA
hold at most a quarter of them together, so a hint cannot make an operand crowd out another's lines. A product
that streams its weights (an operand as large as the output) keeps plain loads.
"""

from __future__ import annotations

from math import prod

from habu.plan.column_epilogue import chain_end
from habu.plan.plan import ContractionKernel
from habu.plan.storage import dtype_bytes
from habu.spec.ir import Model
from habu.target import Target

OPERANDS_SHARE_OF_L2 = 4  # the TMA operands together hold at most 1/4 of the L2


def tensor_bytes(model: Model, tensor: str, sizes: dict[str, int]) -> int | None:
    """Bytes of `tensor` at `sizes` (None where an extent has no size there)."""
    extents = model.tensor(tensor).extents
    if any(e not in sizes for e in extents):
        return None
    return prod(sizes[e] for e in extents) * dtype_bytes(model, tensor)


def keeps_operands(model: Model, kernel: ContractionKernel, operands: tuple[str, str], target: Target,
                   sizes: dict[str, int]) -> bool:
    """Whether the default marks `kernel`'s TMA operand loads evict-last: a warp-specialised wgmma product whose
    output holds at least the L2's bytes while its TMA operands (`operands`: A's and B's tensors) hold at most a
    quarter of them."""
    if str(kernel.mma) != "wgmma" or not kernel.warp_specialized or not target.l2_bytes:
        return False
    loaded = [t for t, move in zip(operands, (kernel.a_move, kernel.b_move), strict=True) if str(move) == "tma"]
    out = tensor_bytes(model, chain_end(model, kernel.nodes), sizes)
    ins = [tensor_bytes(model, t, sizes) for t in dict.fromkeys(loaded)]
    if not loaded or out is None or any(b is None for b in ins):
        return False
    return out >= target.l2_bytes and sum(ins) * OPERANDS_SHARE_OF_L2 <= target.l2_bytes  # type: ignore[arg-type]
