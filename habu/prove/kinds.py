"""What the finite-field check needs of each kernel kind, registered by the kind's own module.

A kernel kind (contraction, row, map, general, column) is a lowering type. The check (habu.prove.verify),
the witness shape (habu.prove.witness) and the field key ask `kind_proof(lowering)` instead of telling
kinds apart: each interpreter module (interp.py, interp_rows.py, interp_general.py, interp_columns.py)
calls `register_kind` for its lowering types at import, and habu/prove/__init__.py imports them all.
A new kind adds its interpreter module with one `register_kind` call and one import line there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Sizes = Mapping[str, int]
Selection = tuple[object, Any, str]  # (the blocks, a box or the lanes to keep, a line for the certificate)


@dataclass(frozen=True)
class TileAxis:
    """One tiled loop of a kernel along an extent, for the coverage proof (habu.prove.witness)."""

    kernel: str
    axis: str
    extent: str  # for a flat axis, its innermost extent
    tile: int
    # a flat axis: the blocks tile the row-major flattening of these extents (a general kernel's output),
    # and a block's class is (first, last, ragged); each thread's work depends on its own element only,
    # so the ragged last block's count of valid lanes is not a class of its own
    flat: tuple[str, ...] = ()

    def size(self, sizes: Mapping[str, int]) -> int:
        """The loop's extent: its extent's size, or the product of a flat axis's."""
        return math.prod(sizes[e] for e in self.flat) if self.flat else sizes[self.extent]


def _no_axes(name: str, lw: Any) -> list[TileAxis]:
    return []


def _no_extents(lw: Any) -> Iterable[str]:
    return ()


def _nothing(name: str, lw: Any, sizes: Sizes) -> None:
    return None


def _same_blocks(lw: Any, sizes: Sizes, selection: object) -> object:
    return selection


def _no_keep(lw: Any, sizes: Sizes) -> object:
    return None


@dataclass(frozen=True)
class KindProof:
    """One kernel kind's part of the finite-field check.

    run: execute the selected blocks, `(name, lw, sizes, memory, blocks, keep)` (keep: the lanes a
        later check needs, or None for all).
    final_selection: for a kernel writing a model output, `(lw, sizes) -> (blocks, output box, text)`:
        the blocks of every tile class and the output elements they cover.
    box_selection: for a kernel whose output a later kernel reads, `(lw, box, sizes) -> (blocks, keep,
        text)`: the blocks covering a demanded box and the lanes of them it needs.
    final_keep: the lanes to keep of the `final_selection` blocks (default: all).
    blocks: turns a selection into what `run` executes (default: the selection itself).
    precheck: a check of the whole grid before any block runs (raises PlanFault).
    tiled_axes: the kernel's tiled loops, which the witness shape keeps every class of.
    frozen_extents: extents the witness never reduces for this kernel (checked at full size).
    offset_tensors: the tensors whose element offsets a 32-bit kernel forms in 32 bits (a tensor past
        2^31 − 1 elements among them keeps its full extents in the witness, where the wrap is executed);
        None: every tensor (the default; a kernel that addresses some tensor otherwise, by TMA coordinates,
        names the others).
    field_key: what of the lowering enters the field key (default: all of it, `repr`).
    exp_field: the kernel relies on exp(a + b) = exp(a)·exp(b) (an online softmax): the check runs over
        Z_q × GF(p) (habu.spec.field_exp) instead of GF(p) with exp uninterpreted.
    length_ranges: the value ranges of the index tensors that bound a mask (sequence lengths): the check draws
        half of such a tensor's values at the range's last value (a whole sequence visible), so that the
        checked sequences reach the kernel's last KV tiles and splits (`habu.prove.virtual.VirtualTensor`).
    """

    run: Callable[..., None]
    final_selection: Callable[[Any, Sizes], Selection]
    box_selection: Callable[[Any, tuple[np.ndarray, ...], Sizes], Selection]
    final_keep: Callable[[Any, Sizes], object] = _no_keep
    blocks: Callable[[Any, Sizes, object], object] = _same_blocks
    precheck: Callable[[str, Any, Sizes], None] = _nothing
    tiled_axes: Callable[[str, Any], list[TileAxis]] = _no_axes
    frozen_extents: Callable[[Any], Iterable[str]] = _no_extents
    offset_tensors: Callable[[Any], Iterable[str] | None] = lambda lw: None
    field_key: Callable[[Any], object] = repr
    exp_field: bool = False
    length_ranges: Callable[[Any], Iterable[str]] = _no_extents


_KINDS: dict[type, KindProof] = {}


def register_kind(lowering_type: type, proof: KindProof) -> None:
    """Called once by the module that interprets `lowering_type`."""
    _KINDS[lowering_type] = proof


def kind_proof(lw: Any) -> KindProof:
    """The registered proof parts of a lowering's kind."""
    proof = next((_KINDS[t] for t in type(lw).__mro__ if t in _KINDS), None)  # a subclass is its base's kind
    if proof is None:
        raise TypeError(f"no finite-field check is registered for {type(lw).__name__} "
                        "(its interpreter module calls habu.prove.kinds.register_kind)")
    return proof


def sample_tiles(count: int) -> list[int]:
    """The tiles standing for all `count` along one grid dimension: the first, the second, the last."""
    return sorted({0, min(1, count - 1), count - 1})


def flat_blocks(lw: Any, box: tuple[np.ndarray, ...], sizes: Sizes) -> Selection:
    """The blocks of a kernel whose blocks take `lw.per_block` consecutive elements of the flattened
    `lw.extents` that hold a box, and the box's flat indices (the lanes to keep)."""
    dims = [sizes[e] for e in lw.extents]
    grids = np.meshgrid(*box, indexing="ij")
    flat = np.ravel_multi_index(tuple(g.ravel() for g in grids), dims) if dims else np.zeros(1, np.int64)
    blocks = np.unique(flat // lw.per_block)
    return blocks, flat, f"{len(blocks)} blocks"
