"""Planted mistakes in the online softmax (habu/plan/online_softmax.py): each is a rescale or a
running-maximum bookkeeping slip of the kind FlashAttention ports have shipped. The check over
Z_q × GF(p) must reject every one on the CPU, naming an output element; the correct variant passes.
Part of the mutation suite (`python -m habu.bench.mutants`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from habu.plan.online_softmax import Variant, check_online_softmax
from habu.spec.ir import Model
from habu.spec.parser import parse_text

# causal grouped-query attention, queries at the end of a longer KV sequence, and padded decode
# with an empty sequence possible: the two shapes of issue 22, at the witness sizes of the check
PREFILL = """
1 EXTENT: #B  2 EXTENT: #H  1 EXTENT: #G  5 EXTENT: #I  11 EXTENT: #J  3 EXTENT: #E  2 EXTENT: #D
TENSOR: Q ( #B #H #I #E )  TENSOR: K ( #B #G #J #E )  TENSOR: V ( #B #G #J #D )  TENSOR: O ( #B #H #I #D )
ITENSOR: H2G ( #H #G )
MODEL: PREFILL  O[b h i d] = Σ j softmax_j(where(j ≤ i + #J − #I, Σ e Q[b h i e] · K[b H2G[h] j e] · rsqrt(#E), −∞))
                             · V[b H2G[h] j d] ;
"""
DECODE = """
3 EXTENT: #B  2 EXTENT: #H  1 EXTENT: #G  11 EXTENT: #J  12 EXTENT: #L  3 EXTENT: #E  2 EXTENT: #D
TENSOR: Q ( #B #H #E )  TENSOR: K ( #B #G #J #E )  TENSOR: V ( #B #G #J #D )  TENSOR: O ( #B #H #D )
ITENSOR: H2G ( #H #G )  ITENSOR: LEN ( #B #L )
MODEL: DECODE  O[b h d] = where(0 < LEN[b], Σ j softmax_j(where(j < LEN[b], Σ e Q[b h e] · K[b H2G[h] j e], −∞))
                                             · V[b H2G[h] j d], 0) ;
"""

BUGS = {
    Variant.RESCALE_INVERTED: "the rescale written exp(m_new − m_old): earlier tiles grow instead of shrinking",
    Variant.NO_RESCALE: "no rescale when the maximum grows: earlier tiles keep their old shift",
    Variant.STALE_MAX: "the tile's weights use the new maximum but the running maximum is never stored",
    Variant.SUM_NOT_RESCALED: "the output accumulator is rescaled, the running sum is not",
}


@dataclass(frozen=True)
class SoftmaxMutant:
    name: str
    bug: str
    source: str
    variant: Variant
    tile: int = 4

    def model(self) -> Model:
        return next(iter(parse_text(self.source, f"<{self.name}>").models.values()))


SOFTMAX_MUTANTS = [SoftmaxMutant(f"online-softmax-{v.value}-{shape}", bug, text, v)
                   for v, bug in BUGS.items() for shape, text in (("prefill", PREFILL), ("decode", DECODE))]


@dataclass
class SoftmaxOutcome:
    mutant: SoftmaxMutant
    killed: bool
    message: str
    seconds: float


def run_softmax_mutant(m: SoftmaxMutant, trials: int = 2) -> SoftmaxOutcome:
    start = time.perf_counter()
    model = m.model()
    sizes = {e.name: e.size for e in model.extents if e.size is not None}
    failure = check_online_softmax(model, "O", m.tile, trials=trials, variant=m.variant, sizes=sizes)
    return SoftmaxOutcome(m, failure is not None, failure or "passed (the mutant survived)",
                          time.perf_counter() - start)
