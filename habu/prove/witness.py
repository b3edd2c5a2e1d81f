"""A smaller shape on which the finite-field check sees every tile class of the full shape.

Along an extent E that kernels tile by sizes T1, T2, … (tiles, k steps, row chunks, vector widths,
the extent's declared multiple, the rows a cluster's blocks take together), let L = lcm(T1, T2, …).
Every tile of every kernel along E then has one of these classes: the first tile, an interior full
tile, and the last tile with E mod Ti valid lanes. The witness size E' = (E mod L) + q·L with q ≥ 3
has all of them (the first, interior ones, the same ragged last tile), so the check at E' executes
every class. `prove_coverage` asks z3 for a tile of the full shape whose class no tile of the
witness has; unsat is the proof.

Sizes keep their equalities (if K = N at the full shape, K' = N' in the witness, and if K ≠ N then
K' ≠ N'), so a stride or bound taken from the wrong extent shows as it would at full size.
Extents are never reduced where it would hide something: those of a tensor whose offsets pass
2^31 − 1 (the int32 wrap must be executed, unless every kernel computes its offsets in 64 bits or
forms none of that tensor's: `KindProof.offset_tensors`) and
the extents of a map kernel (its lanes run over the flattened shape). Under split-K, k is reduced only to a size whose splits have every class the full
shape's splits have (first, last, empty, holding fewer k tiles than the others, holding the ragged
last k tile); there are few splits, so both sides are enumerated (`split_coverage`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import z3

from habu.lower import ContractionLowering, Lowering
from habu.prove.kinds import TileAxis, kind_proof
from habu.prove.z3_context import check
from habu.spec.ir import Model

Q = 3  # full tiles kept: the first, an interior one, and one before the ragged end
INT31 = 2**31 - 1


def tiled_axes(names: list[str], lowerings: list[Lowering]) -> list[TileAxis]:
    """Every kernel's tiled loops (its kind's `tiled_axes`)."""
    return [ax for name, lw in zip(names, lowerings, strict=True) for ax in kind_proof(lw).tiled_axes(name, lw)]


def _frozen(model: Model, lowerings: list[Lowering], sizes: Mapping[str, int]) -> set[str]:
    frozen: set[str] = set()
    for lw in lowerings:
        frozen.update(kind_proof(lw).frozen_extents(lw))
    narrow = [kind_proof(lw).offset_tensors(lw) for lw in lowerings if getattr(lw, "index_width", 32) != 64]
    if not narrow:
        return frozen  # every offset is computed in 64 bits: no int32 wrap to execute at the full shape
    for t in (*model.inputs, *model.outputs, *model.intermediates):
        n = 1
        for e in t.extents:
            n *= sizes[e]
        # (a tensor no 32-bit kernel forms offsets of, such as weights TMA loads by coordinates, wraps nowhere)
        if n > INT31 and any(names is None or t.name in names for names in narrow):
            frozen.update(t.extents)
    return frozen


def witness_sizes(model: Model, names: list[str], lowerings: list[Lowering],
                  sizes: Mapping[str, int]) -> dict[str, int]:
    axes = tiled_axes(names, lowerings)
    lcm: dict[str, int] = {e.name: max(1, e.multiple) for e in model.extents}
    for ax in axes:
        if not ax.flat:
            lcm[ax.extent] = math.lcm(lcm[ax.extent], ax.tile)
    frozen = _frozen(model, lowerings, sizes)
    out = dict(sizes)
    taken: set[int] = set()
    by_size: dict[int, list[str]] = {}
    for e in model.extents:
        by_size.setdefault(sizes[e.name], []).append(e.name)
    for full in sorted(by_size):  # frozen and unreduced sizes first keep their values
        if any(g in frozen for g in by_size[full]):
            taken.add(full)

    def reduced(full: int, q: int) -> int:
        """The group of size `full` at q full tiles past its residue: the least such size ≥ q that
        keeps sizes distinct, split-K's split classes and a runtime extent's range; `full` if none."""
        group = by_size[full]
        L = math.lcm(*(lcm[g] for g in group))
        r = full % L
        w = r + q * L
        # distinct sizes stay distinct; split-K's splits keep their classes
        while w < full and (w in taken or (w in by_size and w != full)
                            or not _same_splits(lowerings, group, full, w)):
            q += 1
            w = r + q * L
        ext = [model.extent(g) for g in group]
        # a runtime extent keeps the witness inside its declared range (a size bucket's); one the plan
        # narrowed to a single size (lo = hi: `planned_model`) reduces as a static extent does
        if w >= full or any(not x.is_static and x.lo != x.hi and not x.admits(w) for x in ext):
            return full
        return w

    quota: dict[int, int] = {}
    for full in sorted(by_size):
        w = full if any(g in frozen for g in by_size[full]) else reduced(full, Q)
        quota[full] = Q if w < full else 0
        taken.add(w)
        for g in by_size[full]:
            out[g] = w
    def assign(full: int, q: int) -> None:
        taken.discard(out[by_size[full][0]])
        quota[full] = q
        w = reduced(full, q)
        taken.add(w)
        for g in by_size[full]:
            out[g] = w

    # a flat axis: grow its reduced extents until it has Q blocks and the full's raggedness (at worst every extent
    # grows to its full size, where the classes are the full shape's); a later axis growing an extent they share
    # can spoil an earlier one's raggedness (the attention backward at #D = 1: dV grew #J, dK's last block went
    # ragged), so the axes are gone over again until none is short (each growth raises a quota: it ends)
    while any(_flat_short(ax, sizes, out) for ax in axes):
        before = dict(out)
        _grow_flat_axes(axes, sizes, out, by_size, quota, reduced, assign)
        if out == before:  # nothing left to grow (every short axis's extents at their full sizes)
            break
    return out


def _grow_flat_axes(axes: list[TileAxis], sizes: Mapping[str, int], out: dict[str, int],
                    by_size: Mapping[int, list[str]], quota: Mapping[int, int], reduced: Any, assign: Any) -> None:
    """One pass over the flat axes, growing each short one's reduced extents (`witness_sizes`)."""
    for ax in axes:
        while _flat_short(ax, sizes, out):
            grow = sorted({sizes[e] for e in ax.flat if out[e] < sizes[e]})
            if not grow:
                break
            best: tuple[int, int, int] | None = None  # (the axis's witness size, group, quota) growing one group
            for full in grow:
                for q in range(quota[full] + 1, quota[full] + 65):
                    w = reduced(full, q)
                    trial = {**out, **dict.fromkeys(by_size[full], w)}
                    if w >= full or not _flat_short(ax, sizes, trial):
                        if best is None or ax.size(trial) < best[0]:
                            best = (ax.size(trial), full, q)
                        break
            if best is not None:
                assign(best[1], best[2])
            else:  # no one group suffices within 64 steps: the smallest grows the product most
                full = min(grow, key=lambda f: out[by_size[f][0]])
                assign(full, quota[full] + 1)


