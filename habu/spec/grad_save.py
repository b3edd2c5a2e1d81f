"""Which forward values a derived backward reads from memory (saved by the forward) and which it
recomputes: the save policy (`SavePolicy`, a dimension of the backward plan space) and what AUTO saves
(`contraction_operands`). habu.spec.grad derives the backward under it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from habu.spec.ir import Equation, Expr, Load, Model, Op, Reduce, free_vars, index_free_vars, walk


class SaveMode(Enum):
    AUTO = "auto"  # save what takes a reduction to make or what the forward stores anyway; recompute the rest
    SAVE = "save"  # save every forward value the backward reads
    RECOMPUTE = "recompute"  # save nothing: the backward recomputes from the forward inputs


@dataclass(frozen=True)
class SavePolicy:
    """Which forward intermediates the backward reads from memory (saved by the forward) and which it
    recomputes from their own inputs.

    This is one dimension of the backward plan space: `Backward.choices` lists the forward values the
    backward reads, and a search varies `save`/`recompute` over them, trading the bytes the forward
    writes and the backward reads (save) against the work and the reads of recomputing (recompute).
    The default, AUTO, saves a value that takes a reduction to make (RMSNorm's per-row rstd, softmax's
    per-row maximum and sum, a LINEAR's product, as Liger's kernels do by hand) and a value the forward
    stores anyway: an operand of a contraction (`contraction_operands`: the GELU output that the second
    LINEAR of an FFN reads, which the forward's plan writes to memory for that kernel to stage), saved in
    the forward's element type; it recomputes the other elementwise values (a GELU's input, whose
    recomputation then fuses into the kernel that reads it)."""

    mode: SaveMode = SaveMode.AUTO
    save: frozenset[str] = frozenset()  # forward intermediates (names as in Backward.choices) forced saved
    recompute: frozenset[str] = frozenset()  # ... forced recomputed

    def saves(self, name: str, eq: Equation, stored: frozenset[str] = frozenset()) -> bool:
        """Whether the forward value `name` (made by `eq`) is saved; `stored`: the forward's contraction
        operands (`contraction_operands`), which AUTO saves."""
        if name in self.save:
            return True
        if name in self.recompute:
            return False
        if self.mode is SaveMode.SAVE:
            return True
        if self.mode is SaveMode.RECOMPUTE:
            return False
        return eq.scatter is not None or any(isinstance(e, Reduce) for e in walk(eq.rhs)) or name in stored


def contraction_operands(model: Model) -> frozenset[str]:
    """The tensors a node of `model` reads as an operand of a contraction: a factor of a product under a
    `Σ` over a variable the read indexes, the read leaving out an index of the sum's result (so several
    of the result's elements read each of its elements: a kernel stages it from memory). `%3` in
    `%4[b d] = Σ h %3[b h] · W2[h d]` is one; `%6` in RMSNorm's `Σ d %6[b d] · %6[b d]` (a row's own
    sum of squares, each element read once) is not."""
    found: set[str] = set()
    for eq in model.nodes:
        for r in walk(eq.rhs):
            if not (isinstance(r, Reduce) and r.op == "sum"):
                continue
            loads = [f for f in _product_factors(r.body) if isinstance(f, Load)]
            if len(loads) < 2:
                continue
            result = free_vars(r)
            for ld in loads:
                read = {v for ix in ld.indices for v in index_free_vars(ix)}
                if read & set(r.vars) and result - read:
                    found.add(ld.tensor)
    return frozenset(found)


def _product_factors(e: Expr) -> list[Expr]:
    if isinstance(e, Op) and e.fn == "mul":
        return [f for a in e.args for f in _product_factors(a)]
    return [e]
