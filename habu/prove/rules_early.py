"""The rules of an epilogue that reads its own loads other than one element at a time.

`early-epilogue-loads`: an epilogue that reads some of its loads at each tile's start (`epilogue_early`,
habu/lower/epilogue_early.py): each such load reads one of the model's inputs, which no kernel of the plan writes,
so the value read before the k loop (and before the wait for the plan's previous kernel) is the one the epilogue
would read after it; each read of the epilogue, at its fragment's (s, j, h) and pair element, finds its own
element in the entry the fill wrote (`registers_mismatch` runs one warpgroup's fill and reads, from the lowering's
`EarlyLoad` maps the emitter prints); and the registers that hold them stay within the lowering's budget.

`epilogue-load-pairs`: a load the epilogue reads as pairs (habu/lower/epilogue_pairs.py) is one 4- or 8-byte load
at the pair's first element, which reads the second element there only where n's step moves the offset by exactly
one (the strides of the positions n feeds sum to 1, through no index table); it is aligned only where every other
position's stride is even; and it stays inside the tensor wherever the first element is only where every bound on
n is even. Restated here from the access's positions, strides and masks, not from the lowering's own test. (The
finite-field check reads the second element at the first's offset plus one too, at the witness's sizes; this rule
holds it for every size.)"""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.access import Access
from habu.lower.contraction import ContractionLowering
from habu.lower.epilogue_early import EARLY_BUDGET, EARLY_REGISTERS, registers_mismatch
from habu.lower.epilogue_pairs import paired_loads
from habu.prove.obligation import Context, Obligation, Rule

EARLY_RULES = {r.name: r for r in (
    Rule("early-epilogue-loads", "an epilogue load read at the tile's start reads a model input, which no kernel "
         "of the plan writes; each epilogue read finds its own element in the registers filled there; and those "
         "registers stay within the lowering's budget",
         "CUDA programming guide: programmatic dependent launch (griddepcontrol.wait makes the previous kernel's "
         "writes visible; a read before it may see older values)"),
    Rule("epilogue-load-pairs", "an epilogue load read as pairs (n, n + 1) is contiguous along n: the pair's "
         "second element, read at the first's offset plus one, is its own",
         "PTX ISA: ld.global.v2 / 4-byte loads read adjacent addresses (session 61, docs/PERF.md)"),
)}


def early_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    """Per early load: its tensor is one of the model's inputs and no kernel of the plan stores it; then the
    registers of all of them, beside the accumulators, within the budget."""
    for i in paired_loads(lw):
        access = lw.epi_loads[i][1]
        fault = pair_fault(access, ctx.model.sizes)
        yield Obligation(EARLY_RULES["epilogue-load-pairs"], name, access.tensor,
                         f"{access.tensor}, read as pairs along n: one aligned load of the pair, inside where its "
                         "first element is", fault is None, detail=fault or "")
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


def pair_fault(access: Access, sizes) -> str | None:
    """Why one load at the pair's first element is not the pair (None where it is), for every size: n's step must
    move the offset by one, every other stride must be even (a static even extent among its factors, or a constant
    position's even multiple) and every bound on n even."""
    static = {name: size for name, size in sizes.items() if size is not None}
    even = lambda names: any(static.get(e, 1) % 2 == 0 for e in names)  # noqa: E731 (a runtime extent: not even)
    step = [i for i, p in enumerate(access.positions) if p.kind != "const" and p.axis == "n"]
    if any(access.positions[i].kind != "axis" for i in step) or access.checks:
        return f"{access.tensor} is read through an index table at n"
    if len(step) != 1 or access.strides[step[0]] != ():
        return f"n's step moves {access.tensor}'s offset by {' + '.join('·'.join(access.strides[i]) or '1' for i in step) or '0'}, not 1"
    for i, p in enumerate(access.positions):
        if i not in step and not (even(access.strides[i]) or (p.kind == "const" and p.value % 2 == 0)):
            return f"{access.tensor}'s position {i} moves its offset by {'·'.join(access.strides[i])}, not always even"
    odd = [b.extent for b in access.masks if b.axis == "n" and not even((b.extent,))]
    return f"n's bound {odd[0]} is not a static even length" if odd else None


__all__ = ["EARLY_RULES", "early_obligations", "pair_fault"]