def _flat_short(ax: TileAxis, full: Mapping[str, int], witness: Mapping[str, int]) -> bool:
    """Whether a flat axis's witness lacks blocks of the full shape: fewer than Q (or than the full
    count), or no ragged last block where the full shape's last is ragged."""
    if not ax.flat:
        return False
    size, small = ax.size(full), ax.size(witness)
    count, have = -(-size // ax.tile), -(-small // ax.tile)
    return have < min(count, Q) or (size % ax.tile != 0) != (small % ax.tile != 0)


def _split(lw: Lowering) -> bool:  # split-K is the contraction kind's
    return isinstance(lw, ContractionLowering) and lw.kernel.split_k > 1


def split_classes(size: int, tile: int, splits: int) -> set[tuple[bool, bool, str, bool]]:
    """Each split's class along k: (first split, last split, how many k tiles it sums — "none",
    "fewer" or "all" of the per-split count — and whether it holds the ragged last k tile)."""
    k_tiles = -(-size // tile)
    per = -(-k_tiles // splits)
    out = set()
    for s in range(splits):
        count = max(0, min(per, k_tiles - s * per))
        holds_last = s * per < k_tiles <= (s + 1) * per
        out.add((s == 0, s == splits - 1, "none" if count == 0 else "all" if count == per else "fewer",
                 holds_last and size % tile != 0))
    return out


def _same_splits(lowerings: list[Lowering], group: list[str], full: int, w: int) -> bool:
    return all(split_classes(full, lw.bk, lw.kernel.split_k) <= split_classes(w, lw.bk, lw.kernel.split_k)
               for lw in lowerings if _split(lw) and lw.k in group)


def split_coverage(names: list[str], lowerings: list[Lowering], full: Mapping[str, int],
                   witness: Mapping[str, int]) -> list[str]:
    """For every split-K kernel: each split class of the full shape is one the witness has (both
    sets enumerated; a kernel has a handful of splits). Raises AssertionError otherwise."""
    lines = []
    for name, lw in zip(names, lowerings, strict=True):
        if not _split(lw):
            continue
        size, small, splits = full[lw.k], witness[lw.k], lw.kernel.split_k
        want, have = split_classes(size, lw.bk, splits), split_classes(small, lw.bk, splits)
        if not want <= have:
            raise AssertionError(f"{name}: a split of k at #{lw.k} = {size} has a class the witness "
                                 f"({small}) lacks: {sorted(want - have)}")
        lines.append(f"{name} split-K: {splits} splits of k tiles of {lw.bk} over #{lw.k} = {size}; witness "
                     f"{small} has all {len(want)} split classes (enumerated)")
    return lines


def _classes(size: int, tile: int) -> set[tuple[bool, bool, int]]:
    count = -(-size // tile)
    return {(t == 0, t == count - 1, min(tile, size - t * tile)) for t in range(count)} if count <= 8 else \
        {(t == 0, t == count - 1, min(tile, size - t * tile)) for t in (0, 1, 2, count - 2, count - 1)}


def prove_coverage(axes: list[TileAxis], full: Mapping[str, int], witness: Mapping[str, int]) -> list[str]:
    """For every tiled loop, z3 proves each tile of the full shape has the class of a witness tile.
    Returns one line per loop; raises AssertionError if some class is missing. A flat axis's classes
    are (first, last, ragged): its blocks' threads depend on their own elements only."""
    lines = []
    for ax in axes:
        size, tile = ax.size(full), ax.tile
        small = ax.size(witness)
        count = -(-size // tile)
        have = _classes(small, tile)
        t = z3.Int("t")
        first, last = t == 0, t == count - 1
        valid = z3.If(size - t * tile < tile, size - t * tile, tile)
        s = z3.Solver()
        s.add(t >= 0, t < count)
        for f, lst, v in have:
            same = (valid < tile) == (v < tile) if ax.flat else valid == v
            s.add(z3.Not(z3.And(first == f, last == lst, same)))
        if check(s) == z3.sat:
            bad = s.model()[t]
            raise AssertionError(f"{ax.kernel}: tile {bad} along {ax.axis} (#{ax.extent}) has a class the "
                                 "witness lacks")
        over = "·".join(f"#{e}" for e in ax.flat) if ax.flat else f"#{ax.extent}"
        lines.append(f"{ax.kernel} {ax.axis}: {count} tiles of {tile} over {over} = {size}; "
                     f"witness {small} has all {len({(f, lst, v < tile) for f, lst, v in have}) if ax.flat else len(have)} "
                     "classes (z3: unsat)")
    return lines
