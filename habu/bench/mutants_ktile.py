"""Planted bugs in the wgmma path's k tiles of several swizzle spans (a K-major tile kept as blocks of
one 128-byte span along k, one TMA box each: habu/lower/pipeline.py `TmaOperandLoad.k_box`, `landing`;
habu/lower/layouts.py `_kmajor_block_start`). The finite-field check runs the functions the emitter
prints (the boxes' coordinates and landing bytes, the descriptors' k starts), so each must be killed
(habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from habu.lower import ContractionLowering, Lowering
from habu.lower.layouts import WgmmaOperands
from habu.lower.pipeline import MbarrierRing, TmaOperandLoad

SHAPE = {"M": 100, "N": 300, "K": 1000}  # a ragged last k tile of 1000 - 7·128 columns
PINS = {"tile": "64x64x128", "stages": "4", "store": "direct"}  # B's k tile: two 64-column boxes along k


def _with_loads(lw: Lowering, **methods: Any) -> Lowering:
    assert isinstance(lw, ContractionLowering) and isinstance(lw.pipeline, MbarrierRing)
    cls = type("PlantedLoad", (TmaOperandLoad,), methods)
    loads = tuple(cls(**{f.name: getattr(ld, f.name) for f in fields(ld)}) if ld.k_boxes > 1 else ld
                  for ld in lw.pipeline.loads)
    return replace(lw, pipeline=replace(lw.pipeline, loads=loads))


def k_boxes_at_first_column(lw: Lowering) -> Lowering:
    """Every k box of the tile is loaded at the tile's first k column (the box's k offset dropped)."""
    return _with_loads(lw, k_box=lambda self, box: 0)


def k_boxes_land_reversed(lw: Lowering) -> Lowering:
    """The k boxes land in the stage in reverse order: the tile's first 64 columns where the
    descriptors read the second."""
    return _with_loads(lw, landing=lambda self, box: (self.boxes - 1 - box) * self.box_bytes)


def k_step_ignores_blocks(lw: Lowering) -> Lowering:
    """B's descriptor advances 32 bytes a k step past the first span, as in a one-span tile: the steps
    after the fourth read the next rows of the first block."""
    assert isinstance(lw, ContractionLowering) and isinstance(lw.operands, WgmmaOperands)
    ops = lw.operands

    def b_start(self, kk):
        return self.b_tile.linear_offset(0), kk * 16 * self.b_tile.elem_bytes

    cls = type("PlantedOperands", (WgmmaOperands,), {"b_start": b_start})
    return replace(lw, operands=cls(**{f.name: getattr(ops, f.name) for f in fields(ops)}))


AHEAD_PINS = {"tile": "64x64x64", "stages": "4", "store": "direct", "b_ahead": "true"}  # B's boxes ahead


def ahead_from_first_stage(lw: Lowering) -> Lowering:
    """B's boxes ahead start from the ring's first stage and phase at every output tile, not from where
    the ring stands: a persistent block's later tiles get B's boxes in stages the k loop fills with
    other tiles."""
    assert isinstance(lw, ContractionLowering) and isinstance(lw.pipeline, MbarrierRing)
    ring = lw.pipeline
    cls = type("PlantedRing", (MbarrierRing,),
               {"ahead_start": lambda self, stage, phase: (self.start_stage, self.start_phase)})
    return replace(lw, pipeline=cls(**{f.name: getattr(ring, f.name) for f in fields(ring)}))


MUTANT_ENTRIES = (
    ("b-ahead-from-first-stage", "the wgmma producer issues B's boxes ahead of each output tile from stage 0 "
     "with phase 0, not from the ring's state", "ggemm.habu", "GGEMM", SHAPE, ahead_from_first_stage, AHEAD_PINS),
    ("ktile-k-boxes-at-first-column", "the wgmma ring loads both 64-column k boxes of a 128-column K-major k tile "
     "at the tile's first column", "ggemm.habu", "GGEMM", SHAPE, k_boxes_at_first_column, PINS),
    ("ktile-k-boxes-land-reversed", "the wgmma ring's k boxes land in the stage in reverse order",
     "ggemm.habu", "GGEMM", SHAPE, k_boxes_land_reversed, PINS),
    ("ktile-k-step-ignores-blocks", "B's wgmma descriptor steps 32 bytes a k step past the first 128-byte span "
     "(into the next rows) instead of moving to the next k block", "ggemm.habu", "GGEMM", SHAPE,
     k_step_ignores_blocks, PINS),
)

__all__ = ["AHEAD_PINS", "MUTANT_ENTRIES", "PINS", "SHAPE", "ahead_from_first_stage", "k_boxes_at_first_column", "k_boxes_land_reversed",
           "k_step_ignores_blocks"]
