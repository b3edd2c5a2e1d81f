"""Random well-typed models for the compile fuzz (tests/test_random_models.py): two to four extents of small
odd sizes, an output over up to three of them, and a right side of loads (some through index maps), unary
functions, + − ·, and sums and maxima over fresh variables, nested up to four deep; one in ten a scatter-add.
Session 45's fuzz with this generator found eight bugs in planning, the evaluators and the field check."""

from __future__ import annotations

import random
import re

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


PRODUCT_SIZES = (16, 17, 64, 100, 128, 192, 256, 511)
EPILOGUES = ("", "tanh", "sigmoid", "exp", "erf", "abs", "-")


def random_product(seed: int) -> str:
    """The text of model FZ: a product `Y[(b) m n] = f(scale · Σ k A·B + C[n]) · P[m]` at sizes where the
    tensor-core paths run (16 to 511: whole, ragged and odd tiles), each operand k-major or transposed, A's rows gathered or not,
    a batch axis or not, each epilogue term present or not, the output f32 or bf16 or a scatter-add of its rows."""
    rng = random.Random(seed)
    batched = rng.random() < 0.25
    sizes = {e: rng.choice(PRODUCT_SIZES) for e in ("M", "N", "K")}
    sizes["B"] = rng.choice((2, 3, 5))
    pre = ["b"] if batched else []
    a_idx = [*pre, *(["m", "k"] if rng.random() < 0.7 else ["k", "m"])]
    b_idx = [*pre, *(["n", "k"] if rng.random() < 0.6 else ["k", "n"])]
    gathered = not batched and rng.random() < 0.2
    if gathered:  # A's rows through an index map (a GGEMM)
        sizes["T"] = rng.choice(PRODUCT_SIZES)
        a_idx = ["IX[m]" if v == "m" else v for v in a_idx]
    extent = {"b": "B", "m": "M", "n": "N", "k": "K", "IX[m]": "T"}
    a_dtype = rng.choice(["bf16", "bf16", "bf16", "f32"])
    term = f"Σ k A[{' '.join(a_idx)}] · W[{' '.join(b_idx)}]"
    if rng.random() < 0.3:
        term = f"{rng.choice(['0.5', '2', '0.125'])} · ({term})"
    extra: list[str] = []
    if rng.random() < 0.4:
        term = f"({term}) + C[n]"
        extra.append(f"{rng.choice(['f32', 'bf16'])} TENSOR: C ( #N )")
    fn = rng.choice(EPILOGUES)
    if fn:
        term = f"{fn}({term})"
    if rng.random() < 0.2:
        term = f"({term}) · P[m]"
        extra.append("f32 TENSOR: P ( #M )")
    scatter = not batched and not gathered and rng.random() < 0.15
    out = [*pre, "m", "n"]
    if scatter:  # its rows added into Y's rows through IS
        sizes["S"] = rng.choice(PRODUCT_SIZES)
        lhs, store, y_over, y_dtype = "Y[IS[m] n]", "+=", ["S", "N"], "f32"
    else:
        lhs, store = f"Y[{' '.join(out)}]", "="
        y_over, y_dtype = [extent[v] for v in out], rng.choice(["f32", "bf16"])
    used = {"B": batched, "M": True, "N": True, "K": True, "T": gathered, "S": scatter}
    lines = [" ".join(f"{sizes[e]} EXTENT: #{e}" for e, drawn in used.items() if drawn)]
    lines.append(f"{a_dtype} TENSOR: A ( {' '.join('#' + extent[v] for v in a_idx)} )")
    lines.append(f"bf16 TENSOR: W ( {' '.join('#' + extent[v] for v in b_idx)} )")
    lines += extra
    lines.append(f"{y_dtype} TENSOR: Y ( {' '.join('#' + e for e in y_over)} )")
    if gathered:
        lines.append("ITENSOR: IX ( #M #T )")
    if scatter:
        lines.append("ITENSOR: IS ( #M #S )")
    lines.append(f"MODEL: FZ  {lhs} {store} {term} ;")
    return "\n".join(lines) + "\n"


