"""The boxes of elements the finite-field check runs and compares (habu/prove/verify.py): which outputs' elements
a trial samples (`demand`: what the outputs' boxes read of every intermediate, through the model's loads), the
elements a kernel stores for a box of its blocks (`stored_boxes`) and the box an earlier kernel's blocks must
cover (`demanded_box`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from habu.lower import ColumnLowering, RowLowering
from habu.lower.stores import statistic_box, stored_accesses
from habu.prove.column_epilogue import column_boxes, column_demand
from habu.prove.interp_general import vector_span
from habu.spec.ir import IndexConst, IndexVar, Model, loads


def _covers(a: np.ndarray, b: np.ndarray) -> bool:
    """`a` is a run of consecutive integers (an `arange`) that holds every element of `b`."""
    return len(a) > 0 and int(a[-1]) - int(a[0]) + 1 == len(a) and (
        len(b) == 0 or (int(b.min()) >= int(a[0]) and int(b.max()) <= int(a[-1])))


def _union(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    """The sorted union of two boxes' coordinates (each sorted and unique): without sorting them again
    where one already holds the other (a full extent's `arange`, sixteen million long for a 1-D model)."""
    if a is None:
        return b
    if _covers(a, b):
        return a
    if _covers(b, a):
        return b
    return np.union1d(a, b)


def demand(model: Model, out_boxes: dict[str, tuple[np.ndarray, ...]], sizes: Mapping[str, int],
           whole_rows: Mapping[str, tuple[int, int]] | None = None,
           whole_columns: Mapping[str, tuple[int, int]] | None = None,
           whole_vectors: Mapping[str, int] | None = None,
           whole_tiles: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, tuple[np.ndarray, ...]]:
    """The elements of every intermediate that the given output elements depend on (a box per tensor).
    `whole_rows`: the nodes a row kernel computes, with their leading (row) axes and the rows a block computes: the
    kernel computes the whole row of each demanded row, so it reads its inputs along every column (`Y =
    COLSUM(TANH(X·COLSUM(X)) + ...)`: the row kernel of X·COLSUM(X) read COLSUM's values at columns the column
    kernel's box left out; found by a fuzz), and every row of each block that holds one (`row_blocks_box`).
    `whole_columns`: the nodes a column kernel computes, with the extent of their column and a tile's columns:
    the kernel computes every column of each tile that holds a demanded one, reading its inputs there (fuzz seed
    13843: %h2's 64-column tile read %h1 at columns %h1's sampled 16-column tiles left out). `whole_vectors`: the
    nodes a general kernel computes in vectors of that many elements along the last axis: a lane computes its
    whole vector, reading its inputs there (fuzz model 8322: %h1's lanes of 2 read %h6 at columns %h6's box left
    out, and the check refused the right plan). `whole_tiles`: what a contraction with a k window stores, with the
    positions of its m and n axes: the check runs every row and column of its tiles (habu.prove.window_terms),
    reading its operands there (fuzz attention 7311: dV.in's rows read %h3 at rows %h3's box left out)."""
    boxes: dict[str, tuple[np.ndarray, ...]] = dict(out_boxes)
    produced = {eq.target for eq in model.nodes}  # intermediates, and outputs a later node reads
    for eq in reversed(model.nodes):
        if eq.target not in boxes:
            continue
        rows = (whole_rows or {}).get(eq.target)
        if rows is not None and eq.scatter is None:
            lead, per_block = rows
            box = row_blocks_box(boxes[eq.target][:lead], tuple(sizes[v.extent] for v in eq.lhs[:lead]), per_block)
            boxes[eq.target] = (*box, *(np.arange(sizes[v.extent]) for v in eq.lhs[lead:]))
        column, tile = (whole_columns or {}).get(eq.target, ("", 1))
        at = [i for i, v in enumerate(eq.lhs) if v.extent == column]
        pos = at[0] if len(at) == 1 else -1
        if pos >= 0 and eq.scatter is None:  # the tiles of one axis: blocks of `tile` columns
            box = list(boxes[eq.target])
            (box[pos],) = row_blocks_box((box[pos],), (sizes[eq.lhs[pos].extent],), tile)
            boxes[eq.target] = tuple(box)
        vector = (whole_vectors or {}).get(eq.target, 1)
        if vector > 1 and eq.lhs and eq.scatter is None:  # whole vectors along the last axis
            box = list(boxes[eq.target])
            box[-1] = vector_span(box[-1], vector, sizes[eq.lhs[-1].extent])
            boxes[eq.target] = tuple(box)
        whole = (whole_tiles or {}).get(eq.target, ())
        if whole and eq.scatter is None:  # every row and column of a windowed contraction's tiles
            boxes[eq.target] = tuple(np.arange(sizes[v.extent]) if i in whole else b
                                     for i, (v, b) in enumerate(zip(eq.lhs, boxes[eq.target], strict=True)))
        # the target's box along each position its store indexes by a plain variable; a scatter's
        # gathered positions (Y[IX[r] n]) leave their variable unrestricted: any r may land in the box
        var_sets = {ix: boxes[eq.target][i] for i, ix in enumerate(eq.store_indices) if isinstance(ix, IndexVar)}
        for ld in loads(eq.rhs):
            decl = model.tensor(ld.tensor)
            if decl.name not in produced or decl.name == eq.target:
                continue
            dims = []
            for pos, ix in enumerate(ld.indices):
                if isinstance(ix, IndexVar) and ix in var_sets:
                    dims.append(var_sets[ix])
                elif isinstance(ix, IndexConst):
                    dims.append(np.array([ix.value]))
                else:
                    dims.append(np.arange(sizes[decl.extents[pos]]))
            old = boxes.get(ld.tensor)
            boxes[ld.tensor] = tuple(_union(old[i] if old else None, d) for i, d in enumerate(dims))
    return boxes


def row_blocks_box(leading: tuple[np.ndarray, ...], dims: tuple[int, ...], per_block: int) -> tuple[np.ndarray, ...]:
    """The smallest box over the leading axes `dims` that holds `leading` and every row of each block of `per_block`
    rows (row-major) that holds one of its rows: a row kernel's block computes all its rows, reading their inputs.
    (Fuzz seed 9140: rows (p, q) of 13 × 13 in blocks of 4; the sampled box p ∈ {0, 12} put row (0, 12) in block 3,
    which also computes (1, 0)..(1, 2) and read the per-row values %h1[1] no earlier kernel had computed.)"""
    box = tuple(np.unique(b) for b in leading)
    if per_block <= 1 or any(len(b) == 0 for b in box):
        return box
    total = int(np.prod(dims))
    while True:
        flat = np.ravel_multi_index(tuple(g.ravel() for g in np.meshgrid(*box, indexing="ij")), dims)
        held = (np.unique(flat // per_block)[:, None] * per_block + np.arange(per_block)).ravel()
        coords = np.unravel_index(held[held < total], dims)
        grown = tuple(np.union1d(b, c) for b, c in zip(box, coords, strict=True))
        if all(len(g) == len(b) for g, b in zip(grown, box, strict=True)):
            return box
        box = grown


def stored_boxes(model: Model, lw: object, nodes: tuple[str, ...], box: tuple[np.ndarray, ...]
                 ) -> dict[str, tuple[np.ndarray, ...]]:
    """The box of each tensor the kernel computes, given its output's: the plan's nodes, not only what the
    lowering stores (a statistic whose store is skipped is compared, and found missing); a row kernel's
    statistic (one value a row: R1[r]) has the rows' box."""
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for t in dict.fromkeys((*nodes, *(a.tensor for a in stored_accesses(lw)))):
        per_row = isinstance(lw, RowLowering) and len(model.tensor(t).extents) == len(lw.leading)
        # a column kernel's sum before the epilogue stores it in a broadcast shape (`G[n]`, then `dB[0 n]`)
        unbroadcast = isinstance(lw, ColumnLowering) and len(model.tensor(t).extents) < len(box)
        out[t] = (box[:len(lw.leading)] if per_row and t != lw.out.tensor  # type: ignore[attr-defined]
                  else (box[lw.column_position],) if unbroadcast else statistic_box(lw, t, box))
    return {**out, **column_boxes(model, lw, box)}  # a contraction's column sum: its columns (row 0 of a bias)


def demanded_box(model: Model, lw: object, nodes: tuple[str, ...], boxes: dict[str, tuple[np.ndarray, ...]],
                 sizes: Mapping[str, int]) -> tuple[np.ndarray, ...] | None:
    """The box of the kernel's output whose blocks compute every demanded element of what it computes (a
    row kernel's statistics demand their rows), or None where nothing of it is demanded."""
    if not isinstance(lw, RowLowering):  # (a column sum's nodes demand their columns: habu.prove.column_epilogue)
        return column_demand(lw, boxes, sizes, boxes.get(lw.out.tensor))  # type: ignore[attr-defined]
    n = len(lw.leading)
    parts = [boxes[t] for t in stored_boxes(model, lw, nodes, ()) if t in boxes]
    if not parts:
        return None
    leading = []
    for i in range(n):
        u = None
        for b in parts:
            u = _union(u, b[i])
        leading.append(u)
    tail = () if lw.per_row else boxes.get(lw.out.tensor, (None,) * n + (np.arange(sizes[lw.c]),))[n:]
    return (*leading, *tail)


def wider_box(box: tuple[np.ndarray, ...], than: tuple[np.ndarray, ...]) -> bool:
    return any(not np.isin(a, b).all() for a, b in zip(box, than, strict=True))


# ----------------------------------------------------------------------------- degree
