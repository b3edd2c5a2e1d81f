"""C for an accumulator's rows stored as 16-byte vectors after its lanes trade column pairs, printed from a
`QuadVectors` (habu/lower/quad_vectors.py): what a lane sends in each round, which vector slot a received pair
fills, the vector's first column. A lane's sent group and filled slot depend on its place t among the lanes it
trades with, so each is printed as a select over t's values (a register array cannot be indexed at run time
without going to local memory); the selects' arms are the lowering's functions evaluated at each t."""

from __future__ import annotations

from collections.abc import Callable

from habu.emit_cuda.cexpr import CExpr, c
from habu.lower.quad_vectors import QuadVectors

# a column pair as 32-bit words: packed 16-bit halves (the low half the lower column), or a float's bits each
PAIR_WORDS: dict[str, tuple[str, ...]] = {
    "bf16": ("habu::pack_bf16x2({a}, {b})",),
    "f16": ("habu::pack_f16x2({a}, {b})",),
    "f32": ("__float_as_uint({a})", "__float_as_uint({b})"),
}


def select(t: str, arms: list[str]) -> str:
    """`arms[t]` as nested conditionals over t's values 0 .. len(arms) − 1."""
    text = arms[-1]
    for v in range(len(arms) - 2, -1, -1):
        text = f"{t} == {v} ? {arms[v]} : {text}"
    return f"({text})"


def _pair_order(qv: QuadVectors) -> tuple[list[int], dict[int, int]]:
    """From the lowering's `position`: the pair's elements q in the order they lie in memory (packed in that order,
    the first in the low half or the first word), and the pair of the vector each slot s fills (its span of
    `pair` places). A layout that does not lay each slot's pair out as one aligned span, the same for every slot,
    cannot be packed before the exchange: refused."""
    pair = qv.fragment.pair
    start = {s: min(int(qv.position(s, q)) for q in range(pair)) for s in range(qv.words)}
    within = [[int(qv.position(s, q)) - start[s] for q in range(pair)] for s in range(qv.words)]
    if any(x != within[0] for x in within) or sorted(within[0]) != list(range(pair)) or \
            sorted(start.values()) != [pair * j for j in range(qv.words)]:
        raise ValueError(f"the vector's places {[[int(qv.position(s, q)) for q in range(pair)] for s in start]} do not "
                         f"hold each slot's pair as one aligned run of {pair}")
    return sorted(range(pair), key=within[0].__getitem__), {s: x // pair for s, x in start.items()}


def quad_store_rows(qv: QuadVectors, dtype: str, value: Callable[[str, int], str], row_code: str,
                    store: Callable[[str, int], str], ind: str = "    ", index_type: str = "long long") -> str:
    """C storing every row half h of a thread's accumulator as vectors. In scope: `lane` and what `value` reads.
    `value(g, q)`: the C value of element q of the lane's pair in column group g (a C expression of `dn`);
    `row_code`: statements run per row half h (the row's coordinates, which `store` may read);
    `store(words, n)`: the statement storing the array `words` of n 32-bit words (its guard and its column `d`
    inside: d is declared before it). Where each element goes in the vector is the lowering's `position`."""
    f, w = qv.fragment, qv.words
    forms = PAIR_WORDS[dtype]
    k = len(forms)
    t_values = range(w)
    order, word_of = _pair_order(qv)
    pack = "\n".join(f"    wd[dn][{x}] = {form.format(a=value('dn', order[0]), b=value('dn', order[1]))};"
                     for x, form in enumerate(forms))
    rounds = []
    for r in qv.rounds:
        for x in range(k):
            sent = select("tl", [f"wd[{c(qv.sent_group(CExpr('u'), t, r))}][{x}]" for t in t_values])
            off = qv.offset(r)
            got = sent if off == 0 else f"__shfl_xor_sync(0xffffffffu, {sent}, {off})"
            rounds.append(f"    got[{r}][{x}] = {got};  // round {r}: lane ^ {off}'s pair")
    slots = []  # round r's pair into slot slot(t, r) of lane t's vector (as the interpreter scatters it)
    for r in qv.rounds:
        for s in range(w):
            lanes = [t for t in t_values if qv.slot(t, r) == s]
            if not lanes:
                continue
            for x in range(k):
                into = f"vec[{word_of[s] * k + x}]"
                if len(lanes) == w:
                    slots.append(f"    {into} = got[{r}][{x}];")
                else:
                    cond = " || ".join(f"tl == {t}" for t in lanes)
                    slots.append(f"    {into} = ({cond}) ? got[{r}][{x}] : {into};  // round {r}")
    d = c(qv.vector_column(CExpr("u"), CExpr("lane")))
    rows = "".join(f"  {line.strip()}\n" for line in row_code.splitlines() if line.strip())
    text = f"""const int tl = {c(qv.lane_in_group(CExpr('lane')))};  // the lane's place among the {w} lanes it trades with
#pragma unroll
for (int h = 0; h < {f.halves}; ++h) {{  // row half h: {qv.sets} vectors of {qv.elements} elements
{rows}  habu::u32 wd[{qv.groups}][{k}];  // the lane's column pair of each 8-column group, as words
#pragma unroll
  for (int dn = 0; dn < {qv.groups}; ++dn) {{
{pack}
  }}
#pragma unroll
  for (int u = 0; u < {qv.sets}; ++u) {{  // groups {w}·u ..: the lane's vector is group {w}·u + tl's
    habu::u32 got[{w}][{k}];
{chr(10).join(rounds)}
    habu::u32 vec[{w * k}] = {{}};
{chr(10).join(slots)}
    const {index_type} d = ({index_type})({d});  // the vector's first column
    {store('vec', w * k)}
  }}
}}
"""
    return "".join(ind + line + "\n" if line else "\n" for line in text.splitlines())


__all__ = ["PAIR_WORDS", "quad_store_rows", "select"]
