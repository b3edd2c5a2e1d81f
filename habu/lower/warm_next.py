"""The plan's next kernel's first k tiles warmed into the L2 (the plan's `warm_next`), as data.

A one-wave product (FFN-SKIP's at 128 tokens: 112 tiles of 128 × 128, one a block) streams its weights until its
k loop ends; then every block runs its epilogue (GELU's erf, the saved S1's loads and stores) while the DRAM has
little to do, and the plan's next product starts its own weight stream only once those blocks leave. With
`warm_next = t` the producer warpgroup of each block, after its last TMA load, prefetches into the L2 a share of
the boxes the next kernel loads first: for each of that kernel's tiles along the streamed operand's rows, each of
its k splits, the split's first t k tiles, every box of each,

    box i (i = `first(blockIdx.x, gridDim.x, ptid)`, stepping by `stride(gridDim.x)`) of `count`:
        row tile r = i / (splits · t · boxes), split q, k tile j, box b (the rest, in that order)
        coordinates = load.origin(r · rows_per_tile, load.k_coordinate(q · k_tiles_per_split, j), b)

(the grid's last blocks first: in a grid of several waves they run last, nearest the next kernel) through the next
kernel's own tensor map of that operand (`cp.async.bulk.prefetch.tensor`: a box past the tensor
is clipped by the TMA unit, as its loads are). A prefetch changes no value: the field check has nothing to run.
The `warm-next` rule runs both maps the emitter prints: the blocks' and threads' indices cover each box index once,
and the decode gives each box the next kernel loads in its first t k tiles once and no other (a box past the
tensor along k, where a split is shorter than t, is clipped whole: nothing is fetched).

Only an operand the next kernel reads by TMA from a model input is warmed (the weights): a tensor an earlier
kernel of the plan writes could be warmed before it is written, which costs traffic and helps nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import cdiv, floordiv, minimum
from habu.lower.contraction import ContractionLowering
from habu.lower.pipeline import MbarrierRing, TmaOperandLoad
from habu.lower.stores import stored_accesses
from habu.lower.tma_maps import OperandMap, operand_map

WARM_THREADS = 128  # the producer warpgroup


@dataclass(frozen=True)
class WarmNext:
    side: str  # the next kernel's operand: "A" or "B"
    next_kernel: ContractionLowering  # the plan's next kernel
    tiles: int  # k tiles warmed per row tile and split (the plan's `warm_next`)
    threads: int = WARM_THREADS

    @property
    def load(self) -> TmaOperandLoad:
        """The next kernel's boxes of the operand, per k tile."""
        return next(ld for ld in self.next_kernel.pipeline.loads if ld.side == self.side)

    @property
    def map(self) -> OperandMap:
        """The next kernel's tensor map of the operand, as its emitter encodes it."""
        return operand_map(self.next_kernel, self.load)

    @property
    def rows(self) -> str:
        """The extent the operand's rows run along in the next kernel (its m or n)."""
        return self.next_kernel.m if self.side == "A" else self.next_kernel.n

    @property
    def rows_per_tile(self) -> int:
        return self.next_kernel.bm if self.side == "A" else self.next_kernel.bn

    @property
    def k(self) -> str:
        return self.next_kernel.k

    @property
    def splits(self) -> int:
        return self.next_kernel.kernel.split_k

    def first(self, block: Any, grid: Any, thread: Any) -> Any:
        """The first box index of a producer thread: the grid's last blocks take the first indices (in a grid of
        several waves they run last, nearest the next kernel)."""
        return (grid - 1 - block) * self.threads + thread

    def stride(self, grid: Any) -> Any:
        """How far a thread's box index steps."""
        return grid * self.threads

    def row_tiles(self, s: Mapping[str, Any]) -> Any:
        return cdiv(s[self.rows], self.rows_per_tile)

    def k_tiles_per_split(self, s: Mapping[str, Any]) -> Any:
        return self.next_kernel.k_tiles_per_split(s)

    def warmed_per_split(self, s: Mapping[str, Any]) -> Any:
        """The k tiles warmed of each split: `tiles`, or fewer where a split has fewer."""
        return minimum(self.k_tiles_per_split(s), self.tiles)

    def count(self, s: Mapping[str, Any]) -> Any:
        return self.row_tiles(s) * self.splits * self.warmed_per_split(s) * self.load.boxes

    def decode(self, i: Any, s: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
        """(row tile, split, k tile, box) of warmed box i."""
        boxes, per = self.load.boxes, self.warmed_per_split(s)
        b = i % boxes if boxes > 1 else 0
        rest = floordiv(i, boxes) if boxes > 1 else i
        j = rest % per
        q = floordiv(rest, per) % self.splits if self.splits > 1 else 0
        r = floordiv(rest, per * self.splits)
        return r, q, j, b

    def origin(self, i: Any, s: Mapping[str, Any]) -> tuple[Any, Any]:
        """The tensor map coordinates of warmed box i, innermost first (as the next kernel's producer issues
        them: `TmaOperandLoad.origin`)."""
        r, q, j, b = self.decode(i, s)
        k = self.load.k_coordinate(q * self.k_tiles_per_split(s), j)
        return self.load.origin(r * self.rows_per_tile, k, b)

    def past_k(self, coordinates: tuple[int, int], s: Mapping[str, int]) -> bool:
        """Whether a box starts past the tensor along k (the TMA unit clips it whole)."""
        return coordinates[1 if self.load.mn_major else 0] >= s[self.k]


def _wgmma_ring(lw: Any) -> bool:
    return isinstance(lw, ContractionLowering) and lw.kernel.mma == "wgmma" and isinstance(lw.pipeline, MbarrierRing)


def warm_target(lw: Any, nxt: Any, model_inputs: frozenset[str], written: frozenset[str]) -> tuple[str | None, str]:
    """The operand of the plan's next kernel `nxt` that kernel `lw` can warm (None and why not): one the next kernel
    loads by TMA from a model input no kernel of the plan writes (of two, B: a product's weights; A where the product
    is transposed)."""
    if not _wgmma_ring(lw):
        return None, "only a warp-specialised wgmma kernel's producer warms the next kernel"
    if nxt is None:
        return None, "it is the plan's last kernel"
    why = "the plan's next kernel streams no model input by TMA (a wgmma kernel's weights)"
    if not _wgmma_ring(nxt):
        return None, why
    if nxt.batch:
        return None, "the plan's next kernel is batched"
    moves = {"A": nxt.kernel.a_move, "B": nxt.kernel.b_move}
    accesses = {"A": nxt.a, "B": nxt.b}
    sides = [ld.side for ld in nxt.pipeline.loads
             if moves[ld.side] == "tma" and ld.mask == 0 and accesses[ld.side].tensor in model_inputs - written
             and not any(p.kind == "gather" for p in accesses[ld.side].positions)]
    if not sides:
        return None, why
    weights = "A" if nxt.kernel.swap_ab else "B"
    return (weights if weights in sides else sides[0]), ""


def warm_next_for(lw: Any, nxt: Any, model_inputs: frozenset[str], written: frozenset[str]) -> WarmNext | None:
    """The boxes kernel `lw` warms of the plan's next kernel `nxt` (its plan's `warm_next` k tiles), or None."""
    tiles = getattr(lw.kernel, "warm_next", 0)
    side, _ = warm_target(lw, nxt, model_inputs, written) if tiles else (None, "")
    if side is None:
        return None
    return WarmNext(side, nxt, tiles)


def with_warm_next(lowerings: tuple[Any, ...], model_inputs: frozenset[str]) -> tuple[Any, ...]:
    """The plan's lowerings, each wgmma kernel with `warm_next` given the boxes it warms of the one after it."""
    written = frozenset(a.tensor for lw in lowerings for a in stored_accesses(lw))
    out = list(lowerings)
    for i, lw in enumerate(lowerings):
        if getattr(getattr(lw, "kernel", None), "warm_next", 0):
            nxt = lowerings[i + 1] if i + 1 < len(lowerings) else None
            out[i] = replace(lw, warm=warm_next_for(lw, nxt, model_inputs, written))
    return tuple(out)


__all__ = ["WarmNext", "warm_next_for", "warm_target", "with_warm_next"]
