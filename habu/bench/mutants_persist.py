"""Planted mistakes in the persistent wgmma attention kernel (`--pin persistent=1`, habu/lower/attention_wgmma.py):
the walk over the work tiles, Q's handoff between a block's tiles (the Q-empty arrival, both barriers' parities).
Each changes the CUDA the emitter prints (the same methods print it); the finite-field check, which runs every
checked block's whole walk with one shared memory, ring and Q barrier pair (habu/prove/interp_attention_wgmma.py),
must reject every one on the CPU. Entries of the mutation suite (`MUTANT_ENTRIES`, habu/bench/mutants.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from habu.lower.attention_wgmma import AttentionWgmmaLowering

# causal GQA with more keys than queries: 3 query tiles of 64 rows × 2 KV heads × 2 query heads a KV head = 12 work
# tiles; the check's grid of 3 blocks walks 4 tiles each (2 to 4 KV tiles of 32 keys each, a ring of 2 stages)
SHAPE = {"B": 1, "G": 2, "R": 2, "I": 150, "J": 200, "E": 64, "D": 64}
PINS = {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "32", "stages": "2", "persistent": "1"}


def _planted(lw: Any, method: str, body: Callable) -> AttentionWgmmaLowering:
    assert isinstance(lw, AttentionWgmmaLowering) and lw.persistent
    cls = type(f"Planted_{method}", (AttentionWgmmaLowering,), {method: body})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def walk_stride_one_more(lw: Any) -> AttentionWgmmaLowering:
    """A block steps gridDim.x + 1 work tiles: some tiles no block takes (their rows never written)."""
    return _planted(lw, "work_of", lambda self, b, n, blocks: n * (blocks + 1) + b)


def q_freed_before_last_s(lw: Any) -> AttentionWgmmaLowering:
    """The consumers arrive on Q-empty once all but the last S are done (and again after it): the next tile's Q
    lands over the one the last S still reads."""
    return _planted(lw, "q_released", lambda self, done, tiles: done + 1 >= tiles)


def q_free_parity_of_this_tile(lw: Any) -> AttentionWgmmaLowering:
    """The producer waits Q-empty with the parity of the tile it is about to load (n mod 2), not the last one's: the
    wait passes at once and the next Q overwrites the one the consumers are multiplying."""
    return _planted(lw, "q_free_parity", lambda self, n: n % 2)


def q_full_parity_always_zero(lw: Any) -> AttentionWgmmaLowering:
    """The consumers wait Q's barrier with parity 0 for every tile (the non-persistent kernel's wait): the second
    tile's wait never returns."""
    return _planted(lw, "q_full_parity", lambda self, n: 0)


def last_kv_tile_dropped(lw: Any) -> AttentionWgmmaLowering:
    """A work tile's KV tiles end one early (the count the kernel reads through `habu::unfolded`): the last tile's
    keys never enter the rows' softmax, and the producer and the consumers agree on the shorter count."""
    return _planted(lw, "end_tile", lambda self, split, tiles: tiles - 1)


MUTANT_ENTRIES: tuple[tuple[Any, ...], ...] = (
    ("persist-walk-stride-one-more", "the persistent attention kernel's blocks step gridDim.x + 1 work tiles",
     "attention.habu", "ATTENTION-GQA", SHAPE, walk_stride_one_more, PINS),
    ("persist-q-freed-before-last-s", "the persistent attention kernel's consumers free Q before the tile's last S",
     "attention.habu", "ATTENTION-GQA", SHAPE, q_freed_before_last_s, PINS),
    ("persist-q-free-parity-of-this-tile", "the persistent attention kernel's producer waits Q-empty with the "
     "parity of the tile it loads", "attention.habu", "ATTENTION-GQA", SHAPE, q_free_parity_of_this_tile, PINS),
    ("persist-q-full-parity-always-zero", "the persistent attention kernel's consumers wait Q's barrier with "
     "parity 0 at every tile", "attention.habu", "ATTENTION-GQA", SHAPE, q_full_parity_always_zero, PINS),
    ("persist-last-kv-tile-dropped", "the persistent attention kernel's work tiles visit one KV tile too few",
     "attention.habu", "ATTENTION-GQA", SHAPE, last_kv_tile_dropped, PINS),
)
