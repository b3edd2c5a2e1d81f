"""The wgmma TMA-store epilogue's own loads, each read once for both elements of the thread's column pair (m, n),
(m, n + 1): as one pair where the lowering reads it so (`paired_loads`, habu/lower/epilogue_pairs.py), from the
registers filled at the tile's start (`epilogue_early`), or element by element."""

from __future__ import annotations

from collections.abc import Mapping

from habu.emit_cuda.common import Signature, TableReader, access_mask, access_offset
from habu.emit_cuda.emit_fma import epilogue_load, table_reader
from habu.lower.access import Access
from habu.lower.contraction import ContractionLowering
from habu.lower.epilogue_pairs import paired_loads
from habu.spec.ir import Load, Model

# a packed 16-bit pair's first (low half) and second element, as floats (include/habu/types.cuh)
UNPACK = {"bf16": ("habu::bf16x2_lo", "habu::bf16x2_hi"), "f16": ("habu::f16x2_lo", "habu::f16x2_hi")}


def pair_load(lw: ContractionLowering, sig: Signature, sizes, table: TableReader, access: Access) -> str:
    """The C expression of `access`'s pair at (m, n), (m, n + 1): a packed `u32` of two 16-bit elements, or a
    `float2`: one load under the first element's mask, the second element kept under its own (zero outside)."""
    p = sig.pointer(access.tensor, access.dtype)
    offset = access_offset(access, {"m": "m", "n": "n"}, sizes, lw.index_width, table)
    first = access_mask(access, {"m": "m", "n": "n"}, sizes, table)
    second = access_mask(access, {"m": "m", "n": "(n + 1)"}, sizes, table)
    load = "habu::load_pair32" if access.dtype == "f32" else "habu::load_pair16"
    return f"{load}({p} + ({offset}), {first}, {second})"


def pair_operands(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str,
                  early: tuple[Mapping[Load, str], Mapping[Load, str]] | None = None
                  ) -> tuple[list[str], dict[Load, str], dict[Load, str]]:
    """Declarations that read each of the epilogue's own loads once for the pair's first element (`e0_<i>`) and
    once for its second (`e1_<i>`), zero outside their tensors as the finite-field check reads them, and each
    load's two variables for `epilogue_value`. GELU's derivative names its input four times: printed inline, each
    name was a load of its own (four 2-byte loads an element, not merged by the compiler), and a 4096-token FFN's
    backward spent 1466 µs in a contraction the same GEMM runs in 620 (H200, 2026-12-02). `early`: the values read
    at the tile's start (`early_values` of the first and the second element, habu.emit_cuda.emit_epilogue_early)."""
    table = table_reader(sig, model, it)
    paired = set(paired_loads(lw))
    decls: list[str] = []
    names0: dict[Load, str] = {}
    names1: dict[Load, str] = {}
    for i, (ld, access) in enumerate(lw.epi_loads):
        if ld in names0:
            continue
        x = len(names0)
        first, second = names0[ld], names1[ld] = f"e0_{x}", f"e1_{x}"
        if early is not None and ld in early[0]:
            values = (early[0][ld], early[1][ld])
        elif i in paired:
            pair = f"pr{x}"
            if access.dtype == "f32":
                decls.append(f"const float2 {pair} = {pair_load(lw, sig, sizes, table, access)};")
                values = (f"{pair}.x", f"{pair}.y")
            else:
                decls.append(f"const habu::u32 {pair} = {pair_load(lw, sig, sizes, table, access)};")
                lo, hi = UNPACK[access.dtype]
                values = (f"{lo}({pair})", f"{hi}({pair})")
        else:
            values = tuple(epilogue_load(lw, sig, sizes, table, {"m": "m", "n": n}, access) for n in ("n", "(n + 1)"))
        decls += [f"const float {first} = {values[0]};", f"const float {second} = {values[1]};"]
    return decls, names0, names1


__all__ = ["UNPACK", "pair_load", "pair_operands"]
