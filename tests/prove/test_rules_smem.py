"""The shared-memory offsets of the wgmma (plain and batched) and column kernels, from the lowering's
maps, stay within what the block allocates (`int32-offsets`, habu/prove/rules_smem.py)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import lower_whole
from habu.prove.rules_smem import column_smem_obligations, contraction_smem_obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT


def _lowered(example: str, model: str, shape: dict[str, int]):
    m = load_program(ROOT / "examples" / example).models[model].with_sizes(shape)
    return lower_whole(m, default_plan(m, TARGETS["sm_90a"], shape)).kernels[0]


def test_a_batched_wgmma_kernels_stage_tiles_and_store_buffers_are_within_its_shared_memory():
    lw = _lowered("bmm.habu", "SCORES", {"B": 3, "I": 72, "J": 80, "D": 64})
    obs = list(contraction_smem_obligations("k0", lw))
    assert len(obs) == 3 and all(o.formula is True for o in obs), obs
    # a stage stride one tile pair longer: the last stage runs into the TMA-store buffers
    moved = replace(lw, operands=replace(lw.operands, stage_stride=lw.operands.stage_stride + 16384))
    bad = [o for o in contraction_smem_obligations("k0", moved) if o.formula is False]
    assert all(o.rule.name == "int32-offsets" for o in bad) and any("stage tiles' end" in o.statement for o in bad)
    # the store buffers moved past the barriers
    far = replace(lw, tma_store=replace(lw.tma_store, base=lw.tma_store.base + 1024))
    bad = [o for o in contraction_smem_obligations("k0", far) if o.formula is False]
    assert {o.statement.split(":")[0] for o in bad} == {
        "32-bit shared-memory byte offset of the TMA-store buffers' end (the last consumer's last buffer)",
        f"32-bit shared-memory barriers at bytes {lw.pipeline.base}..{lw.pipeline.base + 16 * lw.pipeline.stages - 1}"}, bad
    # the ring's barriers (printed as `bars = smem_base + base`) moved into the last store buffer
    inside = replace(lw, pipeline=replace(lw.pipeline, base=lw.pipeline.base - 64))
    bad = [o for o in contraction_smem_obligations("k0", inside) if o.formula is False]
    assert any("barriers at bytes" in o.statement for o in bad), bad


def test_a_column_kernels_partial_slots_are_within_its_partials():
    lw = _lowered("bias_grad.habu", "BIAS-GRAD", {"R": 300, "N": 200})
    assert all(o.formula is True for o in column_smem_obligations("k0", lw))
    wide = replace(lw, partial_map=replace(lw.partial_map, group_stride=lw.partial_map.group_stride + 1))
    bad = [o for o in column_smem_obligations("k0", wide) if o.formula is False]
    assert len(bad) == 2 and all("partial slot" in o.statement for o in bad), bad
