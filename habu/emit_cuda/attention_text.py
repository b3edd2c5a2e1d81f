"""What the attention emitters (the mma.sync loop, its split-KV partials, the wgmma loop) print alike: the
online softmax's arithmetic as C floats, the batch coordinates of a block, and the terms a mask's index
expressions are printed with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from habu.emit_cuda.cexpr import CExpr, c
from habu.lower.attention import AttentionLowering
from habu.spec.ir import Gather, IndexConst, IndexVar


class FloatOps:
    """The online softmax's arithmetic as C floats (what the lowering's rescale and kept maximum are printed with)."""

    @staticmethod
    def max(a: str, b: str) -> str:
        return f"fmaxf({a}, {b})"

    @staticmethod
    def sub(a: str, b: str) -> str:
        return f"({a} - {b})"


def no_load(ld: Any) -> str:
    raise ValueError("the scale of the attention scores reads no tensor")


def batch_lines(lw: AttentionLowering, sizes: Mapping[str, Any], it: str) -> str:
    """Each batch index of the block's batch element `flat`, one declaration a line."""
    extent_of = dict(zip(lw.batch_axes, lw.batch_extents, strict=True))
    return "".join(f"  const {it} {a} = ({it})({c(v)});  // batch index {a} (#{extent_of[a]})\n"
                   for a, v in lw.batch_coords(CExpr("flat"), sizes).items())


def mask_term(table: Callable[[str, str], str]) -> Callable[[Any, Any], object]:
    """How a mask's index expression reads as C: the query row as `last`, another index as its variable, a
    gathered value through the index tensor's reader, a constant as it is."""

    def term(ix: Any, last: Any) -> object:
        if isinstance(ix, IndexVar):
            return last if ix.name == "i" else CExpr(f"(long long){ix.name}")
        if isinstance(ix, Gather):
            assert isinstance(ix.indices[0], IndexVar)
            return CExpr(f"(long long){table(ix.tensor, ix.indices[0].name)}")
        assert isinstance(ix, IndexConst)
        return ix.value

    return term


def chain_slot(lw: Any, chains: int, group: str, half: str) -> str:
    """The slot (`lw.chain_slot`) of score group `group`'s chain (`lw.chain_of`) in row half `half`."""
    return c(lw.chain_slot(lw.chain_of(CExpr(group), chains), CExpr(half)))


def chain_join(lw: Any, chains: int, array: str, half: str, join: Callable[[str, str], str]) -> str:
    """Row half `half`'s chains of `array` (`lw.chains_joined`, at `lw.chain_slot`) joined pairwise, a tree:
    `join(a, b)` prints one."""
    terms = [f"{array}[{c(lw.chain_slot(ch, CExpr(half)))}]" for ch in lw.chains_joined(chains)]
    while len(terms) > 1:
        terms = [join(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]
