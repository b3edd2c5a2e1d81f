"""Lowering the fused attention family (FlashAttention-2 style): `O[batch.. i d] = Σ j softmax_j(where(mask,
Σ e Q·K · scale, −∞)) · V` (habu.plan.attention_split.AttentionForm), one block per (batch and heads, query tile).

The grid is flat: block x takes the query tile `query_tile(x)` (the tiles with the most keys first, so a
causal launch ends with its short tiles) of the batch element `batch_flat(x)` (the batch indices, O's
indices other than i and d, unravelled row-major by `batch_coords`). Its query rows are `row(qt, t)` =
qt·bm + t (masked by `row_inside`: < #I), 16 per warp; it walks `kv_tiles(qt, ...)` tiles of bn keys,
`key(kt, t)` = kt·bn + t (masked by `key_inside`: < #J, and by the model's mask). The causal skip:
where the mask is `j ≤ R` or `j < R` with R an index expression not reading j that does not decrease
with i (`key_limit`: R + 1 or R evaluated at the tile's last row), the tiles wholly at or past the limit
are not visited (`kv_tiles` = ⌈clamp(limit, 0, #J) / bn⌉); the mask is still applied to every score of
the tiles visited. K and V are read at the batch element's indices they have (GQA: K[b g j e] for query
heads (g, r)).

The online softmax per KV tile, per query row, in registers (the same functions print the kernel's
arithmetic and run in the finite-field interpreter, habu.prove.interp_attention, over Z_q × GF(p) where
exp(a + b) = exp(a)·exp(b) holds): `tile_max` the masked row maximum (each lane's registers, then the
lanes of the row by xor shuffles over `quad_offsets`), `running_max(m, tile_max)` the new maximum,
`rescale(m_old, m_new)` the exponent of the factor exp(m_old − m_new) that l and O are multiplied by,
`kept_max(m_old, m_new)` the maximum carried to the next tile. The mutants of the mutation suite
(habu/bench/mutants_attention.py) override these.

Fragments: S and O are mma.sync m16n8k16 accumulators (habu.lower.fragments.ACCUMULATOR: register (jn,
h, q) of lane l in warp w holds row w·16 + l/4 + 8h, column 8·jn + 2·(l%4) + q); P's A fragments are S's
accumulator registers of two adjacent 8-key groups, packed to bf16 (the PTX ISA's m16n8k16 A layout is the
C layout of two n8 tiles); V's B fragments come by ldmatrix.x4.trans from V's row-major tile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from habu.lower.access import Access, cdiv, floordiv
from habu.lower.attention_splitkv import SplitKVMaps
from habu.lower.fragments import ACCUMULATOR, AccumulatorFragment
from habu.plan.attention_split import AttentionForm
from habu.plan.plan import AttentionKernel
from habu.spec.ir import Compare, Expr, Gather, IndexAffine, IndexVar

MMA_M, MMA_N, MMA_K = 16, 8, 16  # mma.sync m16n8k16
PAD = 8  # bf16 elements of padding per staged row (16 bytes: the fragment reads are free of bank conflicts)
STAGES = 2  # K/V buffers by default (cp.async double buffer); `kernel.stages` for the mma.sync loop


@dataclass(frozen=True)
class AttentionLowering(SplitKVMaps):
    kernel: AttentionKernel
    form: AttentionForm
    q: Access  # at axes (batch.., "i", "e")
    k: Access  # at axes (batch.., "j", "e")
    v: Access  # at axes (batch.., "j", "d")
    out: Access  # at axes (batch.., "i", "d")
    batch_axes: tuple[str, ...]  # "x0", "x1", …: O's other indices, in O's order
    batch_extents: tuple[str, ...]
    row_extent: str  # #I
    key_extent: str  # #J
    red_extent: str  # #E
    col_extent: str  # #D
    scale: Expr | None
    mask: Compare | None  # over the axis names (batch axes, "i", "j")
    index_width: int
    width_e: int | None  # #E and #D when static (the kernel needs both: fragments are registers)
    width_d: int | None
    fragment: AccumulatorFragment = ACCUMULATOR
    quad_offsets: tuple[int, ...] = (1, 2)  # xor shuffles joining the 4 lanes of one accumulator row
    mask_ranges: tuple[str, ...] = ()  # the value ranges of the index tensors the mask reads (sequence lengths)
    # a training forward's row statistics at axes (batch.., "i"): the softmax's maximum and sum (attention_fused.py)
    stats: tuple[Access, Access] | None = None

    @property
    def node(self):
        return self.form.node

    @property
    def extents(self) -> tuple[str, ...]:
        return self.out.extents

    @property
    def warps(self) -> int:
        """The block's warps: a group of `kv_warps` for each row tile set (its row tiles' keys sliced over them)."""
        return self.kernel.bm // (MMA_M * self.kernel.warp_m) * self.kv_warps

    @property
    def kv_warps(self) -> int:
        """Warps sharing the block's KV tiles (each a slice of every tile's keys; 1: one warp takes every key)."""
        return self.kernel.kv_warps

    def row_tile(self, warp: Any, mi: Any) -> Any:
        """The 16-row tile a warp's mi-th accumulators compute (rows 16·row_tile..): the warps of one row tile set
        are `kv_warps` adjacent warps."""
        if self.kv_warps == 1:
            return warp * self.kernel.warp_m + mi
        return floordiv(warp, self.kv_warps) * self.kernel.warp_m + mi

    # -- the KV tile's keys sliced over the warps of a row tile set (`kv_warps`)
    @property
    def slice_keys(self) -> int:
        """The keys of a KV tile one warp takes: bn / kv_warps (whole k16 steps of P·V)."""
        return self.kernel.bn // self.kv_warps

    def key_slice(self, warp: Any) -> Any:
        """The slice of each KV tile warp `warp` takes: keys key_slice·slice_keys.. of the tile."""
        return warp % self.kv_warps

    def slice_key(self, warp: Any, col: Any) -> Any:
        """The tile key of column `col` of the warp's scores (S holds its slice's keys)."""
        if self.kv_warps == 1:
            return col
        return self.key_slice(warp) * self.slice_keys + col

    def k_slice_rows(self, warp: Any, stage: Any, lane: Any, kk: Any, jp: Any) -> Any:
        """`k_rows` for the warp's jp-th 16-key pair: the tile's pair key_slice·key_pairs + jp."""
        if self.kv_warps == 1:
            return self.k_rows(stage, lane, kk, jp)
        return self.k_rows(stage, lane, kk, self.key_slice(warp) * self.key_pairs + jp)

    def v_slice_rows(self, warp: Any, stage: Any, lane: Any, kk: Any, dp: Any) -> Any:
        """`v_rows` for the warp's kk-th k16 step of P·V: the tile's step key_slice·pv_steps + kk."""
        if self.kv_warps == 1:
            return self.v_rows(stage, lane, kk, dp)
        return self.v_rows(stage, lane, self.key_slice(warp) * self.pv_steps + kk, dp)

    # -- the merge of the slices' partials in shared memory (kv_warps > 1), as f32 words from the start of the
    # dynamic shared memory (the K/V buffers, free once the KV loop is done): each slice's unnormalised O (bm
    # rows × #D: a row's slice s comes from the warp of its row tile set taking slice s), then the slices'
    # m, then their l
    def merge_o(self, warp: Any, t: Any, d: Any) -> Any:
        assert self.width_d is not None
        return (self.key_slice(warp) * self.kernel.bm + t) * self.width_d + d

    def merge_m(self, warp: Any, t: Any) -> Any:
        assert self.width_d is not None
        return self.kv_warps * self.kernel.bm * self.width_d + self.key_slice(warp) * self.kernel.bm + t

    def merge_l(self, warp: Any, t: Any) -> Any:
        assert self.width_d is not None
        return self.kv_warps * self.kernel.bm * (self.width_d + 1) + self.key_slice(warp) * self.kernel.bm + t

    def merge_bytes(self) -> int:
        assert self.width_d is not None
        return 4 * self.kv_warps * self.kernel.bm * (self.width_d + 2)

    @property
    def merge_count(self) -> int:
        """The elements (row of the tile, column d) the block's threads merge, striding over them."""
        assert self.width_d is not None
        return self.kernel.bm * self.width_d

    def merge_element(self, e: Any) -> tuple[Any, Any]:
        """(row in the tile, column d) of merged element e."""
        assert self.width_d is not None
        return floordiv(e, self.width_d), e % self.width_d

    def merge_warp(self, t: Any, s: Any) -> Any:
        """The warp holding slice s of tile row t's partials (the row tile set of row t, slice s)."""
        return floordiv(t, MMA_M * self.kernel.warp_m) * self.kv_warps + s

    def merge_exponent(self, m_slice: Any, m_all: Any, ops: Any) -> Any:
        """The exponent of the factor a slice's l and O are multiplied by in the merge: exp(m_s − M)."""
        return ops.sub(m_slice, m_all)

    def stat_writer(self, lane: Any) -> Any:
        """Whether a lane stores its rows' statistics (`stats`): the first of the row's quad (after the xor shuffles
        each lane of it holds its row's maximum and sum)."""
        return lane % 4 < 1

    def stat_row(self, rt: Any, lane: Any, h: Any) -> Any:
        """The query tile's row whose statistics a lane holds in its row half h of row tile rt."""
        return self.fragment.element(rt, lane, 0, h, 0)[0]

    def row_writer(self, d: Any) -> Any:
        """Whether the merged element of column d writes its row's m and l (one element a row): d < 1 (an order
        comparison, which C text, z3 and numpy all print or evaluate; `==` on a C expression is Python's)."""
        return d < 1

    @property
    def row_tiles(self) -> int:
        """16-row tiles of the query tile: row tile warp·warp_m + mi holds rows 16·(warp·warp_m + mi).."""
        return self.kernel.bm // MMA_M

    @property
    def threads(self) -> int:
        return 32 * self.warps

    # -- the kernel's loops over fragments (their trip counts; the interpreter runs the same)
    @property
    def sets_per_warp(self) -> int:
        """The 16-row accumulator sets of a warp (mi < sets_per_warp; row tile `row_tile(warp, mi)`)."""
        return self.kernel.warp_m

    @property
    def qk_steps(self) -> int:
        """The k16 steps of S = Q·Kᵀ over #E (kk), each Q's A fragment and K's B fragments."""
        assert self.width_e is not None
        return self.width_e // MMA_K

    @property
    def key_pairs(self) -> int:
        """The 16-key pairs of 8-key groups one ldmatrix.x4 of K serves (jp), of the warp's slice."""
        return self.slice_keys // (2 * MMA_N)

    @property
    def score_groups(self) -> int:
        """The 8-key groups of S's accumulators a lane holds per row tile (jn), of the warp's slice."""
        return self.slice_keys // MMA_N

    @property
    def pv_steps(self) -> int:
        """The k16 steps of O += P·V over the warp's slice of keys (kk): P's A fragment from groups 2kk, 2kk + 1."""
        return self.slice_keys // MMA_K

    @property
    def out_groups(self) -> int:
        """The 8-column groups of O's accumulators over #D (dn)."""
        assert self.width_d is not None
        return self.width_d // MMA_N

    @property
    def value_pairs(self) -> int:
        """The 16-column pairs of 8-column groups one ldmatrix.x4.trans of V serves (dp)."""
        assert self.width_d is not None
        return self.width_d // (2 * MMA_N)

    @property
    def registers(self) -> int:
        """Accumulator registers of one 8-column group (q < registers): the fragment's halves × pair."""
        return self.fragment.registers(1)

    def register_parts(self, q: Any) -> tuple[Any, Any]:
        """Register q of an 8-column group: (h, its column within the lane's pair) = (q / pair, q % pair)."""
        return floordiv(q, self.fragment.pair), q % self.fragment.pair

    def b_registers(self, half: int) -> tuple[int, int]:
        """The registers of one ldmatrix.x4 that form B fragment `half` (K: the 8-key group 2jp + half; V:
        the 8-column group 2dp + half): registers 2·half, 2·half + 1."""
        return 2 * half, 2 * half + 1

    def copy_chunks(self, rows: int, width: int) -> int:
        """The 16-byte chunks of a staged tile of `rows` rows of `width` bf16 elements."""
        return rows * width // 8

    def staged_column(self, col: Any) -> Any:
        """The tensor column (e or d) of a staged chunk whose first element lies in column `col` of its row."""
        return col

    def next_tile(self, kt: Any) -> Any:
        """The KV tile loaded while tile kt is multiplied."""
        return kt + 1

    def first_tile(self, split: Any = 0) -> Any:
        """The KV tile a block of split `split` starts at (0 without a split)."""
        return split * self.split_tiles if self.kernel.kv_split else 0

    # -- the grid (ints, numpy arrays, z3 terms or C text)
    def batch_count(self, sizes: Mapping[str, Any]) -> Any:
        out: Any = 1
        for e in self.batch_extents:
            out = out * sizes[e]
        return out

    def query_tiles(self, sizes: Mapping[str, Any]) -> Any:
        return cdiv(sizes[self.row_extent], self.kernel.bm)

    def grid(self, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        return self.batch_count(sizes) * self.query_tiles(sizes) * self.splits(sizes), 1

    def query_tile(self, x: Any, sizes: Mapping[str, Any]) -> Any:
        """Block x's query tile: the last tiles (the most keys under a causal mask) first; `head_major`: a batch
        element's tiles one after another (each batch element's last tile first)."""
        if self.kernel.head_major:
            return self.query_tiles(sizes) - 1 - x % self.query_tiles(sizes)
        return self.query_tiles(sizes) - 1 - floordiv(x, self.batch_count(sizes))

    def batch_flat(self, x: Any, sizes: Mapping[str, Any]) -> Any:
        if self.kernel.head_major:
            return floordiv(x, self.query_tiles(sizes))
        return x % self.batch_count(sizes)

    def batch_coords(self, flat: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """The batch indices of the flat batch element, row-major over the batch extents."""
        out: dict[str, Any] = {}
        rest = flat
        for axis, e in reversed(list(zip(self.batch_axes, self.batch_extents, strict=True))):
            out[axis] = rest % sizes[e]
            rest = floordiv(rest, sizes[e])
        return out

    def row(self, qt: Any, t: Any) -> Any:
        return qt * self.kernel.bm + t

    def row_inside(self, row: Any, sizes: Mapping[str, Any]) -> Any:
        return row < sizes[self.row_extent]

    def key(self, kt: Any, t: Any) -> Any:
        return kt * self.kernel.bn + t

    def key_inside(self, key: Any, sizes: Mapping[str, Any]) -> Any:
        return key < sizes[self.key_extent]

    # -- the causal skip
    def skip_bound(self) -> tuple[IndexAffine, int] | None:
        """(R, c) when the mask is `j < R + c` with R not reading j and not decreasing with i (then keys
        at or past R + c, at the tile's last row, are masked for every row of the tile); None otherwise."""
        m = self.mask
        if m is None:
            return None
        key, row = IndexVar("j", self.key_extent), IndexVar("i", self.row_extent)
        for left, op, right in ((m.left, m.op, m.right), (m.right, {"ge": "le", "gt": "lt"}.get(m.op, ""), m.left)):
            if op not in ("le", "lt") or left.terms != ((1, key),) or left.sizes or left.const:
                continue
            if any(ix == key or (isinstance(ix, Gather) and key in ix.indices) for _, ix in right.terms):
                continue
            if any(c < 0 for c, ix in right.terms if ix == row) or \
                    any(isinstance(ix, Gather) and row in ix.indices for _, ix in right.terms):
                continue
            return right, 1 if op == "le" else 0
        return None

    def _bound_at(self, row: Any, sizes: Mapping[str, Any], term: Callable[[Any, Any], Any]) -> Any:
        bound = self.skip_bound()
        assert bound is not None
        right, plus = bound
        total: Any = right.const + plus
        for k, e in right.sizes:
            total = total + k * sizes[e]
        for k, ix in right.terms:
            total = total + k * term(ix, row)
        return total

    def key_limit(self, qt: Any, sizes: Mapping[str, Any], term: Callable[[Any, Any], Any]) -> Any:
        """The keys the tile's rows may see lie below this: R + c at the tile's last row where the mask
        allows a skip, else #J. `term(ix, row)` gives an index term's value (i: at `row`)."""
        if self.skip_bound() is None:
            return sizes[self.key_extent]
        return self._bound_at(self.row(qt, self.kernel.bm) - 1, sizes, term)

    def open_limit(self, qt: Any, sizes: Mapping[str, Any], term: Callable[[Any, Any], Any]) -> Any:
        """The keys below this are visible to every row of the tile: R + c at its first row (R does not
        decrease with i) where the mask allows a skip; #J without a mask; else 0 (every KV tile is masked)."""
        if self.mask is None:
            return sizes[self.key_extent]
        if self.skip_bound() is None:
            return 0
        return self._bound_at(self.row(qt, 0), sizes, term)

    def unmasked(self, kt: Any, open_limit: Any, sizes: Mapping[str, Any], both: Callable[[Any, Any], Any]) -> Any:
        """Whether KV tile kt needs no mask: its keys all below #J and below the open limit."""
        end = self.key(kt, self.kernel.bn)
        return both(end <= open_limit, end <= sizes[self.key_extent])

    def kv_tiles(self, limit: Any, sizes: Mapping[str, Any], clamp: Callable[[Any, Any, Any], Any]) -> Any:
        """The KV tiles a query tile visits: ⌈clamp(limit, 0, #J) / bn⌉ (`clamp(x, lo, hi)`)."""
        return cdiv(clamp(limit, 0, sizes[self.key_extent]), self.kernel.bn)

    # -- the online softmax (ops: max, sub over the domain's values)
    def running_max(self, m_old: Any, tile_max: Any, ops: Any) -> Any:
        return ops.max(m_old, tile_max)

    def rescale(self, m_old: Any, m_new: Any, ops: Any) -> Any:
        """The exponent of the factor l and O are multiplied by before the tile's terms are added."""
        return ops.sub(m_old, m_new)

    def kept_max(self, m_old: Any, m_new: Any) -> Any:
        """The running maximum carried to the next tile."""
        return m_new

    # -- shared memory, in bf16 elements from the start of the block's dynamic shared memory
    @property
    def pitch_e(self) -> int:
        """Elements of a staged Q or K row: #E and 16 bytes of padding (the fragment reads of 8 rows × 4
        words then hit 32 different banks)."""
        assert self.width_e is not None
        return self.width_e + PAD

    @property
    def pitch_d(self) -> int:
        assert self.width_d is not None
        return self.width_d + PAD

    def smem_layout(self) -> dict[str, tuple[int, int]]:
        """Each staged array's (offset, elements): Q's tile, then `kv_stages` pairs of a K and a V tile."""
        k = self.kernel
        q, kt, vt = k.bm * self.pitch_e, k.bn * self.pitch_e, k.bn * self.pitch_d
        out = {"Qs": (0, q)}
        for s in range(self.kv_stages):
            out[f"Ks{s}"] = (q + s * (kt + vt), kt)
            out[f"Vs{s}"] = (q + s * (kt + vt) + kt, vt)
        return out

    @property
    def stage_elements(self) -> int:
        """From one K/V buffer to the next."""
        return self.kernel.bn * (self.pitch_e + self.pitch_d)

    def smem_bytes(self) -> int:
        return 2 * sum(n for _, n in self.smem_layout().values())

    def copy_chunk(self, chunk: Any, width: int) -> tuple[Any, Any]:
        """(row, first column) of the 16-byte chunk `chunk` of a staged tile of rows of `width` elements."""
        return floordiv(chunk, width // 8), chunk % (width // 8) * 8

    def q_smem(self, row: Any, col: Any) -> Any:
        return self.smem_layout()["Qs"][0] + row * self.pitch_e + col

    def k_smem(self, stage: Any, row: Any, col: Any) -> Any:
        return self.smem_layout()["Ks0"][0] + stage * self.stage_elements + row * self.pitch_e + col

    def v_smem(self, stage: Any, row: Any, col: Any) -> Any:
        return self.smem_layout()["Vs0"][0] + stage * self.stage_elements + row * self.pitch_d + col

    @property
    def kv_stages(self) -> int:
        """The K/V buffers of the mma.sync loop (`kernel.stages`): tiles kt + 1 .. kt + stages − 1 are in flight
        while tile kt is multiplied."""
        return self.kernel.stages

    def stage_of(self, kt: Any) -> Any:
        """The buffer KV tile kt is staged in (tile kt + 1 loads into the other one while kt is multiplied)."""
        return kt % self.kv_stages

    def prefetch_tile(self, kt: Any) -> Any:
        """The KV tile whose copy is issued while tile kt is multiplied: `next_tile` with two buffers, tile
        kt + stages − 1 with more (the tiles between already in flight)."""
        if self.kv_stages == 2:
            return self.next_tile(kt)
        return kt + (self.kv_stages - 1)

    def prologue_tile(self, first: Any, p: Any) -> Any:
        """The p-th tile loaded before the KV loop (p < stages − 1): first + p."""
        return first + p

    # -- the fragments each lane reads (bf16 element offsets in shared memory; register `reg` is 2 elements)
    def lane_group(self, lane: Any) -> tuple[Any, Any]:
        """(groupID, threadID_in_group) = (lane / 4, lane % 4)."""
        return floordiv(lane, 4), lane % 4

    def q_fragment(self, warp: Any, lane: Any, kk: Any, reg: int) -> Any:
        """Register reg of the A fragment of Q's rows 16·warp.. (`warp`: the row tile) at k step kk (rows g and g + 8, columns
        2t.. and 2t + 8..)."""
        g, t = self.lane_group(lane)
        return self.q_smem(warp * MMA_M + g + 8 * (reg % 2), kk * MMA_K + 2 * t + 8 * (reg // 2))

    def k_rows(self, stage: Any, lane: Any, kk: Any, jp: Any) -> Any:
        """The row lane hands ldmatrix.x4 for the B fragments of keys jp·16.. at k step kk: matrix lane / 8 is
        keys jp·16 + 8·(m / 2).. and columns kk·16 + 8·(m % 2)..; its row lane % 8. Registers 0, 1 are
        the B fragment of keys jp·16.., registers 2, 3 that of keys jp·16 + 8.."""
        m = floordiv(lane, 8)
        return self.k_smem(stage, jp * 2 * MMA_N + floordiv(m, 2) * MMA_N + lane % 8, kk * MMA_K + (m % 2) * 8)

    def v_rows(self, stage: Any, lane: Any, kk: Any, dp: Any) -> Any:
        """The row lane hands ldmatrix.x4.trans for V's B fragments of keys kk·16.., columns dp·16..: matrix
        m = lane / 8 is keys kk·16 + 8·(m % 2).., columns dp·16 + 8·(m / 2)..; its row lane % 8. Registers
        0, 1 are the B fragment of columns dp·16.., registers 2, 3 that of columns dp·16 + 8.."""
        m = floordiv(lane, 8)
        return self.v_smem(stage, kk * MMA_K + (m % 2) * 8 + lane % 8, dp * 2 * MMA_N + floordiv(m, 2) * MMA_N)

    def p_fragment(self, kk: Any, reg: int) -> tuple[tuple[Any, int], tuple[Any, int]]:
        """The two S accumulators (8-key group, register) packed into register reg of P's A fragment of keys
        kk·16..: groups 2kk (reg < 2) and 2kk + 1, registers 0, 1 (reg even) or 2, 3."""
        group = 2 * kk + reg // 2
        return (group, 2 * (reg % 2)), (group, 2 * (reg % 2) + 1)


def flops(lw: AttentionLowering, sizes: Mapping[str, int]) -> float:
    """2·(#E + #D) per visible (row, key) pair, counting the keys of the tiles visited."""
    rows, keys = sizes[lw.row_extent], sizes[lw.key_extent]
    causal = lw.skip_bound() is not None
    pairs = rows * keys / 2 if causal and rows == keys else rows * keys
    return 2.0 * lw.batch_count(sizes) * pairs * (sizes[lw.red_extent] + sizes[lw.col_extent])


__all__ = ["MMA_K", "MMA_M", "MMA_N", "PAD", "STAGES", "AttentionLowering", "flops"]
