"""Planted bugs in a contraction epilogue that stores more than one output of its chain
(`ContractionLowering.extra_outs`: the product S1 beside GELU(S1 + B1), habu.plan.patterns.epilogue_chain).
Every emitter prints the extra store from the lowering's access and value, and the finite-field check
writes the same ones and compares every output, so each must be killed (habu.bench.mutants lists them;
tests/prove/test_multi_output.py runs them)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Position

EXAMPLE = "../tests/data/two_outputs.habu"  # relative to examples/, as habu.bench.mutants reads them
MODEL = "LINEAR-GELU-SAVED"
SHAPE = {"B": 128, "D": 256, "H": 512}


def extra_store_skipped(lw: Lowering) -> Lowering:
    """The epilogue stores the chain's end only: S1 is never written."""
    assert isinstance(lw, ContractionLowering) and lw.extra_outs
    return replace(lw, extra_outs=())


def extra_store_wrong_column(lw: Lowering) -> Lowering:
    """S1's column is the tile's first (n0) for every element: its column position a constant 0 past the
    tile origin is the same bug as a store indexed by the wrong fragment column."""
    assert isinstance(lw, ContractionLowering) and lw.extra_outs
    (value, access), *rest = lw.extra_outs
    positions = tuple(Position("const", value=0) if p.kind == "axis" and p.axis == "n" else p
                      for p in access.positions)
    return replace(lw, extra_outs=((value, replace(access, positions=positions)), *rest))


def extra_store_row_stride_of_d(lw: Lowering) -> Lowering:
    """S1's rows #D elements apart (the input's row stride) instead of #H: every row lands in the wrong place."""
    assert isinstance(lw, ContractionLowering) and lw.extra_outs
    (value, access), *rest = lw.extra_outs
    strides = (("D",), *access.strides[1:])
    return replace(lw, extra_outs=((value, replace(access, strides=strides)), *rest))


def extra_store_chain_end_value(lw: Lowering) -> Lowering:
    """S1 is stored with the chain end's value, GELU(S1 + B1), instead of the product."""
    assert isinstance(lw, ContractionLowering) and lw.extra_outs
    (_value, access), *rest = lw.extra_outs
    return replace(lw, extra_outs=((lw.epilogue, access), *rest))


def staged_extra_round_too_short(lw: Lowering) -> Lowering:
    """The TMA-store epilogue that stages S1 beside S3 takes its two buffers as two rounds of one output: a round
    waits for one store fewer than it should, and the second output of a round is filled over a buffer whose
    store may still read it (or past the epilogue's buffers)."""
    from habu.lower.tma_store import TmaStoreEpilogue

    assert isinstance(lw, ContractionLowering) and lw.staged_extras and lw.tma_store is not None

    class TwoRounds(TmaStoreEpilogue):
        @property
        def rounds(self) -> int:
            return self.buffers

    fields = {f: getattr(lw.tma_store, f) for f in lw.tma_store.__dataclass_fields__}
    return replace(lw, tma_store=TwoRounds(**fields))


def staged_extra_shares_the_buffer(lw: Lowering) -> Lowering:
    """Each box's round stages S1 and S3 in one buffer (the output's term dropped from the buffer map): S3's
    values overwrite S1's before either store reads them."""
    from habu.lower.tma_store import TmaStoreEpilogue

    assert isinstance(lw, ContractionLowering) and lw.staged_extras and lw.tma_store is not None

    class OneBuffer(TmaStoreEpilogue):
        def buffer(self, cw, stored, output=0):  # type: ignore[override]
            return super().buffer(cw, stored, 0)

    fields = {f: getattr(lw.tma_store, f) for f in lw.tma_store.__dataclass_fields__}
    return replace(lw, tma_store=OneBuffer(**fields))


MUTANT_ENTRIES = (
    ("extra-store-skipped", "a contraction's epilogue that should also store its chain's product S1 stores only "
     "GELU(S1 + B1)", EXAMPLE, MODEL, SHAPE, extra_store_skipped),
    ("extra-store-wrong-column", "the extra output S1 is stored at the tile's first column for every element",
     EXAMPLE, MODEL, SHAPE, extra_store_wrong_column),
    ("extra-store-row-stride", "the extra output S1's rows are stored #D apart instead of #H", EXAMPLE, MODEL,
     SHAPE, extra_store_row_stride_of_d),
    ("extra-store-chain-end-value", "the extra output S1 is stored with the chain end's value", EXAMPLE, MODEL,
     SHAPE, extra_store_chain_end_value),
    ("staged-extra-one-buffer", "the TMA-store epilogue stages S1 and S3 of a round in one buffer", EXAMPLE, MODEL,
     SHAPE, staged_extra_shares_the_buffer),
    ("staged-extra-round", "the TMA-store epilogue staging S1 beside S3 takes a round's two buffers for two rounds",
     EXAMPLE, MODEL, SHAPE, staged_extra_round_too_short),
)

__all__ = ["MUTANT_ENTRIES", "extra_store_chain_end_value", "extra_store_row_stride_of_d", "extra_store_skipped",
           "extra_store_wrong_column", "staged_extra_round_too_short", "staged_extra_shares_the_buffer"]
