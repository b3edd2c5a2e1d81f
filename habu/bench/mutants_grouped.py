"""Planted bugs in the grouped family's backward forms: the wgmma loop over n-major weights (`W[E[r] k n]`, a
derived MoE backward's products through the transposed expert weights: habu/lower/grouped_wgmma.py reads them in
64-column TMA boxes) and the grouped weight gradient (`O[E[r] m n] += A[r m] · B[IX[r] n]`:
habu/lower/grouped_wgrad.py). The maps are the lowering's, which the emitter prints and the finite-field check
runs, so a plan whose boxes land at the wrong columns, whose f32 parts are read twice or whose group's end is
unmasked must be killed (habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import fields, replace

from habu.bench.mutant_plants import grouped
from habu.lower import GroupedLowering, GroupedWgradLowering, Lowering
from habu.lower.grouped_wgrad import WgradLoop

GROUPED_N_MAJOR = "../tests/data/grouped_n_major.habu"
GROUPED_WGRAD = "../tests/data/grouped_wgrad.habu"
GROUPED_SCATTER = "../tests/data/grouped_scatter.habu"
SHAPE = {"T": 30, "R": 200}


def wgrad(f):
    """A plant in a grouped weight gradient's lowering."""
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, GroupedWgradLowering) and lw.loop is not None
        return f(lw)
    return g


def _loop(lw: GroupedWgradLowering, **methods) -> GroupedWgradLowering:
    cls = type("Planted_wgrad_loop", (WgradLoop,), methods)
    return replace(lw, loop=cls(**{f.name: getattr(lw.loop, f.name) for f in fields(lw.loop)}))


