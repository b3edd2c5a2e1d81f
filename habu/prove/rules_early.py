"""The rule of an epilogue that reads some of its loads at each tile's start (`epilogue_early`,
habu/lower/epilogue_early.py): each such load reads one of the model's inputs, which no kernel of the plan writes,
so the value read before the k loop (and before the wait for the plan's previous kernel) is the one the epilogue
would read after it; each read of the epilogue, at its fragment's (s, j, h) and pair element, finds its own
element in the entry the fill wrote (`registers_mismatch` runs one warpgroup's fill and reads, from the lowering's
`EarlyLoad` maps the emitter prints); and the registers that hold them stay within the lowering's budget."""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.contraction import ContractionLowering
from habu.lower.epilogue_early import EARLY_BUDGET, EARLY_REGISTERS, registers_mismatch
from habu.prove.obligation import Context, Obligation, Rule

EARLY_RULES = {r.name: r for r in (
    Rule("early-epilogue-loads", "an epilogue load read at the tile's start reads a model input, which no kernel "
         "of the plan writes; each epilogue read finds its own element in the registers filled there; and those "
         "registers stay within the lowering's budget",
         "CUDA programming guide: programmatic dependent launch (griddepcontrol.wait makes the previous kernel's "
         "writes visible; a read before it may see older values)"),
)}


def early_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    """Per early load: its tensor is one of the model's inputs and no kernel of the plan stores it; then the
    registers of all of them, beside the accumulators, within the budget."""
    early = lw.early_loads
    if not early:
        return
    inputs = {t.name for t in ctx.model.inputs}
    written = {n for kernel in ctx.plan.kernels for n in kernel.nodes}
    for e in early:
        tensor = e.access.tensor
        yield Obligation(EARLY_RULES["early-epilogue-loads"], name, tensor,
                         f"{tensor}, read at the tile's start, is a model input no kernel of the plan writes",
                         tensor in inputs and tensor not in written and tensor == e.load.tensor
                         and lw.epi_loads[e.index][0] == e.load,
                         detail=f"{tensor} is {'an input' if tensor in inputs else 'not a model input'}"
                                f"{', written by the plan' if tensor in written else ''}: read it in the epilogue")
    slabs, groups, accumulators = lw.fragment_shape
    for e in early:  # the fill and the epilogue's reads, run over one warpgroup's fragment
        mismatch = registers_mismatch(e, lw.fragment, slabs, groups)
        yield Obligation(EARLY_RULES["early-epilogue-loads"], name, e.access.tensor,
                         f"each epilogue read of {e.access.tensor} finds its element in the registers filled at the "
                         "tile's start", mismatch is None, detail=mismatch or "")
    held = sum(e.registers(slabs, groups, lw.fragment.halves) for e in early)
    yield Obligation(EARLY_RULES["early-epilogue-loads"], name, lw.out.tensor,
                     f"{held} registers of early loads ≤ {EARLY_REGISTERS}, with {accumulators} accumulators "
                     f"≤ {EARLY_BUDGET}", held <= EARLY_REGISTERS and held + accumulators <= EARLY_BUDGET,
                     detail=f"{held} registers of early loads beside {accumulators} accumulators")


__all__ = ["EARLY_RULES", "early_obligations"]
