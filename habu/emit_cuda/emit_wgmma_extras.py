"""The wgmma kernel's optional pieces, printed from its lowering: the consumer lag's named barriers
(`MbarrierRing.lag`) and the producer's L2 prefetch of the epilogue's matrix tiles
(`ContractionLowering.prefetches`). `kc` is habu.emit_cuda.emit_wgmma's `_Kernel`."""

from __future__ import annotations

from typing import Any

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import access_mask, access_offset
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.kernel import TmaSpec


def epilogue_prefetch(kc: Any) -> str:
    """The epilogue's matrix tiles into the L2 (`ContractionLowering.prefetches`): each producer thread its lines,
    inside the access's masks, at the access's offsets (a hint: no value depends on it)."""
    out = []
    table = table_reader(kc.sig, kc.model, kc.it)
    for pf in kc.lw.prefetches:
        coord = {"m": "m", "n": "n"}
        p = kc.sig.pointer(pf.access.tensor, pf.access.dtype)
        out.append(f"""      for (int i = ptid; i < {pf.lines}; i += {pf.threads}) {{  // {pf.access.tensor}'s tile into the L2 for the epilogue
        const {kc.it} m = m0 + ({kc.it})({c(pf.row(CExpr("i")))});
        const {kc.it} n = n0 + ({kc.it})({c(pf.column(CExpr("i")))});
        if ({access_mask(pf.access, coord, kc.sizes, table)}) habu::prefetch_l2({p} + ({access_offset(pf.access, coord, kc.sizes, kc.lw.index_width, table)}));
      }}
""")
    return "".join(out)


def warm_next(kc: Any) -> str:
    """The plan's next kernel's first boxes into the L2 after the producer's last load (`ContractionLowering.warm`,
    habu/lower/warm_next.py): each producer thread its box indices (`WarmNext.first`, `stride`), each decoded to
    the next kernel's coordinates (`WarmNext.origin`), through that kernel's own tensor map of the operand (a hint:
    no value depends on it)."""
    warm = kc.lw.warm
    if warm is None:
        return ""
    tmap = kc.sig.tensormap(TmaSpec.of(warm.map))
    c0, c1 = (c(x) for x in warm.origin(CExpr("i"), kc.sizes))
    first = c(warm.first(CExpr("blockIdx.x"), CExpr("gridDim.x"), CExpr("ptid")))
    return f"""    // the plan's next kernel's first {warm.tiles} k tiles of {warm.map.tensor} into the L2 while this kernel's epilogues run
    for (int i = {first}; i < {c(warm.count(kc.sizes))}; i += {c(warm.stride(CExpr("gridDim.x")))})
      habu::tma_prefetch_2d(&{tmap}, (int)({c0}), (int)({c1}));
"""


def consumer_lag(kc: Any) -> tuple[str, str, str]:
    """The consumer lag (`MbarrierRing.lag`): consumer cw ≥ 1 waits on its named barrier before the tile's k loop;
    consumer cw − 1 arrives there once it has multiplied `lag_tiles` of the tile's k tiles (at once when the tile
    has none). Empty strings without a lag."""
    ring = kc.ring
    if not ring.lag:
        return "", "", ""
    n = c(ring.lag_tiles(CExpr("(kt_end - kt_begin)")))
    last = kc.consumers - 1
    wait = (f"      const long long lag_tiles = {n};  // k tiles the previous warpgroup multiplies before this one starts\n"
            f"      if (cw > 0) habu::named_barrier_sync({c(ring.lag_barrier(CExpr('cw')))}, 256);  // the consumer lag\n")
    arrive = (f"\n        if (cw < {last} && kt - kt_begin + 1 == lag_tiles) "
              f"habu::named_barrier_arrive({c(ring.lag_barrier(CExpr('(cw + 1)')))}, 256);  // the next warpgroup may start")
    none = (f"\n      if (cw < {last} && lag_tiles == 0) "
            f"habu::named_barrier_arrive({c(ring.lag_barrier(CExpr('(cw + 1)')))}, 256);  // a tile without k tiles")
    return wait, arrive, none


__all__ = ["consumer_lag", "epilogue_prefetch", "warm_next"]
