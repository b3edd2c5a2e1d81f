"""Planted bugs: correct lowerings with one bookkeeping mistake of the kind that has shipped in real
kernels. The finite-field check must reject every one, naming an output element that differs.

`run_suite()` returns one row per mutant; `python -m habu.bench.mutants` prints the kill rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from habu.bench import mutants_attention as att
from habu.bench import mutants_attention_wgmma as atw
from habu.bench import mutants_columns as columns
from habu.bench import mutants_epilogue as epilogue
from habu.bench import mutants_grouped as grouped_n_major
from habu.bench import mutants_ktile as ktile
from habu.bench import mutants_multiout as multiout
from habu.bench import mutants_persist as persist
from habu.bench import mutants_rows_saved as rows_saved
from habu.bench import mutants_split as split
from habu.bench import mutants_staged as staged
from habu.bench import mutants_swap as swap
from habu.bench import mutants_window as window
from habu.bench.mutant_plants import (
    GROUPED_LOOP_MUTANTS,
    batch_decode_unreduced,
    box_group_shifted,
    col,
    columns_decoded_wrong,
    combine_skips,
    final_pass_skips,
    group_end_unmasked,
    grouped,
    pair_halves_swapped,
    partials_transposed,
    planted,
    quad_partner_two_lanes_away,
    rows_skip_group,
    split_end_past,
    stops_early,
    tile_origin_from_bn,
    tiles_rounded_down,
    vector_overlap,
    vector_slot_one_off,
)
from habu.bench.mutants_softmax import SOFTMAX_MUTANTS, run_softmax_mutant
from habu.bench.mutants_staged import strided, ungathered
from habu.lower import (
    ContractionLowering,
    GeneralLowering,
    Lowering,
    MapLowering,
    RowLowering,
    lower_plan,
)
from habu.lower.access import Access, Bound, Position
from habu.lower.general import Store
from habu.lower.pipeline import MbarrierRing
from habu.prove.verify import Certificate, verify_plan
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.ir import Model
from habu.spec.parser import load_program
from habu.target import TARGETS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# RMSNorm's derived backward at a static width (habu grad's output): a row kernel keeping two rows
BACKWARD_ROWS = "../tests/data/rmsnorm_backward.habu"


def _drop_mask(acc: Access, axis: str) -> Access:
    return replace(acc, masks=tuple(b for b in acc.masks if b.axis != axis))


def _inclusive(acc: Access, axis: str) -> Access:
    return replace(acc, masks=tuple(Bound(b.axis, b.extent, True) if b.axis == axis else b for b in acc.masks))


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what shipped, and where
    example: str
    model: str
    shape: dict[str, int]
    mutate: Callable[[Lowering], Lowering]
    pins: dict[str, str] | None = None
    kernel: int = 0
    index_width: int | None = None  # force the plan's index width (the int32 wrap mutant)

    def load_model(self) -> Model:
        """The mutant's model at its shape: `NAME` of its example, `NAME:forward`, the forward with the values
        its backward saves (`habu.spec.grad_program.derive_model`: RMSNorm's R1 beside Y), or `NAME:backward`."""
        program = load_program(EXAMPLES / self.example)
        name, _, form = self.model.partition(":")
        model = getattr(derive_model(program, name, None), form.replace("backward", "model")) if form else program.models[name]
        return model.with_sizes(self.shape)


def _c(f: Callable[[ContractionLowering], ContractionLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, ContractionLowering)
        return f(lw)
    return g


def _ring(f: Callable[[MbarrierRing], MbarrierRing]) -> Callable[[Lowering], Lowering]:
    """A mutant of the wgmma k loop's mbarrier ring."""
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, ContractionLowering) and isinstance(lw.pipeline, MbarrierRing)
        return replace(lw, pipeline=f(lw.pipeline))
    return g


def _loads(ring: MbarrierRing, **changes) -> MbarrierRing:
    return replace(ring, loads=tuple(replace(ld, **changes) for ld in ring.loads))


def _reads_next_stage(ring: MbarrierRing) -> MbarrierRing:
    """The same ring whose consumers read the stage after the one they waited for."""

    class NextStage(MbarrierRing):
        def read_slot(self, stage):
            return (stage + 1) % self.stages

    return NextStage(**{f.name: getattr(ring, f.name) for f in fields(ring)})


def _operands(lw: ContractionLowering, **changes) -> ContractionLowering:
    """The lowering with its shared-memory operand maps changed (habu/lower/layouts.py)."""
    assert lw.operands is not None
    return replace(lw, operands=replace(lw.operands, **changes))  # type: ignore[arg-type]


def _r(f: Callable[[RowLowering], RowLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, RowLowering)
        return f(lw)
    return g


def _decoded(lw: RowLowering, decode: Callable) -> RowLowering:
    """The same 3-D row lowering whose row index → (b, s) map is `decode(r, #B, #S)` (a method: planted by
    a subclass)."""

    class Decoded(RowLowering):
        def row_coordinates(self, r, sizes):
            outer, inner = self.row_axes
            b, s = decode(r, sizes[self.leading[0]], sizes[self.leading[1]])
            return {outer: b, inner: s}

    return Decoded(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _m(f: Callable[[MapLowering], MapLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, MapLowering)
        return f(lw)
    return g


def _g(f: Callable[[GeneralLowering], GeneralLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, GeneralLowering)
        return f(lw)
    return g


def _loop_one_short(lw: GeneralLowering) -> GeneralLowering:
    """The same lowering whose reduction loops end one iteration early (`k < K - 1`)."""

    class OneShort(GeneralLowering):
        def loop_end(self, axis, sizes):
            return super().loop_end(axis, sizes) - 1

    return OneShort(**{f.name: getattr(lw, f.name) for f in fields(lw)})


MOE_SMALL = "../tests/data/moe_small.habu"
PV_T = "../tests/data/general_corpus/bmm_pv_transposed.habu"  # P stored [b j i]: A contiguous along m
PV_T_SHAPE = {"B": 3, "I": 40, "D": 48, "J": 40}
GROUPED_WGMMA = {"family": "grouped", "main_loop": "wgmma"}


COMBINE = {"T": 13, "R": 26}  # the MoE combine as a grouped kernel (--pin family=grouped), kernel 3
GROUPED_FAMILY = {"family": "grouped"}

BMM = {"B": 3, "I": 17, "J": 19, "D": 33}  # no extent a multiple of the block's 256 threads
GG = {"M": 300, "N": 200, "K": 511}
BMM_SHAPE = {"B": 3, "I": 72, "J": 80, "D": 64}  # ragged tiles along i and j, three batches
FF = {"B": 40, "D": 256, "H": 320}  # wgmma with n-contiguous weights (64-column TMA boxes, transposed reads)
FF_PINS = {"tile": "128x128x64"}  # two 64-column boxes of B per k tile
COLS = {"R": 300, "N": 200}  # 10 row splits of 32 rows (the last ragged), one column tile with a masked tail
RAGGED_SPLITS = {"rows_per_split": "100"}  # 4 row loops of 32 rows a split: its last one runs past the split
DIRECT = {"A": "ldg", "B": "ldg"}  # the predicated-load paths (the default stages K = 511 operands)
DIRECT_STORE = {**DIRECT, "store": "direct"}  # and each thread stores its own outputs (masked, offset)

MUTANTS: tuple[Mutant, ...] = (
    Mutant("k-tail-mask-missing", "the ragged last k tile reads past K (vLLM #52576)", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, a=_drop_mask(lw.a, "k"), b=_drop_mask(lw.b, "k"))), DIRECT),
    Mutant("k-tail-mask-on-one-operand", "only B is masked on k; A's tail reads the next row (flashinfer PR #5108)",
           "ggemm.habu", "GGEMM", GG, _c(lambda lw: replace(lw, a=_drop_mask(lw.a, "k"))), DIRECT),
    Mutant("k-mask-off-by-one", "k <= K instead of k < K", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, a=_inclusive(lw.a, "k"), b=_inclusive(lw.b, "k"))), DIRECT),
    Mutant("m-mask-off-by-one", "m <= M on A's rows: the gather reads IX[M]", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, a=_inclusive(lw.a, "m"))), DIRECT),
    Mutant("wrong-stride", "B's row stride taken from #N instead of #K", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, b=strided(lw.b, 0, ("N",)))), DIRECT),
    Mutant("k-offset-never-advances", "the k tile offset is not advanced (pytorch #186241)", "ggemm.habu", "GGEMM",
           GG, _c(lambda lw: replace(lw, k_step=0)), DIRECT),
    Mutant("k-offset-advances-twice", "the k tile offset advances by 2·BK", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, k_step=2 * lw.bk)), DIRECT),
    Mutant("k-loop-stops-one-tile-early", "the k loop ends one tile before the last (audit of 402788a: "
           "planted in the emitter's loop, it passed the proof and a 256x256x8193 GEMM passed the GPU golden "
           "at 1.04% relative error)", "ggemm.habu", "GGEMM", GG, _c(stops_early), DIRECT),
    Mutant("split-k-partial-lost", "split-K partials stored instead of added: one is lost", "ggemm.habu", "GGEMM",
           {"M": 256, "N": 256, "K": 4096}, _c(lambda lw: replace(lw, split_mode="none")), {"split_k": "2"}),
    Mutant("ring-stage-off-by-one", "the wgmma consumers read stage s + 1 after waiting for stage s's barrier",
           "ggemm.habu", "GGEMM", GG, _ring(_reads_next_stage)),
    Mutant("ring-advance-wraps-late", "the ring's state update wraps the stage index at stages + 1 "
           "(habu::ring_advance<S + 1>): stage S is past the ring's barriers and buffers", "ggemm.habu", "GGEMM", GG,
           _ring(lambda r: replace(r, wrap=r.wrap + 1))),
    Mutant("ring-advance-keeps-phase", "the ring's state update wraps the stage without flipping the phase: the "
           "second pass over the stages waits for the parity the first pass completed", "ggemm.habu", "GGEMM", GG,
           _ring(lambda r: replace(r, flip=0))),
    Mutant("ring-starts-at-phase-one", "the ring's phase register starts at 1: the producer's first wait on each "
           "empty barrier names the parity no consumer has completed", "ggemm.habu", "GGEMM", GG,
           _ring(lambda r: replace(r, start_phase=1))),
    Mutant("ring-phase-inverted", "the consumers wait for the full barrier's other phase parity (they read a stage "
           "before it is filled)", "ggemm.habu", "GGEMM", GG, _ring(lambda r: replace(r, consumer_parity=1))),
    Mutant("ring-expect-tx-halved", "the full barrier expects half the bytes TMA brings: the phase completes with "
           "B's box still in flight", "ggemm.habu", "GGEMM", GG,
           _ring(lambda r: replace(r, expect_tx=r.expect_tx // 2))),
    Mutant("ring-empty-arrivals-short", "the empty barrier counts one consumer warpgroup too few: the producer "
           "refills a stage the last consumer still reads", "gemm.habu", "GEMM", {"M": 256, "N": 256, "K": 640},
           _ring(lambda r: replace(r, empty_arrivals=r.empty_arrivals - 1)), {"tile": "128x256x64"}),
    Mutant("multicast-mask-wrong", "B's slices are multicast to block 0 of the cluster only",
           "gemm.habu", "GEMM", {"M": 512, "N": 256, "K": 256},
           _ring(lambda r: replace(r, loads=tuple(replace(ld, mask=1) if ld.mask else ld for ld in r.loads))),
           {"cluster": "2"}),
    Mutant("tma-k-coordinate-not-advanced", "the TMA boxes are loaded at the split's first k tile every step",
           "ggemm.habu", "GGEMM", GG, _ring(lambda r: _loads(r, k_step=0))),
    Mutant("cp-async-waits-one-group-short", "the mma.sync k loop waits for all but stages-1 cp.async groups: the "
           "tile it multiplies has not landed", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, pipeline=replace(lw.pipeline, wait_groups=lw.pipeline.wait_groups + 1))),
           {**DIRECT, "mma": "mma.sync"}),
    Mutant("gather-wrong-index", "A's rows read at m instead of IX[m]", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, a=ungathered(lw.a))), DIRECT),
    Mutant("store-overruns-n", "the store is not masked on n: the last tile writes past N", "ggemm.habu", "GGEMM",
           GG, _c(lambda lw: replace(lw, out=_drop_mask(lw.out, "n"))), DIRECT_STORE),
    Mutant("store-overruns-m", "the store is not masked on m", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, out=_drop_mask(lw.out, "m"))), DIRECT_STORE),
    Mutant("store-transposed", "the output is stored at [n, m]", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, out=replace(lw.out, positions=tuple(reversed(lw.out.positions))))), DIRECT_STORE),
    Mutant("tma-store-transposed", "the TMA-stored output's boxes are written at [n, m]", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, out=replace(lw.out, positions=tuple(reversed(lw.out.positions))))),
           {**DIRECT, "store": "tma"}),
    Mutant("tma-store-fragment-rows-swapped", "the TMA-store epilogue puts a register's second row at lane/4 - 8 "
           "instead of lane/4 + 8 (audit of 402788a: fragment rows swapped in the emitter passed the proof)",
           "ggemm.habu", "GGEMM", GG, _c(lambda lw: replace(lw, fragment=replace(lw.fragment, row_step=-8))),
           {**DIRECT, "store": "tma"}),
    Mutant("tma-store-last-box-dropped", "the TMA-store epilogue loops over BN/64 - 1 boxes of columns: the "
           "tile's last 64 columns are never stored", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, tma_store=replace(lw.tma_store, boxes=lw.tma_store.boxes - 1))),
           {**DIRECT, "store": "tma"}),
    Mutant("tma-store-box-group-dropped", "the TMA-store epilogue stages 7 of each box's 8-column groups: TMA "
           "stores the last group from a buffer no thread wrote", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, tma_store=replace(lw.tma_store, groups=lw.tma_store.groups - 1))),
           {**DIRECT, "store": "tma"}),
    Mutant("tma-store-single-buffer", "both of a warpgroup's TMA-store buffers at one address: the threads "
           "stage a box over the one whose store may still read it", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: replace(lw, tma_store=replace(lw.tma_store, buffer_stride=0))),
           {**DIRECT, "store": "tma"}),
    Mutant("mma-fragment-columns-swapped", "the mma.sync epilogue reads a lane's column pair from lane % 2",
           "ggemm.habu", "GGEMM", GG, _c(lambda lw: replace(lw, fragment=replace(lw.fragment, lanes_per_row=2))),
           {**DIRECT, "mma": "mma.sync"}),
    Mutant("smem-swizzle-mismatch", "the copies write A's stage tile in the 128-byte swizzle, ldmatrix reads it "
           "unswizzled (a swizzle XOR dropped on the read side)", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_copy=replace(lw.operands.a_copy, tile=replace(lw.operands.a_tile, swizzle=128)))),
           {**DIRECT, "mma": "mma.sync"}),
    Mutant("smem-row-stride-off-by-8", "the copies write A's rows BK elements apart; ldmatrix reads them BK + 8 "
           "apart (the 16-byte row padding dropped on the store side)", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_copy=replace(lw.operands.a_copy, tile=replace(
               lw.operands.a_tile, row_elems=lw.operands.a_tile.row_elems - 8)))), {**DIRECT, "mma": "mma.sync"}),
    Mutant("ldmatrix-lane-row-map-off", "A's ldmatrix.x4 takes row lane % 8 instead of lane % 16: matrices 1 and 3 "
           "repeat rows 0-7", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_read=replace(lw.operands.a_read, row_lanes=8))), {**DIRECT, "mma": "mma.sync"}),
    Mutant("ldmatrix-trans-k-rows-8-15-dropped", "an A stored [k m] read by ldmatrix.x4.trans with lanes 16-31 "
           "pointing at k rows 0-7 again (the second k block of the lane map dropped): a4..a7 repeat k 0-7",
           PV_T, "PV-T", PV_T_SHAPE,
           _c(lambda lw: _operands(lw, a_read=replace(lw.operands.a_read, row_blocks=1))), {"mma": "mma.sync"}),
    Mutant("warp-grid-columns-halved", "the mma.sync warps' column origins step by half a warp's columns: warps "
           "overlap and the tile's last columns are never computed", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, grid=replace(lw.operands.grid, warp_cols=lw.operands.grid.warp_cols // 2))),
           {**DIRECT, "mma": "mma.sync"}),
    Mutant("fma-staging-transpose-dropped", "the SIMT path's copies store A's k tile as [row][k]; the threads read "
           "it as [k][row]", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_copy=replace(lw.operands.a_copy, tile=replace(lw.operands.a_tile, k_rows=False)))),
           {**DIRECT, "mma": "fma"}),
    Mutant("fma-padding-dropped-on-read", "the SIMT path's threads read B's k rows BN elements apart; the copies "
           "wrote them BN + 1 apart (the bank-conflict padding)", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, b_read=replace(lw.operands.b_read, row_elems=lw.operands.b_read.row_elems - 1))),
           {**DIRECT, "mma": "fma"}),
    Mutant("fma-register-tile-overruns", "each SIMT thread accumulates TM + 1 rows: its last row is the next "
           "tile's (rows ty + TM·TY lie past the block's tile, and its reads past A's stage tile)", "ggemm.habu",
           "GGEMM", GG, _c(lambda lw: _operands(lw, grid=replace(lw.operands.grid,
                                                                 per_thread_m=lw.operands.grid.per_thread_m + 1))),
           {**DIRECT, "mma": "fma"}),
    Mutant("fma-stage-tiles-overlap", "the SIMT path's B stage tile starts inside A's (its offset computed from "
           "the unpadded A tile): the copies of B overwrite A's last k rows", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, b_offset=lw.operands.b_offset - 4 * lw.operands.bk)),
           {**DIRECT, "mma": "fma"}),
    Mutant("wgmma-descriptor-sbo-wrong", "A's wgmma descriptors step 512 bytes between 8-row atoms instead of "
           "1024 (rows of 128 bytes)", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_desc=replace(lw.operands.a_desc, sbo=512))), DIRECT),
    Mutant("wgmma-descriptor-lbo-sbo-swapped", "B's wgmma descriptor has its leading and stride byte offsets "
           "swapped", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, b_desc=replace(lw.operands.b_desc, lbo=lw.operands.b_desc.sbo,
                                                      sbo=lw.operands.b_desc.lbo))), DIRECT),
    Mutant("wgmma-stages-overlap", "the wgmma ring's stages are one A tile apart instead of one A and one B "
           "tile: stage 1's A tile is stage 0's B tile, which the consumers may still read", "ggemm.habu", "GGEMM",
           GG, _c(lambda lw: _operands(lw, stage_stride=lw.operands.a_tile.bytes)), DIRECT),
    Mutant("wgmma-smem-base-misaligned", "the wgmma kernel rounds its shared-memory base to 512 bytes: the "
           "128-byte swizzle's 1024-byte period starts mid-tile, so TMA and wgmma swizzle rows differently",
           "ggemm.habu", "GGEMM", GG, _c(lambda lw: _operands(lw, base_align=512)), DIRECT),
    Mutant("wgmma-mn-major-block-offset-halved", "W1 (a (D, H) weight, contiguous along n) is read by wgmma's "
           "transposed descriptor with LBO half a 64-column block: columns 64.. of each k step read rows of the first "
           "block", "ffn_skip.habu", "FFN-SKIP", FF,
           _c(lambda lw: _operands(lw, b_desc=replace(lw.operands.b_desc, lbo=lw.operands.b_desc.lbo // 2))), FF_PINS),
    Mutant("wgmma-swizzle-dropped-on-copy", "the wgmma producer's ldg copies store A's tile without the 128-byte "
           "swizzle XOR; the descriptors read it swizzled", "ggemm.habu", "GGEMM", GG,
           _c(lambda lw: _operands(lw, a_copy=replace(lw.operands.a_copy, tile=replace(lw.operands.a_tile, swizzle=0)))),
           DIRECT),
    Mutant("int32-offset-wraps", "32-bit offsets at 600000 × 4096 elements wrap (Liger #1246, vLLM PR #34279)",
           "ggemm.habu", "GGEMM", {"M": 600_000, "N": 64, "K": 4096}, lambda lw: lw, index_width=32),
    Mutant("bias-broadcast-wrong-axis", "the epilogue bias is read along m instead of n", "ffn_skip.habu",
           "FFN-SKIP", {"B": 40, "D": 48, "H": 72},
           _c(lambda lw: replace(lw, epi_loads=tuple(
               (ld, replace(acc, positions=tuple(Position("axis", "m") if p.axis == "n" else p for p in acc.positions),
                            masks=tuple(Bound("m", lw.m) if b.axis == "n" else b for b in acc.masks)))
               if ld.tensor.startswith("B") else (ld, acc) for ld, acc in lw.epi_loads)))),
    *(Mutant(*entry) for entry in staged.MUTANT_ENTRIES),  # staged operands, wgmma and mma.sync (mutants_staged.py)
    Mutant("reduction-drops-last-warp", "the block reduction combines one warp's partial too few (the emitter "
           "read `lane < threads/32` partials: a partial last warp was lost, audit of 402788a)", "softmax.habu",
           "SOFTMAX-ROWS", {"R": 8, "C": 1000}, _r(lambda lw: replace(lw, combined_warps=lw.combined_warps - 1)),
           {"threads": "128"}),
    Mutant("row-chunk-stride-off-by-one", "a thread's next chunk of the row is threads + 1 chunks on, not "
           "threads: some chunks are visited twice, others never", "softmax.habu", "SOFTMAX-ROWS",
           {"R": 8, "C": 4000}, _r(lambda lw: replace(lw, thread_map=replace(
               lw.thread_map, chunk_stride=lw.thread_map.chunk_stride + 1))), {"threads": "128"}),
    Mutant("row-register-chunk-stride-off-by-one", "a row kept in registers: each thread's chunks threads + 1 "
           "apart, so the last ones fall past the row and a quarter of it is never read", "rmsnorm.habu",
           "RMSNORM-ROWS", {"R": 8, "D": 4096}, _r(lambda lw: replace(lw, thread_map=replace(
               lw.thread_map, chunk_stride=lw.thread_map.chunk_stride + 1)))),
    Mutant("row-loop-tail-inclusive", "the column loop runs while g <= G chunks: the chunk past the row is "
           "loaded into the row cache, over the next lane's first element", "softmax.habu", "SOFTMAX-ROWS",
           {"R": 8, "C": 1000}, _r(lambda lw: replace(lw, thread_map=replace(lw.thread_map, end_inclusive=True))),
           {"threads": "128"}),
    Mutant("row-cache-slots-collide", "the permuted row cache puts lane q of chunk g at q·(G − 1) + g: two "
           "elements share a slot (a bank-conflict fix with its stride off by one chunk)", "softmax.habu",
           "SOFTMAX-ROWS", {"R": 8, "C": 1000}, _r(lambda lw: replace(lw, cache=replace(lw.cache, lane_pad=-1))),
           {"threads": "128"}),
    Mutant("row-kept-rows-share-slots", "a row kernel keeping two rows in shared memory (dY and X of RMSNorm's "
           "backward) writes the second over the first's slots: dY's row reads X's values", BACKWARD_ROWS,
           "RMSNORM-ROWS-GRAD-1", {"R": 8, "D": 1000}, _r(lambda lw: replace(lw, cache=replace(lw.cache, row_step=0))),
           {"threads": "128"}),
    Mutant("row-kept-row-read-before-load", "a row kernel keeping dY and X in registers loads X only after the "
           "reduction pass that reads it (Σ dY·X reads registers no load has filled)", BACKWARD_ROWS,
           "RMSNORM-ROWS-GRAD-1", {"R": 8, "D": 4096},
           _r(lambda lw: replace(lw, loaded_before=(*lw.loaded_before[:-1], len(lw.passes))))),
    Mutant("row-passes-out-of-order", "softmax's sum pass runs before its max pass and reads a max no pass has "
           "computed yet", "softmax.habu", "SOFTMAX-ROWS", {"R": 8, "C": 1000},
           _r(lambda lw: replace(lw, passes=tuple(reversed(lw.passes))))),
    Mutant("row-stride-wrong", "rows strided by #R instead of #D", "rmsnorm.habu", "RMSNORM-ROWS",
           {"R": 8, "D": 768},
           _r(lambda lw: replace(lw, loads=tuple((ld, strided(acc, 0, ("R",))) for ld, acc in lw.loads)))),
    Mutant("row-flattening-divisor-wrong", "a 3-D row kernel decodes row r as b = r / #B (the outer extent, not "
           "#S), s = r % #S: rows collide and some (b, s) are never computed", "rows_nd.habu", "RMSNORM-BSD",
           {"B": 3, "S": 5, "D": 256}, _r(lambda lw: _decoded(lw, lambda r, B, S: (r // B, r % S)))),
    Mutant("row-flattening-stride-wrong", "a 3-D row kernel strides its batch axis by #D instead of #S·#D (the "
           "leading axes flattened as if the tensor were 2-D)", "rows_nd.habu", "RMSNORM-BSD",
           {"B": 3, "S": 5, "D": 256}, _r(lambda lw: replace(lw, loads=tuple(
               (ld, strided(acc, 0, ("D",)) if len(acc.positions) == 3 else acc) for ld, acc in lw.loads)))),
    Mutant("map-lane-without-vector", "the map kernel's lane index is blockIdx·threads + threadIdx without the "
           "vector factor: lanes overlap and most of each block's elements are never computed", "fused.habu",
           "AXPY-RELU", {"N": 1000}, _m(lambda lw: replace(lw, lanes=replace(lw.lanes, lane_stride=1)))),
    Mutant("map-tail-unmasked", "the elementwise kernel's last block is not masked", "fused.habu", "AXPY-RELU",
           {"N": 1000}, _m(lambda lw: replace(lw, loads=tuple((ld, _drop_mask(acc, "e0")) for ld, acc in lw.loads),
                                                  out=_drop_mask(lw.out, "e0")))),
    Mutant("general-store-unmasked", "the general kernel's threads past the last element store (its guard, the "
           "output's mask, dropped)", "weighted_scores.habu", "SCORES", BMM, _g(lambda lw: replace(lw, out=_drop_mask(lw.out, "e0")))),
    Mutant("general-wrong-stride", "Q's rows strided by #J instead of #D in the general kernel", "weighted_scores.habu", "SCORES",
           BMM, _g(lambda lw: replace(lw, loads=tuple((ld, strided(acc, 1, ("J",)) if acc.tensor == "Q" else acc)
                                                      for ld, acc in lw.loads)))),
    Mutant("scatter-plain-store", "the scatter kernel stores its value instead of adding it with atomicAdd "
           "(duplicate indices overwrite each other, the target's prior contents are lost)", "scatter_add.habu",
           "UNPERMUTE", {"R": 64, "T": 16, "N": 8}, _g(lambda lw: replace(lw, store=Store.WRITE))),
    Mutant("columns-split-stores", "row splits store their partial sums instead of adding them: the last split "
           "to finish wins", "bias_grad.habu", "BIAS-GRAD", COLS, col(lambda lw: replace(lw, combine="store"))),
    Mutant("columns-partials-transposed", "the shared-memory partials are written [v][tc] and read [tc][v]",
           "bias_grad.habu", "BIAS-GRAD", COLS, col(partials_transposed)),
    Mutant("columns-row-loop-overlaps", "the row loop advances G·U − 1 rows an iteration (a row added twice)",
           "bias_grad.habu", "BIAS-GRAD", COLS, col(rows_skip_group), RAGGED_SPLITS),
    Mutant("columns-unrolled-rows-overlap", "a thread's unrolled rows are G − 1 rows apart instead of G (the "
           "column kernel's unroll stride): row groups load each other's rows, some twice, others never",
           "bias_grad.habu", "BIAS-GRAD", COLS, col(lambda lw: replace(lw, thread_map=replace(
               lw.thread_map, unroll_step=lw.thread_map.unroll_step - 1)))),
    Mutant("columns-split-end-off-by-one", "a row split runs to begin + S inclusive (its neighbour's first row "
           "added twice)", "bias_grad.habu", "BIAS-GRAD", COLS, col(split_end_past), RAGGED_SPLITS),
    Mutant("columns-combine-skips-slots", "the combining loop strides 2·threads slots: half the tile's columns "
           "are never stored", "bias_grad.habu", "BIAS-GRAD", COLS, col(combine_skips), {"threads": "128"}),
    Mutant("columns-vectors-overlap", "column threads step by vector − 1 columns (vectors overlap)",
           "bias_grad.habu", "BIAS-GRAD", COLS, col(vector_overlap)),
    Mutant("columns-column-mask-missing", "the tail tile's loads are not masked on columns (they read the next "
           "row's first columns, and past the end)", "bias_grad.habu", "BIAS-GRAD", COLS,
           col(lambda lw: replace(lw, loads=tuple((ld, _drop_mask(acc, "c")) for ld, acc in lw.loads)))),
    Mutant("columns-store-unmasked", "the combined values of the tail tile's columns past #N are stored",
           "bias_grad.habu", "BIAS-GRAD", COLS, col(lambda lw: replace(lw, out=_drop_mask(lw.out, "c")))),
    *(Mutant(*entry) for entry in columns.MUTANT_ENTRIES),  # a bias gradient's broadcast store, a column sum in an epilogue
    Mutant("batch-stride-wrong", "K's batch stride is #I·#D (Q's) instead of #J·#D: every batch after the first "
           "reads the wrong keys (a batched GEMM given the first operand's batch stride for both)", "bmm.habu",
           "SCORES", BMM_SHAPE, _c(lambda lw: replace(lw, b=strided(lw.b, 0, ("I", "D")))), {"mma": "mma.sync"}),
    Mutant("batch-decode-unreduced", "a batched decode takes the tile from the block index, not from the index "
           "within its batch: the blocks of batches 1.. compute tiles past the grid", "bmm.habu", "SCORES",
           BMM_SHAPE, _c(batch_decode_unreduced)),
    Mutant("batch-missing-on-output", "the output's batch position dropped: every batch stores into batch 0",
           "bmm.habu", "SCORES", BMM_SHAPE, _c(lambda lw: replace(lw, out=replace(lw.out, positions=(Position("const"), *lw.out.positions[1:])))),
           {"store": "direct"}),  # (a TMA store's map takes the output's strides from the host array)
    Mutant("columns-flattening-divisor-wrong", "a column reduction over (b, s) decodes row r as b = r / #B, "
           "s = r % #S: rows added twice, others never", "column_reductions.habu", "BIAS-GRAD-3D", {"B": 3, "S": 100, "N": 200},
           col(columns_decoded_wrong)),
    Mutant("columns-max-splits-added", "a column max's row splits add their partial maxima (atomicAdd) "
           "instead of taking their max", "column_reductions.habu", "COL-MAX", COLS,
           col(lambda lw: replace(lw, combine="atomic"))),
    Mutant("columns-max-splits-stored", "a column max's row splits store their partial maxima: the last split "
           "to finish wins", "column_reductions.habu", "COL-MAX", COLS, col(lambda lw: replace(lw, combine="store"))),
    Mutant("columns-final-pass-skips-columns", "a tile's last block's epilogue pass strides 2·threads columns: "
           "half of each 128-column tile of the gradient is left unscaled", "column_reductions.habu",
           "BIAS-GRAD-UNSCALED", {"R": 300, "N": 700}, col(final_pass_skips), {"threads": "64"}),
    Mutant("columns-block-decode-swapped", "the column kernel takes its tile from blockIdx.y and its row split "
           "from blockIdx.x", "column_reductions.habu", "BIAS-GRAD-UNSCALED", {"R": 300, "N": 700},
           col(lambda lw: planted(lw, "block", lambda self, bx, by: (by, bx))), {"threads": "64"}),
    Mutant("columns-row-mask-inclusive", "a row split's loads and sums run to r <= row_end: the next split's "
           "first row is added twice", "column_reductions.habu", "BIAS-GRAD-UNSCALED", {"R": 300, "N": 700},
           col(lambda lw: replace(lw, thread_map=replace(lw.thread_map, end_inclusive=True))),
           {"threads": "64", **RAGGED_SPLITS}),  # (a row loop that runs past its split's end)
    Mutant("columns-tile-counters-shared", "every column tile counts its row splits on counter 0 (as on the one "
           "counter of the module before): the first tile's last split finishes it, no later tile is finished",
           "column_reductions.habu", "BIAS-GRAD-UNSCALED", {"R": 300, "N": 700},
           col(lambda lw: replace(lw, thread_map=replace(lw.thread_map, counter_stride=0))), {"threads": "64"}),
    Mutant("grouped-tiles-rounded-down", "the grouped GEMM's scheduler rounds a group's row tiles down "
           "(rows // bm): the rows of a group's ragged last tile, or of a group smaller than a tile, are never "
           "written", "../tests/data/moe_small.habu", "MOE-FFN", {"T": 200, "R": 400}, tiles_rounded_down,
           {"bm": "32"}),
    Mutant("combine-row-factor-dropped", "the grouped MoE combine's epilogue forgets the router weight P[r]",
           MOE_SMALL, "MOE-FFN", COMBINE, grouped(lambda lw: replace(lw, row_scale=None)), GROUPED_FAMILY, kernel=3),
    Mutant("combine-plain-store", "the grouped MoE combine stores Y[IX[r] d] instead of adding atomically: a "
           "token's rows overwrite each other and Y's prior contents", MOE_SMALL, "MOE-FFN", COMBINE,
           grouped(lambda lw: replace(lw, store=Store.WRITE)), GROUPED_FAMILY, kernel=3),
    Mutant("combine-scatter-row-wrong", "the grouped MoE combine adds routed row r into Y[r d], not into its "
           "token's row Y[IX[r] d]", MOE_SMALL, "MOE-FFN", COMBINE, grouped(lambda lw: replace(lw, out=ungathered(lw.out))),
           GROUPED_FAMILY, kernel=3),
    Mutant("grouped-wgmma-box-group-off-by-one", "the grouped wgmma loop's TMA box of W starts one group past the "
           "tile's (box origin (k0, n0, g + 1)): every row multiplies the next expert's weights", MOE_SMALL,
           "MOE-FFN", COMBINE, grouped(box_group_shifted), GROUPED_WGMMA),
    Mutant("grouped-wgmma-group-end-unmasked", "the grouped wgmma combine drops the row mask at offs[g + 1]: a tile "
           "adds the next groups' rows with its own group's weights", MOE_SMALL, "MOE-FFN", COMBINE,
           grouped(group_end_unmasked), GROUPED_WGMMA, kernel=3),
    Mutant("grouped-wgmma-quad-partner-two-lanes", "the grouped wgmma combine's 4-wide epilogue (store_vector 4) "
           "trades accumulator pairs with the lane two away (lane ^ 2), not its neighbour: a quarter of the sums "
           "added four columns off", MOE_SMALL, "MOE-FFN", COMBINE, grouped(quad_partner_two_lanes_away),
           {**GROUPED_WGMMA, "store_vector": "4"}, kernel=3),
    Mutant("grouped-wgmma-ring-wraps-late", "the grouped wgmma loop's ring wraps its stage index one stage late "
           "(ring_advance<stages + 1>): a k tile lands in a stage past the ring, a consumer waits on a barrier "
           "no producer completes", MOE_SMALL, "MOE-FFN", COMBINE,
           grouped(lambda lw: replace(lw, wgmma=replace(lw.wgmma, ring=replace(lw.wgmma.ring, wrap=lw.wgmma.ring.stages + 1)))),
           GROUPED_WGMMA),
    *(Mutant(*spec) for spec in GROUPED_LOOP_MUTANTS),
    Mutant("pair-second-weights-wrong", "the fused gate/up kernel multiplies the up accumulator with the gate's "
           "weights (W1 staged twice)", MOE_SMALL, "MOE-FFN", COMBINE,
           grouped(lambda lw: replace(lw, pair=replace(lw.pair, w=lw.w))), {"pair": "fused"}),
    Mutant("pair-one-instruction-halves-swapped", "the fused gate/up kernel by one n = 2·bn wgmma (pair_wgmmas 1) "
           "reads gate from the accumulator's second half and up from its first: SwiGLU(up)·gate", MOE_SMALL,
           "MOE-FFN", COMBINE, grouped(pair_halves_swapped), {**GROUPED_WGMMA, "pair": "fused", "pair_wgmmas": "1"}),
    Mutant("grouped-vector-slot-one-off", "the fused gate/up kernel's 16-byte epilogue (store_vector 8) puts each "
           "traded column pair one slot off: the row's columns stored pairwise swapped", MOE_SMALL, "MOE-FFN",
           {"T": 150, "R": 300}, grouped(vector_slot_one_off),
           {**GROUPED_WGMMA, "pair": "fused", "store_vector": "8", "bm": "128", "warps_m": "2"}),
    Mutant("general-loop-one-short", "the general kernel's reduction loop stops one iteration early (k < K - 1)",
           "weighted_scores.habu", "SCORES", BMM, _g(_loop_one_short)),
    Mutant("general-block-stride-doubled", "the general kernel's thread map strides blocks by 2·threads "
           "elements: block b computes elements 2b·threads.., so the blocks after the first skip every other "
           "block's elements (at the witness shape, only if its output spans several blocks)",
           "weighted_scores.habu", "SCORES", {"B": 3, "I": 17, "J": 1300, "D": 33},  # the witness reduces #J
           _g(lambda lw: replace(lw, thread_map=replace(lw.thread_map, threads=2 * lw.thread_map.threads)))),
    Mutant("general-vector-factor-dropped", "a general kernel moving 4-element vectors numbers its threads' "
           "first elements (b·threads + t) without the factor 4: threads overlap, three quarters of the "
           "output are never added", "scatter_add.habu", "UNPERMUTE", {"R": 64, "T": 16, "N": 8},
           _g(lambda lw: replace(lw, thread_map=replace(lw.thread_map, vector=1))), {"vector": "4"}),
    Mutant("tile-origin-from-bn", "a block's first row m0 = tm·BN instead of tm·BM (a rectangular tile's "
           "extents mixed up): blocks compute overlapping rows and some rows of the output are never written",
           "ggemm.habu", "GGEMM", GG, _c(tile_origin_from_bn), {"tile": "128x64x64"}),
    Mutant("cluster-split-ranks-overlap", "a cluster split's rank r finishes rows from r·(BM/S − 1): two ranks "
           "add up one row, nobody the last", "ggemm.habu", "GGEMM", split.SHAPE, split.ranks_overlap, split.PINS),
    Mutant("cluster-split-partial-rows-overlap", "a cluster split's partial rows BN − 2 words apart",
           "ggemm.habu", "GGEMM", split.SHAPE, split.partial_rows_overlap, split.PINS),
    Mutant("cluster-split-partial-column-major", "a cluster split's partial tile stored column-major while "
           "its pairs are stored and read as two adjacent words", "ggemm.habu", "GGEMM", split.SHAPE,
           split.partial_column_major, split.PINS),
    *(Mutant(*entry) for entry in epilogue.MUTANT_ENTRIES),  # the TMA-store epilogue's loads (mutants_epilogue.py)
    *(Mutant(*entry) for entry in ktile.MUTANT_ENTRIES),  # k tiles of several spans (mutants_ktile.py)
    *(Mutant(*entry) for entry in swap.MUTANT_ENTRIES),  # transposed products, swap_ab (mutants_swap.py)
    *(Mutant(*entry) for entry in multiout.MUTANT_ENTRIES),  # an epilogue's extra outputs (mutants_multiout.py)
    *(Mutant(*entry) for entry in grouped_n_major.MUTANT_ENTRIES),  # n-major grouped weights (mutants_grouped.py)
    *(Mutant(*entry) for entry in rows_saved.MUTANT_ENTRIES),  # a row kernel's saved statistic (mutants_rows_saved.py)
    *(Mutant(*entry) for entry in att.MUTANT_ENTRIES),  # the fused attention kernel's (mutants_attention.py)
    *(Mutant(*entry) for entry in window.MUTANT_ENTRIES),  # k tiles skipped by a window (mutants_window.py)
    *(Mutant(*entry) for entry in persist.MUTANT_ENTRIES),  # the persistent wgmma attention kernel's (mutants_persist.py)
    Mutant("attention-wgmma-rescale-inverted", "the wgmma attention loop rescales l and O by exp(m_new − m_old)",
           "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.rescale_inverted, atw.PINS),
    Mutant("attention-wgmma-p-row-swapped", "the wgmma attention loop packs P's A registers from the other row "
           "half of S's accumulators", "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.p_row_swapped, atw.PINS),
    Mutant("attention-wgmma-kv-boxes-in-one-stage", "the wgmma attention loop's producer loads every K tile into "
           "stage 0", "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.kv_boxes_in_one_stage, atw.PINS),
    Mutant("attention-wgmma-v-descriptor-atoms", "V's wgmma descriptor steps 8 keys by half an atom",
           "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.v_descriptor_rows_of_k, atw.PINS),
    Mutant("attention-wgmma-score-groups-short", "the wgmma attention loop's softmax loops stop one 8-key group "
           "short", "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.score_groups_short, atw.PINS),
    Mutant("attention-wgmma-kv-loop-skips-a-tile", "the wgmma attention loop's consumers step two KV tiles",
           "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.kv_loop_skips_a_tile, atw.PINS),
    Mutant("attention-head-major-blocks-repeat", "the head-major grid decodes a block's batch element as x mod "
           "#tiles", "attention.habu", "ATTENTION-GQA", atw.SHAPE, atw.head_major_blocks_repeat, atw.HEAD_MAJOR_PINS),
    *(Mutant(*entry) for entry in atw.MUTANT_ENTRIES),  # the wgmma loop's split decode (mutants_attention_wgmma.py)
)


# Bugs that the row kernels' loops make harmless: planted in the lowering they change the printed CUDA, yet the
# kernel stays correct, because each thread's column loop ends at its part of the row (the loop's tail predicate,
# `RowThreads`) and a row kept in registers splits into whole chunks, so no thread reaches a column past the row.
# The check must pass them (tests/bench/test_mutants.py): it executes the loops the kernel runs, not a padded
# picture of them (until the thread map was in the lowering, the check ran padded chunks, and killed these).
EQUIVALENT: tuple[Mutant, ...] = (
    Mutant("reduce-mask-missing", "the reductions' column guard `col < #C` dropped", "softmax.habu",
           "SOFTMAX-ROWS", {"R": 8, "C": 1000}, _r(lambda lw: replace(lw, reduce_mask=False))),
    Mutant("column-mask-missing", "row loads are not masked on columns", "softmax.habu", "SOFTMAX-ROWS",
           {"R": 8, "C": 1000},
           _r(lambda lw: replace(lw, loads=tuple((ld, _drop_mask(acc, "c")) for ld, acc in lw.loads)))),
)


@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    message: str
    seconds: float

def run_mutant(m: Mutant, trials: int = 2, seeds: list[int] | None = None, witness: bool = False) -> Outcome:
    """`witness`: check on the reduced shape the search checks candidates at (habu.prove.witness)."""
    model = m.load_model()
    plan = default_plan(model, TARGETS["sm_90a"], m.shape, m.pins)
    if m.index_width is not None:
        plan = replace(plan, kernels=tuple(replace(k, index_width=m.index_width) for k in plan.kernels))
    lowerings = lower_plan(model, plan)
    lowerings[m.kernel] = m.mutate(lowerings[m.kernel])
    cert: Certificate = verify_plan(model, plan, m.shape, trials=trials, seeds=seeds or [1, 2][:trials],
                                    lowerings=lowerings, witness=witness)
    return Outcome(m, not cert.passed, cert.failure or "passed (the mutant survived)", cert.seconds)


def run_suite(trials: int = 2) -> list[Outcome]:
    return [run_mutant(m, trials) for m in MUTANTS]


def main() -> None:
    rows: list = [*run_suite(), *(run_softmax_mutant(m) for m in SOFTMAX_MUTANTS)]
    killed = sum(o.killed for o in rows)
    for o in rows:
        print(f"{'killed  ' if o.killed else 'SURVIVED'} {o.mutant.name:<28} {o.seconds:5.2f}s  {o.message[:150]}")
    print(f"kill rate: {killed}/{len(rows)} = {100 * killed / len(rows):.0f}%")


if __name__ == "__main__":
    main()
