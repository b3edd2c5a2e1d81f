"""Executing a lowered plan over GF(p), block by block, exactly as its kernels would.

Every load computes its offset from the lowering's strides in the plan's index width (int32
arithmetic wraps as on the GPU), applies the lowering's masks, and reads a virtual input or what an
earlier kernel wrote; every store goes to memory the same way. Reading out of bounds, reading
memory no kernel wrote, writing outside the tile a block owns, or writing one element twice
without accumulating is a fault, reported with the element.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Access
from habu.lower.conditions import condition_coordinates
from habu.lower.contraction import ACC
from habu.lower.epilogue_pairs import paired_loads
from habu.lower.general import Store
from habu.lower.pipeline import MbarrierRing
from habu.plan.fields import Reader, fields_read_by
from habu.plan.plan import ContractionKernel
from habu.prove.block_products import block_products
from habu.prove.column_epilogue import column_tile_sums, finish_column_sums
from habu.prove.conditions import condition_holds
from habu.prove.deadline import check_deadline
from habu.prove.fragments import fragment_mismatch
from habu.prove.index_arith import computing
from habu.prove.interp_access import element_at, read, read_pair, read_vector, write
from habu.prove.interp_stage import run_stage, stage_blocks
from habu.prove.kinds import KindProof, TileAxis, kind_proof, register_kind, sample_tiles
from habu.prove.lane_arithmetic import LaneArithmetic
from habu.prove.pipeline import delivered
from habu.prove.smem_route import route_key, route_of, warp_parts
from habu.prove.split_cluster import finish_cluster_split
from habu.prove.tma_landing import tma_landing_faults
from habu.prove.tma_store import tma_store_faults, tma_store_key
from habu.prove.virtual import VirtualTensor, WrittenTensor
from habu.prove.window_terms import check_window, skipped_ranges, skipped_terms
from habu.spec.field import PrimeField
from habu.spec.ir import Compare, Const, Expr, Load, NegInf, Op, Size


class PlanFault(Exception):
    """The plan's kernels do something no correct kernel does (out-of-bounds access, a race...)."""


POISON = np.uint64(0x5EED_BAD_F00D)


class Memory:
    """The inputs (virtual) and the tensors kernels have written, by name.

    A faulty access does not stop the run: it is recorded, an out-of-bounds or never-written read
    yields poison (values unrelated to any input), and the run goes on so that the check can also
    say which output elements the fault spoiled."""

    def __init__(self, inputs: Mapping[str, VirtualTensor], field: PrimeField, sizes: Mapping[str, int],
                 allocated: frozenset[str] = frozenset()):
        self.inputs = dict(inputs)
        self.written: dict[str, WrittenTensor] = {}
        # tensors that exist before any kernel runs (the runtime allocates a plan's intermediates first):
        # one that no kernel wrote reads as memory never written (poison, a fault), not as a missing tensor
        self.allocated = allocated
        self.field = LaneArithmetic(field)  # the kernels' arithmetic: a division by zero gives 0, not an error
        self.sizes = sizes
        self.faults: list[str] = []
        # index values outside their axis, masked as the kernel masks them (`Access.checks`): what the
        # kernel's error words record (habu/emit_cuda/include/habu/memory/index.cuh), first ones kept
        self.index_errors: list[tuple[str, str, int, int]] = []  # (kernel, index tensor, position, value)
        self.index_error_count = 0

    def index_error(self, kernel: str, table: str, positions: np.ndarray, values: np.ndarray) -> None:
        self.index_error_count += int(positions.size)
        if len(self.index_errors) < 8 and positions.size:
            self.index_errors.append((kernel, table, int(positions.flat[0]), int(values.flat[0])))

    def fault(self, text: str) -> None:
        if len(self.faults) < 8 and text not in self.faults:
            self.faults.append(text)

    def poison(self, offsets: np.ndarray) -> np.ndarray:
        from habu.spec.field import _mix

        h = _mix(np.asarray(offsets, dtype=np.int64).astype(np.uint64) ^ POISON)
        return (h % np.uint64(self.field.p)).astype(np.int64)

    def value(self, kernel: str, access: Access, offsets: np.ndarray, mask: np.ndarray,
              oob: np.ndarray | None = None) -> np.ndarray:
        bad = oob if oob is not None else np.zeros(mask.shape, bool)
        ok = mask & ~bad
        safe = np.where(ok, offsets, 0)
        if access.tensor in self.written:
            held = self.written[access.tensor].numel
            if np.any(ok & (offsets >= held)):  # a reader of a layout larger than the writer's (one buffer, two)
                self.fault(f"{kernel} reads {access.tensor} past the {held} elements an earlier kernel wrote it as")
                safe = np.where(offsets < held, safe, 0)
            vals, found = self.written[access.tensor].read(safe)
            missing = ok & ~found
            if np.any(missing):
                o = int(safe[missing].flat[0])
                self.fault(f"{kernel} reads {element_at(access, o, self.sizes)}, which no earlier kernel wrote")
                vals = np.where(missing, self.poison(safe), vals)
        elif access.tensor in self.inputs:
            vals = self.inputs[access.tensor].at(safe)
        elif access.tensor in self.allocated:
            if np.any(ok):
                self.fault(f"{kernel} reads {element_at(access, int(safe[ok].flat[0]), self.sizes)}, which no earlier "
                           "kernel wrote")
            vals = self.poison(safe)
        else:
            raise PlanFault(f"{kernel} reads {access.tensor}, which is neither an input nor written before it")
        if np.any(bad & mask):
            vals = np.where(bad & mask, self.poison(offsets), vals)
        return np.where(mask, vals, 0)

    def table(self, name: str) -> VirtualTensor:
        return self.inputs[name]


