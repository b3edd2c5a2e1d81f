"""Thread→element maps of the row and map kernels: which elements each thread visits, where a row
kept in shared memory puts each element, and which element each lane of a map kernel computes.

These are data of the lowering. The emitter prints its loops, lane indices, tail predicates and cache
indices from them (as C, through `CExpr`); the finite-field interpreter (`habu.prove.interp`) runs the
same methods on integer arrays, thread by thread and chunk by chunk, so a map that skips an element,
visits one twice, or reads past the row fails the check; the int32 rule (`habu.prove.rules_fields`)
evaluates them over z3 terms. Every method is written with `+`, `*`, `//` only, so it runs on ints,
numpy arrays, z3 terms and `CExpr`s alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RowThreads:
    """The threads of one row and the chunks each visits.

    A block holds `rows` rows; thread x of the block works on row slot x / `threads` as lane
    t = x % `threads`. Lane t's i-th chunk is g = t + `chunk_stride`·i (chunks of the block's part of
    the row, `vector` elements each: columns g·vector + q, q < vector). A thread keeps visiting chunks
    while g < end (the chunks of the part; `end_inclusive`: g ≤ end, only in planted bugs), or, with a
    row kept in registers, exactly its `unrolled` chunks (`ChunkLoop`)."""

    threads: int
    rows: int
    vector: int
    chunk_stride: int
    end_inclusive: bool = False

    def lane(self, x: Any) -> Any:
        """The lane within its row of block thread x."""
        return x % self.threads

    def row_slot(self, x: Any) -> Any:
        """The row slot (0 .. rows − 1) of block thread x."""
        return x // self.threads

    def row(self, block: Any, slot: Any) -> Any:
        """The row a block's row slot computes (a block per `rows` consecutive rows)."""
        return block * self.rows + slot

    def warp(self, t: Any) -> Any:
        """The warp of lane t, whose partial a block reduction combines (`RowLowering.combined_warps`)."""
        return t // 32


@dataclass(frozen=True)
class ChunkLoop:
    """A thread's column loop at given sizes: `RowThreads`' chunks of `vector` columns (1: a loop
    over single columns, for a row that does not move in 16-byte vectors), `unrolled` chunks each
    (a row in registers) or while the chunk is below `end` (the chunks of the block's part)."""

    threads: RowThreads
    vector: int
    unrolled: int
    end: Any

    def chunk(self, t: Any, i: Any) -> Any:
        return t + self.threads.chunk_stride * i

    def first(self, t: Any) -> Any:
        return self.chunk(t, 0)

    @property
    def step(self) -> int:
        """What the loop adds to g: the stride between a thread's chunks (`chunk`)."""
        return self.threads.chunk_stride

    def column(self, g: Any, q: Any) -> Any:
        """The column (within the block's part) of element q of chunk g."""
        return g * self.vector + q

    def inside(self, g: Any, arith: Any) -> Any:
        """The loop's tail predicate: chunk g is one of the part's (`arith`: C text, numpy arrays)."""
        return arith.le(g, self.end) if self.threads.end_inclusive else arith.lt(g, self.end)

    def last_chunk(self) -> Any:
        """The largest value g takes: a register row's last chunk, or the loop variable after its last
        increment (the thread's last chunk below `end`, plus the stride)."""
        if self.unrolled:
            return self.chunk(self.threads.threads - 1, self.unrolled - 1)
        return self.end + self.threads.chunk_stride - (0 if self.threads.end_inclusive else 1)


