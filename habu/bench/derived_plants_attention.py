"""The wgmma attention loop's maps, each planted one off, for `habu.bench.derived_lines` (what
`habu.prove.interp_attention_wgmma` runs: the TMA boxes' destinations and origins, the descriptors'
start addresses, the register maps, the thread roles, the layout's offsets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _first_moved(d: dict[str, Any]) -> dict[str, Any]:
    key = next(iter(d))
    return {**d, key: d[key] + 1}


WGMMA_ATTENTION_PLANTS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("q_box_dst", lambda sup, box: sup(box) + 128),
    ("k_box_dst", lambda sup, stage, box: sup(stage, box) + 128),
    ("v_box_dst", lambda sup, stage, box: sup(stage, box) + 128),
    ("stage_base", lambda sup, stage: sup(stage + 1)),
    ("q_box_origin", lambda sup, qt, coords, box: {**sup(qt, coords, box), "i": sup(qt, coords, box)["i"] + 1}),
    ("k_box_origin", lambda sup, kt, coords, box: {**sup(kt, coords, box), "j": sup(kt, coords, box)["j"] + 1}),
    ("v_box_origin", lambda sup, kt, coords, box: {**sup(kt, coords, box), "j": sup(kt, coords, box)["j"] + 1}),
    ("q_start", lambda sup, cw, kk: sup(cw, kk) + 32),
    ("k_start", lambda sup, stage, kk: sup(stage, kk) + 32),
    ("v_start", lambda sup, stage, kk: sup(stage, kk) + 128),
    ("s_register", lambda sup, j, h, q: sup(j, h, q) + 1),
    ("o_register", lambda sup, dn, h, q: sup(dn, h, q) + 1),
    ("s_element", lambda sup, *args: (sup(*args)[0] + 1, sup(*args)[1])),
    ("o_element", lambda sup, *args: (sup(*args)[0] + 1, sup(*args)[1])),
    ("p_registers", lambda sup, kk, reg: tuple(reversed(sup(kk, reg)))),
    ("consumer_of", lambda sup, tid: sup(tid) + 1),
    ("turn_barrier", lambda sup, cw: sup(cw) + 1),
    # split-KV on the wgmma loop (session 35): the guard of a split's first S, the partial max's scale
    ("visits", lambda sup, first, tiles: sup(first + 1, tiles)),
    ("partial_max_scaled", lambda sup, sizes: not sup(sizes)),
)
# the layout's offsets, each moved (bytes)
WGMMA_ATTENTION_OFFSETS: tuple[tuple[str, int], ...] = (
    ("q_offset", 1024), ("kv_offset", 1024), ("v_in_stage", 1024), ("stage_bytes", 1024), ("q_bar", 8),
)
# O's vector exchange (habu/lower/quad_vectors.py, session 36): planted in the lowering's `out_vectors`
VECTOR_PLANTS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("sent_group", lambda sup, u, lane, r: sup(u, lane, r) + 1),
    ("slot", lambda sup, lane, r: sup(lane, (r + 1) % 2)),
    ("offset", lambda sup, r: sup(r) + 1),
    ("vector_column", lambda sup, u, lane: sup(u, lane) + 1),
    ("row", lambda sup, warp, lane, h: sup(warp, lane, h) + 1),
    ("lane_in_group", lambda sup, lane: sup(lane) + 1),
    ("position", lambda sup, s, q: sup(s, q ^ 1)),
)


def planted_vectors(qv: Any, method: str, planted: Callable[..., Any]) -> Any:
    """`qv` (a QuadVectors) with one method's result planted wrong: `planted(the method as it was, *args)`."""
    base = getattr(type(qv), method)
    cls = type(f"Planted_{method}", (type(qv),), {method: lambda self, *args: planted(lambda *a: base(self, *a), *args)})
    return cls(qv.words, qv.groups, qv.fragment)