def eval_pointwise(expr: Expr, leaf, field: PrimeField, sizes: Mapping[str, int],
                   condition: Callable[[Compare], np.ndarray] | None = None) -> np.ndarray:
    """Evaluate an expression without reductions; `leaf(load)` gives each load's values, `condition(c)`
    where a condition on indices holds (a contraction epilogue's mask: exactly 0 or 1)."""
    if isinstance(expr, Compare) and condition is not None:
        return np.where(condition(expr), field.const(Fraction(1)), field.const(Fraction(0)))
    if isinstance(expr, NegInf):
        return field.neg_inf()
    if isinstance(expr, Const):
        return field.const(expr.value)
    if isinstance(expr, Size):
        return field.const(Fraction(sizes[expr.extent]))
    if isinstance(expr, Load):
        return leaf(expr)
    if isinstance(expr, Op):
        args = [eval_pointwise(a, leaf, field, sizes, condition) for a in expr.args]
        args = list(np.broadcast_arrays(*args)) if len(args) > 1 else args
        return field.op(expr.fn, [np.asarray(a) for a in args])
    raise PlanFault(f"a reduction inside a pointwise expression: {expr}")


# ----------------------------------------------------------------------------- the kernels


@dataclass
class Selection:
    """Which blocks of a kernel the check executes."""

    blocks: np.ndarray  # linear block (tile) ids
    description: str


def _local(t: int, tile: int, keep: np.ndarray | None) -> tuple[int, ...]:
    """The lanes of tile t that the check computes: all, or those whose coordinate is kept."""
    lanes = np.arange(tile)
    if keep is None:
        return tuple(lanes.tolist())
    return tuple(lanes[np.isin(t * tile + lanes, keep)].tolist())


