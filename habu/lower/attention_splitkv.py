"""The split-KV maps of the fused attention lowering (flash-decoding, `AttentionKernel.kv_split`): a query tile's KV
tiles split over blocks, each split's partial (running max m, sum l, unnormalised O) in the launch's workspaces, the
counters that find each query tile's last split, and the combine that finishes it. A base of
habu.lower.attention.AttentionLowering: these methods read its kernel, extents and grid (`batch_count`,
`query_tiles`, `smem_bytes`); the finite-field interpreter (habu/prove/interp_attention_split.py), the rules and the
emitters run them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from habu.lower.access import cdiv, floordiv, minimum


class SplitKVMaps:
    @property
    def split_tiles(self) -> int:
        """The KV tiles of one split."""
        return self.kernel.kv_split // self.kernel.bn

    def splits(self, sizes: Mapping[str, Any]) -> Any:
        """The blocks a query tile's keys are split over: ⌈#J / kv_split⌉ (1 without a split)."""
        return cdiv(sizes[self.key_extent], self.kernel.kv_split) if self.kernel.kv_split else 1

    def block_split(self, x: Any, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        """(split, the block's index among its split's blocks): split-major, so that the blocks of a split
        decode their query tile and batch element as an unsplit launch does."""
        if not self.kernel.kv_split:
            return 0, x
        per = self.batch_count(sizes) * self.query_tiles(sizes)
        return floordiv(x, per), x % per

    def end_tile(self, split: Any, tiles: Any) -> Any:
        """One past the last KV tile split `split` visits (of the `tiles` the query tile visits)."""
        return minimum(tiles, (split + 1) * self.split_tiles) if self.kernel.kv_split else tiles

    def prologue_limit(self, split: Any, tiles: Any, sizes: Mapping[str, Any]) -> Any:
        """The tiles the loop's prologue may copy (tile first + p where it lies below this): the `tiles` the block
        visits, known once the mask's key limit is read; with `kv_ahead`, the block's tiles within #J, so the
        copies need no read before them (the loop still stops at `tiles`: a tile past it is copied, never read)."""
        if not self.kernel.kv_ahead:
            return tiles
        return self.end_tile(split, cdiv(sizes[self.key_extent], self.kernel.bn))

    # the partials (workspaces of the launch, named after the output: no other kernel writes those names)
    @property
    def partial_tensors(self) -> tuple[str, str, str]:
        """The workspaces of the splits' unnormalised O, running maxima m and sums l."""
        return tuple(f"${self.out.tensor}.{x}" for x in "oml")  # type: ignore[return-value]

    @property
    def counter_tensor(self) -> str:
        """The counters the splits of a query tile count themselves on (zero-filled before the launch)."""
        return f"${self.out.tensor}.n"

    def partial_extents(self) -> tuple[str, ...]:
        """m's and l's workspace shape as extent tokens: splits ("J/1024"), the batch, the rows."""
        return (f"{self.key_extent}/{self.kernel.kv_split}", *self.batch_extents, self.row_extent)

    def counter_extents(self) -> tuple[str, ...]:
        return (*self.batch_extents, f"{self.row_extent}/{self.kernel.bm}")

    def partial_slot(self, split: Any, flat: Any, row: Any, sizes: Mapping[str, Any]) -> Any:
        """Where split `split` keeps m and l of row `row` of batch element `flat`."""
        return (split * self.batch_count(sizes) + flat) * sizes[self.row_extent] + row

    def partial_offset(self, split: Any, flat: Any, row: Any, d: Any, sizes: Mapping[str, Any]) -> Any:
        """Where it keeps O's column d of that row (the slot's #D columns)."""
        assert self.width_d is not None
        return self.partial_slot(split, flat, row, sizes) * self.width_d + d

    def partial_slots(self, sizes: Mapping[str, Any]) -> Any:
        """m's and l's workspace elements (the size of `partial_extents`)."""
        return self.splits(sizes) * self.batch_count(sizes) * sizes[self.row_extent]

    def counter_slot(self, flat: Any, qt: Any, sizes: Mapping[str, Any]) -> Any:
        return flat * self.query_tiles(sizes) + qt

    def counter_after(self, sizes: Mapping[str, Any]) -> Any:
        """What the combining block leaves in its query tile's counter: 0, so that the next launch finds it
        zero (the runtime zero-fills the counters once, when it allocates them: `CudaKernel.zero_once`)."""
        return 0

    def arrivals(self, sizes: Mapping[str, Any]) -> Any:
        """Blocks that count themselves on a query tile's counter: its splits; the one bringing the count to
        this combines."""
        return self.splits(sizes)

    @property
    def combine_count(self) -> int:
        """The output elements of a query tile the combining block finishes (bm rows × #D)."""
        assert self.width_d is not None
        return self.kernel.bm * self.width_d

    def combine_element(self, e: Any) -> tuple[Any, Any]:
        """(row in the tile, column d) of the combining block's element e (its threads stride over them)."""
        assert self.width_d is not None
        return floordiv(e, self.width_d), e % self.width_d

    # the combine's weights in shared memory (f32 words from the start of the dynamic shared memory, free once
    # the block's own partial is stored), where a split count known when the kernel is compiled fits there:
    # each split's weight of each row of the tile, then each row's total l, then each split's l of each row; a
    # thread a (split, row) pair reads m and l together (one round trip to the L2), a thread a row turns the m
    # into weights and sums weight·l, then a thread an element reads only the splits' O
    def combine_in_smem(self, sizes: Mapping[str, Any]) -> bool:
        n = self.splits(sizes)
        return isinstance(n, int) and (2 * n + 1) * self.kernel.bm <= self.combine_words()

    def combine_words(self) -> int:
        """The 4-byte words of shared memory the combining block may take for the splits' weights (the K/V
        buffers, free once the main loop is done): the whole block's."""
        return self.smem_bytes() // 4

    def combine_pairs(self, sizes: Mapping[str, Any]) -> Any:
        """The (split, row of the tile) pairs whose m the combining block reads into its weights."""
        return self.splits(sizes) * self.kernel.bm

    def combine_pair(self, p: Any, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        """(split, row in the tile) of pair p: a row's splits on consecutive threads, so the tile's first rows
        (a decode's only rows: its query heads) are the first pairs, read by all the threads at once (row-minor
        pairs left 2 of every 16 threads reading, one split after another: 8 L2 round trips at 64 splits)."""
        n = self.splits(sizes)
        return p % n, floordiv(p, n)

    def combine_w(self, s: Any, t: Any) -> Any:
        """The word holding split s's m, then its weight, for row t of the tile."""
        return s * self.kernel.bm + t

    def combine_total(self, t: Any, sizes: Mapping[str, Any]) -> Any:
        """The word holding row t's total l (Σ_s weight·l_s)."""
        return self.splits(sizes) * self.kernel.bm + t

    def combine_l(self, s: Any, t: Any, sizes: Mapping[str, Any]) -> Any:
        """The word holding split s's l for row t of the tile (read with its m, before the weights)."""
        return (self.splits(sizes) + 1 + s) * self.kernel.bm + t

    def combine_exponent(self, m_split: Any, m_all: Any, ops: Any) -> Any:
        """The exponent of the factor a split's l and O are multiplied by in the combine: exp(m_s − M),
        M the maximum of every split's m (the online softmax's rescale, once per split)."""
        return ops.sub(m_split, m_all)


__all__ = ["SplitKVMaps"]
