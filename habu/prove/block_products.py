"""The finite-field check's products of a contraction's k step: every block's tile product at once."""

from __future__ import annotations

from typing import Any

import numpy as np


def block_products(f: Any, a: np.ndarray, ia: np.ndarray, b: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """Each block's product a[ia[x]]·b[ib[x]]ᵀ over k (x, m, n): the distinct loads `a` (i, m, k) and `b`
    (j, n, k), block x reading a's row ia[x] and b's ib[x]. Where the blocks are (nearly) every pair, all
    pairs in one product (a matrix product BLAS runs at once: the blocks of a whole output's row of tiles
    share their A tile); else block by block."""
    if len(a) * len(b) <= 2 * len(ia):
        every = f.contract([a, b], "imk,jnk->ijmn")
        return every[ia, ib]
    return f.contract([a[ia], b[ib]], "xmk,xnk->xmn")
