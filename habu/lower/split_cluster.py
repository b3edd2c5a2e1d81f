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

A transposed product (`swap_ab`) stores its output contiguous along the tile's m, so there the pairs run
along m (`pair_axis` "m"): the partial tile is stored column-major,

    partial at word  col · col_words + row          (col_words = BM + PAD_M)

each fragment element by its own word, and thread t takes the pairs of adjacent rows

    q = t + threads · i:  col = q / (BM/2S),  row = r·BM/S + 2·(q mod BM/2S)

so consecutive threads store consecutive output elements (the row-major pairs of a transposed tile put each
thread's element in another output row: a sector per element). Either way a pair's second element is the
word after its first (`second`), read with the first as one float2.

The emitter prints these maps (`partial_word`, `reduced_pair`, `second`); the finite-field check
(habu.prove.interp) executes them: each split's exact partial written at `partial_word`, each rank's
pairs read back at the same words of every block, and every element of the tile reduced by exactly
one (rank, thread, iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.access import floordiv

PARTIAL_PAD = 8  # words after each row: a half-warp's float2 stores (4 rows x 8 words) hit 32 distinct banks
# words after each column (pairs along m): a warp's fragment stores, 8 rows by 4 even columns 2·col_words apart,
# hit 32 distinct banks where 2·col_words = 8 (mod 32), i.e. BM + 4 for BM a multiple of 16
PARTIAL_PAD_M = 4


@dataclass(frozen=True)
class ClusterSplitReduction:
    split: int  # blocks of the cluster (= split_k)
    bm: int
    bn: int
    threads: int  # consumer threads of a block (128 per consumer warpgroup)
    base: int = 0  # byte offset of the partial tile in shared memory (over the ring's stages)
    pad: int = PARTIAL_PAD
    pair_axis: str = "n"  # the tile axis a reduced pair's two elements are adjacent along (the output's contiguous one)

    @property
    def row_words(self) -> int:
        return self.bn + self.pad

    @property
    def col_words(self) -> int:
        return self.bm + self.pad

    @property
    def bytes(self) -> int:
        """The partial tile's bytes in shared memory."""
        return (self.bm * self.row_words if self.pair_axis == "n" else self.bn * self.col_words) * 4

    @property
    def fragment_pairs(self) -> bool:
        """Whether a fragment's column pair (row, col), (row, col + 1) is stored as one float2 (row-major
        partials); else each of its elements at its own word."""
        return self.pair_axis == "n"

    @property
    def rows_per_rank(self) -> int:
        return self.bm // self.split

    @property
    def pairs(self) -> int:
        """Pairs one rank adds up."""
        return self.rows_per_rank * self.bn // 2

    @property
    def iterations(self) -> int:
        return -(-self.pairs // self.threads)

    def partial_word(self, row: Any, col: Any) -> Any:
        """The f32 word of the partial tile holding element (row, col) of the tile."""
        return row * self.row_words + col if self.pair_axis == "n" else col * self.col_words + row

    def reduced_pair(self, rank: Any, thread: Any, iteration: Any) -> tuple[Any, Any, Any]:
        """(row, col, q) of the first element of the pair that consumer thread `thread` of block `rank`
        adds up at `iteration`; the pair exists where q < pairs."""
        q = thread + self.threads * iteration
        if self.pair_axis == "n":
            half = self.bn // 2
            row_in = floordiv(q, half)
            return rank * self.rows_per_rank + row_in, (q - row_in * half) * 2, q
        half = self.rows_per_rank // 2
        col = floordiv(q, half)
        return rank * self.rows_per_rank + (q - col * half) * 2, col, q

    def second(self, row: Any, col: Any) -> tuple[Any, Any]:
        """The pair's second element (the word after the first's)."""
        return (row, col + 1) if self.pair_axis == "n" else (row + 1, col)


def cluster_reduction_for(split: int, bm: int, bn: int, consumers: int, pair_axis: str = "n") -> ClusterSplitReduction:
    """The reduction of a cluster split of `split` blocks; `pair_axis` "m" where the output is contiguous along
    the tile's m (a transposed product)."""
    pad = PARTIAL_PAD if pair_axis == "n" else PARTIAL_PAD_M
    return ClusterSplitReduction(split, bm, bn, 128 * consumers, pad=pad, pair_axis=pair_axis)


__all__ = ["PARTIAL_PAD", "PARTIAL_PAD_M", "ClusterSplitReduction", "cluster_reduction_for"]