MASKS = ("n ≤ m + {c}", "m < n", "n ≤ m + #N − #M", "m + n ≥ {c}", "n ≠ m", "m ≥ {c}")


def random_masked_product(seed: int) -> str:
    """`random_product(seed)` with a condition on its output's indices around its right side or beside it
    (session 63: a contraction's epilogue computes a causal-style mask, habu/lower/conditions.py):
    `where(n ≤ m + c, f(…), fill)`, `f(…) · where(m < n, 1, 0)`, a batch index in the condition too."""
    rng = random.Random(seed + 7_000_003)
    *head, line = random_product(seed).rstrip("\n").split("\n")
    lhs, store, term = re.fullmatch(r"MODEL: FZ  (.*?) (\+?=) (.*) ;", line).groups()
    cond = rng.choice(MASKS + (("b ≤ n",) if lhs.startswith("Y[b ") else ())).format(c=rng.choice((0, 3, 17, 40)))
    fill = rng.choice(("0", "−∞", "1.5"))
    form = rng.random()
    if form < 0.5:
        term = f"where({cond}, {term}, {fill})"
    elif form < 0.8:
        term = f"({term}) · where({cond}, 1, 0)"
    else:
        term = f"where({cond}, {term}, {fill}) + 1"
    return "\n".join([*head, f"MODEL: FZ  {lhs} {store} {term} ;"]) + "\n"


ROW_MASKS = ("j ≤ i + {c}", "i < j", "j ≤ i + #J − #I", "i + j ≥ {c}", "j ≠ i", "j ≥ {c}", "i ≥ {c}")


def random_masked_rows(seed: int) -> str:
    """The text of model FZ: a row reduction or a softmax under a condition on the row's and the column's indices
    (session 64: row kernels compute conditions, habu/lower/rows.py `conditions_on_columns`), over 2-D rows or
    rows with a leading batch axis, with a saved-statistic form: `Y[(b) i] = max/Σ j where(c, f(X…), fill)`,
    `Y[(b) i j] = softmax_j(where(c, X…, −∞))`, `Y[(b) i j] = div0(where(c, exp(X − M), 0), L)`."""
    rng = random.Random(seed + 9_000_011)
    sizes = {"I": rng.choice((1, 3, 17, 40, 128, 130)), "J": rng.choice((1, 5, 33, 64, 200, 256)),
             "B": rng.choice((1, 2, 3))}
    batch = rng.random() < 0.4
    b, bx = ("b ", "#B ") if batch else ("", "")
    dtype = rng.choice(("f32", "bf16"))
    cond = rng.choice(ROW_MASKS).format(c=rng.choice((0, 3, 17)))
    x = f"X[{b}i j]"
    form = rng.choice(("max", "sum", "softmax", "weights"))
    lines = [f"{n} EXTENT: #{e}" for e, n in sizes.items()]
    lines += [f"{dtype} TENSOR: X ( {bx}#I #J )", f"f32 TENSOR: M ( {bx}#I )", f"f32 TENSOR: L ( {bx}#I )"]
    if form in ("max", "sum"):
        f = rng.choice((x, f"exp({x} − M[{b}i])", f"{x} · {x}", f"tanh({x})"))
        fill = "−∞" if form == "max" and rng.random() < 0.7 else "0"
        op = "max" if form == "max" else "Σ"
        lines += [f"f32 TENSOR: Y ( {bx}#I )", f"MODEL: FZ  Y[{b}i] = {op} j where({cond}, {f}, {fill}) ;"]
    elif form == "softmax":
        lines += [f"{dtype} TENSOR: Y ( {bx}#I #J )", f"MODEL: FZ  Y[{b}i j] = softmax_j(where({cond}, {x}, −∞)) ;"]
    else:
        lines += [f"{dtype} TENSOR: Y ( {bx}#I #J )",
                  f"MODEL: FZ  Y[{b}i j] = div0(where({cond}, exp({x} − M[{b}i]), 0), L[{b}i]) ;"]
    return "\n".join(lines) + "\n"


