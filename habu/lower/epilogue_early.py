"""The epilogue's loads read at each tile's start (the plan's `epilogue_early`), as data.

A one-wave product (FFN-SKIP's at 128 tokens: 112 tiles, one a block) streams its weights from the first instant
to the k loop's end, and only then do the epilogue's own loads go out: the bias B1 of GELU(S1 + B1), the saved S1
and B1 of GELU's derivative. Each round of the epilogue waited for them from DRAM behind the other blocks' last
weights, and the L2 prefetch (`epilogue_prefetch`) was evicted by the same weights before the epilogue read it.
With `epilogue_early` each consumer thread loads, before the k loop, every value its fragment's epilogue will
read of such a load, into registers:

    pre<i>[s][j][h]   the pair (m, n), (m, n + 1) of the element the accumulator's registers of slab s,
                      column group j and row half h hold (`AccumulatorFragment`: m = m0 + (cw·slabs + s)·64 +
                      row_in_warpgroup, n = n0 + col(j)); a 16-bit pair packed in one 32-bit register, an f32
                      pair in a float2

with the dimensions the access does not depend on left out (a bias over n: `pre<i>[j]`; a per-row value:
`pre<i>[s][h]`, one value). The epilogue reads the register instead of memory: the same element, read earlier.

The value is the same only where nothing writes the tensor between the tile's start and its epilogue, and before
the plan's previous kernel is waited for (the consumers wait after their k loop): so only the model's inputs are
read early, which no kernel of the plan writes (the `early-epilogue-loads` rule checks each against the model).
An input is complete before the plan's first kernel starts: that one is launched without programmatic
serialisation, and each later kernel's blocks start after every block of the one before has."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from habu.lower.access import Access
from habu.lower.fragments import AccumulatorFragment
from habu.spec.ir import Load

EARLY_DTYPES = ("bf16", "f16", "f32")
# registers a consumer thread may give the early values, beside its accumulators: GELU's derivative over a
# 128 × 128 tile of two consumer warpgroups holds S1's 32 packed pairs and B1's 16
EARLY_REGISTERS = 64
# the accumulators plus the early values stay under this (of setmaxnreg's 232 a consumer thread): the rest is the
# epilogue's addressing and, with a column sum, its partial sums
EARLY_BUDGET = 144


@dataclass(frozen=True)
class EarlyLoad:
    """One epilogue load read at the tile's start: its index in `ContractionLowering.epi_loads`, its access, and
    which of the fragment's coordinates its value depends on."""

    index: int
    load: Load
    access: Access
    rows: bool  # on m: one value (pair) per slab s and row half h
    columns: bool  # on n: one pair (n, n + 1) per column group j

    def kept(self) -> tuple[str, ...]:
        """The fragment coordinates (s, j, h) that index the registers: those the value depends on."""
        return tuple(a for a, used in (("s", self.rows), ("j", self.columns), ("h", self.rows)) if used)

    def dims(self, slabs: int, groups: int, halves: int) -> tuple[int, ...]:
        """The register array's dimensions: [slabs][groups][halves], less those the value does not depend on."""
        size = {"s": slabs, "j": groups, "h": halves}
        return tuple(size[a] for a in self.kept())

    def slot(self, s: int, j: int, h: int) -> tuple[int, ...]:
        """The register entry of the fragment's slab s, column group j and row half h."""
        at = {"s": s, "j": j, "h": h}
        return tuple(at[a] for a in self.kept())

    def dropped(self) -> tuple[str, ...]:
        """The coordinates the registers leave out: an entry is filled once, where each of them is 0."""
        return tuple(a for a in ("s", "j", "h") if a not in self.kept())

    def halves(self) -> int:
        """Values an entry holds: the pair (n, n + 1) where the value depends on n, else one."""
        return 2 if self.columns else 1

    def half_of(self, q: int) -> int:
        """The entry's half that holds the pair's element q (n + q)."""
        return q if self.columns else 0

    def held_column(self, half: int) -> int:
        """The column, past the pair's first, whose value the entry's `half` holds (what the fill loads there)."""
        return half

    def registers(self, slabs: int, groups: int, halves: int) -> int:
        """32-bit registers a thread holds: a packed 16-bit pair or one float per entry where the pair shares one
        value (no column dependence), two floats per f32 pair."""
        count = 1
        for d in self.dims(slabs, groups, halves):
            count *= d
        return count * (2 if self.columns and self.access.dtype == "f32" else 1)


