"""Planted bugs in the grouped wgmma loop over n-major weights (`W[E[r] k n]`, a derived MoE backward's products
through the transposed expert weights: habu/lower/grouped_wgmma.py reads them in 64-column TMA boxes). The box
origins are the lowering's (`WgmmaMainLoop.w_box_origin`), which the emitter prints and the finite-field check
runs, so a plan whose boxes land at the wrong columns must be killed (habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import fields, replace

from habu.bench.mutant_plants import grouped
from habu.lower import GroupedLowering

GROUPED_N_MAJOR = "../tests/data/grouped_n_major.habu"
SHAPE = {"T": 30, "R": 200}


def boxes_at_first_column(lw: GroupedLowering) -> GroupedLowering:
    """An n-major W's 64-column boxes all at the tile's first column (the box's offset n0 + box·64 dropped):
    the tile's later columns multiply its first 64 columns' weights."""
    assert lw.wgmma is not None
    base = type(lw.wgmma)
    cls = type("Planted_w_box_origin", (base,),
               {"w_box_origin": lambda self, g, n0, k0, box=0: base.w_box_origin(self, g, n0, k0, 0)})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


# (name, bug, example, model, shape, mutate): habu.bench.mutants.Mutant's fields
MUTANT_ENTRIES = (
    ("grouped-wgmma-n-major-boxes-at-first-column", "the grouped wgmma loop over n-major weights (W[E[r] k n], a MoE "
     "backward's product through the transposed experts) issues every 64-column box of W at the tile's first "
     "column: columns 64.. multiply the first 64 columns' weights", GROUPED_N_MAJOR, "DACT", SHAPE,
     grouped(boxes_at_first_column)),
)
