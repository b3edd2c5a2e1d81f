"""The epilogue loads a consumer thread reads at each tile's start (`epilogue_early`; the lowering's
`ContractionLowering.early_loads`, habu/lower/epilogue_early.py): the registers' declarations and loads before the
k loop, and the expression of each value where the epilogue reads it (the element of the fragment's slab s,
column group j and row half h, the first or the second of its pair)."""

from __future__ import annotations

from habu.emit_cuda.common import Signature, references
from habu.emit_cuda.emit_epilogue_pairs import UNPACK, pair_load
from habu.emit_cuda.emit_fma import epilogue_load, table_reader
from habu.lower.contraction import ContractionLowering
from habu.lower.epilogue_early import EarlyLoad
from habu.lower.epilogue_pairs import paired_loads
from habu.spec.ir import Load, Model

PACK = {"bf16": "habu::pack_bf16x2", "f16": "habu::pack_f16x2"}


def _index(e: EarlyLoad) -> str:
    """The entry of the fragment's (s, j, h), from the lowering's coordinates (`EarlyLoad.kept`)."""
    return "".join(f"[{a}]" for a in e.kept())


def _storage(e: EarlyLoad) -> str:
    """The C type of one entry: a packed 16-bit pair, an f32 pair, or one float (no column dependence)."""
    if not e.columns:
        return "float"
    return "float2" if e.access.dtype == "f32" else "habu::u32"


def early_declarations(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str) -> str:
    """C at a consumer's tile start (m0, n0 set, before the k loop): each early load's registers, filled with the
    values of the thread's fragment elements, zero outside the tensor as the epilogue reads them."""
    early, st = lw.early_loads, lw.tma_store
    if not early:
        return ""
    assert st is not None
    frag, groups = lw.fragment, lw.bn // 8
    table = table_reader(sig, model, it)
    dims = (st.slabs, groups, frag.halves)
    paired = set(paired_loads(lw))
    decls = "".join(f"      {_storage(e)} pre{e.index}{''.join(f'[{d}]' for d in e.dims(*dims))};  // "
                    f"{e.access.tensor} at the tile's start (`epilogue_early`)\n" for e in early)
    fills = []
    for e in early:
        # each half's value, at the column the lowering says it holds (`EarlyLoad.held_column`)
        if e.columns and e.index in paired:  # the pair (n, n + 1) in one load (habu/lower/epilogue_pairs.py)
            value = pair_load(lw, sig, sizes, table, e.access)
        else:
            values = [epilogue_load(lw, sig, sizes, table, {"m": "m", "n": f"(n + {e.held_column(x)})"
                                                            if e.held_column(x) else "n"}, e.access)
                      for x in range(e.halves())]
            value = (values[0] if not e.columns else f"make_float2({', '.join(values)})" if e.access.dtype == "f32"
                     else f"{PACK[e.access.dtype]}({', '.join(values)})")
        guard = f"if ({' && '.join(f'{a} == 0' for a in e.dropped())}) " if e.dropped() else ""
        fills.append(f"            {guard}pre{e.index}{_index(e)} = {value};\n")
    slab_row = f"(cw * {st.slabs} + s) * {st.box.rows}"
    body = "".join(fills)
    coordinates = "".join(  # the coordinates the loads read
        f"            const {it} {x} = {x}0 + ({it})({at});\n" for x, at in (("m", f"{slab_row} + row"), ("n", frag.col()))
        if references(body, x))
    row = f"            const int row = {frag.row_in_warpgroup()};\n" if references(coordinates, "row") else ""
    return decls + f"""#pragma unroll
      for (int s = 0; s < {st.slabs}; ++s)
#pragma unroll
        for (int j = 0; j < {groups}; ++j)
#pragma unroll
          for (int h = 0; h < {frag.halves}; ++h) {{  // the elements this thread's epilogue will read
{row}{coordinates}{body}          }}
"""


def early_values(lw: ContractionLowering, second: bool) -> dict[Load, str]:
    """Each early load's value for the epilogue at its (s, j, h): the pair's first element (n) or `second` (n + 1),
    for `pair_operands` (habu.emit_cuda.emit_epilogue_pairs)."""
    out = {}
    for e in lw.early_loads:
        at = f"pre{e.index}{_index(e)}"
        half = e.half_of(int(second))  # the half that holds the pair's element (`EarlyLoad.half_of`)
        if not e.columns:
            out[e.load] = at
        elif e.access.dtype == "f32":
            out[e.load] = f"{at}.{'xy'[half]}"
        else:
            out[e.load] = f"{UNPACK[e.access.dtype][half]}({at})"
    return out


__all__ = ["early_declarations", "early_values"]