@dataclass(frozen=True)
class RowCache:
    """Where element q of chunk g of a block's part of the row sits in the shared-memory copy of the
    row: `permuted` (16-byte chunks), slot q·(G + `lane_pad`) + g with G the part's chunks, so that
    consecutive threads write consecutive words (no bank conflicts); else slot g·vector + q, the
    column itself. `lane_pad` is nonzero only in planted bugs.

    The cache holds `rows` kept rows one after the other (RMSNorm's backward keeps dY and X): kept row
    k's slots start at k·`row_step`·L, L = G·vector the slots of one row (`row_length`); `row_step` is
    1 (0 only in planted bugs: every kept row written over the first's slots)."""

    permuted: bool
    lane_pad: int = 0
    rows: int = 1
    row_step: int = 1

    def slot(self, g: Any, q: Any, loop: ChunkLoop) -> Any:
        if self.permuted:
            return q * (loop.end + self.lane_pad) + g
        return loop.column(g, q)

    def row_length(self, loop: ChunkLoop) -> Any:
        """The slots one kept row takes: the part's chunks times their elements (its columns)."""
        return loop.end * loop.vector

    def row_base(self, k: int, loop: ChunkLoop) -> Any:
        """Where kept row k's slots start (k ≥ 1)."""
        return k * self.row_step * self.row_length(loop)

    def place(self, k: int, g: Any, q: Any, loop: ChunkLoop) -> Any:
        """The slot of element q of chunk g of kept row k (row 0: `slot` itself)."""
        if k == 0:
            return self.slot(g, q, loop)
        return self.row_base(k, loop) + self.slot(g, q, loop)

    def last_slot(self, loop: ChunkLoop) -> Any:
        """The largest slot a thread's loop indexes (its last chunk's last element, of the last kept row)."""
        return self.place(self.rows - 1, loop.last_chunk(), loop.vector - 1, loop)


@dataclass(frozen=True)
class MapLanes:
    """A map kernel's lanes: thread x of block b starts at element (b·`threads` + x)·`lane_stride`
    and computes `vector` consecutive elements from there (lane_stride = vector: the lanes tile the
    output; another stride only in planted bugs)."""

    threads: int
    vector: int
    lane_stride: int

    def first(self, block: Any, x: Any) -> Any:
        return (block * self.threads + x) * self.lane_stride

    def element(self, first: Any, v: Any) -> Any:
        return first + v

    def largest(self, blocks: Any) -> Any:
        """The largest element index a launch of `blocks` blocks computes (before its guard)."""
        return self.element(self.first(blocks - 1, self.threads - 1), self.vector - 1)


@dataclass(frozen=True)
class FlatThreads:
    """A general kernel's threads: thread x of block b computes flat output element b·`threads` + x
    (`threads`: the block's threads, so the blocks tile the output; another stride only in planted
    bugs). The emitter prints `element` (`e`), the interpreter runs it for every launched thread and the
    int32 rule bounds its largest value."""

    threads: int
    # elements a thread computes: thread x of block b takes (b·per_thread + v)·threads + x, v < per_thread
    # (a block tiles threads·per_thread consecutive elements; each v is one coalesced sweep of the block)
    per_thread: int = 1
    # consecutive elements of one sweep a thread moves at once (vector loads and stores): its sweep v then
    # starts at element ((b·per_thread + v)·threads + x)·vector and takes the next vector − 1 too
    vector: int = 1
    # block b takes the piece (the block-sized run of elements) blocks − 1 − b instead of b
    reverse: bool = False

    def piece(self, block: Any, blocks: Any) -> Any:
        """The piece of the output block `block` of a launch of `blocks` computes (`element` takes it)."""
        return blocks - 1 - block if self.reverse else block

    def element(self, block: Any, x: Any, v: Any = 0) -> Any:
        """The first element of the thread's sweep v (`block`: the piece its block takes)."""
        first = block * self.threads + x if self.per_thread == 1 else (block * self.per_thread + v) * self.threads + x
        return first if self.vector == 1 else first * self.vector

    def largest(self, blocks: Any, launched: int) -> Any:
        """The largest element index a launch of `blocks` blocks of `launched` threads computes (before
        its guard): the last piece's."""
        last = self.element(blocks - 1, launched - 1, self.per_thread - 1)
        return last if self.vector == 1 else last + (self.vector - 1)
