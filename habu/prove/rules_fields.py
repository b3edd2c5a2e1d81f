"""Rules about a plan's fields and the launches they make.

- `plan-fields`: every schedule field holds one of the values the field table allows (the same
  check `Plan.from_json` makes; here a plan built in Python is refused too, before its lowering
  divides by a zero tile).
- `pipeline-stages`: a pipelined k loop (mma.sync, wgmma) keeps at least two stages.
- `grid-dims`: every grid the lowering launches is within the launch limits.
- `int32-offsets`: the thread and lane indices a kernel computes in 32 bits before any access
  (a map kernel's `(blockIdx.x·T + threadIdx.x)·V`, a staging pass's columns, a row kernel's row,
  chunk, column and cache slot, a prefetching row kernel's next row), evaluated from the lowering's
  thread maps (habu/lower/lanes.py), do not wrap; the offsets themselves are the access obligations'
  (rules.py), and the shared-memory offsets of the wgmma and column kernels are habu/prove/rules_smem.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from habu.lower import ContractionLowering, GeneralLowering, Lowering, MapLowering, RowLowering
from habu.lower.pipeline import lag_phases_apart
from habu.lower.staging import StageLowering
from habu.plan.fields import Mma, field_problems
from habu.plan.plan import ContractionKernel, Kernel
from habu.prove.obligation import INT31, INT32_OFFSETS, Context, Obligation, Rule
from habu.prove.pipeline import pipeline_problem
from habu.prove.rules_smem import contraction_smem_obligations

FIELD_RULES = {r.name: r for r in (
    Rule("plan-fields", "every schedule field holds one of the values the plan's field table allows",
         "habu/plan/plan.py (tile_k = 0 divided by zero; a row kernel of 48 threads lost its partial warp's "
         "share of the block reduction)"),
    Rule("pipeline-stages", "a pipelined k loop keeps at least two stages in flight",
         "wgmma consumers release a stage only once the next has arrived: a one-stage mbarrier ring deadlocks "
         "(ggemm K=511 with --pin stages=1 was certified); mma.sync waits for cp.async groups stages−2 behind"),
    Rule("pipeline-schedule", "the k loop's pipeline, executed with the mbarrier and cp.async-group semantics, "
         "never deadlocks, every k step multiplies the stage holding exactly its tile (no copy lands in a stage "
         "still read), and a full phase expects the bytes its TMA boxes bring",
         "PTX ISA: mbarrier phases and try_wait.parity, cp.async.wait_group (a one-stage wgmma ring deadlocked: "
         "ggemm K=511 --pin stages=1 was certified; habu/prove/pipeline.py)"),
    Rule("grid-dims", "grid dimensions are within the launch limits: x ≤ 2^31−1, y and z ≤ 65535",
         "CUDA guide: maximum grid dimensions (a staged GGEMM at M = 100000 launched grid.y = 100000)"),
)}


def field_obligations(name: str, kernel: Kernel) -> list[Obligation]:
    """The kernel's fields against the field table; structural facts, before any lowering."""
    rule = FIELD_RULES["plan-fields"]
    bad = field_problems(kernel)
    out = [Obligation(rule, name, None, f"{kf.name} is {kf.describe()}", False,
                      detail=f"{kf.name} = {value!r}: {why}") for kf, value, why in bad]
    if not bad:
        out.append(Obligation(rule, name, None, f"every field of the {kernel.kind} kernel is within its allowed "
                                                "values", True))
    if isinstance(kernel, ContractionKernel) and kernel.mma in (Mma.MMA_SYNC, Mma.WGMMA):
        out.append(Obligation(FIELD_RULES["pipeline-stages"], name, None,
                              f"the {kernel.mma} k loop pipelines {kernel.stages} stage(s): at least 2",
                              kernel.stages >= 2, detail=f"stages = {kernel.stages}"))
    return out


def fields_allowed(obs: list[Obligation]) -> bool:
    """No field is outside its values: the kernel can be lowered."""
    return not any(o.rule.name == "plan-fields" and o.formula is False for o in obs)


def launch_obligations(name: str, lw: Lowering, ctx: Context) -> Iterator[Obligation]:
    """The grid of each launch the lowering makes, and the 32-bit lane indices it computes (by its
    kind, `LAUNCHES`; a kind not listed states them with its family's rules, as the column kernel does)."""
    launches = next((LAUNCHES[t] for t in type(lw).__mro__ if t in LAUNCHES), None)  # a subclass is its base's
    if launches is not None:
        yield from launches(name, lw, ctx)


