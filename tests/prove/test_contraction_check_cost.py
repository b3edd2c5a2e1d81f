"""What the finite-field check of a contraction executes once: the operand tile blocks at one output origin
share, and the products of blocks that pair every A tile with every B tile (habu/prove/interp.py)."""

from __future__ import annotations

import numpy as np

import habu.prove.interp as interp
from habu.cli_grad import backward_program
from habu.compile import bind_shape
from habu.prove.block_products import block_products
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import load_program
from habu.target import target_named
from tests.conftest import EXAMPLES


def test_block_products_by_pairs_equal_the_products_block_by_block():
    f = PrimeField(2**31 - 1, 5)
    rng = np.random.default_rng(0)
    a = rng.integers(0, f.p, size=(2, 4, 8), dtype=np.int64)
    b = rng.integers(0, f.p, size=(3, 5, 8), dtype=np.int64)
    for ia, ib in ((np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1, 2, 0, 1, 2])), (np.array([1]), np.array([2]))):
        want = f.contract([a[ia], b[ib]], "xmk,xnk->xmn")
        assert np.array_equal(block_products(f, a, ia, b, ib), want)


def test_regression_ffn_backward_check_loads_each_operand_tile_once(monkeypatch):
    # the kernel computing %d2 over every column tile (dX's contraction over #H reads all of it) loaded its A tile
    # once per block, 2·224 blocks at the full FFN-SKIP width, and multiplied block by block: 135 s of the 168 s
    # check of `habu compile examples/ffn_skip.habu --backward`; blocks at one origin now share the load
    shape = {"B": 128, "D": 256, "H": 1024}
    program, name = backward_program(load_program(EXAMPLES[0].parent / "ffn_skip.habu"), "FFN-SKIP", None, "auto")
    model = bind_shape(program.model(name), shape)
    plan = default_plan(model, target_named("sm_90a"), shape, {})
    blocks: list[int] = []
    origins: list[int] = []
    real = interp._k_tile

    def counted(name, lw, side, rows, *args, **kwargs):
        blocks.append(rows.shape[0])
        origins.append(len(np.unique(rows[:, 0, 0])))
        return real(name, lw, side, rows, *args, **kwargs)

    monkeypatch.setattr(interp, "_k_tile", counted)
    assert verify_plan(model, plan, trials=1, seeds=[3]).passed
    assert blocks == origins and max(blocks) > 1  # every block loaded is at an origin of its own