def parts_read_from_the_hi_block(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """Both of an f32 A's instructions read the hi part's block: every product counted twice, the lo part never."""
    return _loop(lw, part_slab=lambda self, q, part: q * self.parts)


def group_end_unmasked(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The k tile's rows past the group's end kept: the next group's rows added into this group's slab."""
    cls = type("Planted_wgrad", (GroupedWgradLowering,), {"row_inside": lambda self, row, end: row < row + 1})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def held_tile_one_behind(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """A scaled A held two k tiles deep stores the registers it loaded at this step (`load_tile` without the step
    between): each stage holds A's rows of the k tile before B's."""
    return _loop(lw, load_tile=lambda self, step: step)


def staged_halves_swapped(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """A staged f32 A (`wgrad_copy` staged): the producer copies each chunk's two halves into each other's units,
    so the consumers split columns 4..7 of each chunk as 0..3 and the reverse."""
    return _loop(lw, a_landed_offset=lambda self, m, k, half=0: WgradLoop.a_landed_offset(self, m, k, 1 - half))


def split_halves_swapped(lw: GroupedLowering) -> GroupedLowering:
    """An f32 A split by the consumers (`a_split` consumers): the producer copies each chunk's two raw halves into
    each other's places, so the consumers split k + 4..7 of each chunk as k..k + 3."""
    assert lw.wgmma is not None
    base = type(lw.wgmma)
    cls = type("Planted_landing", (base,),
               {"a_landed_offset": lambda self, i, k, half=0: base.a_landed_offset(self, i, k, 1 - half)})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


def search_one_round(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The grouped weight gradient's offsets found by one round of the warp's search where the rows take two: a
    group's first row is the first of a part of rows, not of the group."""
    cls = type("Planted_wgrad_search", (GroupedWgradLowering,), {"search_rounds": lambda self, rows: 1})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def indices_a_tile_too_far(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The staged producer copies its gather's indices one k tile further ahead than its index ring is deep: each k
    tile's rows gathered through the indices of another tile (the first through a slot never filled)."""
    return _loop(lw, index_tile=lambda self, step: step + self.index_depth + 1)


def index_wait_one_short(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The staged producer's wait for its copies of a k tile's indices leaves one group more in flight: it reads the
    tile's indices before their copies surely landed."""
    return _loop(lw, index_wait=lambda self: self.index_depth)


def walk_from_the_next_item(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The persistent blocks each start one work item further (`walk`): item 0 (group 0's first tile) is never added,
    and the block after the last adds one past the work."""
    cls = type("Planted_wgrad_walk", (GroupedWgradLowering,),
               {"walk": lambda self, block, blocks, items: (block + 1, items + 1, blocks)})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def index_copied_past_the_item(lw: GroupedWgradLowering) -> GroupedWgradLowering:
    """The persistent producer copies the indices of the k tiles past a work item's last (`index_staged` always
    true): those copies, still in flight, take the slots of the next item's first tiles, and either copy may land
    last."""
    return _loop(lw, index_staged=lambda self, tile, k_tiles: tile < tile + 1)


def boxes_at_first_column(lw: GroupedLowering) -> GroupedLowering:
    """An n-major W's 64-column boxes all at the tile's first column (the box's offset n0 + box·64 dropped):
    the tile's later columns multiply its first 64 columns' weights."""
    assert lw.wgmma is not None
    base = type(lw.wgmma)
    cls = type("Planted_w_box_origin", (base,),
               {"w_box_origin": lambda self, g, n0, k0, box=0: base.w_box_origin(self, g, n0, k0, 0)})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


# (name, bug, example, model, shape, mutate[, pins]): habu.bench.mutants.Mutant's fields
MUTANT_ENTRIES = (
    ("grouped-wgmma-n-major-boxes-at-first-column", "the grouped wgmma loop over n-major weights (W[E[r] k n], a MoE "
     "backward's product through the transposed experts) issues every 64-column box of W at the tile's first "
     "column: columns 64.. multiply the first 64 columns' weights", GROUPED_N_MAJOR, "DACT", SHAPE,
     grouped(boxes_at_first_column)),
    ("grouped-wgmma-f32-split-halves-swapped", "the grouped wgmma loop's producer copies a raw f32 A chunk's two "
     "halves into each other's places: the consumers split k + 4..7 as k..k + 3", GROUPED_SCATTER, "COMBINE-F32",
     SHAPE, grouped(split_halves_swapped), {"family": "grouped", "main_loop": "wgmma", "a_split": "consumers"}),
    ("grouped-wgrad-parts-read-twice", "the grouped weight gradient's consumers read an f32 A's hi block for both "
     "parts' instructions: every product added twice, the low parts never", GROUPED_WGRAD, "WGRAD", SHAPE,
     wgrad(parts_read_from_the_hi_block)),
    ("grouped-wgrad-group-end-unmasked", "the grouped weight gradient keeps a k tile's rows past its group's end: the "
     "next group's rows added into this group's weights", GROUPED_WGRAD, "WGRAD", SHAPE, wgrad(group_end_unmasked)),
    ("grouped-wgrad-held-tile-one-behind", "the grouped weight gradient's producer, a scaled bf16 A two k tiles deep "
     "in its registers, stores the tile it has just loaded: A's rows one k tile behind B's", GROUPED_WGRAD,
     "WGRAD-P-BF16", SHAPE, wgrad(held_tile_one_behind), {"wgrad_copy": "cp.async"}),
    ("grouped-wgrad-search-one-round", "the grouped weight gradient's warp search of the group offsets stops after "
     "one round of 32 reads where 200 rows take two: groups start at the first row of a part", GROUPED_WGRAD, "WGRAD",
     SHAPE, wgrad(search_one_round)),
    ("grouped-wgrad-indices-a-tile-too-far", "the grouped weight gradient's staged producer copies the gather's "
     "indices one k tile further ahead than its index ring is deep: rows gathered through another tile's IX",
     GROUPED_WGRAD, "WGRAD", SHAPE, wgrad(indices_a_tile_too_far), {"wgrad_copy": "staged"}),
    ("grouped-wgrad-index-wait-one-short", "the grouped weight gradient's staged producer reads a k tile's gather "
     "indices while their copies may be in flight (its cp.async wait leaves one group too many)", GROUPED_WGRAD,
     "WGRAD", SHAPE, wgrad(index_wait_one_short), {"wgrad_copy": "staged"}),
    ("grouped-wgrad-walk-from-the-next-item", "the grouped weight gradient's persistent blocks each start one work "
     "item further: group 0's first output tile is never added", GROUPED_WGRAD, "WGRAD", SHAPE,
     wgrad(walk_from_the_next_item), {"wgrad_copy": "staged", "wgrad_persistent": "true"}),
    ("grouped-wgrad-index-copied-past-the-item", "the grouped weight gradient's persistent producer copies the "
     "gather's indices of the k tiles past a work item's last into the slots the next item's first tiles take: the "
     "two copies of a slot land in either order", GROUPED_WGRAD, "WGRAD", SHAPE, wgrad(index_copied_past_the_item),
     {"wgrad_copy": "staged", "wgrad_persistent": "true"}),
    ("grouped-wgrad-staged-halves-swapped", "the grouped weight gradient's producer copies a raw f32 A chunk's two "
     "halves into each other's places: the consumers split columns 4..7 as 0..3", GROUPED_WGRAD, "WGRAD", SHAPE,
     wgrad(staged_halves_swapped), {"wgrad_copy": "staged"}),
)
