"""Random well-typed models for the compile fuzz (tests/test_random_models.py): two to four extents of small
odd sizes, an output over up to three of them, and a right side of loads (some through index maps), unary
functions, + − ·, and sums and maxima over fresh variables, nested up to four deep; one in ten a scatter-add.
Session 45's fuzz with this generator found eight bugs in planning, the evaluators and the field check."""

from __future__ import annotations

import random

SIZES = (1, 2, 3, 5, 7, 13, 17, 33, 64, 100, 130)
UNARY = ("exp", "tanh", "sigmoid", "abs", "erf", "neg")
EXTENTS = ("P", "Q", "S", "U")


def random_model(seed: int) -> str:
    """The text of model FZ (output Y), drawn from `seed`."""
    rng = random.Random(seed)
    extents = list(EXTENTS[:rng.randint(2, 4)])
    sizes = {e: rng.choice(SIZES) for e in extents}
    tensors: dict[str, tuple[str, list[str]]] = {}
    maps: dict[str, tuple[str, str]] = {}
    fresh = [0]

    def variable(extent: str) -> str:
        fresh[0] += 1
        return f"{extent.lower()}{fresh[0] + 1}"

    def load(scope: list[tuple[str, str]]) -> str:
        if not scope:
            return rng.choice(["0.5", "2", "#" + rng.choice(extents)])
        chosen = rng.sample(scope, rng.randint(1, min(3, len(scope))))
        name = f"X{len(tensors)}"
        indices, over = [], []
        for var, extent in chosen:
            if rng.random() < 0.12:  # through an index map into a random extent
                target = rng.choice(extents)
                table = f"IX{len(maps)}"
                maps[table] = (extent, target)
                indices.append(f"{table}[{var}]")
                over.append(target)
            else:
                indices.append(var)
                over.append(extent)
        tensors[name] = (rng.choice(["f32", "bf16"]), over)
        return f"{name}[{' '.join(indices)}]"

    def expr(scope: list[tuple[str, str]], depth: int) -> str:
        r = rng.random()
        if depth <= 0 or r < 0.3:
            return load(scope)
        if r < 0.45:
            fn = rng.choice(UNARY)  # (negation is the prefix minus: the language has no function `neg`)
            return f"{'-' if fn == 'neg' else fn}({expr(scope, depth - 1)})"
        if r < 0.75:
            return f"({expr(scope, depth - 1)} {rng.choice(['+', '-', '·', '·'])} {expr(scope, depth - 1)})"
        extent = rng.choice(extents)
        var = variable(extent)
        return f"({rng.choice(['Σ', 'Σ', 'max'])} {var} {expr([*scope, (var, extent)], depth - 1)})"

    scope = [(variable(e), e) for e in rng.sample(extents, rng.randint(0, min(3, len(extents))))]
    body = expr(scope, rng.randint(1, 4))
    out_dtype = rng.choice(["f32", "f32", "bf16"])
    if scope and out_dtype == "f32" and rng.random() < 0.1:  # a scatter-add along the first output variable
        var, extent = scope[0]
        target = rng.choice(extents)
        maps["IS"] = (extent, target)
        lhs = "Y[" + " ".join([f"IS[{var}]", *(v for v, _ in scope[1:])]) + "]"
        out, store = [target, *(e for _, e in scope[1:])], "+="
    else:
        lhs = f"Y[{' '.join(v for v, _ in scope)}]" if scope else "Y"
        out, store = [e for _, e in scope], "="
    lines = [" ".join(f"{sizes[e]} EXTENT: #{e}" for e in extents)]
    lines += [f"{dt} TENSOR: {name} ( {' '.join('#' + e for e in over)} )" for name, (dt, over) in tensors.items()]
    lines.append(f"{out_dtype} TENSOR: Y ( {' '.join('#' + e for e in out)} )")
    lines += [f"ITENSOR: {name} ( #{e} #{target} )" for name, (e, target) in maps.items()]
    lines.append(f"MODEL: FZ  {lhs} {store} {body} ;")
    return "\n".join(lines) + "\n"