def random_shared_product(seed: int) -> str:
    """The text of model FZ: a product that reads one tensor as both operands, m and n over one extent (session
    58's find: the Gram matrix's field check, S·S's tensor maps): `Y[m m2] = f(Σ k A[m k] · A[m2 k])` with A
    k-major or transposed on either side, or `Y[m m2] = f(Σ m3 S[m m3] · S[m3 m2])`, at tensor-core sizes."""
    rng = random.Random(seed)
    sizes = {e: rng.choice(PRODUCT_SIZES) for e in ("M", "K")}
    dtype = rng.choice(["bf16", "bf16", "f32"])
    if rng.random() < 0.5:
        a = "A[m k]" if rng.random() < 0.6 else "A[k m]"
        b = "A[m2 k]" if rng.random() < 0.6 else "A[k m2]"
        over = "#M #K" if a == "A[m k]" else "#K #M"
        if (a == "A[m k]") != (b == "A[m2 k]"):  # one tensor has one layout: both sides read it so
            b = "A[m2 k]" if a == "A[m k]" else "A[k m2]"
        term, decl = f"Σ k {a} · {b}", f"{dtype} TENSOR: A ( {over} )"
    else:
        term, decl = "Σ m3 S[m m3] · S[m3 m2]", f"{dtype} TENSOR: S ( #M #M )"
    fn = rng.choice(EPILOGUES)
    if fn:
        term = f"{fn}({term})"
    lines = [f"{sizes['M']} EXTENT: #M {sizes['K']} EXTENT: #K", decl,
             f"{rng.choice(['f32', 'bf16'])} TENSOR: Y ( #M #M )", f"MODEL: FZ  Y[m m2] = {term} ;"]
    return "\n".join(lines) + "\n"


def random_batched_product(seed: int) -> str:
    """The text of model FZ: a batched product whose batch index runs over the extent of its m axis, its n axis or
    both (session 59's find: the field check's sample box took the batch dim for n's, model 15488), each operand's
    and the output's dims in a random order: `Y[.. b m n ..] = f(Σ k A[.. b m k ..] · B[.. b n k ..])`."""
    rng = random.Random(seed)
    sizes = {"S": rng.choice((2, 3, 16, 17, 64)), "K": rng.choice(PRODUCT_SIZES), "M": rng.choice(PRODUCT_SIZES),
             "N": rng.choice(PRODUCT_SIZES)}
    m_over, n_over = rng.choice((("S", "N"), ("M", "S"), ("S", "S")))
    names = {"b": "s", "m": "s2" if m_over == "S" else "m", "n": ("s3" if m_over == "S" else "s2") if n_over == "S"
             else "n", "k": "k"}
    over = {"b": "S", "m": m_over, "n": n_over, "k": "K"}

    def dims(axes: list[str]) -> list[str]:
        rng.shuffle(axes)
        return axes

    a, b, y = dims(["b", "m", "k"]), dims(["b", "n", "k"]), dims(["b", "m", "n"])

    def decl(name: str, axes: list[str], dtype: str) -> str:
        return f"{dtype} TENSOR: {name} ( {' '.join('#' + over[x] for x in axes)} )"

    def read(name: str, axes: list[str]) -> str:
        return f"{name}[{' '.join(names[x] for x in axes)}]"

    dtype = rng.choice(["bf16", "bf16", "f32"])
    term = f"Σ k {read('A', a)} · {read('B', b)}"
    fn = rng.choice(EPILOGUES)
    if fn:
        term = f"{fn}({term})"
    used = sorted({over[x] for x in "bmnk"})
    lines = [" ".join(f"{sizes[e]} EXTENT: #{e}" for e in used), decl("A", a, dtype), decl("B", b, dtype),
             decl("Y", y, rng.choice(["f32", "bf16"])), f"MODEL: FZ  {read('Y', y)} = {term} ;"]
    return "\n".join(lines) + "\n"


