"""The share of emitted lines printed from the lowering is measured, not assumed: a line counts only if
a perturbation of the lowering moves it."""

from __future__ import annotations

from habu.bench.derived_lines import CASES, run


def test_every_path_prints_some_of_its_index_arithmetic_from_the_lowering():
    rows = {m.label: m for m in run()}
    assert set(rows) == {c[0] for c in CASES}
    for m in rows.values():
        assert 0 < m.index_derived <= m.index_lines <= m.lines, m
    # floors as measured on 2026-12-01 (docs/VERIFY.md): a change that prints less from the lowering fails here
    # the row and map kernels print their thread maps, tail predicates, cache slots, passes and lane
    # indices from the lowering (before that, 2026-12-01: softmax 22%, rmsnorm 20%, map 33%)
    for label in ("map", "rows softmax", "rows rmsnorm", "rows softmax smem, C=1000", "rows softmax cluster"):
        assert rows[label].index_share >= 0.6, rows[label]
    # the general kernel (2026-12-01): its guard, loop bound, load and store offsets
    assert rows["general"].index_share >= 0.5
    # s27-derive17: the SIMT path's loop bounds and tile offsets, the wgmma stage tiles, TMA-store epilogue,
    # ring state update and n-contiguous B, and the column kernel's maps as data (before: fma 44%, wgmma
    # 34-36%, FFN-SKIP 44%, columns 10%)
    assert rows["fma split-k"].index_share >= 0.65, rows["fma split-k"]
    for label in ("wgmma tma", "wgmma gather cp.async + tma", "wgmma ldg, K=511", "wgmma staged, K=511"):
        assert rows[label].index_share >= 0.55, rows[label]
    assert rows["wgmma tma, n-contiguous B (FFN-SKIP: 2 GEMMs + rows)"].index_share >= 0.6
    assert rows["columns"].index_share >= 0.75, rows["columns"]
    # the merge of s27-derive17 with s27-batched: a batched wgmma plan keeps derive17's maps (stage tiles,
    # TMA-store epilogue with the batch in its box origin, ring state); 24/73 (33%) on main before the merge
    batched = rows["wgmma tma batched (bmm: TMA-store box 1 per batch)"]
    assert batched.index_share >= 0.5, batched
    # s28-derive18: the block decode (split, pid, batch), tile origins, k range start, the accumulator's
    # thread decode, the barrier addresses and the general kernel's element and coordinates (before: all
    # 505/770, general 50%, batched 55%, wgmma 57-65%)
    assert rows["general"].index_share == 1.0, rows["general"]
    assert batched.index_share >= 0.75, batched
    for label in ("wgmma tma", "wgmma gather cp.async + tma", "wgmma ldg, K=511", "wgmma staged, K=511"):
        assert rows[label].index_share >= 0.75, rows[label]
    # s29-hard17: the wgmma kernels no longer declare k0/m/n/smem where they never read them (16 derived
    # lines fewer), the column kernel's block decode and row mask come from the lowering, and the grouped,
    # scatter-add and unfused attention paths are measured (before: 627 of these cases, columns 81%)
    for label in ("columns", "columns, epilogue by each tile's last split"):
        assert rows[label].index_share >= 0.9, rows[label]
    assert rows["scatter-add (general, atomic)"].index_share == 1.0
    assert rows["attention unfused (wgmma scores, softmax, mma.sync PV)"].index_share >= 0.75
    assert sum(m.index_derived for m in rows.values()) >= 850
    # s30-att22: the fused attention kernel measured, its fragment loops, copies, register decode, B registers
    # and KV loop printed from the lowering (before: 35/76 and 35/75, 46%)
    for label in ("attention fused (mma.sync, online softmax)",
                  "attention fused, causal skip (70 queries at the end of 100 keys, 32×32 tiles, 2 row tiles a warp)",
                  "attention fused, split-KV decode (lengths, 4096 keys in splits of 512)",
                  # s31-dec22: the warps' key slices, the merge's maps, the K/V buffers' prologue and prefetch
                  "attention fused, sliced split-KV decode (4 warps a block, each 16 keys of a tile, merged; 3 K/V "
                  "buffers)"):
        assert rows[label].index_share >= 0.9, rows[label]
    # s30-grp17: the grouped loops' tiles, copies, operand words, accumulator maps, thread and block decodes
    # come from the lowering (habu/lower/grouped_mma.py, grouped_wgmma.py), and the wgmma loop is measured
    # (before: mma.sync grouped 49/138 = 36%; wgmma 121/207 = 58%, fused pair 79/136 = 58%)
    for label in ("grouped (MoE: gate, up, act rows, combine scatter-add)",
                  "grouped wgmma (MoE: gate, up on the wgmma loop, act rows, combine scatter-add)",
                  "grouped wgmma, pair fused (gate + up + SwiGLU; combine scatter-add)"):
        assert rows[label].index_share >= 0.75, rows[label]
    # session 71: the staging passes' block origins, lanes and shared slots come from the lowering (77 of 94 index
    # lines of the batch-tile plan; the K = 511 plan's 59 of 74 before, 61 since)
    assert rows["wgmma staged by batch tiles (batch-innermost operands, #S = 13)"].index_share >= 0.8
    assert rows["wgmma staged, K=511"].index_derived >= 61


def test_the_session_30_paths_print_most_of_their_index_arithmetic_from_the_lowering():
    """The fused attention kernel's wgmma main loop (its TMA boxes, descriptor starts, register maps and
    fragment loop counts, which `habu.prove.interp_attention_wgmma` runs: 47% before its loops read the
    lowering's counts) and the cluster split-K (partials through DSMEM)."""
    from habu.bench.derived_lines import CASES, EXAMPLES, lower_whole, measure
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    floors = {"attention fused, wgmma/TMA main loop (FA3-style, 2 consumer warpgroups)": 0.6,
              "wgmma cluster split-K (partials through DSMEM)": 0.75,
              # session 35: the split's guard, partials and the consumers' combine (69 of 96 index lines)
              "attention fused, wgmma split-KV decode (4096 keys in splits of 1024, the consumers' combine)": 0.7}
    for label, example, model_name, shape, pins, target_name in CASES:
        if label not in floors:
            continue
        target = TARGETS[target_name]
        model = load_program(EXAMPLES / example).models[model_name]
        model = model.with_sizes(shape) if shape else model
        plan = default_plan(model, target, shape or None, pins)
        row = measure(lower_whole(model, plan),
                      lambda lw, plan=plan, target=target: [k.source for k in emit_lowered(lw, plan, target).kernels],
                      label)
        assert row.index_share >= floors.pop(label), row
    assert not floors