def registers_mismatch(e: EarlyLoad, fragment: AccumulatorFragment, slabs: int, groups: int) -> str | None:
    """Run one warpgroup's fill and reads of `e`'s registers over the accumulator fragment: each entry filled where
    its dropped coordinates are 0, with the element (slab row, column) of each half (`held_column`), keeping only
    the coordinates the value depends on (a bias: the column; a row scale: the row); then each epilogue read, at
    (s, j, h) and pair element q, must find its own element's value there. The first read that does not, in words;
    None where every one does."""
    warps = fragment.group_warps
    for warp in range(warps):
        for lane in range(fragment.warp_size):
            held: dict[tuple[int, ...], list[tuple]] = {}
            for s, j, h in product(range(slabs), range(groups), range(fragment.halves)):
                if all({"s": s, "j": j, "h": h}[a] == 0 for a in e.dropped()):
                    held[e.slot(s, j, h)] = [_seen(e, fragment, s, warp, lane, j, h, e.held_column(x))
                                             for x in range(e.halves())]
            for s, j, h, q in product(range(slabs), range(groups), range(fragment.halves), range(fragment.pair)):
                got = held.get(e.slot(s, j, h))
                want = _seen(e, fragment, s, warp, lane, j, h, q)
                if got is None or got[e.half_of(q)] != want:
                    return (f"{e.access.tensor}: warp {warp} lane {lane} reads (s {s}, j {j}, h {h}, q {q}) = element "
                            f"{want} from entry {e.slot(s, j, h)}, which holds {got and got[e.half_of(q)]}")
    return None


def _seen(e: EarlyLoad, fragment: AccumulatorFragment, s: int, warp: int, lane: int, j: int, h: int,
          q: int) -> tuple:
    """The coordinates of the fragment's element that the value of `e` depends on: (slab row, column)."""
    row, col = fragment.element(warp, lane, j, h, q)
    return (s * fragment.group_warps * fragment.warp_rows + row if e.rows else None, col if e.columns else None)


def _axes(access: Access) -> set[str]:
    return {p.axis for p in access.positions if p.kind == "axis"}


def early_candidates(epi_loads: tuple[tuple[Load, Access], ...], inputs: frozenset[str]) -> tuple[EarlyLoad, ...]:
    """The epilogue loads that may be read at the tile's start: a model input (`inputs`: no kernel of the plan
    writes it), of a type the registers hold as pairs, read at positions of the output's axes or constants (no
    gather: its index would be one more early read)."""
    out = []
    for i, (ld, access) in enumerate(epi_loads):
        if access.tensor not in inputs or access.dtype not in EARLY_DTYPES:
            continue
        if any(p.kind not in ("axis", "const") for p in access.positions):
            continue
        axes = _axes(access)
        out.append(EarlyLoad(i, ld, access, "m" in axes, "n" in axes))
    return tuple(out)


def early_loads(candidates: tuple[EarlyLoad, ...], slabs: int, groups: int, halves: int,
                accumulators: int) -> tuple[EarlyLoad, ...]:
    """The candidates a thread's registers hold (in order, while the total stays within `EARLY_REGISTERS` and,
    with the `accumulators`, within `EARLY_BUDGET`)."""
    chosen, used = [], 0
    for e in candidates:
        r = e.registers(slabs, groups, halves)
        if used + r <= EARLY_REGISTERS and accumulators + used + r <= EARLY_BUDGET:
            chosen.append(e)
            used += r
    return tuple(chosen)


__all__ = ["EARLY_BUDGET", "EARLY_REGISTERS", "EarlyLoad", "early_candidates", "early_loads", "registers_mismatch"]