ATTENTION_MASKS = ("", "j ≤ i", "j ≤ i + #J − #I", "j < i", "j ≥ i", "j ≤ i + 17")


def random_attention(seed: int) -> str:
    """The text of model FZ: a softmax-weighted sum in attention's form (issue 22), each tensor's dims in a random
    order (BHSD, BSHD, heads last), one head axis or grouped query heads (g, r), a mask from `ATTENTION_MASKS`
    and a padded batch's lengths (`j < LEN[b]`), the scale rsqrt(#E), a constant or none, head widths 16-128, bf16
    or f32 operands and outputs:
    `O[.. i d] = Σ j softmax_j(where(mask, Σ e Q[.. i e]·K[.. j e]·scale, −∞))·V[.. j d]`."""
    rng = random.Random(seed + 11_000_027)
    gqa = rng.random() < 0.4
    heads = ["g", "r"] if gqa else ["h"]
    sizes = {"B": rng.choice((1, 2)), "I": rng.choice((1, 17, 64, 130, 200)), "J": rng.choice((1, 17, 64, 200, 333)),
             "E": rng.choice((16, 64, 64, 128, 32)), "D": rng.choice((16, 64, 64, 128))}
    sizes.update({"G": 2, "R": rng.choice((1, 2))} if gqa else {"H": rng.choice((1, 2, 3))})
    kv_heads = ["g"] if gqa else ["h"]

    def order(axes: list[str]) -> list[str]:
        if rng.random() < 0.6:  # the usual orders: batch first, the head width last
            mid = axes[1:-1]
            rng.shuffle(mid)
            return [axes[0], *mid, axes[-1]]
        rng.shuffle(axes)
        return axes

    q, k, v = order(["b", *heads, "i", "e"]), order(["b", *kv_heads, "j", "e"]), order(["b", *kv_heads, "j", "d"])
    o = order(["b", *heads, "i", "d"])
    extent = {"b": "B", "h": "H", "g": "G", "r": "R", "i": "I", "j": "J", "e": "E", "d": "D"}

    def decl(name: str, axes: list[str], dtype: str) -> str:
        return f"{dtype} TENSOR: {name} ( {' '.join('#' + extent[a] for a in axes)} )"

    def read(name: str, axes: list[str]) -> str:
        return f"{name}[{' '.join(axes)}]"

    dtype = rng.choice(("bf16", "bf16", "bf16", "f32"))
    scale = rng.choice((" · rsqrt(#E)", " · rsqrt(#E)", " · 0.125", ""))
    scores = f"Σ e {read('Q', q)} · {read('K', k)}{scale}"
    mask = rng.choice(ATTENTION_MASKS)
    body = f"where({mask}, {scores}, −∞)" if mask else scores
    used = sorted({extent[a] for a in [*q, *k, *v, *o]})
    out_dtype = rng.choice(("f32", "bf16"))
    lengths = rng.random() < 0.25  # a padded batch: sequence b's keys below LEN[b] (drawn last: seeds kept)
    if lengths:
        body = f"where(j < LEN[b], {body}, −∞)"
    lines = [" ".join(f"{sizes[e]} EXTENT: #{e}" for e in used) + (f" {sizes['J'] + 1} EXTENT: #L" if lengths else ""),
             decl("Q", q, dtype), decl("K", k, dtype), decl("V", v, dtype), decl("O", o, out_dtype),
             *(["ITENSOR: LEN ( #B #L )"] if lengths else []),
             f"MODEL: FZ  {read('O', o)} = Σ j softmax_j({body}) · {read('V', v)} ;"]
    return "\n".join(lines) + "\n"


