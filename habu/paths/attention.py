"""The fused attention path (FlashAttention-2 style): a softmax-weighted sum `O = Σ j softmax_j(where(mask,
Σ e Q·K · scale, −∞)) · V` in one kernel, the online softmax in registers, proven over Z_q × GF(p)
(habu/lower/attention.py lowers it, habu/emit_cuda/emit_attention.py prints it, habu/prove/interp_attention.py
checks it). It builds a general region whose node is such a sum (the model without the `attention:T`
rewrite), through `--pin family=attention` and the search (`region_space`). It is the analytic default of a
decode (`default_pins`: at most 16 query rows a sequence; its sliced split-KV plan passed its golden GPU runs
and ran 16x the unfused plan, session 31) and of a prefill of at least `WGMMA_PREFILL_ROWS` query rows (the wgmma
main loop, two consumers in ping-pong, persistent blocks: `prefill_pins`); a shorter prefill's stays the unfused
plan. A region of the sum and its softmax's row maximum and sum (a training forward after `fused:T`,
habu/plan/attention_fused.py) takes the kernel too, which then stores them. The cost of the wgmma loop:
habu/paths/attention_schedule.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace

from habu.emit_cuda.emit_attention import emit_attention
from habu.emit_cuda.emit_attention_wgmma import emit_attention_wgmma
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.attention import AttentionLowering, flops
from habu.lower.attention_lower import lower_attention
from habu.lower.attention_wgmma import AttentionWgmmaLowering, lower_attention_wgmma, wgmma_smem_bytes
from habu.lower.support import ATTENTION
from habu.paths.analytic import index_width
from habu.paths.attention_schedule import kv_dram_bytes, wgmma_attention_seconds
from habu.paths.base import KernelPath
from habu.plan.attention_fused import attention_statistics, fused_view
from habu.plan.attention_split import AttentionForm, attention_form
from habu.plan.patterns import Region
from habu.plan.plan import AttentionKernel, Kernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model
from habu.target import Target

# the share of the mma.sync peak the kernel reaches (a guess for the cost model until it is measured)
MMA_SHARE = 0.5
# a decode's block before session 55 (session 31, docs/PERF.md): 4 warps, each 16 keys of a 64-key KV tile, 3 K/V
# buffers; still the default of a cache under `DECODE_WIDE_KEYS` or where the wide block's buffers do not fit
DECODE_WARPS, DECODE_BN, DECODE_STAGES = 4, 64, 3
# a decode's default block since session 55 (`decode_split_one_wave`): 8 warps, each 16 keys of a 128-key KV tile,
# 3 K/V buffers (192 KB at head width 128: one block an SM), splits that give at most one block an SM
DECODE_WIDE_WARPS, DECODE_WIDE_BN, DECODE_WIDE_STAGES = 8, 128, 3
DECODE_WIDE_KEYS = 256  # ... from caches of this many keys (shorter ones were not timed with it)
MAX_SPLITS = 64  # a query tile's splits: the one block that combines them reads all their partials
HEAD_MAJOR_SLACK = 0.03  # head-major's schedule may be this much longer (`head_major_pays`)
HEAD_MAJOR_TRAFFIC = 1.5  # ... where the heaviest-first order reads this many times its K and V bytes from DRAM
# the wgmma main loop's tiles in the search: (query rows, keys, stages, ping-pong, persistent)
WGMMA_TILES = ((128, 128, 2, False, False), (128, 128, 2, True, False), (128, 64, 3, False, False),
               (64, 128, 2, False, False), (128, 128, 3, False, False), (128, 128, 3, True, False),
               (128, 128, 3, True, True), (128, 64, 3, False, True), (64, 128, 2, False, True),
               # KV tiles of 192 keys: at head width 64 a 16k-key full prefill 2.6% faster than 128 (H200, session
               # 40), slower below 4k keys; at 128 the register and shared-memory rules refuse them
               (128, 192, 3, True, True),
               # three consumer warpgroups (`THREE_CONSUMER_TILE`; the register rule refuses them past head width 64
               # and with a mask)
               (192, 128, 4, False, True), (192, 128, 3, False, True), (192, 128, 4, False, False))
# a decode's splits on the wgmma loop (`region_variants`; 0: one block a query tile)
WGMMA_DECODE_SPLITS = (0, 256, 512, 1024, 2048)
# a wgmma decode's KV tile and stages where its splits are 1024 keys or fewer: 16 tiles of 64 keys a block, not 8 of
# 128 (the first tile lands sooner and the last drains sooner; H200, 2026-12-04, KV 4096 × batch 16, split 1024,
# cuDNN SDPA in the same run: 26.2 µs, 1.01×, against 27.3, 0.97×, for 128 × 3; at splits of 2048 no change)
WGMMA_DECODE_SHORT_SPLIT_TILE = ("64", "4")
# query rows from which a softmax-weighted sum's default is the fused kernel on the wgmma loop (`default_pins`)
WGMMA_PREFILL_ROWS = 128  # one query tile (H200, session 37: 128-512 queries 1.5-10x the unfused plan)
# a full prefill's tile at head width 64 (`three_consumer_tile`): three consumer warpgroups of 64 query rows
THREE_CONSUMER_TILE = {"bm": "192", "bn": "128", "pingpong": "0", "stages": "4"}
THREE_CONSUMER_WASTE = 0.05  # ... where 192-row tiles add at most this share of padding rows
# a prefill at head width 64 of at most this many keys: O rescaled on every KV tile without a mask, the consumers
# not in ping-pong with one (`short_d64_pins`)
SHORT_D64_KEYS = 1024
# the wgmma main loop's default (keys, stages), the first whose shared memory fits (`wgmma_kernel`)
WGMMA_DEFAULT_TILES = ((128, 3), (128, 2), (64, 3), (64, 2))


def kv_split_for(blocks: int, keys: int, sms: int) -> int:
    """Split-KV for a decode of `blocks` query tiles over `keys` keys: the largest split from 512 down to 128
    keys that gives about two blocks an SM; 0 where the query tiles alone fill the GPU or the keys are one
    split. Measured on the H200 (golden-checked in the same runs, docs/PERF.md): session 30, blocks of one
    warp (~2.4 µs a 64-key tile): the whole-cache kernel ran 0.01-0.41x cuDNN SDPA, the split one
    0.24-0.80x (KV 4096 and 32768, batch 1-64); session 31, blocks of 4 warps (the default,
    `DECODE_WARPS`): at KV 4096 batch 1 splits of 128 keys took 11.4 µs, of 64 keys 13.6 (the combine
    reads twice the partials: ~0.1 µs a split), so at most `MAX_SPLITS` splits (KV 32768: 512 keys, not
    128). At least 128 keys: a multiple of every KV tile size (a pinned bn keeps the split whole)."""
    want = -(-2 * sms // max(1, blocks))
    if want <= 1:
        return 0
    split = 512
    while split > 128 and -(-keys // split) < want:
        split //= 2
    while -(-keys // split) > MAX_SPLITS and split < 4096:  # the combining block reads every split's partial
        split *= 2
    return split if keys > split else 0  # one split would only add the combine


def decode_split_one_wave(blocks: int, keys: int, sms: int) -> int:
    """Split-KV for the wide decode block (`DECODE_WIDE_WARPS` warps over 128-key tiles, one block an SM): the
    smallest split of 256 keys or more, a power of two, whose blocks (query tiles × splits) all run at once, one
    an SM, with at most `MAX_SPLITS` splits; 0 where the keys are one split. H100, session 55 (2 KV heads × 2
    query heads, d128, cuDNN SDPA in the same run): KV 4096 × batch 1, 2, 4 at splits of 256 1.07×, 1.01×, 1.05×
    (the 4-warp 64-key tiles over 128-key splits: 1.03×, 0.96×, 0.95×), 4096 × 8 at 512 1.01× (the wgmma loop's
    512-key splits 0.92×), 32768 × 1 at 512 1.03× (0.99×); splits that take two waves ran 0.72-0.85×."""
    split = 256
    while split < 4096 and (blocks * -(-keys // split) > sms or -(-keys // split) > MAX_SPLITS):
        split *= 2
    return split if keys > split else 0


def extent_size(model: Model, sizes: Mapping[str, int], extent: str) -> int:
    """An extent's size: the model's static one, else the shape's, else 0 (a runtime extent not known yet)."""
    return model.sizes.get(extent) or sizes.get(extent) or 0