def run_contraction(name: str, lw: ContractionLowering, sizes: Mapping[str, int], mem: Memory,
                    tiles: list[tuple[int, int, int, int]], rows: np.ndarray | None = None,
                    cols: np.ndarray | None = None) -> None:
    """Execute the given blocks, each (tm, tn, split, batch z); `rows`/`cols` restrict them to the lanes
    a later check needs (a block's output rows and columns do not depend on one another)."""
    f = mem.field
    if lw.column_sum is not None or lw.window:  # a column sum adds every row and column of its tiles; a window's
        rows = cols = None  # edges against the diagonal run whole (habu.prove.window_terms)
    # the epilogue reads each register where the instruction put it: the lowering's fragment map is run
    # against both tensor-core layouts whatever the plan's instruction (the check reads no emission
    # field, so plans that differ only in `mma` may share it; the fma path does not print the map)
    for instruction in ("mma.sync", "wgmma"):
        moved = fragment_mismatch(instruction, lw.fragment, max(1, lw.bn // 8))
        if moved:
            mem.fault(f"{name}: {moved}")
    bm, bn = lw.bm, lw.bn
    if lw.tma_store is not None:  # the TMA-store epilogue's staging and boxes (habu.prove.tma_store)
        for fault in tma_store_faults(lw.tma_store, lw.fragment, bm, bn):
            mem.fault(f"{name}: {fault}")
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for tm, tn, s, z in tiles:  # (blocks grouped by their k range too: a window gives each tile its own)
        key = (s, z, _local(tm, bm, rows), _local(tn, bn, cols), *(int(x) for x in lw.tile_k_range(s, sizes, tm, tn)))
        if key[2] and key[3]:
            groups.setdefault(key, []).append((tm, tn))
    accumulate = lw.atomic_store
    scatter = lw.store is Store.ATOMIC_ADD
    if scatter and lw.out.tensor not in mem.written:
        # atomicAdd onto the target's memory, which holds its prior contents (an input of the model): every
        # value lands, duplicates included, in any order (as the grouped family's scatter-add)
        mem.written[lw.out.tensor] = WrittenTensor(lw.out.tensor, int(lw.out.numel(sizes)), f.p, True,
                                                   mem.inputs.get(lw.out.tensor))
    for stage in lw.pre:  # staging passes: the blocks that copy every row the chosen tiles read, all of k
        tile = bm if stage.row_axis == "m" else bn
        picked = {t[0] if stage.row_axis == "m" else t[1] for t in tiles}
        keep = rows if stage.row_axis == "m" else cols
        need = np.unique(np.concatenate([t * tile + np.array(_local(t, tile, keep), dtype=np.int64)
                                         for t in sorted(picked)] or [np.zeros(0, np.int64)]))
        # the batches those tiles read, as the contraction decodes its grid.z
        wanted = {tuple(int(lw.batch_coordinates(np.int64(t[3]), sizes)[a]) for a, _e in stage.batch) for t in tiles}
        run_stage(f"{name} staging {stage.src.tensor}", stage, sizes, mem, lw.index_width,
                  stage_blocks(stage, sizes, need, wanted))
    partials: dict[tuple, dict[tuple[int, int], dict[int, tuple]]] = {}  # a cluster split's, by tile and split
    paired = set(paired_loads(lw))  # loads read a pair at once: the second at the first's offset + 1
    # each block's column sums (a column sum in the epilogue): finished once every block has run, since the tile
    # rows' sums meet in one workspace whatever groups the blocks are run in (a window groups them by k range)
    column_sums: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []

    def epilogue(acc: np.ndarray, mc: np.ndarray, nc: np.ndarray, batch_at: Mapping[str, Any], where,
                 skipped: np.ndarray | None = None) -> None:
        coords = {**batch_at, "m": mc[:, :, None], "n": nc[:, None, :]}
        loads = {ld: read(name, a, coords, sizes, mem, lw.index_width, where) if i not in paired
                 else read_pair(name, a, coords, lw.fragment.pair, sizes, mem, lw.index_width, where)
                 for i, (ld, a) in enumerate(lw.epi_loads)}
        owned = (mc[:, :, None] < sizes[lw.m]) & (nc[:, None, :] < sizes[lw.n])
        at = condition_coordinates(coords)  # a mask compares the element's coordinates (habu/lower/conditions.py)

        def holds(e: Compare) -> np.ndarray:
            return condition_holds(e, at, sizes, mem)
        values = [eval_pointwise(e, lambda ld: acc if ld.tensor == ACC else loads[ld], f, sizes, holds) for e, _ in lw.stores]
        if skipped is not None:  # a window: the k tiles it skips change no stored value (habu.prove.window_terms)
            full = [eval_pointwise(e, lambda ld: (acc + skipped) % f.p if ld.tensor == ACC else loads[ld], f, sizes,
                                   holds) for e, _ in lw.stores]
            check_window(name, lw, values, full, owned, (mc, nc, batch_at), mem)
        for (_, access), value in zip(lw.extra_outs, values[:-1], strict=True):  # the chain's other outputs
            write(name, access, coords, value, sizes, mem, lw.index_width, False, owned, where)
        value = values[-1]
        # a scatter's element is the gathered row's, not the coordinates' (its masks and index check still hold)
        write(name, lw.out, coords, value, sizes, mem, lw.index_width, accumulate, None if scatter else owned, where)
        if lw.column_sum is not None:  # the chain's end, or a load, summed over the tile's rows (habu.prove.column_epilogue)
            summed = value if lw.column_sum.summand is None else loads[lw.column_sum.summand]
            column_sums.append(column_tile_sums(name, lw, np.broadcast_to(summed, acc.shape), mc, nc, sizes, mem))
    route = route_of(lw)
    for fault in (*route.faults, *tma_landing_faults(lw.pipeline, lw.operands)):
        mem.fault(f"{name}: {fault}")
    for (split, z, lrows, lcols, begin, end), mn in sorted(groups.items()):
        # the blocks of one batch: every access reads the batch positions at the decoded coordinates
        batch = {axis: np.int64(v) for axis, v in lw.batch_coordinates(np.int64(z), sizes).items()}
        tms = np.array([t[0] for t in mn], dtype=np.int64)
        tns = np.array([t[1] for t in mn], dtype=np.int64)
        m0, n0 = lw.tile_origin(tms, tns)  # the blocks' first rows and columns, as the kernel computes them
        mc = m0[:, None] + np.array(lrows)[None, :]  # (blocks, rows computed)
        nc = n0[:, None] + np.array(lcols)[None, :]
        acc = np.zeros((len(mn), len(lrows), len(lcols)), dtype=np.int64)

        def where(bad: np.ndarray, mc=mc, nc=nc, batch=batch) -> str:
            b = int(np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0][0]) if bad.ndim else 0
            first = {**{e: int(batch[a]) for e, a in zip(lw.batch, lw.batch_axes, strict=True)},
                     lw.m: int(mc[b, 0]), lw.n: int(nc[b, 0])}
            at = ", ".join(str(first.get(e, 0)) for e in lw.out.extents)
            return f"{lw.out.tensor}[{at}] and the rest of its {lw.bm}x{lw.bn} tile"
        # every k tile is loaded exactly as the kernel loads it (its own k0, masks and offsets, a TMA
        # operand box by box); the k step multiplies the tile its pipeline delivers to the stage it
        # reads (habu.prove.pipeline), and each element reaches each warp's product through the
        # shared-memory operand maps (`route`); the products of up to 64 tiles are then summed in one
        # exact contraction, which over GF(p) equals accumulating them one by one
        steps = max(0, int(end) - int(begin))
        ranks = tms % max(1, lw.kernel.cluster_m) if lw.pipeline is not None else np.zeros_like(tms)
        reads = {}
        for q in sorted(set(ranks.tolist())):
            reads[q], fault = delivered(lw.pipeline, steps, q)
            if fault is not None:
                mem.fault(f"{computing(where, np.ones((len(mn), 1), bool))}{name}'s k pipeline: {fault}")
        # the k tile each block's stage holds at step j (-1: none of this output tile's, poison)
        tile_at = [np.array([-1 if reads[q][j] is None else reads[q][j] for q in ranks.tolist()], dtype=np.int64)
                   for j in range(steps)]
        parts = list(warp_parts(route, bm, bn, lrows, lcols))
        batch_at = batch
        for first in range(0, steps, 64):
            check_deadline(f"in {name}'s k loop")
            batch = range(first, min(steps, first + 64))
            loaded: dict[tuple, np.ndarray] = {}  # warps that read the same elements share the load

            def load(side: str, mn: np.ndarray, k: np.ndarray, steps=batch, m0=m0, n0=n0, ranks=ranks,
                     tile_at=tile_at, where=where, begin=begin, loaded=loaded, at=batch_at) -> np.ndarray:
                key = (side, mn.tobytes(), k.tobytes(), mn.shape)
                if key not in loaded:
                    origin = m0 if side == "A" else n0
                    # blocks at one origin (rows or columns of the output) and one cluster rank load the same
                    # values (their stages hold the same k tiles): each such load is executed once
                    pair = np.stack([origin, ranks, *(t for t in tile_at)], axis=1) if tile_at else \
                        np.stack([origin, ranks], axis=1)
                    _, first, inverse = np.unique(pair, axis=0, return_index=True, return_inverse=True)
                    inverse = inverse.reshape(-1)

                    def where_one(bad: np.ndarray, inverse=inverse) -> str:
                        return where(bad[inverse] if bad.ndim else bad)
                    loaded[key] = np.concatenate(
                        [_k_tile(name, lw, side, origin[first][:, None, None] + mn[None], k, tile_at[j][first],
                                 ranks[first], begin, sizes, mem, where_one, at) for j in steps], axis=-1), inverse
                return loaded[key]

            for out_r, out_c, a_mn, a_k, b_mn, b_k in parts:
                (a, ia), (b, ib) = load("A", a_mn, a_k), load("B", b_mn, b_k)
                cell = (slice(None), out_r[:, None], out_c[None, :])
                acc[cell] = (acc[cell] + block_products(f, a, ia, b, ib)) % f.p
        if lw.reduction is not None:  # a cluster split: the partials meet in shared memory first
            for x, tile in enumerate(mn):
                partials.setdefault((z, lrows, lcols), {}).setdefault(tile, {})[split] = (acc[x], mc[x], nc[x])
            continue
        gap = skipped_ranges(lw, split, begin, end, sizes) if lw.window else []
        epilogue(acc, mc, nc, batch_at, where,
                 skipped_terms(name, lw, gap, mc, nc, batch_at, sizes, mem, read) if gap else None)
    if lw.reduction is not None:
        finish_cluster_split(name, lw, sizes, mem, partials, epilogue)
    if column_sums and all(part is not None for part in column_sums):
        total, mc, n = (np.concatenate(x) for x in zip(*column_sums, strict=True))
        finish_column_sums(name, lw, total, mc, n, sizes, mem)


def _k_tile(name: str, lw: ContractionLowering, side: str, rows: np.ndarray, kk: np.ndarray, tile: np.ndarray,
            ranks: np.ndarray, begin: int, sizes: Mapping[str, int], mem: Memory, where,
            batch: Mapping[str, Any] | None = None) -> np.ndarray:
    """The values of operand `side` a k step multiplies: `rows` (blocks, R, C) are the elements' rows
    (m or n) and `kk` (R, C) their k within the k tile, as the shared-memory operand route gives them;
    each block's stage holds its k tile `tile` (-1: a stage holding no tile of this output tile,
    poison). Without TMA the lanes load the access at k0 = k_origin; a TMA operand is its boxes, each
    read at the origin the lowering gives (box j of rows [j·box_rows, (j+1)·box_rows), at the box's k
    coordinate), landing in the block when it issues the box or is in the box's multicast mask, and
    zero past the access's masks (the tensor map's dims are `Access.bounded_extents`). `batch`: the
    blocks' batch coordinates (a TMA box is 1 along each)."""
    access = lw.a if side == "A" else lw.b
    axis = "m" if side == "A" else "n"
    ring = lw.pipeline
    load = ring.load(side) if isinstance(ring, MbarrierRing) else None
    local = rows % (lw.bm if side == "A" else lw.bn)  # rows within the tile
    row0 = rows - local
    kk = kk[None]
    t = np.maximum(tile, 0)  # a stage holding no tile: read tile 0's addresses, then poison the values
    if load is None:
        k0 = lw.k_origin(int(begin), t)[:, None, None]
        coords = {**(batch or {}), axis: rows, "k": k0 + kk}
        landed = np.ones(rows.shape, bool)
    else:
        assert isinstance(ring, MbarrierRing)
        row_box = local // load.box_rows
        k_box = kk // load.box_k if load.k_boxes > 1 else 0  # (boxes along k: a K-major tile of several spans)
        box = k_box * load.row_boxes + row_box  # the box holding the element, as the lowering numbers them
        first = load.origin(row0, load.k_coordinate(int(begin), t)[:, None, None], box)
        start, k = first if load.mn_major else (first[1], first[0])
        coords = {**(batch or {}), axis: start + local - row_box * load.box_rows, "k": k + kk - k_box * load.box_k}
        table = np.array([[any(load.lands_in(j, q, i) for i in range(ring.cluster)) for j in range(load.boxes)]
                          + [False] for q in range(ring.cluster)], dtype=bool)
        landed = table[ranks[:, None, None] % ring.cluster, np.minimum(box, load.boxes)]
    copy = getattr(lw.operands, "a_copy" if side == "A" else "b_copy", None) if load is None else None
    if copy is not None and copy.vector > 1:  # the lanes' vectors: each read under its first element's mask
        along = "k" if copy.k_inner else axis
        lane = kk if along == "k" else local  # the element's place in the tile (vectors start at multiples of theirs)
        values = read_vector(name, access, coords, along, coords[along] - lane % copy.vector, sizes, mem,
                             lw.index_width, where)
    else:
        values = read(name, access, coords, sizes, mem, lw.index_width, where)
    stale = (tile < 0)[:, None, None] | ~landed
    if np.any(stale):
        values = np.where(stale, mem.poison(np.broadcast_to(rows * 7919 + kk, values.shape)), values)
    return values


def _batch_index(lw: ContractionLowering, batch: Mapping[str, Any], sizes: Mapping[str, int]) -> Any:
    """The linear batch index of batch coordinates (the last varies fastest), and 0 unbatched."""
    z: Any = np.int64(0)
    for axis, extent in zip(lw.batch_axes, lw.batch, strict=True):
        z = z * sizes[extent] + batch[axis]
    return z


def _decode_all(lw: ContractionLowering, sizes: Mapping[str, int]) -> tuple[Any, Any, Any, Any, Any]:
    """(tm, tn, split, batch index, inside the batch grid) of every block of the grid, by the lowering's decode."""
    ids = np.arange(int(lw.tiles(sizes)), dtype=np.int64)
    batch, tm, tn, s = lw.decode(ids, sizes)
    inside = np.ones(ids.shape, bool)
    for axis, extent in zip(lw.batch_axes, lw.batch, strict=True):
        inside &= (batch[axis] >= 0) & (batch[axis] < sizes[extent])
    z = _batch_index(lw, batch, sizes)
    return tm, tn, s, np.broadcast_to(z, ids.shape), inside


def check_raster(name: str, lw: ContractionLowering, sizes: Mapping[str, int]) -> None:
    """Every tile of the grid (of every batch) is computed by exactly one block (per split)."""
    total = int(lw.tiles(sizes))
    tm, tn, s, z, inside = _decode_all(lw, sizes)
    tm_n, tn_n = int(lw.tiles_m(sizes)), int(lw.tiles_n(sizes))
    inside = inside & (tm >= 0) & (tm < tm_n) & (tn >= 0) & (tn < tn_n) & (s >= 0) & (s < lw.kernel.split_k)
    if not np.all(inside):
        i = int(np.nonzero(~inside)[0][0])
        at = ""
        if lw.batch:  # the output element the block would start at, to name it
            batch = lw.batch_coordinates(np.int64(z[i]), sizes)
            first = {**{e: int(batch[a]) for e, a in zip(lw.batch, lw.batch_axes, strict=True)},
                     lw.m: int(tm[i]) * lw.bm, lw.n: int(tn[i]) * lw.bn}
            at = f" (it would compute {lw.out.tensor}[{', '.join(str(first.get(e, 0)) for e in lw.out.extents)}] on)"
        raise PlanFault(f"{name}: block {i} maps to tile ({int(tm[i])}, {int(tn[i])}, split {int(s[i])}"
                        + (f", batch {int(z[i])}" if lw.batch else "") + f"), outside the grid{at}")
    flat = ((z * lw.kernel.split_k + s) * tm_n + tm) * tn_n + tn
    counts = np.bincount(flat, minlength=total)
    if np.any(counts != 1):
        missing = int(np.nonzero(counts == 0)[0][0]) if np.any(counts == 0) else None
        raise PlanFault(f"{name}: the raster order computes some tiles twice"
                        + (f" and never tile {divmod(missing % (tm_n * tn_n), tn_n)}" if missing is not None else ""))


def tile_ids(lw: ContractionLowering, sizes: Mapping[str, int], wanted: set[tuple[int, int, int]]
             ) -> list[tuple[int, int, int, int]]:
    """The (tm, tn, split, batch) of every block that computes one of the wanted (batch, tm, tn) tiles."""
    tm, tn, s, z, _inside = _decode_all(lw, sizes)
    out = []
    for a, b, c, d in zip(tm.tolist(), tn.tolist(), s.tolist(), z.tolist(), strict=True):
        if (d, a, b) in wanted:
            out.append((a, b, c, d))
    return out


def run_kernel(name: str, lw: Lowering, sizes: Mapping[str, int], mem: Memory, selection, keep=None) -> None:
    """Run the selected blocks; `keep` (per kernel kind) limits them to the lanes needed later."""
    check_deadline(f"before {name}")
    kind_proof(lw).run(name, lw, sizes, mem, selection, keep)


# ----------------------------------------------------------------------------- the contraction kind

# what the finite-field check reads of a contraction's schedule (the lowering's methods: tiles, k
# range, raster, grid): the fields the field table (habu/plan/plan.py) marks as read by the proof.
# The rest of the lowering (accesses, masks, staging passes, epilogue) is compared whole. Pipeline
# depth, warps, the instruction, how tiles travel (TMA, cp.async) and how the output leaves (store)
# are emission: they change no element any lane reads or writes.
FIELD_CHECK_FIELDS = fields_read_by(ContractionKernel, Reader.PROOF)


def _contraction_field_key(lw: ContractionLowering) -> object:
    # the pipeline (stages, barrier counts, boxes) is left out: every plan's own pipeline is
    # executed by the `pipeline-schedule` rule, which proves it delivers k tile t to step t (the
    # interpreter's tiles), so plans differing only in it compute the same elements; the
    # shared-memory operand maps enter through what they route (habu.prove.smem_route): maps
    # that multiply the plain tile product share the check, others are keyed by themselves; so does
    # the TMA-store epilogue (habu.prove.tma_store); the next kernel's boxes warmed into the L2 change no value
    return (tuple(getattr(lw.kernel, f) for f in FIELD_CHECK_FIELDS),
            repr(replace(lw, kernel=None, pipeline=None, operands=None, tma_store=None, warm=None)), route_key(lw),
            tma_store_key(lw))


def _run_contraction(name: str, lw: ContractionLowering, sizes: Mapping[str, int], mem: Memory, tiles, keep) -> None:
    rows, cols = keep if keep is not None else (None, None)
    run_contraction(name, lw, sizes, mem, tiles, rows, cols)


def _contraction_final(lw: ContractionLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    tms, tns = sample_tiles(int(lw.tiles_m(sizes))), sample_tiles(int(lw.tiles_n(sizes)))
    if lw.column_sum is not None or lw.window:  # a column sum adds every tile row of its column tiles; a window
        tms = list(range(int(lw.tiles_m(sizes))))  # is run on every tile (habu.prove.window_terms)
    if lw.window:
        tns = list(range(int(lw.tiles_n(sizes))))
    # a batched kernel: the first, second and last coordinate of each batch index, or, along a batch axis a staging
    # pass tiles, every coordinate of its first, second and last tile (each offset within a tile is a lane of it)
    tiled = {st.tile.axis: st.tile.across for st in lw.pre if st.tile is not None and st.tile.axis in lw.batch_axes}
    samples = [np.array([b for t in sample_tiles(-(-sizes[e] // tiled.get(a, 1)))
                         for b in range(t * tiled.get(a, 1), min((t + 1) * tiled.get(a, 1), sizes[e]))],
                        dtype=np.int64) for a, e in zip(lw.batch_axes, lw.batch, strict=True)]
    zs = sorted({int(_batch_index(lw, dict(zip(lw.batch_axes, combo, strict=True)), sizes))
                 for combo in itertools.product(*samples)})
    scatter = lw.store is Store.ATOMIC_ADD
    gathered = {p.axis for p in lw.out.positions if p.kind == "gather"} if scatter else set()
    # a scatter-add: any row (column) lands anywhere, so every tile along a gathered axis runs, and the
    # target's every row (column) there is compared
    tms = list(range(int(lw.tiles_m(sizes)))) if "m" in gathered else tms
    tns = list(range(int(lw.tiles_n(sizes)))) if "n" in gathered else tns
    wanted = {(z, a, b) for z in zs for a in tms for b in tns}
    rows = np.unique(np.concatenate([np.arange(t * lw.bm, min((t + 1) * lw.bm, sizes[lw.m])) for t in tms]))
    cols = np.unique(np.concatenate([np.arange(t * lw.bn, min((t + 1) * lw.bn, sizes[lw.n])) for t in tns]))
    extents = lw.out.extents  # the output's own dims (not the lowering's, which a planted bug may permute)
    batch_dims = iter(samples)  # the output's batch dims come in the batch's order (the lhs order)
    box = []
    for e, p in zip(extents, lw.out.positions, strict=True):
        if scatter and p.kind == "gather":  # the target's rows (the gather's range), whatever their extent
            box.append(np.arange(sizes[e]))
        elif p.kind == "axis" and [lw.m, lw.n, *lw.batch].count(e) > 1:
            # an extent of several of the kernel's axes (A·Aᵀ: m and n; a batch over n's extent): the dim's own axis
            box.append(rows if p.axis == "m" else cols if p.axis == "n" else next(batch_dims))
        else:
            box.append(rows if e == lw.m else cols if e == lw.n else next(batch_dims))
    batches = f", batches {[s.tolist() for s in samples]}" if lw.batch else ""
    return wanted, tuple(box), f"tiles m {tms} × n {tns}, all {lw.kernel.split_k} split(s){batches}"


def _contraction_for_box(lw: ContractionLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]
                         ) -> tuple[object, object, str]:
    by_axis = {p.axis: box[i] for i, p in enumerate(lw.out.positions)}
    if lw.store is Store.ATOMIC_ADD:  # a scatter's target rows come from any row: every row of m
        by_axis = {**by_axis, **{p.axis: np.arange(sizes[lw.m] if p.axis == "m" else sizes[lw.n])
                                 for p in lw.out.positions if p.kind == "gather"}}
    whole = lw.column_sum is not None or bool(lw.window)  # every tile row (a window: every tile)
    tms = list(range(int(lw.tiles_m(sizes)))) if whole else np.unique(by_axis["m"] // lw.bm).tolist()
    tns = list(range(int(lw.tiles_n(sizes)))) if lw.window else np.unique(by_axis["n"] // lw.bn).tolist()
    zs = {int(_batch_index(lw, dict(zip(lw.batch_axes, combo, strict=True)), sizes))
          for combo in itertools.product(*(np.unique(by_axis[a]).tolist() for a in lw.batch_axes))}
    tiles = {(z, a, b) for z in zs for a in tms for b in tns}
    return tiles, (by_axis["m"], by_axis["n"]), (f"{len(tms)}×{len(tns)} tiles, "
                                                 f"{len(by_axis['m'])}×{len(by_axis['n'])} of their elements")


def _contraction_axes(name: str, lw: ContractionLowering) -> list[TileAxis]:
    out = [TileAxis(name, "m", lw.m, lw.bm), TileAxis(name, "n", lw.n, lw.bn), TileAxis(name, "k", lw.k, lw.bk)]
    if lw.kernel.cluster_m > 1:
        # a cluster's blocks take c tiles of m together: the witness keeps ⌈M/BM⌉ a multiple
        # of c (its size is ≡ M modulo BM·c) and every class of the clusters' row groups
        out.append(TileAxis(name, "m (clusters)", lw.m, lw.bm * lw.kernel.cluster_m))
    for stage in lw.pre:  # a staging pass's blocks: along k (to the padded row), its rows, a tiled batch axis
        out.append(TileAxis(f"{name} staging", "k", stage.k, stage.step_k))
        if stage.step_rows > 1:
            out.append(TileAxis(f"{name} staging", stage.row_axis, stage.rows, stage.step_rows))
        if stage.tile and stage.tile.axis != stage.row_axis:
            out.append(TileAxis(f"{name} staging", stage.tile.axis, dict(stage.batch)[stage.tile.axis],
                                stage.tile.across))
    return out


register_kind(ContractionLowering, KindProof(
    run=_run_contraction, final_selection=_contraction_final, box_selection=_contraction_for_box,
    blocks=tile_ids, precheck=check_raster, tiled_axes=_contraction_axes, field_key=_contraction_field_key))