LAYER_TOKENS = (1, 16, 17, 128, 300)
LAYER_WIDTHS = (64, 100, 128, 192, 256, 511)


def random_layer(seed: int) -> str:
    """The text of model FZ: a small layer of several equations at tensor-core sizes, each weight in either layout,
    drawn from: a product with a bias and an activation (GELU by erf, SiLU, tanh or none), a gated product
    (SwiGLU), an RMS norm of the hidden row scaling the down projection, a residual add:
    `H[t h] = act(Σ d X[t d]·W1[h d] + B1[h])`, `A[t h] = H·sigmoid(H)·G` with `G = Σ d X·W3`,
    `R[t] = rsqrt(Σ h A·A / #H + ε)`, `Y[t d] = (Σ h A[t h]·W2[d h])·R[t] + X[t d]`."""
    rng = random.Random(seed + 13_000_049)
    sizes = {"T": rng.choice(LAYER_TOKENS), "D": rng.choice(LAYER_WIDTHS), "H": rng.choice(LAYER_WIDTHS)}
    dtype = rng.choice(("bf16", "bf16", "f32"))

    def weight(name: str, out: str, inp: str) -> tuple[str, str]:
        axes = [out, inp] if rng.random() < 0.6 else [inp, out]
        return (f"{dtype} TENSOR: {name} ( {' '.join('#' + a.upper() for a in axes)} )",
                f"{name}[{' '.join(axes)}]")

    decls = [f"{dtype} TENSOR: X ( #T #D )"]
    d1, w1 = weight("W1", "h", "d")
    decls.append(d1)
    pre = f"Σ d X[t d] · {w1}"
    if rng.random() < 0.5:
        decls.append(f"{dtype} TENSOR: B1 ( #H )")
        pre += " + B1[h]"
    act = rng.choice(("gelu", "silu", "tanh", ""))
    h = {"gelu": "0.5 · S[t h] · (1 + erf(S[t h] · 0.70710678))", "silu": "S[t h] · sigmoid(S[t h])",
         "tanh": "tanh(S[t h])", "": "S[t h]"}[act]
    eqs = [f"S[t h] = {pre}", f"A[t h] = {h}"]
    if rng.random() < 0.3:  # gated: A · (Σ d X·W3)
        d3, w3 = weight("W3", "h", "d")
        decls.append(d3)
        eqs += [f"G[t h] = Σ d X[t d] · {w3}", "Z[t h] = A[t h] · G[t h]"]
        last = "Z"
    else:
        last = "A"
    d2, w2 = weight("W2", "d", "h")
    decls.append(d2)
    down = f"Σ h {last}[t h] · {w2}"
    if rng.random() < 0.3:  # the hidden row's RMS scales the down projection
        eqs.append(f"R[t] = rsqrt(Σ h {last}[t h] · {last}[t h] / #H + 0.000001)")
        down = f"({down}) · R[t]"
    if rng.random() < 0.5:
        down += " + X[t d]"
    eqs.append(f"Y[t d] = {down}")
    lines = [" ".join(f"{n} EXTENT: #{e}" for e, n in sizes.items()), *decls,
             f"{rng.choice(('f32', 'bf16'))} TENSOR: Y ( #T #D )", "MODEL: FZ  " + "\n  ".join(eqs) + " ;"]
    return "\n".join(lines) + "\n"


def with_runtime_extent(text: str, extent: str) -> str:
    """`text` with static extent `extent` (`N EXTENT: #X`) made a runtime one of the range 1..N (at least 2): the
    plan is then made for every size up to N (guards, buckets)."""
    return re.sub(rf"(?<![.\d])(\d+) EXTENT: #{extent}\b", lambda m: f"1..{max(int(m.group(1)), 2)} EXTENT: #{extent}",
                  text, count=1)
