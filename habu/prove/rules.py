"""The hardware rules a lowered plan must satisfy, as z3 obligations: COMMON on every target, and the
families a target's file names (`Target.rules`, habu/targets/).

Each rule produces obligations: a statement, a z3 formula over the extents (static ones fixed,
runtime ones free within their declared range) and the tensor it concerns. An obligation is
*proved* when z3 finds no extents that violate it; *violated* when it does (the counterexample is
kept); a violation that depends on a runtime extent becomes a *guard* — the plan is then valid only
where the formula holds, one member of a checked set of kernels dispatched by shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import z3

from habu.lower import (
    ContractionLowering,
    LoweredPlan,
    Lowering,
    MapLowering,
    RowLowering,
    lower,
)
from habu.lower.access import Access, cdiv, size_of
from habu.lower.general import Store
from habu.lower.rows import MAX_REGISTER_CHUNKS, MAX_REGISTER_CHUNKS_REREAD
from habu.lower.support import ROWS, accumulator_registers, lowering_smem, support_for
from habu.plan.plan import ROW_CLUSTERS, Plan
from habu.prove.obligation import (
    INT31,
    INT32_OFFSETS,
    Context,
    Obligation,
    Rule,
    _surely_false,
    context,
    discharge,
)
from habu.prove.rules_attention import ATTENTION_RULES
from habu.prove.rules_attention_wgmma import attention_family_obligations
from habu.prove.rules_columns import COLUMN_RULES, column_obligations, column_sum_obligations
from habu.prove.rules_early import EARLY_RULES, early_obligations
from habu.prove.rules_fields import FIELD_RULES, field_obligations, fields_allowed, launch_obligations
from habu.prove.rules_general import general_obligations
from habu.prove.rules_grouped import GROUPED_RULES, grouped_obligations
from habu.prove.rules_movement import cluster_obligations, movement_obligations, tma_store_obligations
from habu.prove.rules_occupancy import OCCUPANCY_RULES, occupancy_obligations
from habu.prove.rules_split import SPLIT_RULES, split_obligations
from habu.prove.rules_warm import WARM_RULES, warm_obligations
from habu.prove.rules_window import WINDOW_RULES, window_obligations
from habu.spec.ir import Model
from habu.target import Target

# ----------------------------------------------------------------------------- the rules

R = {r.name: r for r in (
    Rule("bounds", "every access is in bounds under its mask", "T16; vLLM #52576, flashinfer PR #5108"),
    Rule("index-range", "gathered indices lie in their range extent", "kernels-community #1153 (checked at run time)"),
    INT32_OFFSETS,
    Rule("k-tail-masked", "a ragged k tile contributes zero from every operand", "T16: vLLM #52576"),
    Rule("k-advance", "the k loop advances its tile offset every iteration", "T19: pytorch #186241, CUTLASS #2944"),
    Rule("smem-budget", "shared memory fits the block's limit", "cudaFuncSetAttribute limits (CUDA guide)"),
    Rule("register-budget", "accumulators fit the register file without spilling", "PTX ISA: 255 registers per thread"),
    Rule("setmaxnreg-pool", "a warp-specialised kernel's setmaxnreg requests fit the CTA's register pool",
         "PTX ISA setmaxnreg: .inc blocks until the pool has the registers (a 20-warp kernel hung on the H200)"),
    Rule("threads", "threads per block within the limit", "CUDA guide: 1024 threads per block"),
    Rule("mma-shape", "the MMA instruction's shape is legal for the dtype and target", "T18: PTX ISA; tilelang #2593"),
    Rule("cp.async-size", "cp.async copies 4, 8 or 16 bytes from addresses aligned to that size", "T13: PTX ISA cp.async"),
    Rule("vector-align", "vector loads are aligned to their width", "T13: PTX ISA ld.global.v*"),
    Rule("tma-rank", "a TMA descriptor has rank 1..5", "T1: cuTensorMapEncodeTiled"),
    Rule("tma-base-align", "a TMA global address is 16-byte aligned", "T2: cuTensorMapEncodeTiled (checked at launch)"),
    Rule("tma-dims", "TMA global dims are 1..2^32", "T3: cuTensorMapEncodeTiled"),
    Rule("tma-stride-16B", "every TMA global stride but the innermost is a multiple of 16 bytes, below 2^40",
         "T4: Triton #10927 (bf16 K=511: 1022-byte stride, 96% wrong on B200)"),
    Rule("tma-box", "TMA box dims 1..256, inner box bytes a multiple of 16", "T6: cuTensorMapEncodeTiled"),
    Rule("tma-swizzle", "the swizzle span covers the inner box bytes", "T7: cuTensorMapEncodeTiled"),
    Rule("tma-smem-align", "TMA shared destinations are 128-byte aligned (1024 with 128B swizzle)", "T10: tilelang #2379"),
    Rule("tma-gather", "plain TMA cannot gather rows; gather4 only on sm_100+, 2-D, one-row box",
         "T11: PTX ISA cp.async.bulk.tensor gather4; ptxas rejects it on sm_90a"),
    Rule("target-feature", "the target has the instruction the plan uses", "PTX ISA target requirements"),
    Rule("scatter-accumulates", "a store through an index tensor (a scatter) adds into an f32 target with "
         "atomicAdd: duplicate indices accumulate, none overwrites another", "issue 19: np.add.at semantics"),
    Rule("split-k-linear", "split-K partial sums only pass through a linear epilogue into f32", "atomicAdd semantics"),
    Rule("supported-path", "Habu's emitter has a code path for this combination", "habu/emit_cuda"),
    Rule("cluster-tiles", "a cluster's blocks share one step of the raster: the tile rows divide among them",
         "CUDA guide: thread-block clusters; PTX ISA multicast::cluster"),
    *FIELD_RULES.values(),
    *COLUMN_RULES.values(),
    *GROUPED_RULES.values(),
    *SPLIT_RULES.values(), *OCCUPANCY_RULES.values(), *EARLY_RULES.values(), *WARM_RULES.values(), *WINDOW_RULES.values(),
    *ATTENTION_RULES.values(),
)}

COMMON = ("bounds", "index-range", "int32-offsets", "k-tail-masked", "k-advance", "smem-budget",
          "register-budget", "threads", "mma-shape", "cp.async-size", "vector-align", "target-feature",
          "split-k-linear", "scatter-accumulates", "supported-path", "cluster-tiles", *SPLIT_RULES, *FIELD_RULES, *COLUMN_RULES,
          *GROUPED_RULES, *ATTENTION_RULES, *OCCUPANCY_RULES, *EARLY_RULES, *WARM_RULES, *WINDOW_RULES)


def checked_rules(target: Target) -> frozenset[str]:
    """The rules that apply on a target: COMMON, and the families its file names (`Target.rules`)."""
    return frozenset(COMMON) | frozenset(target.rules)


# ----------------------------------------------------------------------------- helpers


def _offset_terms(access: Access, coord: Mapping[str, Any], ctx: Context, table_value: Any) -> list[Any]:
    terms = []
    for pos, p in enumerate(access.positions):
        stride = access.stride(pos, ctx.ext)
        if p.kind == "const":
            terms.append(p.value * stride)
        elif p.kind == "axis":
            terms.append(coord[p.axis] * stride)
        else:
            terms.append(table_value[p.table] * stride)
    return terms


def _coords_in_tile(axes: Mapping[str, tuple[Any, int]], names: list[str]) -> tuple[dict[str, Any], list[Any]]:
    """Symbolic coordinates: for each axis a tile origin (multiple of the tile) plus a lane."""
    coord: dict[str, Any] = {}
    cons: list[Any] = []
    for a in names:
        size, tile = axes[a]
        t = z3.Int(f"tile_{a}")
        i = z3.Int(f"lane_{a}")
        cons += [t >= 0, t < cdiv(size, tile), i >= 0, i < tile]
        coord[a] = t * tile + i
    return coord, cons


def _access_obligations(name: str, access: Access, axes: Mapping[str, tuple[Any, int]], ctx: Context,
                        width: int, what: str) -> Iterator[Obligation]:
    if ctx.quick:
        return
    used = [a for a in dict.fromkeys(access.axes)]
    coord, cons = _coords_in_tile(axes, used)
    tables: dict[str, Any] = {}
    for p in access.positions:
        if p.kind == "gather":
            v = z3.Int(f"value_{p.table}")
            decl = ctx.model.tensor(p.table)
            assert decl.range is not None
            cons += [v >= 0, v < ctx.ext[decl.range]]
            tables[p.table] = v
    mask = [coord[b.axis] < size_of(b.extent, ctx.ext) if not b.inclusive else coord[b.axis] <= size_of(b.extent, ctx.ext)
            for b in access.masks]  # (a staged buffer's writes run to its padded row, "K^8")
    terms = _offset_terms(access, coord, ctx, tables)
    offset = sum(terms) if terms else 0
    numel = access.numel(ctx.ext)
    inside = z3.And(offset >= 0, offset < numel)
    yield Obligation(R["bounds"], name, access.tensor,
                     f"{what} of {access.tensor} stays in 0..numel-1 wherever its mask holds",
                     z3.Implies(z3.And(*cons, *mask), inside) if cons or mask else inside,
                     detail="an element outside the tensor is accessed")
    if width == 32:
        # every partial product and the sum, for every lane of the tile (masked or not: the
        # kernel computes the address before it predicates the access)
        fits = [z3.And(t >= -INT31 - 1, t <= INT31) for t in (*terms, offset)]
        yield Obligation(R["int32-offsets"], name, access.tensor,
                         f"32-bit offsets of {access.tensor} do not wrap (every coordinate·stride ≤ 2^31−1)",
                         z3.Implies(z3.And(*cons), z3.And(*fits)) if cons else z3.And(*fits),
                         detail="an offset exceeds 2^31 − 1; use 64-bit indices")
    for p in access.positions:
        if p.kind == "gather":
            decl = ctx.model.tensor(p.table)
            yield Obligation(R["index-range"], name, p.table,
                             f"values of {p.table} are in 0..#{decl.range}-1 (checked before launch)", True,
                             status="runtime-check", how="checked by the runtime before every launch")


def scatter_accumulates(name: str, store: Store, out: Access, overwrite: str) -> Obligation:
    """`scatter-accumulates` of a scatter node's store (`T[IX[r] n] += …`): f32 atomicAdd (`overwrite`: why not)."""
    return Obligation(R["scatter-accumulates"], name, out.tensor,
                      f"the scatter into {out.tensor} adds each value with f32 atomicAdd",
                      store is Store.ATOMIC_ADD and out.dtype == "f32",
                      detail=f"the kernel stores {out.tensor} ({out.dtype}) by {store.value}: {overwrite}")


