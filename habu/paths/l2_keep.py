"""`keep_operands` and `stream_b`: where a wgmma product's operand loads carry an L2 eviction policy.

A product whose output is larger than the L2 streams all of it through the L2 (stores allocate lines there),
and the loads of small operands that every tile re-reads compete with that stream. FFN-SKIP's 128-token weight
gradients (dW = Xᵀ·dT: a 117 MB bf16 output from 1–4 MB operands, K = 128) ran 8–9 µs slower than their store
stream alone on an H100, though 93% of their operand reads hit the L2 (ncu: what exactly they waited on is not
settled). With the operands' TMA loads marked evict-last they went from 47.8 to 41.7 and from 49.1 to 42.6 µs,
outputs bitwise the same (2026-12-06, docs/PERF.md, session 59). The hint changes no value: the lowering sets
each load's policy (`TmaOperandLoad.l2_hint`, `l2_hints`), and the emitter prints the load's `_hinted` form with
it (include/habu/memory/tma.cuh). The default (`keep_operands`) takes it where the output holds at least the
L2's bytes and the operands the loads bring by TMA hold at most a quarter of them together, so a hint cannot
make an operand crowd out another's lines.

A product that streams its weights (B larger than the L2, read once) takes `stream_b` instead where its A (at
most a quarter of the L2) is multiplied again by a later product of the plan: A's loads evict-last, B's
evict-first. FFN-SKIP's 128-token backward has two such products: dT2 = dT6·W2 (dW2 multiplies dT6) and dX =
dT2·W1 (dW1 multiplies dT2). With the hints its step took 317–319 µs against 329–333 (H100, 2026-12-06,
docs/PERF.md, session 60: four interleaved rounds, outputs bitwise the same); the products alone gained less
(dT2 63.3 → 59.6 µs), and why the step gains more is not settled: the rule keeps to what was measured. The
forward's two products, whose activations no later product of the forward plan multiplies (the residual's row
kernel or the second product's epilogue reads X), gained nothing in the step (328–330 µs with both), and the
first of them hinted beside the backward's two cost 7 µs: they keep plain loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import prod

from habu.paths.analytic import node_of
from habu.plan.column_epilogue import chain_end
from habu.plan.patterns import kernel_contraction
from habu.plan.plan import ContractionKernel, Kernel
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


def streams_b(model: Model, kernels: Sequence[Kernel], index: int, target: Target, sizes: dict[str, int]) -> bool:
    """Whether the default marks kernel `index` of the plan `stream_b`: a warp-specialised wgmma product loading
    both operands by TMA, without `keep_operands`, whose B holds at least the L2's bytes and whose A at most a
    quarter of them, and a later product of the plan multiplies A (`multiplied`: a row kernel or an epilogue
    reading it does not count; the forward's first product, whose X the residual reads, lost in the step with the
    hint)."""
    kernel = kernels[index]
    if not isinstance(kernel, ContractionKernel) or kernel.keep_operands or not target.l2_bytes:
        return False
    if str(kernel.mma) != "wgmma" or not kernel.warp_specialized or (str(kernel.a_move), str(kernel.b_move)) != (
            "tma", "tma"):
        return False
    c = kernel_contraction(node_of(model, kernel.nodes[0]), kernel)
    if c is None:
        return False
    a, b = tensor_bytes(model, c.a.load.tensor, sizes), tensor_bytes(model, c.b.load.tensor, sizes)
    if a is None or b is None or b < target.l2_bytes or a * OPERANDS_SHARE_OF_L2 > target.l2_bytes:
        return False
    return any(c.a.load.tensor in multiplied(model, k) for k in kernels[index + 1:])


def multiplied(model: Model, kernel: Kernel) -> set[str]:
    """The tensors a product kernel's main loop reads as its operands (its epilogue's reads not among them)."""
    if not isinstance(kernel, ContractionKernel):
        return set()
    c = kernel_contraction(node_of(model, kernel.nodes[0]), kernel)
    return set() if c is None else {c.a.load.tensor, c.b.load.tensor}


def stream_weights(model: Model, kernels: tuple[Kernel, ...], target: Target,
                   sizes: dict[str, int]) -> tuple[Kernel, ...]:
    """The plan's kernels, `stream_b` set where `streams_b` holds."""
    return tuple(replace(k, stream_b=True) if streams_b(model, kernels, i, target, sizes) else k
                 for i, k in enumerate(kernels))
