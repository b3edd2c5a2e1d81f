"""The search's cheap first filter: the structural rules, with a memory of operand-local failures.

Most of a region's candidates that break a rule break one about a single operand's data movement:
a 16-byte cp.async on rows 1022 bytes apart, TMA on gathered rows, a vector wider than the row
alignment. Those verdicts depend on the operand, its movement, its vector width and the tile, never
on the warps, stages, raster order, split-K or persistence. Once one candidate fails such a rule,
every candidate that shares that operand's (movement, vector, tile) fails it too: it is pruned here
without lowering the plan again. The rules themselves stay the authority (`quick_reject`); this only
remembers their answers, for one model bound to one shape.
"""

from __future__ import annotations

from collections.abc import Mapping

from habu.plan.patterns import kernel_contraction
from habu.plan.plan import ContractionKernel, Plan
from habu.plan.rewrite import apply_rewrites
from habu.prove.rules import Obligation, quick_reject
from habu.spec.ir import Model

# rules whose verdict reads only one operand's access, movement, vector width, the tile and the target
OPERAND_LOCAL_RULES = frozenset({"target-feature", "cp.async-size", "vector-align", "tma-rank", "tma-dims",
                                 "tma-stride-16B", "tma-gather"})


class QuickPruner:
    """`quick_reject` for a stream of candidates of one model at one fixed shape."""

    def __init__(self, model: Model, fixed: Mapping[str, int]):
        self.model, self.fixed = model, dict(fixed)
        self.known: dict[tuple, Obligation] = {}  # operand signature -> the rule it broke
        self.remembered = 0  # candidates pruned from memory
        self.graphs: dict[tuple[str, ...], Model] = {}  # the model after each set of rewrites

    def _operands(self, graph: Model, kernel: ContractionKernel) -> dict[str, tuple]:
        """Each operand tensor's signature in this kernel (none when both operands are one tensor)."""
        c = kernel_contraction(next(eq for eq in graph.nodes if eq.target == kernel.nodes[0]), kernel)
        if c is None or c.a.load.tensor == c.b.load.tensor:
            return {}
        tile = (kernel.tile_m, kernel.tile_n, kernel.tile_k)
        return {c.a.load.tensor: ("A", c.a.load.tensor, kernel.a_move, kernel.a_vector, *tile),
                c.b.load.tensor: ("B", c.b.load.tensor, kernel.b_move, kernel.b_vector, *tile)}

    def _graph(self, rewrites: tuple[str, ...]) -> Model:
        if rewrites not in self.graphs:
            self.graphs[rewrites] = apply_rewrites(self.model, rewrites)
        return self.graphs[rewrites]

    def reject(self, plan: Plan, only: set[int] | None = None) -> Obligation | None:
        """The first structural rule `plan` breaks (in the kernels `only`, else all), or None."""
        sigs: dict[str, tuple] = {}
        graph = self._graph(plan.rewrites)
        for i, k in enumerate(plan.kernels):
            if isinstance(k, ContractionKernel) and (only is None or i in only):
                for tensor, sig in self._operands(graph, k).items():
                    sigs[f"{i}:{tensor}"] = sig
                    if (plan.rewrites, *sig) in self.known:
                        self.remembered += 1
                        return self.known[(plan.rewrites, *sig)]
        ob = quick_reject(self.model, plan, self.fixed, only)
        if ob is not None and ob.rule.name in OPERAND_LOCAL_RULES and ob.tensor is not None:
            kernel_index = _kernel_index(ob.kernel)
            sig = sigs.get(f"{kernel_index}:{ob.tensor}")
            if sig is not None:
                self.known[(plan.rewrites, *sig)] = ob
        return ob


def _kernel_index(kernel_label: str) -> int | None:
    """The kernel number in an obligation's label, "kernel 0 (O)"."""
    parts = kernel_label.split()
    if len(parts) >= 2 and parts[0] == "kernel" and parts[1].isdigit():
        return int(parts[1])
    return None


__all__ = ["OPERAND_LOCAL_RULES", "QuickPruner"]
