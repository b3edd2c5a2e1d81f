"""The canonical IR: a stable hash that ignores spelling and follows meaning."""

from __future__ import annotations

from tests.conftest import parse

DECLS = """
128 EXTENT: #M  64 EXTENT: #N  32 EXTENT: #K
bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  TENSOR: O ( #M #N )  ITENSOR: IX ( #M #M )
"""


def h(eq: str, decls: str = DECLS) -> str:
    return parse(decls + eq).models["G"].canonical_hash()


def test_hash_ignores_whitespace_comments_and_bound_index_names():
    base = h("MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;")
    assert h("MODEL:   G\n  O[m n] = \\ a comment\n  Σ k  A[ IX[m] k ]·B[n k]\n ;") == base
    assert h("MODEL: G O[m2 n'] = Σ k' A[IX[m2] k'] · B[n' k'] ;") == base
    assert h("MODEL: G O[m n] = sum k A[IX[m] k] * B[n k] ;") == base


def test_hash_ignores_extent_names_but_not_structure():
    other = """
    64 EXTENT: #C  32 EXTENT: #Q  128 EXTENT: #R
    bf16 TENSOR: A ( #R #Q )  bf16 TENSOR: B ( #C #Q )  TENSOR: O ( #R #C )  ITENSOR: IX ( #R #R )
    """
    assert h("MODEL: G O[r c] = Σ q A[IX[r] q] · B[c q] ;", other) == h("MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;")


def test_regression_canonical_hash_ignored_static_extent_sizes():
    """Two models differing only in a static size (128 or 256 EXTENT: #K) hashed alike, so a
    certificate (bound to the model hash, habu/prove/trust.py) made for one was accepted for the other."""
    gemm = "MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;"
    base = h(gemm)
    assert h(gemm, DECLS.replace("32 EXTENT: #K", "256 EXTENT: #K")) != base
    assert h(gemm, DECLS.replace("128 EXTENT: #M", "256 EXTENT: #M")) != base
    runtime = DECLS.replace("32 EXTENT: #K", "1..4096 EXTENT: #K")
    assert h(gemm, runtime) != base
    assert h(gemm, runtime) != h(gemm, DECLS.replace("32 EXTENT: #K", "1..8192 EXTENT: #K"))
    # a shape bound for a plan does not change the hash of the model as written
    m = parse(runtime + gemm).models["G"]
    assert m.with_sizes({"K": 511}).canonical_hash() == m.canonical_hash() == h(gemm, runtime)


def test_hash_changes_with_meaning():
    base = h("MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;")
    assert h("MODEL: G O[m n] = Σ k A[m k] · B[n k] ;") != base  # no gather
    assert h("MODEL: G O[m n] = Σ k B[n k] · A[IX[m] k] ;") != base  # operand order is kept
    assert h("MODEL: G O[m n] = 2 · Σ k A[IX[m] k] · B[n k] ;") != base
    f32 = DECLS.replace("bf16 TENSOR: A", "TENSOR: A")
    assert h("MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;", f32) != base  # dtypes are part of the model


def test_composition_and_equation_forms_of_rmsnorm_hash_alike():
    program = parse("""
        64 EXTENT: #R  32 EXTENT: #D
        TENSOR: X ( #R #D )  TENSOR: Y ( #R #D )
        MODEL: A ( x -- y ) RMSNORM ;
        MODEL: B  Y[r d] = X[r d] · rsqrt(Σ d' X[r d'] · X[r d'] / #D + 0.000001) ;""")
    assert program.models["A"].canonical_hash() == program.models["B"].canonical_hash()


def test_models_are_hashable_and_frozen():
    program = parse(DECLS + "MODEL: G O[m n] = Σ k A[IX[m] k] · B[n k] ;")
    m = program.models["G"]
    assert hash(m) == hash(m.with_sizes({}))
    assert m.with_sizes({"K": 511}).extent("K").size == 511
    assert m.with_sizes({"K": 511}).canonical_hash() == m.canonical_hash()
