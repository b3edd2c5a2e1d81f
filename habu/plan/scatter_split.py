"""`scatter:T`: a contraction's scatter-add store taken out of its epilogue into a kernel of its own.

`dA[IX[m] k] += Σ n dO[m n] · B[n k]` (GGEMM's backward) is one node the contraction family computes
with a scatter-add epilogue: each value added at its gathered row by f32 reductions issued from the
consumer warps, which do not overlap them with the multiplies (H200, 4096³: 361 µs, against 172 µs for
the same product stored plainly). Rewritten, it is two nodes, as torch computes it (a GEMM, then
`index_add_`):

    T.mm[m k] = Σ n dO[m n] · B[n k]        a plain contraction (TMA stores, any default path)
    T[IX[m] k] += T.mm[m k]                 a scatter-add kernel (the general family's atomicAdd)

T.mm is an intermediate in f32, whatever the model's activation type: T is f32 (a scatter adds with
f32 atomicAdd only), so the product rounded to f32 once, then added, is what the fused epilogue adds
(its accumulator, f32), value for value; a 16-bit T.mm would round every product before the addition
(and integer inputs past 256 would no longer be exact: the GPU exact check would fail). The two plans
differ only in the order the duplicates of IX add, which f32 addition of the atomics leaves unspecified
either way. The rewrite is proven like any other: the finite-field check of the rewritten plan against
the model as written (T.mm is a kernel boundary, an intermediate the check already reads and writes).
"""

from __future__ import annotations

from habu.plan.patterns import as_contraction
from habu.plan.split import with_f32_part
from habu.spec.ir import Equation, Load, Model


def scatter_part(model: Model, target: str) -> tuple[Equation, Equation, Equation] | None:
    """T's node, its product as a plain node `T.mm[m k] = Σ …` and the scatter-add `T[IX[m] k] += T.mm[m k]`;
    None unless T is a scatter-add of a contraction (`as_contraction`) into an f32 target, its product
    over T's domain without a gather."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is None or as_contraction(eq) is None:
        return None
    dtype = model.tensor(target).dtype
    if dtype is None or dtype.name != "f32":
        return None
    product = Equation(f"{target}.mm", eq.lhs, eq.rhs)
    if as_contraction(product) is None or not as_contraction(product).by_default:  # type: ignore[union-attr]
        return None  # (an operand gathered on the reduction axis: a contraction the default does not take)
    scatter = Equation(target, eq.lhs, Load(product.target, eq.lhs), eq.scatter)
    return eq, product, scatter


def apply_scatter(model: Model, target: str) -> Model:
    found = scatter_part(model, target)
    assert found is not None
    eq, product, scatter = found
    return with_f32_part(model, eq, product, scatter)


__all__ = ["apply_scatter", "scatter_part"]
