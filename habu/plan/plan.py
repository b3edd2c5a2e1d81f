"""Plans: how a model is computed. Frozen, hashable, printed and stored as JSON.

A plan is a list of kernels, one per fusion region of the model, each with its schedule. Every
field carries a one-line doc (`field_docs`) so the compilation report can explain the plan; every
schedule field also carries its allowed values, what reads it and its pin keys (`choice`, see
habu/plan/fields.py): JSON reading, pins, the plan-fields rule and the finite-field key derive
from that one table.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar

from habu.errors import HabuError
from habu.plan.fields import (
    KEEP,
    Accumulator,
    FieldError,
    Mma,
    Move,
    Raster,
    Reader,
    SplitReduce,
    Store,
    choice,
    coerce_enums,
    kernel_fields,
)

PLAN_FORMAT = 1


def doc(text: str, default: Any = MISSING) -> Any:
    if default is MISSING:
        return field(metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


MOVEMENTS = tuple(Move)
MMAS = tuple(Mma)
RASTERS = tuple(Raster)
STORES = tuple(Store)
CLUSTERS = (1, 2)
SPLIT_REDUCES = tuple(SplitReduce)
SPLIT_CLUSTERS = (2, 4, 8)  # split_k of a cluster split: portable cluster sizes
ROW_CLUSTERS = (1, 2, 4, 8)  # blocks of a cluster that share one row (portable cluster sizes)
SWIZZLES = (0, 32, 64, 128)
INDEX_WIDTHS = (32, 64)

P, L, E = Reader.PROOF, Reader.LOWERING, Reader.EMISSION


@dataclass(frozen=True)
class ContractionKernel:
    """A tiled contraction T[m n] = Σ k A·B, with the elementwise nodes after it as its epilogue."""

    kind: ClassVar[str] = "contraction"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes: the contraction, then its epilogue")
    tile_m: int = choice("rows of the output tile one block computes", P, lo=1, unguarded=KEEP)
    tile_n: int = choice("columns of the output tile one block computes", P, lo=1, unguarded=KEEP)
    tile_k: int = choice("depth of one step of the k loop", P, lo=1, unguarded=KEEP)
    warps: int = choice("warps per block (with warp specialisation, one warpgroup of them loads)", E, lo=1,
                        pins=("warps",), unguarded=KEEP)
    stages: int = choice("shared-memory pipeline depth: k tiles in flight (at least 2 where a ring of them "
                         "is pipelined: mma.sync, wgmma)", E, lo=1, pins=("stages",), unguarded=KEEP)
    mma: Mma = choice("the multiply instruction: fma (SIMT), mma.sync (m16n8k16) or wgmma (m64nNk16)", E,
                      pins=("mma",), unguarded=KEEP)
    a_move: Move = choice("how A's tiles reach shared memory: ldg (predicated loads), cp.async, tma, tma-gather4, "
                          "staged (a pre-pass copies the rows, gathered, to 16-byte-aligned rows read with TMA)", L, unguarded=Move.LDG)
    b_move: Move = choice("how B's tiles reach shared memory", L, unguarded=Move.LDG)
    a_vector: int = choice("elements per global access of A (ldg / cp.async)", E, lo=1, pins=("vector",), unguarded=1)
    b_vector: int = choice("elements per global access of B (ldg / cp.async)", E, lo=1, pins=("vector",), unguarded=1)
    split_k: int = choice("blocks sharing one output tile, each summing a slice of k (partials added atomically)",
                          P, lo=1, pins=("split_k", "splitk"), unguarded=KEEP)
    raster: Raster = choice("order in which blocks walk the tile grid: row (n fastest) or column (m fastest)", P,
                            pins=("raster",), unguarded=KEEP)
    group_m: int = choice("grouped rasterisation: tile rows walked together so B tiles stay in L2 (1: none)", P,
                          lo=1, pins=("group_m",), unguarded=KEEP)
    persistent: bool = choice("one block per SM looping over tiles, instead of one block per tile", P,
                              pins=("persistent",), unguarded=KEEP)
    warp_specialized: bool = choice("a producer warpgroup issues loads while consumer warpgroups multiply", E,
                                    pins=("ws",), unguarded=KEEP)
    swizzle: int = choice("shared-memory swizzle span in bytes (0, 32, 64, 128) for TMA / wgmma tiles", E,
                          allowed=SWIZZLES, pins=("swizzle",), unguarded=KEEP)
    accumulator: Accumulator = choice("accumulator element type", E, default=Accumulator.F32, unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in: 32 (proved not to wrap) or 64", P,
                              default=32, allowed=INDEX_WIDTHS, pins=("index", "index_width"), unguarded=KEEP)
    store: Store = choice("how the output tile reaches global memory: direct (each thread stores its registers) or "
                          "tma (through shared memory in boxes, bulk tensor stores that drain while the next tile "
                          "runs)", E, default=Store.DIRECT, pins=("store",), json_optional=True, unguarded=KEEP)
    cluster_m: int = choice("blocks of a thread-block cluster along m: they compute vertically adjacent tiles and "
                            "share B's tile, each loading a part and multicasting it to all (1: no cluster)", P,
                            default=1, allowed=CLUSTERS, pins=("cluster", "cluster_m"), json_optional=True, unguarded=KEEP)
    split_reduce: SplitReduce = choice(
        "how a tile's split_k blocks combine their partial sums: atomic (f32 atomic adds into an output zeroed "
        "first; a linear epilogue) or cluster (the blocks form a thread-block cluster, leave their partial tiles "
        "in shared memory, and each adds up 1/split_k of the tile's rows from all of them and applies the "
        "epilogue; any epilogue, no zero fill)", P, default=SplitReduce.ATOMIC, pins=("split_reduce", "reduce"),
        json_optional=True, unguarded=KEEP)
    b_ahead: bool = choice(
        "wgmma: the producer issues B's TMA boxes of each tile's first `stages` k tiles before anything else "
        "(A's gathered row offsets, the wait for the plan's previous kernel), so the weights stream from the "
        "kernel's first instant", L, default=False, pins=("b_ahead",), json_optional=True, unguarded=KEEP)
    blocks_per_sm: int = choice(
        "warp-specialised wgmma: blocks co-resident on one SM (`__launch_bounds__(threads, n)`, the register split "
        "and shared memory sized for n): while one block runs its epilogue, another's main loop keeps the tensor "
        "cores busy (1: one block an SM)", P, default=1, allowed=(1, 2), pins=("blocks_per_sm",),
        json_optional=True, unguarded=KEEP)
    a_ahead: bool = choice(
        "wgmma: as b_ahead, for A's TMA boxes (a transposed product's weights, `swap_ab`)", L, default=False,
        pins=("a_ahead",), json_optional=True, unguarded=KEEP)
    swap_ab: bool = choice(
        "the product computed transposed: the tile's rows run along the output's columns and A is the factor that "
        "carries them (a skinny product's weights fill wgmma's 64-row side and its few tokens the narrow n side, "
        "so no shared memory holds rows of padding)", L, default=False, pins=("swap_ab", "swap"),
        json_optional=True, unguarded=KEEP)
    consumer_lag: int = choice(
        "wgmma: consumer warpgroup c starts a tile's k loop once warpgroup c − 1 has multiplied this many of its k "
        "tiles, so their epilogues do not run at once: one's beside the other's last k tiles (0: in step)", L,
        default=0, lo=0, hi=8, pins=("consumer_lag", "lag"), json_optional=True, unguarded=KEEP)
    epilogue_prefetch: bool = choice(
        "wgmma: at each tile's start the producer warpgroup prefetches into the L2 the lines of the tile that the "
        "epilogue reads of each matrix it loads (GELU's derivative reads the saved S1), so those loads hit the L2 "
        "(a hint: no value depends on it)", E, default=False, pins=("epilogue_prefetch",), json_optional=True,
        unguarded=KEEP)
    epilogue_early: bool = choice(
        "wgmma, TMA-store epilogue: each consumer thread reads the epilogue's loads of model inputs (a bias, the "
        "saved S1 of GELU's derivative) into registers at each tile's start, so their latency runs under the k "
        "loop (habu/lower/epilogue_early.py)", L, default=False, pins=("epilogue_early", "early"),
        json_optional=True, unguarded=KEEP)
    warm_next: int = choice(
        "wgmma: after its last TMA load the producer warpgroup prefetches into the L2 the boxes of the plan's next "
        "kernel's first this-many k tiles (each of its tiles and splits) of the operand it streams from a model "
        "input, so the next product's weights load while this kernel's epilogues run (a hint: no value depends "
        "on it; habu/lower/warm_next.py; 0: none)", L, default=0, lo=0, hi=64, pins=("warm_next",),
        json_optional=True, unguarded=KEEP)
    keep_operands: bool = choice(
        "wgmma: the operands' TMA loads ask the L2 to evict their lines last, so operands that many tiles re-read "
        "stay in the L2 while an output larger than it streams through (a hint: no value depends on it; "
        "habu/paths/l2_keep.py)", L, default=False, pins=("keep_operands",), json_optional=True, unguarded=KEEP)
    stream_b: bool = choice(
        "wgmma: A's TMA loads ask the L2 to evict their lines last and B's first: a product that streams B (larger "
        "than the L2) once, whose A a later kernel of the plan reads again, leaves the L2 to A and the tiles it "
        "writes (a hint: no value depends on it; habu/paths/l2_keep.py)", L, default=False, pins=("stream_b",),
        json_optional=True, unguarded=KEEP)
    skip_zero: bool = choice(
        "each tile's k loop skips the k tiles whose terms the model makes zero: an operand zero past a causal mask's "
        "diagonal (attention's backward: dQ = Σ j dS·K), or a tile whose outputs are zero whatever the product "
        "(habu/lower/k_bounds.py; the `k-window` rule)", P, default=False, pins=("skip_zero", "skip"),
        json_optional=True, unguarded=KEEP)

    def __post_init__(self) -> None:
        coerce_enums(self)

    def transposed(self) -> ContractionKernel:
        """The same tiles in the other orientation (`swap_ab` flipped): tile sides, the operands' movements and
        vectors exchanged, since A and B exchange factors."""
        return replace(self, swap_ab=not self.swap_ab, tile_m=self.tile_n, tile_n=self.tile_m, a_move=self.b_move,
                       b_move=self.a_move, a_vector=self.b_vector, b_vector=self.a_vector)


@dataclass(frozen=True)
class RowKernel:
    """Row-local nodes (normalisations, softmax, their elementwise neighbours): blocks own rows."""

    kind: ClassVar[str] = "rows"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes, in order")
    rows_per_block: int = choice("rows one block owns (one warp-group of threads per row)", P, lo=1, pins=("rows",), unguarded=KEEP)
    # whole warps: the block reduction combines one partial per warp (a partial warp's would be lost)
    threads: int = choice("threads working on one row (whole warps)", P, lo=32, hi=1024, multiple=32,
                          pins=("threads",), unguarded=KEEP)
    vector: int = choice("elements per global access", P, lo=1, pins=("vector",), unguarded=1)
    cache_row: bool = choice("keep the row in registers/shared memory between passes (one read of x)", L,
                             pins=("cache_row",), unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)
    cluster: int = choice("blocks of a thread-block cluster that share one row, each a contiguous 1/cluster of its "
                          "columns; they combine their reductions through distributed shared memory", P, default=1,
                          allowed=ROW_CLUSTERS, pins=("row_cluster",), json_optional=True, unguarded=KEEP)
    prefetch: bool = choice("persistent blocks (one per resident slot) walk the rows, each copying its next row "
                            "into shared memory (cp.async) while it computes this one from registers", E,
                            default=False, pins=("row_prefetch",), json_optional=True, unguarded=KEEP)
    blocks_per_sm: int = choice("blocks the launch bounds ask ptxas to fit on one SM (`__launch_bounds__(threads, "
                                "n)`): a row kept in registers then takes at most 64 K / (n·threads) registers a "
                                "thread, so n blocks overlap one's loads with another's arithmetic (1: no bound)", E,
                                default=1, allowed=(1, 2, 3, 4), pins=("blocks_per_sm",), json_optional=True,
                                unguarded=KEEP)


@dataclass(frozen=True)
class MapKernel:
    """Elementwise nodes fused into one pass over their elements."""

    kind: ClassVar[str] = "map"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes, in order")
    threads: int = choice("threads per block", E, lo=1, hi=1024, pins=("threads",), unguarded=KEEP)
    vector: int = choice("elements per access (a lane handles this many consecutive elements)", E, lo=1,
                         pins=("vector",), unguarded=1)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)


@dataclass(frozen=True)
class GeneralKernel:
    """Any one equation node: a thread per output element, each reduction a loop (the fallback family)."""

    kind: ClassVar[str] = "general"
    nodes: tuple[str, ...] = doc("the model's node this kernel computes (one)")
    threads: int = choice("threads per block (one output element each)", P, lo=1, hi=1024, pins=("threads",), unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)
    elements: int = choice("output elements each thread computes, one block-wide sweep each (a block takes "
                           "threads·elements consecutive ones; their loads in flight together)", P, default=1, allowed=(1, 2, 4, 8),
                           pins=("elements",), json_optional=True, unguarded=KEEP)
    vector: int = choice("consecutive elements a thread moves at once in each sweep (vector loads and stores, a "
                         "scatter's vector atomics; at most 16 bytes; a kernel without reduction loops whose last "
                         "extent is a multiple of it)", P, default=1, allowed=(1, 2, 4, 8), pins=("vector",),
                         json_optional=True, unguarded=1)
    reverse: bool = choice("blocks take the output's pieces from the last: block b the piece grid − 1 − b (a "
                           "kernel reading what the kernel before it wrote last finds it in the L2 first)", P,
                           default=False, pins=("reverse",), json_optional=True, unguarded=KEEP)


@dataclass(frozen=True)
class ColumnKernel:
    """A reduction over the leading axis, one value per column (`G[n] = Σ r dY[r n]`): blocks own a tile
    of adjacent columns and a split of the rows; row splits add their partials atomically."""

    kind: ClassVar[str] = "columns"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes: elementwise nodes inlined as a prologue, "
                                 "then the reduction")
    threads: int = choice("threads per block (column_threads × row groups)", P, lo=1, hi=1024, pins=("threads",), unguarded=KEEP)
    column_threads: int = choice("threads of a block along the columns (a block's tile is column_threads × "
                                 "vector columns; threads / column_threads row groups)", P, lo=1, hi=1024,
                                 pins=("column_threads",), unguarded=KEEP)
    vector: int = choice("adjacent columns each thread owns (one 16-byte load of bf16/f16 is 8)", P, lo=1, hi=16,
                         pins=("vector",), unguarded=1)
    rows_per_split: int = choice("rows one block reduces (the row splits: ⌈#R / rows_per_split⌉ blocks per column "
                                 "tile, their partials added atomically)", P, lo=1, pins=("rows_per_split",), unguarded=KEEP)
    unroll: int = choice("rows each thread loads before it adds them (loads in flight)", P, lo=1, hi=32,
                         pins=("unroll",), unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)


@dataclass(frozen=True)
class GroupedKernel:
    """A grouped GEMM (`T[r n] = Σ k A[IX[r] k] · W[E[r] n k]`, E grouped): one launch over every group's
    tiles of bm rows × bn columns, the group offsets found on the device, mma.sync m16n8k16 (bf16, f32
    accumulate) by warps of 16·wm rows × 8·wn columns (habu/lower/grouped.py)."""

    kind: ClassVar[str] = "grouped"
    nodes: tuple[str, ...] = doc("the model's node this kernel computes (one; or two grouped GEMMs of the same rows "
                                 "and the node of both, gate, up and SwiGLU: `--pin pair=fused`)")
    bm: int = choice("rows of a tile (a group's rows are cut into tiles of bm)", P, allowed=(16, 32, 64, 128),
                     pins=("bm",), unguarded=KEEP)
    bn: int = choice("columns of a tile", P, allowed=(16, 32, 64, 128, 256), pins=("bn",), unguarded=KEEP)
    bk: int = choice("reduced elements staged in shared memory per step of the k loop", P, allowed=(16, 32, 64),
                     pins=("bk",), unguarded=KEEP)
    warps_m: int = choice("warps of a block along the rows (each 16·(bm / 16 / warps_m) rows)", P,
                          allowed=(1, 2, 4), pins=("warps_m",), unguarded=KEEP)
    warps_n: int = choice("warps of a block along the columns", P, allowed=(1, 2, 4), pins=("warps_n",),
                          unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)
    main_loop: str = choice("the k loop: mma.sync (one stage, plain loads) or wgmma (a producer warpgroup fills a "
                            "ring of `stages` stages, W by TMA and A's rows by cp.async; (warps_m·warps_n)/4 "
                            "consumer warpgroups of 64-row slabs multiply with wgmma; bk 64)", P, default="mma.sync",
                            allowed=("mma.sync", "wgmma"), pins=("main_loop",), json_optional=True, unguarded=KEEP)
    stages: int = choice("k tiles in flight in the wgmma main loop's ring (1: the mma.sync loop's one stage)", P,
                         default=1, lo=1, hi=8, pins=("stages",), json_optional=True, unguarded=KEEP)
    store_vector: int = choice("elements the wgmma loop's epilogue stores (or, a scatter, adds) at once: 2 (a "
                               "thread's accumulator pair) or 4 (the pairs of two neighbouring lanes, traded by one "
                               "shuffle: a 16-byte vector atomic add, half the atomic operations; where the output is "
                               "f32 along the columns and not a pair's) or 8 (a bf16 or f16 output written along the "
                               "columns: the four lanes of a row trade pairs, each stores 16 bytes); else the pairs",
                               P, default=2, allowed=(2, 4, 8), pins=("store_vector",), json_optional=True, unguarded=KEEP)
    pair_wgmmas: int = choice("a fused pair's wgmma instructions a slab and k step on the wgmma loop: 2 (each "
                              "weights' box times A into its own accumulator, n = bn) or 1 (one instruction of "
                              "n = 2·bn over both boxes, A read from shared memory once: the first weights' "
                              "columns in the accumulator's first half)", P, default=2, allowed=(1, 2),
                              pins=("pair_wgmmas",), json_optional=True, unguarded=KEEP)
    a_split: str = choice("an f32 A on the grouped wgmma loop (two bf16 parts): producer (loaded into the producer's "
                          "registers, two k tiles of them, split and stored there) or consumers (copied raw by "
                          "cp.async into the bytes its parts take, every stage of the ring in flight; each consumer "
                          "warpgroup splits its own slab in place before its wgmmas)", P, default="producer",
                          allowed=("producer", "consumers"), pins=("a_split",), json_optional=True, unguarded=KEEP)
    wgrad_copy: str = choice("how a grouped weight gradient's producer moves its operands into the stage: registers "
                             "(a k tile's chunks loaded, then stored: one k tile in flight a thread), cp.async (each "
                             "bf16 operand it does not scale by 16-byte asynchronous copies, zero-filled where "
                             "masked, the stage's barrier arriving as they land: up to `stages` k tiles in flight; "
                             "an f32 A or a scaled one through registers) or staged (every operand by cp.async: an "
                             "f32 A lands raw and each consumer splits its slab into bf16 parts in place, a row "
                             "factor applied there too)", P, default="registers",
                             allowed=("registers", "cp.async", "staged"), pins=("wgrad_copy",), json_optional=True,
                             unguarded=KEEP)
    wgrad_index_ring: bool = choice("a grouped weight gradient's staged producer copies a gathered side's row indices "
                                    "(IX[r]) by cp.async into a ring in shared memory, as many k tiles ahead as the "
                                    "ring has stages where it fits, and gathers through them (false: it loads each "
                                    "chunk's index as it copies the chunk, and waits for it)", P, default=True,
                                    pins=("wgrad_index_ring",), json_optional=True, unguarded=KEEP)
    wgrad_persistent: bool = choice("a grouped weight gradient's blocks persist: one a resident slot (an SM), each "
                                    "walking the work items (a group's output tile) w = blockIdx.x + t·gridDim.x, its "
                                    "producer filling the ring with the next item's k tiles while the consumers add "
                                    "this one's tile into O (the ring runs on across items; every group's offsets "
                                    "found once a block)", P, default=False, pins=("wgrad_persistent",),
                                    json_optional=True, unguarded=KEEP)


@dataclass(frozen=True)
class AttentionKernel:
    """Fused attention (FlashAttention-2 style; habu/lower/attention.py): one block per (batch and heads,
    query tile of bm rows), 16 query rows per warp; the K and V tiles of bn keys staged in shared memory
    by cp.async (two buffers), S = Q·Kᵀ and O += P·V with mma.sync m16n8k16 (bf16, f32 accumulate), the
    scale, the mask and the online softmax applied to S in registers; tiles above the causal diagonal
    are skipped."""

    kind: ClassVar[str] = "attention"
    # a rounding inside the kernel the golden tolerance counts like a stored stage: P in bf16 before P·V
    internal_stage: ClassVar[str] = "bf16"
    nodes: tuple[str, ...] = doc("the model's node this kernel computes (one softmax-weighted sum)")
    bm: int = choice("query rows of a block (16 per warp; on the wgmma loop 64 per consumer warpgroup, up to three)",
                     P, allowed=(16, 32, 64, 128, 192), pins=("bm",),
                     unguarded=KEEP)
    bn: int = choice("keys of one K/V tile staged in shared memory", P,
                     allowed=(32, 64, 96, 128, 192, 256), pins=("bn",),
                     unguarded=KEEP)
    warp_m: int = choice("16-row mma tiles a warp computes (2: each K and V fragment feeds two; Q's fragments are "
                         "then read per step instead of kept)", E, default=1, allowed=(1, 2), pins=("warp_m",),
                         unguarded=KEEP)
    main_loop: str = choice("the KV loop: mma.sync (cp.async double buffer, 16 query rows a warp) or wgmma (FA3-style, "
                            "habu/lower/attention_wgmma.py: a producer warpgroup fills a TMA/mbarrier ring of `stages` "
                            "K/V tiles, bm/64 consumer warpgroups of 64 query rows multiply with wgmma, P from "
                            "registers)", P, default="mma.sync", allowed=("mma.sync", "wgmma"), pins=("main_loop",),
                            json_optional=True, unguarded=KEEP)
    stages: int = choice("K/V tiles in flight in the wgmma main loop's ring; the mma.sync loop's K/V buffers (stages − 1 "
                         "tiles in flight while one is multiplied; a decode block alone on its SM takes up to 6)", P,
                         default=2, lo=1, hi=8, pins=("stages",), json_optional=True, unguarded=KEEP)
    pingpong: bool = choice("the wgmma main loop's two consumer warpgroups take turns issuing their wgmmas (FA3's "
                            "ping-pong, named barriers 1 and 2): one's softmax runs while the other's products do", E,
                            default=False, pins=("pingpong",), json_optional=True, unguarded=KEEP)
    index_width: int = choice("bits of the integers offsets are computed in", P, default=32, allowed=INDEX_WIDTHS,
                              pins=("index", "index_width"), unguarded=KEEP)
    late_wait: bool = choice("the wgmma main loop's wait for P·V in a basic block after the next tile's softmax "
                             "(habu::end_block: ptxas otherwise hoists it above the exponentials, which then never "
                             "overlap P·V); not yet timed or GPU-checked (session 31)", E, default=False,
                             pins=("late_wait",), json_optional=True, unguarded=KEEP)
    head_major: bool = choice("the grid's order: a batch element's (head's) query tiles one after another, so that the "
                              "blocks running at once share fewer heads' K and V in the L2 (else every batch element "
                              "of a query tile together)", P, default=False, pins=("head_major",), json_optional=True,
                              unguarded=KEEP)
    kv_split: int = choice("keys one block reads (split-KV, flash-decoding: the blocks of a query tile each take "
                           "kv_split keys, write a partial — running max, sum, unnormalised O — to a workspace, "
                           "and the last of them to finish combines them); 0: one block reads every key", P,
                           default=0, allowed=(0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192), pins=("kv_split",),
                           json_optional=True, unguarded=KEEP)
    kv_warps: int = choice("warps sharing one query tile's KV tiles (a decode: query tiles of 16 rows): warp w takes "
                           "keys w·bn/kv_warps.. of each tile (a slice of 16 or more keys) with its own running max, sum "
                           "and O, merged in shared memory at the end (the online softmax's combine); the block's "
                           "threads copy the tiles together", P, default=1, allowed=(1, 2, 4, 8), pins=("kv_warps",),
                           json_optional=True, unguarded=KEEP)
    kv_ahead: bool = choice("the mma.sync loop's first stages − 1 K/V tiles are copied before the mask's key limit is "
                            "read (the block's tiles within #J; without it, those the limit leaves visible): a memory "
                            "round trip off a decode block's start, where the limit is a length read from memory; a "
                            "block whose keys are all masked then copies tiles it never reads", P, default=False,
                            pins=("kv_ahead",), json_optional=True, unguarded=KEEP)
    persistent: bool = choice("the wgmma main loop's blocks persist: one a resident slot (an SM), each walking the "
                              "work tiles (query tile, batch element) w = blockIdx.x + t·gridDim.x in the heaviest-first "
                              "order, its producer loading the next tile's Q and K/V while the consumers finish this "
                              "one (the ring runs on across tiles; Q is freed once the tile's last S is done)", P,
                              default=False, pins=("persistent",), json_optional=True, unguarded=KEEP)
    store_vectors: bool = choice("the wgmma main loop's epilogue stores O in 16-byte vectors: the 4 lanes of an "
                                 "accumulator row trade their column pairs by shuffles first (habu/lower/quad_vectors.py; "
                                 "else one element a store); where O's rows are runs of its head width", P, default=True,
                                 pins=("store_vectors",), json_optional=True, unguarded=KEEP)
    exp_fma: int = choice("score groups (8 keys of a row) of every 8 whose exponentials run on the FMA and integer "
                          "pipes (habu::exp2_fma: a degree-3 polynomial, FlashAttention-4's split) instead of the SFU, "
                          "(16 results a cycle an SM); 0: all on the SFU. Slower at every share on the H200 (session 40, "
                          "head width 64 and 128: +1-10%; the SFU is not what bounds these kernels): a pin, not searched",
                          E, default=0, allowed=(0, 1, 2, 3, 4), pins=("exp_fma",), json_optional=True, unguarded=KEEP)
    max_chains: int = choice("independent running maxima a row half of the wgmma main loop's softmax keeps over a KV "
                             "tile's score groups (group jn in chain jn mod max_chains, the chains then joined by "
                             "a tree): shorter dependent chains of FMNMX (a max is exact: the same result). 4: "
                             "slower at 16 × 1k d64, full and causal (H100, session 67)", E,
                             default=2, allowed=(1, 2, 4), pins=("max_chains",), json_optional=True, unguarded=KEEP)
    rescale_always: bool = choice("the wgmma main loop's O rescaled by alpha before every tile's P·V (else only where a "
                                  "warp's vote finds a row maximum that moved; x · 1.0f is x: the same result). H100, 16 × "
                                  "1k d64 (session 67): full 162.5 → 159.0 µs, causal 109.2 → 110.8: searched, not the "
                                  "default", E, default=False, pins=("rescale_always",), json_optional=True,
                                  unguarded=KEEP)
    sum_chains: int = choice("independent partial sums a row half of the wgmma main loop's softmax adds a KV tile's "
                             "exponentials into (group jn in chain jn mod sum_chains), added to the running sum l "
                             "after the tile: shorter dependent chains of FADD (another rounding of l). 2, H100, 16 × "
                             "1k d64 (session 67): full 162.5 → 160.7 µs, causal 109.2 → 112.0: searched, not the "
                             "default", E,
                             default=1, allowed=(1, 2, 4), pins=("sum_chains",), json_optional=True, unguarded=KEEP)


Kernel = ContractionKernel | RowKernel | MapKernel | GeneralKernel | ColumnKernel | GroupedKernel | AttentionKernel
KERNEL_KINDS: dict[str, type] = {k.kind: k for k in (ContractionKernel, RowKernel, MapKernel, GeneralKernel,
                                                      ColumnKernel, GroupedKernel, AttentionKernel)}


@dataclass(frozen=True)
class Plan:
    """How one model is computed on one target, for one shape (or one guarded shape range)."""

    model: str = doc("the model's name")
    model_hash: str = doc("the model's canonical hash: a plan is only valid for this computation")
    target: str = doc("the GPU architecture the kernels are built for")
    shape: tuple[tuple[str, int], ...] = doc("the extents' sizes the plan was made for")
    kernels: tuple[Kernel, ...] = doc("the kernels, in launch order; each computes one fusion region")
    storage: tuple[tuple[str, str], ...] = doc("element type of each intermediate written between kernels", ())
    guards: tuple[str, ...] = doc("conditions on runtime extents under which this plan is valid", ())
    rewrites: tuple[str, ...] = doc("algebraic rewrites applied to the model before it is cut into kernels "
                                    "(inline:P, factor:T); the kernels name the rewritten model's nodes", ())
    ranges: tuple[tuple[str, int, int], ...] = doc("the sizes lo..hi of runtime extents this plan is made and "
                                                   "proven for (one size bucket, habu/plan/buckets.py; none: the "
                                                   "declared ranges)", ())
    lanes: int = doc("streams the kernels are launched on: 1, in order on the caller's stream; 2, kernels that share "
                     "no tensor side by side on a side stream (habu/emit_cuda/lanes.py)", 1)

    # -- JSON
    def to_json(self) -> dict:
        out = {
            "format": PLAN_FORMAT,
            "model": self.model,
            "model_hash": self.model_hash,
            "target": self.target,
            "shape": {k: v for k, v in self.shape},
            "kernels": [{"kind": k.kind, **_kernel_dict(k)} for k in self.kernels],
            "storage": {k: v for k, v in self.storage},
            "guards": list(self.guards),
        }
        if self.rewrites:  # absent when none, so plans without rewrites keep their keys
            out["rewrites"] = list(self.rewrites)
        if self.ranges:  # likewise: absent for a plan of the declared ranges
            out["ranges"] = [list(r) for r in self.ranges]
        if self.lanes != 1:  # likewise: absent for one stream
            out["lanes"] = self.lanes
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @property
    def key(self) -> str:
        """A short stable id of the plan (its JSON, hashed)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def from_json(data: Any, where: str = "plan") -> Plan:
        try:
            if not isinstance(data, dict):
                raise TypeError("the plan must be a JSON object")
            if data.get("format") != PLAN_FORMAT:
                raise ValueError(f"unknown plan format {data.get('format')!r} (this Habu reads {PLAN_FORMAT})")
            kernels = []
            for i, kd in enumerate(data["kernels"]):
                kind = kd.get("kind")
                cls = KERNEL_KINDS.get(kind)
                if cls is None:
                    raise ValueError(f"kernel {i}: unknown kind {kind!r}")
                kernels.append(_kernel_from(cls, kd, f"kernel {i}"))
            return Plan(
                model=str(data["model"]),
                model_hash=str(data["model_hash"]),
                target=str(data["target"]),
                shape=tuple((str(k), _int(v, f"shape {k}")) for k, v in data["shape"].items()),
                kernels=tuple(kernels),
                storage=tuple((str(k), str(v)) for k, v in data.get("storage", {}).items()),
                guards=tuple(str(g) for g in data.get("guards", [])),
                rewrites=_strings(data.get("rewrites", []), "rewrites"),
                ranges=_ranges(data.get("ranges", [])),
                lanes=_lanes(data.get("lanes", 1)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise HabuError(f"{where}: not a valid Habu plan: {what}") from None


def _strings(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{what} must be a list of strings, got {v!r}")
    return tuple(v)


def _ranges(v: Any) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(v, list):
        raise TypeError(f"ranges must be a list of [extent, lo, hi], got {v!r}")
    out = []
    for r in v:
        if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)):
            raise TypeError(f"ranges must be a list of [extent, lo, hi], got {r!r}")
        out.append((r[0], _int(r[1], f"range {r[0]} lo"), _int(r[2], f"range {r[0]} hi")))
    return tuple(out)


def _kernel_dict(k: Kernel) -> dict:
    d: dict[str, Any] = {}
    for kf in kernel_fields(type(k)):
        value = getattr(k, kf.name)
        if kf.spec is None:
            d[kf.name] = list(value)
        elif kf.spec.json_optional and value == kf.default:
            continue  # a field added after format 1, absent at its default so older plans keep their keys
        else:
            d[kf.name] = value.value if isinstance(value, enum.Enum) else value
    return d


def _lanes(v: Any) -> int:
    if _int(v, "lanes") not in (1, 2):
        raise ValueError(f"lanes must be 1 or 2, got {v}")
    return v


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an integer, got {v!r}")
    return v


def _kernel_from(cls: type, kd: dict, where: str) -> Kernel:
    """A kernel from its JSON object: every field checked against the field table."""
    kwargs: dict[str, Any] = {}
    for kf in kernel_fields(cls):
        if kf.name not in kd:
            if kf.default is not MISSING:
                continue
            raise ValueError(f"{where}: missing field {kf.name!r}")
        v = kd[kf.name]
        if kf.spec is None:  # nodes
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise TypeError(f"{where}: nodes must be a list of node names")
            v = tuple(v)
        elif isinstance(kf.kind, enum.EnumMeta):
            if not isinstance(v, str) or v not in kf.spec.allowed_values(kf.kind):
                raise ValueError(f"{where}: {kf.name} must be {kf.describe()}, got {v!r}")
            v = kf.kind(v)
        elif kf.problem(v):
            raise ValueError(f"{where}: {kf.name} must be {kf.describe()}, got {v!r}")
        kwargs[kf.name] = v
    extra = set(kd) - {kf.name for kf in kernel_fields(cls)} - {"kind"}
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ValueError(f"{where}: {err}") from None


def field_docs(obj: Any) -> list[tuple[str, Any, str]]:
    """(name, value, doc) for every field of a plan or kernel."""
    return [(f.name, getattr(obj, f.name), f.metadata.get("doc", "")) for f in fields(obj)]


def with_fields(k: Kernel, **changes: Any) -> Kernel:
    return replace(k, **changes)