def _contraction_launch(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    s = ctx.ext
    if lw.pipeline is not None:
        problem = pipeline_problem(lw.pipeline)
        yield Obligation(FIELD_RULES["pipeline-schedule"], name, None,
                         f"the k loop's {type(lw.pipeline).__name__} of {lw.pipeline.stages} stage(s) delivers "
                         "every k tile to its step", problem is None, detail=problem or "")
    ring = lw.pipeline
    if getattr(ring, "lag", 0) and lw.kernel.persistent:  # (one tile a block: one barrier phase, nothing to mix up)
        yield _lag_phases(name, lw, ring, s)
    if not lw.kernel.persistent:  # a persistent grid is the blocks resident at once
        yield _grid(name, "x", "one block per tile (and split)", lw.tiles(s), ctx.target.max_grid_x)
    for stage in lw.pre:
        yield from _stage(f"{name} staging", stage, lw.index_width, ctx)
    yield from contraction_smem_obligations(name, lw)


def _lag_phases(name: str, lw: ContractionLowering, ring, s) -> Obligation:
    """A persistent block's lagged consumers (`MbarrierRing.lag`) meet at their named barrier once a tile, the
    first arriving, the next waiting; the first could arrive for a tile's successor before the next has waited for
    the tile (two arrivals completing the barrier without it) only by running n + min(n, lag) k tiles ahead of it,
    and the ring lets it run at most `stages` ahead (a stage is refilled once every consumer has released it)."""
    n = lw.k_tiles_per_split(s)
    return Obligation(FIELD_RULES["pipeline-schedule"], name, None,
                      f"a persistent block's lagged warpgroups meet once a tile at their named barrier: "
                      f"⌈#{lw.k}/{lw.bk}⌉ + min(that, {ring.lag}) k tiles exceed the ring's {ring.stages} stages",
                      lag_phases_apart(n, ring.lag, ring.stages),
                      detail=f"#{lw.k} may take {ring.stages - ring.lag} k tiles or fewer: the first warpgroup could "
                             "arrive for the next tile before the second has waited for this one")


def _row_launch(name: str, lw: RowLowering, ctx: Context) -> Iterator[Obligation]:
    s, k = ctx.ext, lw.kernel
    groups = lw.row_groups(s)
    yield _grid(name, "x", f"a cluster of {k.cluster} per group of {k.rows_per_block} row(s)"
                if k.cluster > 1 else f"one block per group of {k.rows_per_block} row(s)",
                groups * k.cluster, ctx.target.max_grid_x)
    if k.prefetch and lw.index_width == 32:
        # r += row_step (the clusters launched, at most the groups) after the last row
        yield _lanes(name, f"the row index r + row_step after a block's last row (≤ #{lw.rows_name} − 1 + "
                           f"⌈#{lw.rows_name}/{k.rows_per_block}⌉)", lw.rows(s) - 1 + groups)
    if lw.index_width == 32:
        yield from _row_lanes(name, lw, ctx)


def _map_launch(name: str, lw: MapLowering, ctx: Context) -> Iterator[Obligation]:
    s = ctx.ext
    yield _grid(name, "x", f"one block per {lw.per_block} elements", lw.grid(s), ctx.target.max_grid_x)
    if lw.index_width == 32:
        lanes = lw.lanes
        yield _lanes(name, f"the lane's element (blockIdx.x·{lanes.threads} + threadIdx.x)·{lanes.lane_stride} "
                           f"+ v of the last lane of the last of ⌈numel/{lw.per_block}⌉ blocks",
                     lanes.largest(lw.grid(s)))


def _general_launch(name: str, lw: GeneralLowering, ctx: Context) -> Iterator[Obligation]:
    s, k = ctx.ext, lw.kernel
    yield _grid(name, "x", f"one block per {lw.per_block} output elements", lw.grid(s), ctx.target.max_grid_x)
    if lw.index_width == 32:
        m = lw.thread_map
        if m.per_thread == 1:
            what = (f"the thread's element blockIdx.x·{m.threads} + threadIdx.x, up to "
                    f"(⌈numel/{k.threads}⌉ − 1)·{m.threads} + {k.threads} − 1")
        else:
            what = (f"the thread's element (blockIdx.x·{m.per_thread} + v)·{m.threads} + threadIdx.x, up to "
                    f"((⌈numel/{lw.per_block}⌉ − 1)·{m.per_thread} + {m.per_thread} − 1)·{m.threads} + {k.threads} − 1")
        yield _lanes(name, what, m.largest(lw.grid(s), k.threads))
        for axis, extent in lw.loops:
            yield _lanes(name, f"the loop counter {axis} < #{extent}, up to #{extent}", s[extent])


def _row_lanes(name: str, lw: RowLowering, ctx: Context) -> Iterator[Obligation]:
    """The 32-bit indices of a row kernel's threads, from the lowering's thread map (`chunk_loop`): the
    block's first row, the chunk a thread's loop reaches last (the loop variable after its last
    increment), its last column (plus a cluster block's first column) and its last cache slot."""
    s, m = ctx.ext, lw.thread_map
    loop = lw.chunk_loop(s)
    groups = lw.row_groups(s)
    yield _lanes(name, f"the row blockIdx.x·{m.rows} + row_slot of the last block", m.row(groups - 1, m.rows - 1))
    last = loop.last_chunk()
    yield _lanes(name, f"a thread's chunk index g = tid + {m.chunk_stride}·i, up to its last value", last)
    base = (lw.kernel.cluster - 1) * lw.columns(s) if lw.kernel.cluster > 1 else 0
    yield _lanes(name, f"the column {'cbase + ' if lw.kernel.cluster > 1 else ''}g·{loop.vector} + q of a thread's last "
                       "chunk", base + loop.column(last, loop.vector - 1))
    cache = lw.row_cache(s)
    if cache is not None:
        yield _lanes(name, "the row cache's slot of a thread's last chunk", cache.last_slot(loop))
    if len(lw.leading) > 1:
        # a flattened row's offsets: every access of the row reads at most the offset of X[b s .. c] at the
        # last row a block computes (masked or not) and its last column, r·#C + c
        last_row = m.row(groups - 1, m.rows - 1)
        yield _lanes(name, f"the flattened row's offset r·#{lw.c} + c at the last row (⌈#{lw.rows_name}/{m.rows}⌉·"
                           f"{m.rows} − 1) and column a thread computes", last_row * s[lw.c] + base
                     + loop.column(last, loop.vector - 1))


def _stage(name: str, stage: StageLowering, width: int, ctx: Context) -> Iterator[Obligation]:
    s = ctx.ext
    along_k, rows = stage.grid(s)
    yield _grid(name, "x", f"blocks along #{stage.k}", along_k, ctx.target.max_grid_x)
    yield _grid(name, "y", f"blocks along the rows (#{stage.rows})", rows, ctx.target.max_grid_yz)
    if stage.batch:
        yield _grid(name, "z", f"the batches ({' · '.join('#' + e for e in stage.batch_slabs())})", stage.batches(s),
                    ctx.target.max_grid_yz)
    if width == 32:
        step = stage.step_k
        yield _lanes(name, f"the column kk = k0 + the thread's offset, up to ⌈#{stage.k}/{step}⌉·{step} − 1",
                     along_k * step - 1)
        if stage.step_rows > 1:
            yield _lanes(name, f"the row r0 + the thread's offset, up to ⌈#{stage.rows}/{stage.step_rows}⌉·"
                               f"{stage.step_rows} − 1", rows * stage.step_rows - 1)


def _grid(name: str, dim: str, what: str, blocks: Any, most: int) -> Obligation:
    shown = f"grid.{dim} = {blocks}" if isinstance(blocks, int) else f"grid.{dim}"
    return Obligation(FIELD_RULES["grid-dims"], name, None,
                      f"grid.{dim} ({what}) ≤ {most}", blocks <= most,
                      detail=f"{shown} ({what}) exceeds {most} blocks")


def _lanes(name: str, what: str, largest: Any) -> Obligation:
    return Obligation(INT32_OFFSETS, name, None, f"32-bit {what} ≤ 2^31−1", largest <= INT31,
                      detail=f"{what} exceeds 2^31 − 1 in 32 bits; use 64-bit indices (--pin index=64)")


# each kind's launch obligations, by lowering type (a new kind adds its entry, or states them with its
# family's rules: the column kernel's grid is `column_obligations`', habu/prove/rules_columns.py)
LAUNCHES: dict[type, Callable[[str, Any, Context], Iterator[Obligation]]] = {
    ContractionLowering: _contraction_launch,
    RowLowering: _row_launch,
    MapLowering: _map_launch,
    GeneralLowering: _general_launch,
}
