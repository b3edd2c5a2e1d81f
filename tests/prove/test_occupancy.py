"""Two blocks of a warp-specialised wgmma contraction on one SM (`blocks_per_sm`, habu/prove/rules_occupancy.py):
the launch bound and the register split the emitter prints, and the rule that refuses a plan whose blocks do not
fit an SM together or whose path prints no bound."""

from __future__ import annotations

from dataclasses import replace

from habu.lower.registers import warp_specialized_split
from habu.paths.emit import emit_plan
from habu.plan.plan import ContractionKernel
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

TARGET = TARGETS["sm_90a"]
GELU_GRAD = """512 EXTENT: #B  256 EXTENT: #D  512 EXTENT: #H
bf16 TENSOR: A ( #B #D )  bf16 TENSOR: W ( #H #D )  bf16 TENSOR: T ( #B #H )  bf16 TENSOR: O ( #B #H )
MODEL: DG-GELU  O[b h] = (Σ d A[b d] · W[h d]) · (0.5 · (1 + erf(T[b h] · 0.7071067811865476))
  + T[b h] · 0.3989422804014327 · exp(−(0.5 · T[b h] · T[b h]))) ;
"""
TWO = {"tile": "128x128x64", "warps": "8", "blocks_per_sm": "2"}


def _plan(pins: dict[str, str]):
    model = parse_text(GELU_GRAD).models["DG-GELU"]
    return model, default_plan(model, TARGET, {}, pins)


def _broken(model, plan) -> list[str]:
    return [f"{o.rule.name}: {o.detail}" for o in failures(obligations(model, plan))]


def test_two_blocks_an_sm_halve_the_register_pool_of_the_split():
    one, two = warp_specialized_split(8), warp_specialized_split(8, 2)
    assert (one.at_launch, two.at_launch) == (248, 128)
    assert two.pool == 256 * 128 and two.fits and two.producer == 40 and two.consumer == 216


def test_the_emitter_prints_the_bound_and_the_split_for_two_blocks():
    model, plan = _plan({**TWO, "stages": "3", "store": "direct"})
    kernel = plan.kernels[0]
    assert isinstance(kernel, ContractionKernel) and kernel.blocks_per_sm == 2
    assert not _broken(model, plan)
    source = emit_plan(model, plan, TARGET).kernels[0].source
    assert "__launch_bounds__(256, 2)" in source and "setmaxnreg_inc<216>" in source
    assert "2 blocks an SM" in source


def test_two_blocks_whose_shared_memory_overflows_the_sm_by_32_bytes_are_refused():
    """3 stages of 128x128x64 and two TMA-store boxes a consumer: 115744 bytes a block (1008 of them the
    base's alignment slack); with the reserved kilobyte each, two need 233536 of the SM's 233472."""
    model, plan = _plan({**TWO, "stages": "3", "store": "tma"})
    broken = _broken(model, plan)
    assert any(b.startswith("co-resident-blocks") and "233536" in b for b in broken), broken
    model, plan = _plan({**TWO, "stages": "2", "store": "tma"})
    assert not _broken(model, plan)


def test_two_blocks_an_sm_on_a_path_that_prints_no_bound_are_refused():
    model, plan = _plan({"mma": "mma.sync"})
    forced = replace(plan, kernels=(replace(plan.kernels[0], blocks_per_sm=2),))
    broken = _broken(model, forced)
    assert any(b.startswith("co-resident-blocks") and "warp-specialised wgmma" in b for b in broken), broken


def test_one_block_an_sm_adds_no_obligation():
    model, plan = _plan({})
    assert plan.kernels[0].blocks_per_sm == 1
    assert not any(o.rule.name == "co-resident-blocks" for o in obligations(model, plan))