# ----------------------------------------------------------------------------- per kernel family


def contraction_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    k = lw.kernel
    t = ctx.target
    s = ctx.ext
    axes = {"m": (s[lw.m], k.tile_m), "n": (s[lw.n], k.tile_n), "k": (s[lw.k], k.tile_k),
            # a batched kernel's batch coordinates: 0..#B-1 (the offsets' batch strides enter int32-offsets)
            **{a: (s[e], 1) for a, e in zip(lw.batch_axes, lw.batch, strict=True)}}
    yield from _access_obligations(name, lw.a, axes, ctx, lw.index_width, "every load")
    yield from _access_obligations(name, lw.b, axes, ctx, lw.index_width, "every load")
    for _value, out in lw.stores:  # the output, after the chain's other ones: each store's bounds and offsets
        yield from _access_obligations(name, out, axes, ctx, lw.index_width, "every store")
    for _ld, acc in lw.epi_loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every epilogue load")
    if any(eq.target == lw.kernel.nodes[-1] and eq.scatter is not None for eq in ctx.model.nodes):
        yield scatter_accumulates(name, lw.store, lw.out, "rows whose indices repeat would overwrite each other")
    for stage in lw.pre:
        row_axis = stage.row_axis
        # (a batched operand's source and buffer read their batch positions at the batch axes: inside, but for a
        # batch axis the pass tiles, whose last tile is masked at its extent)
        # every coordinate a block computes (k to the padded row; masked or not), in the pass's blocks and tiles
        stage_axes = {row_axis: (s[stage.rows], stage.step_rows), "k": (stage.row_length(s), stage.step_k),
                      **{a: (s[e], stage.tile.across if stage.tile and stage.tile.axis == a else 1)
                         for a, e in zip(lw.batch_axes, lw.batch, strict=True)}}
        yield from _access_obligations(f"{name} staging", stage.src, stage_axes, ctx, lw.index_width, "every load")
        yield from _access_obligations(f"{name} staging", stage.dst, stage_axes, ctx, lw.index_width, "every store")

    # ragged k: both operands masked on k whenever K is not a multiple of BK
    for acc in (lw.a, lw.b):
        masked = any(b.axis == "k" and not b.inclusive for b in acc.masks)
        yield Obligation(R["k-tail-masked"], name, acc.tensor,
                         f"{acc.tensor} is masked on k (k < #{lw.k}) for the ragged last k tile",
                         z3.Or(s[lw.k] % k.tile_k == 0, masked),
                         detail=f"{acc.tensor}'s k mask is {'missing' if not masked else 'k <= K'}")
    yield Obligation(R["k-advance"], name, None, f"k0 advances by tile_k = {k.tile_k} each iteration",
                     lw.k_step == k.tile_k, detail=f"k0 advances by {lw.k_step}")

    support = support_for(k)
    yield from supported(name, lw, ctx)
    # the instruction and its shape
    shape = support.shape(lw, t)
    yield Obligation(R["mma-shape"], name, None, shape.statement, shape.ok, detail=shape.detail)
    threads = 32 * k.warps
    yield Obligation(R["threads"], name, None, f"{threads} threads per block ≤ {t.max_threads_per_block}",
                     threads <= t.max_threads_per_block, detail=f"{threads} threads")
    # registers: the compiler may use at most 65536 / threads per thread (launch bounds), 255 at most
    cap = min(255, (65536 // threads) // 8 * 8)
    acc_regs = accumulator_registers(k)
    need = support.registers(k)
    where = f"65536 over {threads} threads"
    split = support.register_split(k)
    if split is not None:
        cap, where = split.consumer, "a consumer thread's share after setmaxnreg"
        yield Obligation(R["setmaxnreg-pool"], name, None, split.describe(), split.fits,
                         detail=f"{split.demand} registers asked of a {split.pool}-register pool")
    yield Obligation(R["register-budget"], name, None,
                     f"about {need} registers per thread ({acc_regs} accumulators) ≤ {cap} "
                     f"({where})", need <= cap,
                     detail=f"{acc_regs} accumulator registers per thread, {cap} available")
    layout = lowering_smem(lw)
    yield Obligation(R["smem-budget"], name, None,
                     f"{layout.total} bytes of shared memory ≤ {t.smem_per_block}",
                     layout.total <= t.smem_per_block,
                     detail=f"{layout.total} bytes of shared memory; the target has {t.smem_per_block}")
    yield from occupancy_obligations(name, k, split, layout.total, t)
    if k.split_k > 1:
        yield from split_obligations(name, lw, ctx, R["target-feature"], R["split-k-linear"])

    # data movement per operand
    for side, acc, move, vec in (("A", lw.a, k.a_move, k.a_vector), ("B", lw.b, k.b_move, k.b_vector)):
        yield from movement_obligations(name, side, acc, move, vec, lw, ctx, layout)
    if k.store == "tma":
        yield from tma_store_obligations(name, lw, ctx, layout)
    yield from column_sum_obligations(name, lw, ctx)  # a column sum in the epilogue (habu/lower/column_epilogue.py)
    yield from early_obligations(name, lw, ctx)  # loads read at the tile's start (`epilogue_early`)
    yield from warm_obligations(name, lw, ctx)  # the next kernel's first boxes into the L2 (`warm_next`)
    yield from window_obligations(name, lw, ctx)  # k tiles skipped where the model makes the terms zero
    if k.cluster_m > 1:
        yield from cluster_obligations(name, lw, ctx)


def supported(name: str, lw: Lowering, ctx: Context) -> Iterator[Obligation]:
    """What Habu's emitter can generate (no hardware rule: a plan outside it cannot be built), as the kernel's path
    says (`refusals`, habu/lower/support.py)."""
    support = support_for(lw.kernel)
    reasons = support.refusals(lw)
    yield Obligation(R["supported-path"], name, None, f"the {support.name} path supports this plan", not reasons,
                     detail="; ".join(reasons))


def rows_obligations(name: str, lw: RowLowering, ctx: Context) -> Iterator[Obligation]:
    k = lw.kernel
    s = ctx.ext
    # the leading coordinates of a flattened row stay below their extents (r / #S < #B where r < #B·#S); the
    # 32-bit rule over the flattened row index itself is the launch's (`_row_lanes`)
    rows = {a: (s[e], k.rows_per_block if len(lw.leading) == 1 else 1) for a, e in zip(lw.row_axes, lw.leading, strict=True)}
    axes = {**rows, "c": (s[lw.c], lw.chunk)}
    for _ld, acc in lw.loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every load")
        if k.vector > 1:
            e = ctx.dtype_bytes(acc)
            c_last = acc.positions and acc.positions[-1].kind == "axis" and acc.positions[-1].axis == "c"
            aligned = z3.And(s[lw.c] % k.vector == 0) if c_last else True
            yield Obligation(R["vector-align"], name, acc.tensor,
                             f"{k.vector * e}-byte vectors of {acc.tensor} are aligned (#{lw.c} a multiple of {k.vector})",
                             aligned, detail=f"#{lw.c} is not a multiple of {k.vector}")
    for stored in lw.stores():  # a saved statistic's (RMSNorm's R1[r], one a row), then the output's
        yield from _access_obligations(name, stored, axes, ctx, lw.index_width, "every store")
    threads = k.threads * k.rows_per_block
    yield Obligation(R["threads"], name, None, "several rows per block are a warp (32 threads) each",
                     k.rows_per_block == 1 or k.threads == 32,
                     detail=f"{k.rows_per_block} rows per block of {k.threads} threads each")
    yield Obligation(R["threads"], name, None, f"{threads} threads per block ≤ {ctx.target.max_threads_per_block}",
                     threads <= ctx.target.max_threads_per_block, detail=f"{threads} threads")
    kept = lw.kept_row()
    if k.cache_row and kept is not None:
        # the emitter keeps each kept row, as its own element type (emit_rows `_kernel`): not the
        # widest of every load (an f32 per-row value), and nothing with no row kept
        n = len(lw.kept_rows())
        e = ctx.dtype_bytes(kept) * n
        cached = e * s[lw.c] * k.rows_per_block / k.cluster
        part = f"/{k.cluster}" if k.cluster > 1 else ""
        rows = f" of {n} kept rows" if n > 1 else ""
        yield Obligation(R["smem-budget"], name, None,
                         f"the cached row{rows} ({e}·#{lw.c}{part}·{k.rows_per_block} bytes) fits in "
                         f"{ctx.target.smem_per_block} bytes",
                         cached <= ctx.target.smem_per_block,
                         detail=f"the cached row needs {_number(cached)} bytes of shared memory; the target has "
                                f"{ctx.target.smem_per_block}")
    if k.cluster > 1:
        yield from _row_cluster(name, lw, ctx)
    if k.prefetch:
        yield from _row_prefetch(name, lw, ctx)
    yield from supported(name, lw, ctx)


def _row_prefetch(name: str, lw: RowLowering, ctx: Context) -> Iterator[Obligation]:
    """Persistent blocks copy their next row to shared memory (cp.async) while they compute this one
    from registers: each thread copies, and later reads back, only its own chunks."""
    k, t = lw.kernel, ctx.target
    yield Obligation(R["target-feature"], name, None, f"cp.async exists on {t.name}", t.cp_async,
                     detail=f"{t.name} has no cp.async")
    chunks, why = lw.register_fit(ctx.ext)
    yield Obligation(R["supported-path"], name, None,
                     "a block that prefetches its next row keeps this one in registers: one row per block, a "
                     "static row of 16-byte vectors, whole chunks per thread, at most "
                     f"{MAX_REGISTER_CHUNKS} each ({MAX_REGISTER_CHUNKS_REREAD} when several passes read it), within "
                     f"the registers {k.threads} threads have",
                     chunks > 0 and k.rows_per_block == 1,
                     detail=(f"{k.rows_per_block} rows per block" if k.rows_per_block != 1
                             else f"the row does not stay in registers: {why}"))


def _number(x: Any) -> str:
    """A byte count for a message: %g of a number, the formula of a z3 term (a runtime extent's)."""
    return f"{x:g}" if isinstance(x, int | float) else str(x)


def _row_cluster(name: str, lw: RowLowering, ctx: Context) -> Iterator[Obligation]:
    """The blocks of a cluster share one row: block `rank` owns columns [rank·#C/n, (rank+1)·#C/n)."""
    k, t, s = lw.kernel, ctx.target, ctx.ext
    n = k.cluster
    yield Obligation(R["target-feature"], name, None, f"thread-block clusters exist on {t.name}", t.clusters,
                     detail=f"{t.name} has no clusters")
    yield Obligation(R["supported-path"], name, None,
                     f"a cluster of {n} shares one row: a portable cluster size (1, 2, 4, 8), one row per block",
                     n in ROW_CLUSTERS and k.rows_per_block == 1,
                     detail=f"cluster of {n}, {k.rows_per_block} rows per block")
    static = ROWS.cluster_refusals(lw, s)
    yield Obligation(R["supported-path"], name, None, f"a cluster of {n} shares a static row of whole vectors",
                     not static, detail="; ".join(static))
    yield Obligation(R["vector-align"], name, None,
                     f"each block's part of a row starts on a {k.vector}-element vector (#{lw.c} a multiple of "
                     f"{n}·{k.vector})", s[lw.c] % (n * k.vector) == 0,
                     detail=f"#{lw.c} is not a multiple of {n * k.vector}")


def map_obligations(name: str, lw: MapLowering, ctx: Context) -> Iterator[Obligation]:
    s = ctx.ext
    axes = {f"e{i}": (s[e], 1) for i, e in enumerate(lw.extents)}
    for _ld, acc in lw.loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every load")
    yield from _access_obligations(name, lw.out, axes, ctx, lw.index_width, "every store")
    if lw.kernel.vector > 1 and lw.extents:
        inner = s[lw.extents[-1]]
        yield Obligation(R["vector-align"], name, lw.out.tensor,
                         f"{lw.kernel.vector}-element vectors stay aligned (#{lw.extents[-1]} a multiple of "
                         f"{lw.kernel.vector})", inner % lw.kernel.vector == 0,
                         detail=f"#{lw.extents[-1]} is not a multiple of {lw.kernel.vector}")
    yield Obligation(R["threads"], name, None, f"{lw.kernel.threads} threads per block",
                     lw.kernel.threads <= ctx.target.max_threads_per_block, detail=f"{lw.kernel.threads} threads")
    yield from supported(name, lw, ctx)


# the rule families, by the name a kernel path gives (`PathSupport.family`, habu/lower/support.py)
FAMILY: dict[str, Callable[[str, Any, Context], Iterator[Obligation]]] = {
    "contraction": contraction_obligations,
    "rows": rows_obligations,
    "map": map_obligations,
    "general": general_obligations,
    "columns": column_obligations,
    "grouped": grouped_obligations,
    "attention": attention_family_obligations,  # the FA2 rules, and the wgmma main loop's where it runs
}


def _kernel_obligations(ctx: Context, plan: Plan, only: set[int] | None,
                        lowered: LoweredPlan | None = None) -> Iterator[Obligation]:
    """Every obligation of the plan's kernels (those in `only`, else all), undischarged: the fields (a kernel
    with one outside its values is not lowered), its family's rules and launches over the context's model
    (`lowered`: as `prove` lowered it); a kernel its family cannot lower breaks supported-path."""
    storage = dict(plan.storage)
    for i, k in enumerate(plan.kernels):
        if only is not None and i not in only:
            continue
        name = f"kernel {i} ({'+'.join(k.nodes)})"
        fields = field_obligations(name, k)
        yield from fields
        if not fields_allowed(fields):
            continue
        try:
            lw = lowered.kernels[i] if lowered is not None else lower(ctx.model, k, storage)
        except ValueError as err:  # the kernel's family does not compute its node (a lowering's refusal)
            yield Obligation(R["supported-path"], name, None, f"its family computes {name}", False, detail=str(err))
            continue
        yield from FAMILY[support_for(k).family](name, lw, ctx)
        yield from launch_obligations(name, lw, ctx)


def quick_reject(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None,
                 only: set[int] | None = None) -> Obligation | None:
    """The first structural rule the plan breaks (those that need no solver), or None: the search's cheap filter
    before the z3 obligations. `only`: check these kernels alone."""
    ctx = replace(context(model, plan, sizes), quick=True)
    table = checked_rules(ctx.target)
    for ob in _kernel_obligations(ctx, plan, only):
        if ob.rule.name in table and ob.status != "runtime-check" and _surely_false(ob.formula):
            ob.status, ob.how = "violated", "fails"
            return ob
    return None


def obligations(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None,
                only: set[int] | None = None, lowered: LoweredPlan | None = None) -> list[Obligation]:
    """Every obligation of every kernel of the plan (or of the kernels in `only`), discharged. `lowered`: the plan's
    lowering when the caller has it (the proof then rules on the very objects the emitter prints)."""
    ctx = context(model, plan, sizes)
    table = checked_rules(ctx.target)
    return [discharge(ob, ctx) for ob in _kernel_obligations(ctx, plan, only, lowered) if ob.rule.name in table]


def failures(obs: list[Obligation]) -> list[Obligation]:
    return [o for o in obs if o.status == "violated"]


def guards(obs: list[Obligation]) -> list[Obligation]:
    return [o for o in obs if o.status == "guarded"]

