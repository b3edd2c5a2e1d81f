"""Which adjoints of a backward derivation vanish identically (habu/spec/grad.py drops them).

Softmax is shift-invariant: its output depends on the row maximum only through `exp(x − max)`, whose
shift the normalising sum cancels, so the maximum's adjoint is exactly zero, yet the rules give it as
a sum of terms (Σ c −dY·y + Σ c dQ·exp(x − max)) and the backward would spend a pass per row on it and
another on the arg-max count that distributes it. `vanishes` evaluates an adjoint over GF(p) at small
sizes, with the forward computed from random inputs and a random output gradient, in `TRIALS`
independent fields (each function a different keyed random function there, its derivative its
rule): an adjoint that is zero in all of them is zero as an identity of the rules — it does not
depend on what exp is, only on the sum being the sum of the same values — up to a probability of
about degree/p per trial (Schwartz–Zippel). The backward with the adjoint dropped is then checked
like any other (`grad_check.adjoint_check`), which would catch a wrong drop with probability
1 − 1/p.
"""

from __future__ import annotations

import numpy as np

from habu.spec.evaluate import bind_inputs
from habu.spec.field import DEFAULT_PRIME, PrimeField, evaluate_field
from habu.spec.ir import Equation, Model, TensorDecl

TRIALS = 3
_SMALL = (3, 4, 5, 2, 6, 7)


def _sizes(model: Model) -> dict[str, int]:
    out, k = {}, 0
    for e in model.extents:
        out[e.name] = 1 if e.size == 1 else _SMALL[k % len(_SMALL)]
        k += e.size != 1
    return out


def vanishes(fwd: Model, cotangents: tuple[TensorDecl, ...], nodes: list[Equation],
             intermediates: dict[str, TensorDecl], adjoint: str) -> bool:
    """Whether `adjoint` (computed by the backward `nodes` from the forward's values and the output
    gradients `cotangents`) is zero in every trial."""
    inter = {t.name: t for t in (*fwd.intermediates, *fwd.outputs)}
    inter.update({n: t for n, t in intermediates.items() if n != adjoint})
    probe = Model(f"{fwd.name}-zero-probe", "composition", fwd.extents, (*fwd.inputs, *cotangents),
                  (intermediates[adjoint],), tuple(inter.values()), (*fwd.nodes, *nodes))
    sizes = _sizes(probe)
    probe = probe.with_sizes(sizes)
    for trial in range(TRIALS):
        field = PrimeField(DEFAULT_PRIME, seed=7919 + trial)
        rng = np.random.default_rng([7919, trial])
        values = {}
        for t in probe.inputs:
            shape = tuple(sizes[e] for e in t.extents)
            values[t.name] = (rng.integers(0, sizes[t.range], size=shape) if t.is_index
                              else field.random(rng, shape))
        bind_inputs(probe, values, where="field input")
        if np.any(np.asarray(evaluate_field(probe, values, field)[adjoint]) % field.p):
            return False
    return True
