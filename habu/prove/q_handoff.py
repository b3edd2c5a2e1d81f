"""Executing a persistent attention block's Q handoff (habu/lower/attention_wgmma.py: `q_full_parity`,
`q_free_parity`, `q_released`, `s_completed`) under several orders of the producer and the consumers, with the
mbarrier semantics of habu.prove.pipeline (`Barrier`: a wait with parity p returns once the phase of parity p has
completed).

The producer, for the block's n-th work tile: waits Q-empty with `q_free_parity(n)` (n ≥ 1), then loads Q (one
arrival and its bytes on Q's barrier, landing at once). Each consumer warpgroup, for its n-th tile of `tiles` KV
tiles: waits Q's barrier with `q_full_parity(n)`, arrives on Q-empty where `q_released(0, tiles)` holds, then for
each KV tile j reads Q (its S) and arrives where `q_released(s_completed(j), tiles)` holds. Faults: an S reading
another tile's Q (overwritten too early, or a wait that returned on the wrong phase), a deadlock (every actor
blocked before the end), a Q-empty phase completed by arrivals of more than one tile. The K/V ring is
`pipeline-schedule`'s; the field check runs one of these orders (the producer ahead) on the data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from habu.prove.pipeline import Barrier

# the KV-tile counts of a block's work tiles the rule runs: one tile; a tile with no KV tile (a causal tile of
# rows that see no key) between others; several of each length
HANDOFF_TILES = ((1,), (0, 2), (3, 0, 1, 2), (2, 2, 1, 3))
ORDERS = ("the producer ahead", "the consumers ahead", "one consumer ahead")


def _producer(lw: Any, kvs: tuple[int, ...], state: dict) -> Iterator[bool]:
    full, empty = state["full"], state["empty"]
    for n in range(len(kvs)):
        while n > 0 and not empty.completed(int(lw.q_free_parity(n))):
            yield False
        state["q"] = n  # Q's boxes land
        full.pending -= 1
        full.settle()
        yield True


def _consumer(lw: Any, c: int, kvs: tuple[int, ...], state: dict) -> Iterator[bool]:
    full = state["full"]

    def free(done: int, tiles: int) -> None:
        if bool(lw.q_released(done, tiles)):
            state["arrivals"].append(state["tile_of"][c])
            empty = state["empty"]
            empty.pending -= 1
            if empty.pending <= 0 and len(set(state["arrivals"][-empty.count:])) > 1:
                state["faults"].append(f"a Q-empty phase completes on arrivals of tiles {state['arrivals'][-empty.count:]}")
            empty.settle()

    for n, tiles in enumerate(kvs):
        state["tile_of"][c] = n
        while not full.completed(int(lw.q_full_parity(n))):
            yield False
        free(0, tiles)
        yield True
        for j in range(tiles):
            if state["q"] != n:
                state["faults"].append(f"consumer {c}'s S of KV tile {j} of work tile {n} reads work tile "
                                       f"{state['q']}'s Q")
            yield True
            free(int(lw.s_completed(j)), tiles)
            yield True


def handoff_run(lw: Any, kvs: tuple[int, ...], order: str) -> list[str]:
    """The faults of one order over a block's work tiles of `kvs` KV tiles (empty: sound)."""
    consumers = max(1, lw.consumers)
    state: dict = {"full": Barrier(1), "empty": Barrier(consumers), "q": None, "faults": [], "arrivals": [],
                   "tile_of": [0] * consumers}
    producer = _producer(lw, kvs, state)
    cons = [_consumer(lw, c, kvs, state) for c in range(consumers)]
    actors = {"the producer ahead": [producer, *cons], "the consumers ahead": [*cons, producer],
              "one consumer ahead": [cons[0], producer, *cons[1:]]}[order]
    live = list(actors)
    for _ in range(10_000):
        if not live or state["faults"]:
            break
        for actor in live:  # the first actor (in the order's priority) that can move moves
            try:
                moved = next(actor)
            except StopIteration:
                live.remove(actor)
                break
            if moved:
                break
        else:
            return [*state["faults"], "every consumer and the producer wait: a deadlock"]
    return state["faults"]


def handoff_problem(lw: Any) -> str | None:
    """The first fault of the Q handoff over `HANDOFF_TILES` in every order of `ORDERS`; None: sound."""
    for kvs in HANDOFF_TILES:
        for order in ORDERS:
            faults = handoff_run(lw, kvs, order)
            if faults:
                return f"over work tiles of {list(kvs)} KV tiles, {order}: {faults[0]}"
    return None


__all__ = ["HANDOFF_TILES", "handoff_problem", "handoff_run"]