def decode_shape(model: Model, form: AttentionForm, sizes: Mapping[str, int]) -> tuple[int, int]:
    """A decode's (query tiles of 16 rows, keys) at `sizes`; 0 for a count not known yet (a runtime extent)."""
    size = lambda e: extent_size(model, sizes, e)  # noqa: E731
    blocks = -(-(size(form.row.extent) or 16) // 16)
    for v in form.batch:
        blocks *= size(v.extent)
    return blocks, size(form.key.extent)


def short_d64_pins(model: Model, form: AttentionForm, sizes: Mapping[str, int]) -> dict[str, str]:
    """The wgmma loop's float code for a prefill at head width 64 over at most `SHORT_D64_KEYS` keys, where a
    tile's softmax is about as long as its two products and a query tile has few KV tiles. Without a mask O is
    rescaled on every KV tile (`rescale_always`: the warp's vote and branch sit in the short softmax's dependent
    chain); with one the two consumers do not take turns (`pingpong` off). H100, cuDNN SDPA in the same runs (16
    heads, bf16): 16 × 1k d64 full 164.9 → 161.0 µs (session 67), 165.9 → 159.2 and 165.9 → 160.2 (session 68:
    0.97× → 0.99×); 16 × 1k d64 causal without ping-pong 110.2 → 106.3, then 109.0/110.2/109.2 → 106.9/106.8/107.4
    (0.98× → 1.00×, session 68). Not taken at 1k d128 (full 224.8 → 225.9 rescaling every tile; causal 152.8 →
    158.7 without ping-pong), 4 × 4k d64 (full 528.5 → 534.8; causal 314.0 → 310.8, within the runs' spread), 4 ×
    4k d128 (full 807.7 → 821.3), 1 × 16k d64 causal (1114.2 → 1126.1), nor causal 1k d64 rescaling every tile (109.2
    → 110.8); {} there."""
    size = lambda e: extent_size(model, sizes, e)  # noqa: E731
    keys = size(form.key.extent)
    if size(form.red.extent) != 64 or size(form.col.extent) != 64 or not 0 < keys <= SHORT_D64_KEYS:
        return {}
    return {"rescale_always": "1"} if form.mask is None else {"pingpong": "0"}


def wgmma_decode_split(blocks: int, keys: int, sms: int) -> int | None:
    """Split-KV for a decode of `blocks` query tiles on the wgmma loop (K and V by TMA, one block an SM: 208 KB of
    shared memory at KV tiles of 128 × 3 stages), or None where the mma.sync decode stays faster: 0 where the
    query tiles nearly fill the GPU, else the fewest splits of a power of two keys (1024 to 8192) that fill it.
    H200, 2026-12-03 (2 KV heads × 2 query heads, d128; against cuDNN SDPA in the same run): unsplit at batch 64
    1.00× at KV 4096 and 32768 (4.60 TB/s; the mma.sync default 0.80-0.88×), splits of 1024 at 4096 × 16
    0.92× (0.83×), of 2048 at 32768 × 16 0.95× (0.85×); splits under 1024 keys ran slower than the mma.sync
    decode (batch 1: 0.75-0.79× against 0.86-0.95×). Splits of 512 keys where at most 8 filled the GPU (sessions
    46-54: KV 4096 × 8, 0.92-0.97×) lost to the wide mma.sync block in session 55 (`decode_split_one_wave`).
    Splits of 8192 (H100, session 56): 32768 × 16 in 128 blocks, one wave, 179.5 µs (0.99× SDPA) against 182.9
    (0.97×) for splits of 4096 in two waves."""
    if 10 * blocks >= 9 * sms:
        return 0
    want = -(-sms // max(1, blocks))
    split = 1024
    while split < 8192 and -(-keys // split) > want:
        split *= 2
    splits = -(-keys // split)
    return split if splits > 1 and 10 * blocks * splits >= 9 * sms else None


class AttentionPath(KernelPath):
    support = ATTENTION

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> AttentionKernel | None:
        """Query tiles of 64 rows (4 warps; 16 or 32 where the query rows are no more), KV tiles of 64 keys; a
        decode (query tiles of 16 rows): KV tiles of 64 keys sliced over 4 warps, 3 K/V buffers, split over
        its keys where its query tiles leave the GPU idle (`kv_split_for`; golden GPU runs passed, session 31).
        None where the region is not one softmax-weighted sum the kernel computes, or the head widths are not
        static multiples of 16."""
        stats = attention_statistics(model, region.nodes)  # (M, L, T): a training forward's row statistics too
        if (len(region.nodes) != 1 and stats is None) or not target.mma_sync:
            return None
        form = attention_form(model, region.nodes[-1])
        if form is None:
            return None
        static = model.sizes
        e, d = static.get(form.red.extent), static.get(form.col.extent)
        if e is None or d is None or e % 16 or d % 16 or e > 256 or d > 256:
            return None
        rows = static.get(form.row.extent) or sizes.get(form.row.extent) or 64
        bm = 16 if rows <= 16 else 32 if rows <= 32 else 64  # a decode's few query heads: one warp, not four
        kernel = AttentionKernel(nodes=region.nodes, bm=bm, bn=64, index_width=index_width(model, sizes))
        if bm == 16 and stats is None:  # a decode: KV tiles sliced over warps, split-KV where the GPU would idle
            return self.decode_kernel(model, kernel, form, target, sizes)
        return kernel

    def decode_kernel(self, model: Model, kernel: AttentionKernel, form: AttentionForm, target: Target,
                      sizes: Mapping[str, int]) -> AttentionKernel:
        """A decode's block (query tiles of 16 rows): 8 warps over 128-key tiles, split so that its blocks run in one
        wave (`decode_split_one_wave`), where the cache has at least `DECODE_WIDE_KEYS` keys and the block's 3 K/V
        buffers fit its shared memory; else 4 warps over 64-key tiles, split for about two blocks an SM
        (`kv_split_for`)."""
        blocks, keys = decode_shape(model, form, sizes)
        wide = replace(kernel, bn=DECODE_WIDE_BN, kv_warps=DECODE_WIDE_WARPS, stages=DECODE_WIDE_STAGES)
        if keys >= DECODE_WIDE_KEYS and lower_attention(model, wide).smem_bytes() <= target.smem_per_block:
            return replace(wide, kv_split=decode_split_one_wave(blocks, keys, target.sm_count)) if blocks else wide
        narrow = replace(kernel, bn=DECODE_BN, kv_warps=DECODE_WARPS, stages=DECODE_STAGES)
        return replace(narrow, kv_split=kv_split_for(blocks, keys, target.sm_count)) if keys and blocks else narrow

    def default_pins(self, model: Model, target: Target, sizes: Mapping[str, int]) -> dict[str, str]:
        """The plan choices that make the fused kernel a model's default: a decode's (`decode_pins`) or a long
        prefill's on the wgmma loop (`prefill_pins`); {} where the unfused plan stays the default."""
        return self.decode_pins(model, target, sizes) or self.prefill_pins(model, target, sizes)

    def decode_pins(self, model: Model, target: Target, sizes: Mapping[str, int]) -> dict[str, str]:
        """`--pin family=attention` for a decode: a model of one softmax-weighted sum over at most 16 query rows a
        sequence that the fused kernel computes (its sliced split-KV plan measured faster than the unfused one
        and than cuDNN's SDPA, and its golden GPU runs passed: session 31, docs/PERF.md), with the wgmma loop's
        pins where its sequences, whole or split over 1024-4096 keys, fill the GPU (`wgmma_decode_split`;
        session 35: 0.94-1.00× cuDNN at 16-64 sequences against the mma.sync decode's 0.81-0.86×) and, split,
        the wide mma.sync block cannot run in one wave (H100, session 55, cuDNN SDPA in the same run: KV 4096 ×
        16, 32768 × 2 and 32768 × 4 on the wide block 1.03×, 1.02×, 1.01× against the wgmma loop's 0.99×, 0.96×,
        0.98×); {} otherwise."""
        if len(model.nodes) != 1 or not target.mma_sync:
            return {}
        node = model.nodes[0].target
        form = attention_form(model, node)
        if form is None:
            return {}
        rows = model.sizes.get(form.row.extent) or sizes.get(form.row.extent)
        if rows is None or rows > 16:
            return {}
        kernel = self.default(model, Region("general", (node,)), target, sizes)
        if kernel is None:
            return {}
        blocks, keys = decode_shape(model, form, sizes)
        if keys and blocks and self.wgmma_kernel(model, kernel, target) is not None:
            wide = wgmma_decode_split(blocks, keys, target.sm_count)
            # the wide mma.sync block whose splits run in one wave beat the wgmma loop's splits (session 55)
            one_wave = kernel.kv_warps == DECODE_WIDE_WARPS and \
                blocks * -(-keys // (kernel.kv_split or keys)) <= target.sm_count
            if wide == 0 or (wide is not None and not one_wave):  # the wgmma loop, K and V by TMA
                bn, stages = WGMMA_DECODE_SHORT_SPLIT_TILE if 0 < wide <= 1024 else ("128", "3")
                return {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": bn, "stages": stages,
                        "kv_warps": "1", "kv_split": str(wide)}
        return {"family": "attention"}

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """Query tiles of 16 to 128 rows × KV tiles of 32 to 128 keys; with a decode's query tile of 16 rows
        (one query a sequence and its few query heads), also split-KV (flash-decoding) over 64 to 512 keys a
        block, in KV tiles of 32 or 64 keys (a decode block is one warp: the shared memory of its two K/V
        buffers decides how many run on an SM; the H200 run of session 30: one warp takes ~2.4 µs a
        64-key tile), and the KV tiles sliced over 2, 4 or 8 warps a block (`kv_warps`, 16 keys each, merged in
        shared memory; session 31: 4 warps the decode's default), and those with their first K/V tiles copied
        before the length is read (`kv_ahead`)."""
        assert isinstance(base, AttentionKernel)
        for bm, bn in itertools.product((64, 128, 16, 32), (64, 32, 128)):
            yield replace(base, bm=bm, bn=bn)
        if base.bm == 16:
            for split, bn in itertools.product((256, 512, 128, 64), (32, 64)):
                yield replace(base, bn=bn, kv_split=split)
            # the KV tiles sliced over several warps a block (16 keys each; merged in shared memory)
            for split, (bn, warps) in itertools.product((0, 128, 256, 512), ((64, 4), (128, 8), (32, 2))):
                yield replace(base, bn=bn, kv_split=split, kv_warps=warps)
            # the wide block over long splits (`decode_split_one_wave`: one wave of a few sequences' long caches)
            for split in (1024, 2048, 4096, 8192):
                yield replace(base, bn=DECODE_WIDE_BN, kv_split=split, kv_warps=DECODE_WIDE_WARPS,
                              stages=DECODE_WIDE_STAGES)
            # the first K/V tiles copied before the length is read (`kv_ahead`): a round trip off a block's start
            for split in (0, 128, 512):
                yield replace(base, bn=64, kv_split=split, kv_warps=4, stages=3, kv_ahead=True)

    def region_variants(self, model: Model, region: Region, base: Kernel, target: Target,
                        sizes: dict[str, int]) -> Iterator[Kernel]:
        """`variants`, then the wgmma main loop's tiles (`WGMMA_TILES`) where it can run the kernel (`wgmma_kernel`)."""
        yield from self.variants(base, target)
        assert isinstance(base, AttentionKernel)
        if self.wgmma_kernel(model, base, target) is not None:
            for bm, bn, stages, pingpong, persistent in WGMMA_TILES:
                tile = replace(base, main_loop="wgmma", bm=bm, bn=bn, stages=stages, warp_m=1, pingpong=pingpong,
                               kv_warps=1, kv_split=0, persistent=persistent)
                yield tile
                # the softmax's float code (the same elements): H100, 16 × 1k d64 (session 67), each faster without a
                # mask and slower with the causal one, so the search times them
                yield replace(tile, rescale_always=True)
                yield replace(tile, sum_chains=2)
                if persistent:  # a batch element's query tiles together: K and V shared in the L2 (`kv_dram_bytes`)
                    yield replace(tile, head_major=True)
            if base.bm == 16:  # a decode: its query heads in one 64-row tile, K and V by TMA, split-KV
                for split, (bn, stages) in itertools.product(WGMMA_DECODE_SPLITS, ((128, 3), (64, 4))):
                    yield replace(base, main_loop="wgmma", bm=64, bn=bn, stages=stages, warp_m=1, pingpong=False,
                                  kv_warps=1, kv_split=split, persistent=False)

    def wgmma_kernel(self, model: Model, kernel: AttentionKernel, target: Target) -> AttentionKernel | None:
        """`kernel` on the wgmma main loop (`--pin main_loop=wgmma`; habu/lower/attention_wgmma.py): query tiles
        of 128 rows (two consumer warpgroups), KV tiles of 128 keys (64 where two stages of 128 do not fit: head
        widths past 128), as many stages up to 3 as the block's shared memory holds (3 at head width 128: a
        tile's load then has a whole tile's products to land in; with 2, the load of tile kt + 2 is issued only
        when tile kt's P·V is done and tile kt + 1's S already waits for it); None where the target has no wgmma
        and TMA or a head width is not a static multiple of 64. H200, 16 heads × 4096, d128 (session 31):
        2 stages 184.2 / 341.2 µs (causal / full), 3 stages 140.0 / 247.4, 3 stages with ping-pong (`--pin
        pingpong=1`, the default plan's: `default_pins`) 141.6 / 229.8 (cuDNN SDPA 151.5 / 206.7)."""
        whole = len(kernel.nodes) == 1 or attention_statistics(model, kernel.nodes) is not None
        form = attention_form(model, kernel.nodes[-1]) if whole else None
        if form is None or not (target.wgmma and target.tma):
            return None
        e, d = model.sizes.get(form.red.extent), model.sizes.get(form.col.extent)
        if e is None or d is None or e % 64 or d % 64:
            return None
        for bn, stages in WGMMA_DEFAULT_TILES:
            if wgmma_smem_bytes(128, bn, e, d, stages) <= target.smem_per_block:
                return replace(kernel, main_loop="wgmma", bm=128, bn=bn, stages=stages, warp_m=1, kv_warps=1)
        return replace(kernel, main_loop="wgmma", bm=128, bn=64, stages=2, warp_m=1, kv_warps=1)  # the rules refuse it

    def prefill_pins(self, model: Model, target: Target, sizes: Mapping[str, int]) -> dict[str, str]:
        """The plan choices that make the fused kernel on the wgmma main loop a model's default (instead of the
        unfused plan, the `attention:T` rewrite), its two consumers in ping-pong: a prefill of at least
        `WGMMA_PREFILL_ROWS` query rows of every
        softmax-weighted sum the loop can run (bf16, static head widths in 64s, a target with wgmma and TMA),
        where it was measured faster than cuDNN's SDPA and passed its exact GPU tests (docs/PERF.md, session
        31); persistent blocks walking the work tiles in a snake (`work_of`): one block an SM hides a tile's Q load
        and ring fill under the last one's P·V and epilogue (H200, session 33: 4 × 16 × 1024 causal 62.0 µs against
        71.2, full 84.2 against 88.8, with the round robin; the snake keeps a causal grid's blocks equal). {}
        otherwise (a decode, a short prefill, sm_80: the unfused plan stays). A full prefill at head width 64 takes
        three consumer warpgroups instead (`three_consumer_tile`)."""
        if not (target.wgmma and target.tma and target.mma_sync):
            return {}
        model = fused_view(model)  # a training forward's unfused nodes, one sum again (`fused:T`)
        nodes = [eq.target for eq in model.nodes]
        forms = [(n, attention_form(model, n)) for n in nodes]
        forms = [(n, f) for n, f in forms if f is not None]
        if not forms:
            return {}
        for node, form in forms:
            rows = model.sizes.get(form.row.extent) or sizes.get(form.row.extent)
            kernel = AttentionKernel(nodes=(node,), bm=64, bn=64)
            if rows is None or rows < WGMMA_PREFILL_ROWS or self.wgmma_kernel(model, kernel, target) is None:
                return {}
        pins = {"family": "attention", "main_loop": "wgmma", "pingpong": "1", "persistent": "1"}
        tile = self.three_consumer_tile(model, forms[0][1], sizes) if len(forms) == 1 else None
        if tile is not None:
            pins.update(tile)
        if len(forms) == 1 and self.head_major_pays(model, forms[0][0], target, sizes, tile):
            pins["head_major"] = "1"
        if len(forms) == 1 and tile is None:
            pins.update(short_d64_pins(model, forms[0][1], sizes))
        return pins

    def three_consumer_tile(self, model: Model, form: AttentionForm, sizes: Mapping[str, int]) -> dict[str, str] | None:
        """The tile of three consumer warpgroups (`THREE_CONSUMER_TILE`: 192 query rows, FlashAttention-3's
        tile at head width 64) for a full (unmasked) prefill at head width 64 whose query rows fill 192-row
        tiles to within `THREE_CONSUMER_WASTE`; None otherwise (with a mask the register rule refuses 128-key
        tiles: ptxas spills). H200, session 41 (16 heads, bf16, cuDNN SDPA in the same runs): 4 × 4096 full
        606.0 → 528.0-534.0 µs (0.95× → 1.08-1.09×, persistent, 4 stages), 1 × 16384 full 2336.2 → 1995.1-2019.8
        (1.00× → 1.18×); 16 × 1024 (6 tiles of 192 for 1024 rows: 12.5% of the rows padding) 165.4 →
        164.5-188.6, causal 4 × 4096 319.9 → 348.6-377.1 (96 keys): not taken there. A consumer skipping a tile's
        slab of padding rows (tried: a branch around its work) made ptxas's main loop slower, 4k 528.0 → 567.9 µs."""
        e, d = model.sizes.get(form.red.extent), model.sizes.get(form.col.extent)
        rows = model.sizes.get(form.row.extent) or sizes.get(form.row.extent)
        if form.mask is not None or e != 64 or d != 64 or rows is None:
            return None
        bm = int(THREE_CONSUMER_TILE["bm"])
        if -(-rows // bm) * bm > rows * (1 + THREE_CONSUMER_WASTE):
            return None
        return dict(THREE_CONSUMER_TILE)

    def head_major_pays(self, model: Model, node: str, target: Target, sizes: Mapping[str, int],
                        tile: Mapping[str, str] | None = None) -> bool:
        """Whether the persistent wgmma kernel should take a batch element's query tiles one after another
        (`head_major`) instead of the heaviest-first order: where that order's tiles would read K and V from DRAM
        once a query tile (`kv_dram_bytes`, at least `HEAD_MAJOR_TRAFFIC` more than head-major) and head-major's
        schedule (`wgmma_attention_seconds`: the blocks' sums of KV steps) is within `HEAD_MAJOR_SLACK` of it. The
        traffic is not a bound the roofline's max sees (the loads are spread over the tiles), so it decides only
        where the schedules are about equal. H200, session 36, 16k tokens a batch (d128): full 16 × 1024
        294.9 → 213.8 µs, causal 182.4 → 149.2, full 4 × 4096 862.3 → 756.6; causal 1 × 16384 1635.6 → 2229.7 (the
        heaviest tiles no longer spread over the blocks; its schedule 50% longer: not taken)."""
        # the model's static sizes over the shape's (a runtime extent's None in `model.sizes` is not a size)
        full = {**sizes, **{e: n for e, n in model.sizes.items() if n is not None}}
        if any(full.get(e.name) is None for e in model.extents):
            return False
        kernel = self.wgmma_kernel(model, AttentionKernel(nodes=(node,), bm=64, bn=64), target)
        if kernel is None:
            return False
        sized = model.with_sizes(full)
        tile = tile or {}  # the tile's pins (`three_consumer_tile`), else the default tile in ping-pong
        shape = {k: int(tile[k]) for k in ("bm", "bn", "stages") if k in tile}
        pingpong = tile.get("pingpong", "1") == "1"
        lws = [lower_attention_wgmma(lower_attention(sized, replace(kernel, pingpong=pingpong, persistent=True,
                                                                    head_major=hm, **shape)))
               for hm in (False, True)]
        (t0, t1) = (wgmma_attention_seconds(lw, full, target) for lw in lws)
        (b0, b1) = (kv_dram_bytes(lw, full, target) for lw in lws)
        return t1 <= t0 * (1 + HEAD_MAJOR_SLACK) and b0 >= b1 * HEAD_MAJOR_TRAFFIC

    def seconds(self, lw: AttentionLowering, sizes: Mapping[str, int], target: Target) -> tuple[float, float, float]:
        """(FLOPs, bytes moved, seconds): the two products over the visible pairs at MMA_SHARE of mma.sync (the
        wgmma loop: its work tiles scheduled on the SMs, `wgmma_attention_seconds`); Q and O once, K and V once
        per query tile."""
        c = target.ceilings
        f = flops(lw, sizes)
        rows, keys = sizes[lw.row_extent], sizes[lw.key_extent]
        n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
        count = lw.batch_count(sizes)
        if isinstance(lw, AttentionWgmmaLowering):  # the work tiles as they land on the SMs (attention_schedule);
            # K and V from DRAM as the grid's order lets the L2 keep them (`kv_dram_bytes`: once a round of the
            # tiles that run at once); the bandwidth of the SMs the grid keeps busy (a decode's few blocks; split-KV
            # fills them) and the splits' partials, written once and read by the combine
            moved = (2.0 * count * rows * n_e + kv_dram_bytes(lw, sizes, target)
                     + DTYPES[lw.out.dtype].bytes * count * rows * n_d)
            blocks = lw.work_tiles(sizes) * (lw.splits(sizes) if lw.kernel.kv_split else 1)
            busy = 1.0 if lw.persistent else min(1.0, blocks / max(1, target.sm_count))
            if lw.kernel.kv_split:
                moved += 2 * 4.0 * lw.splits(sizes) * count * rows * (n_d + 2)
            return f, moved, max(wgmma_attention_seconds(lw, sizes, target), moved / (c.bandwidth * busy)) + c.launch_s
        tiles = -(-rows // lw.kernel.bm)
        moved = 2.0 * count * (rows * n_e + tiles * keys * (n_e + n_d)) + 4.0 * count * rows * n_d
        peak = (c.mma_sync_flops or c.fma_flops) * MMA_SHARE
        # the share of the SMs the grid keeps busy (a decode's few query tiles leave most idle; split-KV fills
        # them), and split-KV's partials: written once and read by the combine
        blocks = count * tiles * (lw.splits(sizes) if lw.kernel.kv_split else 1)
        busy = min(1.0, blocks / max(1, target.sm_count))
        if lw.kernel.kv_split:
            moved += 2 * 4.0 * lw.splits(sizes) * count * rows * (n_d + 2)
        return f, moved, max(f / (peak * busy), moved / (c.bandwidth * busy)) + c.launch_s

    def smem_bytes(self, lowering: AttentionLowering) -> int:  # type: ignore[override]
        return 0

    def registers(self, lowering: AttentionLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: AttentionLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        if isinstance(lowering, AttentionWgmmaLowering):
            return emit_attention_wgmma(name, model, lowering, static)
        return emit_attention(name, model, lowering, static)


PATH = AttentionPath()
