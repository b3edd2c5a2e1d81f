"""The plan's next kernel's first k tiles warmed into the L2 (the plan's `warm_next`), as data.

A one-wave product (FFN-SKIP's at 128 tokens: 112 tiles of 128 × 128, one a block) streams its weights until its
k loop ends; then every block runs its epilogue (GELU's erf, the saved S1's loads and stores) while the DRAM has
little to do, and the plan's next product starts its own weight stream only once those blocks leave. With
`warm_next = t` the producer warpgroup of each block, after its last TMA load, prefetches into the L2 a share of
the boxes the next kernel loads first: for each of that kernel's tiles along the streamed operand's rows, each of
its k splits, the split's first t k tiles, every box of each,

    box i (i = (gridDim.x − 1 − blockIdx.x) · 128 + ptid, stepping by gridDim.x · 128) of `count`:
        row tile r = i / (splits · t · boxes), split q, k tile j, box b (the rest, in that order)
        coordinates = load.origin(r · rows_per_tile, load.k_coordinate(q · k_tiles_per_split, j), b)

(the grid's last blocks first: in a grid of several waves they run last, nearest the next kernel) through the next
kernel's own tensor map of that operand (`cp.async.bulk.prefetch.tensor`: a box past the tensor
is clipped by the TMA unit, as its loads are). A prefetch changes no value: the field check has nothing to run.
The `warm-next` rule checks the decode above against the next kernel's boxes (each warmed box is one it loads,
each of its first t k tiles' boxes is warmed once) at the witness sizes.

Only an operand the next kernel reads by TMA from a model input is warmed (the weights): a tensor an earlier
kernel of the plan writes could be warmed before it is written, which costs traffic and helps nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from habu.lower.access import Access, cdiv, floordiv, minimum
from habu.lower.pipeline import TmaOperandLoad

WARM_THREADS = 128  # the producer warpgroup


@dataclass(frozen=True)
class WarmNext:
    side: str  # the next kernel's operand: "A" or "B"
    access: Access  # its access (the tensor map's tensor and dimensions)
    load: TmaOperandLoad  # the next kernel's boxes of that operand, per k tile
    rows: str  # the extent the operand's rows run along in the next kernel (its m or n)
    rows_per_tile: int  # the next kernel's tile along those rows (bm or bn)
    k: str  # the next kernel's contraction extent
    bk: int
    splits: int
    tiles: int  # k tiles warmed per row tile and split (the plan's `warm_next`)
    box: tuple[int, ...]  # the next kernel's tensor map box, innermost first
    swizzle: int
    threads: int = WARM_THREADS

    def row_tiles(self, s: Mapping[str, Any]) -> Any:
        return cdiv(s[self.rows], self.rows_per_tile)

    def k_tiles_per_split(self, s: Mapping[str, Any]) -> Any:
        return cdiv(cdiv(s[self.k], self.bk), self.splits)

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

    def loaded(self, s: Mapping[str, int]) -> set[tuple[int, int]]:
        """Every box the next kernel loads in each split's first `tiles` k tiles (a static shape), as its
        producer computes them."""
        per = self.k_tiles_per_split(s)
        return {self.load.origin(r * self.rows_per_tile, self.load.k_coordinate(q * per, j), b)
                for r in range(self.row_tiles(s)) for q in range(self.splits)
                for j in range(min(self.tiles, per)) for b in range(self.load.boxes)
                if q * per + j < cdiv(s[self.k], self.bk)}


def warm_refusal(lw: Any, nxt: Any, model_inputs: frozenset[str], written: frozenset[str]) -> str | None:
    """Why kernel `lw` cannot warm the plan's next kernel `nxt` (None: it can)."""
    from habu.lower.contraction import ContractionLowering
    from habu.lower.pipeline import MbarrierRing

    if not isinstance(lw, ContractionLowering) or lw.kernel.mma != "wgmma" or not isinstance(lw.pipeline, MbarrierRing):
        return "only a warp-specialised wgmma kernel's producer warms the next kernel"
    if nxt is None:
        return "it is the plan's last kernel"
    side = warmed_side(nxt, model_inputs, written)
    if side is None:
        return "the plan's next kernel streams no model input by TMA (a wgmma kernel's weights)"
    if nxt.batch:
        return "the plan's next kernel is batched"
    return None


def warmed_side(nxt: Any, model_inputs: frozenset[str], written: frozenset[str]) -> str | None:
    """The operand of the next kernel to warm: one it loads by TMA from a model input no kernel of the plan writes
    (of two, B: a product's weights; A where the product is transposed)."""
    from habu.lower.contraction import ContractionLowering
    from habu.lower.pipeline import MbarrierRing

    if (not isinstance(nxt, ContractionLowering) or nxt.kernel.mma != "wgmma"
            or not isinstance(nxt.pipeline, MbarrierRing)):
        return None
    moves = {"A": nxt.kernel.a_move, "B": nxt.kernel.b_move}
    sides = [ld.side for ld in nxt.pipeline.loads
             if moves[ld.side] == "tma" and ld.mask == 0
             and (nxt.a if ld.side == "A" else nxt.b).tensor in model_inputs - written
             and not any(p.kind == "gather" for p in (nxt.a if ld.side == "A" else nxt.b).positions)]
    if not sides:
        return None
    weights = "A" if nxt.kernel.swap_ab else "B"
    return weights if weights in sides else sides[0]


def warm_next_for(lw: Any, nxt: Any, model_inputs: frozenset[str], written: frozenset[str]) -> WarmNext | None:
    """The boxes kernel `lw` warms of the plan's next kernel `nxt` (its plan's `warm_next` k tiles), or None."""
    tiles = getattr(lw.kernel, "warm_next", 0)
    if not tiles or warm_refusal(lw, nxt, model_inputs, written) is not None:
        return None
    from habu.lower.contraction import tma_box

    side = warmed_side(nxt, model_inputs, written)
    load = next(ld for ld in nxt.pipeline.loads if ld.side == side)
    acc = nxt.a if side == "A" else nxt.b
    rows, per_tile = (nxt.m, nxt.bm) if side == "A" else (nxt.n, nxt.bn)
    ops = nxt.operands
    tile = getattr(ops, "a_tile" if side == "A" else "b_tile", None)
    box = tma_box(acc, "m" if side == "A" else "n", load.box_rows, load.box_k)
    return WarmNext(side, acc, load, rows, per_tile, nxt.k, nxt.bk, nxt.kernel.split_k, tiles, box,
                    tile.swizzle if tile is not None else 128)


def with_warm_next(lowerings: tuple[Any, ...], model_inputs: frozenset[str]) -> tuple[Any, ...]:
    """The plan's lowerings, each wgmma kernel with `warm_next` given the boxes it warms of the one after it."""
    from dataclasses import replace

    from habu.lower.stores import stored_accesses

    written = frozenset(a.tensor for lw in lowerings for a in stored_accesses(lw))
    out = list(lowerings)
    for i, lw in enumerate(lowerings):
        if getattr(getattr(lw, "kernel", None), "warm_next", 0):
            nxt = lowerings[i + 1] if i + 1 < len(lowerings) else None
            out[i] = replace(lw, warm=warm_next_for(lw, nxt, model_inputs, written))
    return tuple(out)


__all__ = ["WarmNext", "warm_next_for", "warm_refusal", "warmed_side", "with_warm_next"]
