"""The cluster split-K reduction: how the split_k blocks of one output tile add up their partials.

The S = split_k blocks of a tile are one thread-block cluster (consecutive block indices: the decode
puts the split innermost, so split s is the block's cluster rank). After its k loop each block writes
its f32 partial tile into its own shared memory, over the ring's stages (the loads are all consumed):

    partial at word  row · row_words + col          (row < BM, col < BN; row_words = BN + PAD)

Then a cluster barrier; block r finishes the rows [r·BM/S, (r+1)·BM/S): consumer thread t takes the
pairs of adjacent columns

    q = t + threads · i  (i < iterations, q < pairs):  row = r·BM/S + q / (BN/2),  col = 2·(q mod BN/2)

reads both words of that pair in every block of the cluster (distributed shared memory, rank order),
adds them, applies the epilogue to (m0 + row, n0 + col) and (…, col + 1) and stores them. A second
cluster barrier keeps every block's partial alive until its peers have read it. Every element is
added once and stored once: no atomics, no output zeroed before the kernel, any epilogue.

The emitter prints these maps (`partial_word`, `reduced_pair`); the finite-field check
(habu.prove.interp) executes them: each split's exact partial written at `partial_word`, each rank's
pairs read back at the same words of every block, and every element of the tile reduced by exactly
one (rank, thread, iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.access import floordiv

PARTIAL_PAD = 8  # words after each row: a half-warp's float2 stores (4 rows x 8 words) hit 32 distinct banks


@dataclass(frozen=True)
class ClusterSplitReduction:
    split: int  # blocks of the cluster (= split_k)
    bm: int
    bn: int
    threads: int  # consumer threads of a block (128 per consumer warpgroup)
    base: int = 0  # byte offset of the partial tile in shared memory (over the ring's stages)
    pad: int = PARTIAL_PAD

    @property
    def row_words(self) -> int:
        return self.bn + self.pad

    @property
    def bytes(self) -> int:
        """The partial tile's bytes in shared memory."""
        return self.bm * self.row_words * 4

    @property
    def rows_per_rank(self) -> int:
        return self.bm // self.split

    @property
    def pairs(self) -> int:
        """Column pairs one rank adds up."""
        return self.rows_per_rank * (self.bn // 2)

    @property
    def iterations(self) -> int:
        return -(-self.pairs // self.threads)

    def partial_word(self, row: Any, col: Any) -> Any:
        """The f32 word of the partial tile holding element (row, col) of the tile."""
        return row * self.row_words + col

    def reduced_pair(self, rank: Any, thread: Any, iteration: Any) -> tuple[Any, Any, Any]:
        """(row, col, q) of the first element of the pair that consumer thread `thread` of block `rank`
        adds up at `iteration`; the pair exists where q < pairs."""
        q = thread + self.threads * iteration
        half = self.bn // 2
        row_in = floordiv(q, half)
        return rank * self.rows_per_rank + row_in, (q - row_in * half) * 2, q


def cluster_reduction_for(split: int, bm: int, bn: int, consumers: int) -> ClusterSplitReduction:
    return ClusterSplitReduction(split, bm, bn, 128 * consumers)


__all__ = ["PARTIAL_PAD", "ClusterSplitReduction", "cluster_reduction_for"]
