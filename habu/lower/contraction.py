"""Lowering a contraction kernel: the grid, the raster order, the k loop, every access.

    block b -> (batch z, split s, tile tm, tile tn)   z = b / (tiles per batch) when the contraction
                                                      is batched (z -> the batch coordinates, outermost
                                                      first), the rest by the raster order (and
                                                      persistence) within the batch; in a
                                                      cluster of c along m, b's c blocks take tiles
                                                      tm = c·pm + rank of one raster step (pm, tn)
    m0 = tm·BM, n0 = tn·BN
    k tiles of split s: [s·KPS, min((s+1)·KPS, ⌈K/BK⌉)),  KPS = ⌈⌈K/BK⌉ / split⌉
    for each of them, k0 = s·KPS·BK + j·k_step:
        a[i, kk] = A at (m = m0+i, k = k0+kk)   if m < M and k < K, else 0
        b[j, kk] = B at (n = n0+j, k = k0+kk)   if n < N and k < K, else 0
        acc += a · bᵀ
    out at (m0+i, n0+j) = epilogue(acc)         if m < M and n < N  (added atomically when split > 1)

A cluster split (`split_reduce = cluster`) puts the split innermost instead (split = b mod split_k: a
tile's blocks are consecutive, one cluster, the split their rank); the blocks add their partials in
shared memory (habu/lower/split_cluster.py) and the epilogue runs once on the sum, any epilogue.

Every access of a batched kernel reads its batch positions at the block's batch coordinates (axes
"batch0", "batch1", ...: always inside, so unmasked); a TMA operand's tensor map keeps them as outer
dimensions with a box of 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import Access, Bound, VectorAccess, access_for, cdiv, floordiv, minimum
from habu.lower.batch_axes import batch_axis, batch_coordinates, is_batch_axis
from habu.lower.column_epilogue import EpilogueColumnSum, column_sum_for, placed
from habu.lower.conditions import conditions_on_axes
from habu.lower.epilogue_early import EarlyLoad, early_candidates, early_loads
from habu.lower.epilogue_pairs import pair_vector_accesses, pairable
from habu.lower.epilogue_prefetch import EpiloguePrefetch, epilogue_prefetches
from habu.lower.fragments import ACCUMULATOR, AccumulatorFragment
from habu.lower.general import Store
from habu.lower.k_bounds import NO_WINDOW, KWindow, k_window, scheduled_window
from habu.lower.layouts import FmaOperands, MmaSyncOperands, WgmmaOperands, operands_for
from habu.lower.pipeline import Pipeline, pipeline_for
from habu.lower.registers import consumer_warpgroups
from habu.lower.split_cluster import ClusterSplitReduction, cluster_reduction_for
from habu.lower.staging import StageLowering, staged
from habu.lower.tma_store import TmaStoreEpilogue, staged_outputs, tma_store_for
from habu.plan.column_epilogue import kernel_chain, summed_tensor
from habu.plan.patterns import Contraction, kernel_contraction
from habu.plan.plan import ContractionKernel
from habu.spec.ir import Equation, Expr, IndexVar, Load, Model, Op, Reduce, rename_vars

ACC = "%acc"  # the accumulator, as the epilogue expression names it


@dataclass(frozen=True)
class ContractionLowering:
    kernel: ContractionKernel
    m: str  # extent of the m axis
    n: str
    k: str
    a: Access  # positions over axes "m" and "k"
    b: Access  # positions over axes "n" and "k"
    out: Access  # positions over "m" and "n"
    epilogue: Expr  # over Load(ACC, ()) and the loads in epi_loads
    epi_loads: tuple[tuple[Load, Access], ...]
    k_step: int  # how far k0 advances per iteration (= tile_k)
    split_mode: str  # "none", or "atomic" when split_k > 1
    index_width: int
    tables: tuple[str, ...]  # index tensors read (gathers)
    pre: tuple[StageLowering, ...] = ()  # staging passes run before the contraction
    a_src: Access | None = None  # the operands as the model reads them (before any staging)
    b_src: Access | None = None
    # A's and B's staged buffers' name suffixes where an earlier kernel of the plan stages the same tensor in another
    # layout (`habu.lower.stage_names`): `@K` there, `@K_k3` here
    stage_suffix: tuple[str, str] = ("", "")
    # which output element each accumulator register holds, as the mma.sync and wgmma epilogues read
    # them (printed by the emitters; run against the instruction's layout by the finite-field check)
    fragment: AccumulatorFragment = ACCUMULATOR
    # the k loop's pipeline (habu/lower/pipeline.py): stages, barrier phases and counts, TMA boxes;
    # proven per plan by the `pipeline-schedule` rule, executed by the interpreter
    pipeline: Pipeline | None = None
    # the mma.sync and fma paths' shared-memory stage tiles, their store and read maps and warp/thread grid
    # (printed by its emitter; executed by the finite-field check, habu.prove.smem_route)
    operands: MmaSyncOperands | FmaOperands | WgmmaOperands | None = None
    # the wgmma TMA-store epilogue's staging buffers and boxes (habu/lower/tma_store.py; printed by the
    # emitter, executed by habu.prove.tma_store); a batched output's map and box origin add the batch
    # axes (`tma_box`, `tma_coordinates`: a box of 1 at the block's batch coordinates)
    tma_store: TmaStoreEpilogue | None = None
    # the extents of the batch axes batch0, batch1, ... (outermost first); () when not batched
    batch: tuple[str, ...] = ()
    # ATOMIC_ADD: a scatter-add node (`dA[IX[m] k] += Σ n …`): `out` is the element the scatter names
    # (its row through the gather, index-checked), each value added with f32 atomicAdd onto the target's
    # prior contents (never zeroed), so rows whose index repeats accumulate (`scatter-accumulates`)
    store: Store = Store.WRITE
    # split_mode "cluster": how the split blocks of a tile, one thread-block cluster, add their partial
    # tiles through distributed shared memory (habu/lower/split_cluster.py); None otherwise
    reduction: ClusterSplitReduction | None = None
    # the chain's other outputs, stored by the same epilogue (`habu.plan.patterns.epilogue_chain`: the
    # forward that saves S1 = X·W1 and S3 = GELU(S1 + B1) stores both): each node's value over Load(ACC, ())
    # and the loads of `epi_loads`, and where it is stored (positions over "m", "n" and the batch axes, its
    # masks); `out` and `epilogue` stay the chain's end. Written, never added (no split-K's atomic adds)
    extra_outs: tuple[tuple[Expr, Access], ...] = ()
    # a column sum of the chain's end over m, finished and stored by the epilogue where one tile row holds every
    # row (habu/lower/column_epilogue.py: the shuffles, the partials' slots, the finishing threads); None otherwise
    column_sum: EpilogueColumnSum | None = None
    # the tensors of `epi_loads` that are the model's inputs (no kernel of the plan writes them): those the plan's
    # `epilogue_early` may read at each tile's start (habu/lower/epilogue_early.py; the `early-epilogue-loads` rule)
    epi_inputs: tuple[str, ...] = ()
    epi_pairable: tuple[int, ...] = ()  # the `epi_loads` one load a column pair may read (habu/lower/epilogue_pairs.py)
    warm: Any = None  # the plan's next kernel's first boxes this one warms into the L2 (habu/lower/warm_next.py)
    # the k tiles each output tile needs, where an operand is zero outside a condition tying k to the tile's rows
    # or the outputs are zero on the whole tile (habu/lower/k_bounds.py; `tile_k_range`)
    window: KWindow = NO_WINDOW
    zero_window: KWindow = NO_WINDOW  # the model's, whatever the schedule (`with_kernel` keeps what the plan asks)

    @property
    def stores(self) -> tuple[tuple[Expr, Access], ...]:
        """Every output the epilogue stores, with its value: the extra outputs, then the chain's end."""
        return (*self.extra_outs, (self.epilogue, self.out))

    @property
    def staged_extras(self) -> tuple[tuple[Expr, Access], ...]:
        """The extra outputs the TMA-store epilogue stages beside the chain's end (each box's round, a buffer
        each; `TmaStoreEpilogue.outputs`); the others leave directly from the registers."""
        k = self.kernel
        if k.mma != "wgmma" or k.store != "tma" or _staged_count(self) == 1:
            return ()  # (a costing lowering has no `tma_store`: the cost model reads the same answer)
        return self.extra_outs if self.tma_store is None or self.tma_store.outputs > 1 else ()

    @property
    def prefetches(self) -> tuple[EpiloguePrefetch, ...]:
        """The epilogue's matrix tiles the producer prefetches into the L2 at each tile's start (the plan's
        `epilogue_prefetch`; habu/lower/epilogue_prefetch.py)."""
        if not getattr(self.kernel, "epilogue_prefetch", False):
            return ()
        early = {e.index for e in self.early_loads}  # already in registers from the tile's start
        return epilogue_prefetches(tuple(x for i, x in enumerate(self.epi_loads) if i not in early), self.bm, self.bn)

    @property
    def early_loads(self) -> tuple[EarlyLoad, ...]:
        """The epilogue loads each consumer thread reads into registers at each tile's start (the plan's
        `epilogue_early`; habu/lower/epilogue_early.py): the wgmma TMA-store epilogue of unsplit tiles, whose
        pairs run along n."""
        k = self.kernel
        if (not getattr(k, "epilogue_early", False) or k.mma != "wgmma" or k.store != "tma" or self.tma_store is None
                or self.split_mode != "none" or self.store != Store.WRITE or k.swap_ab):
            return ()
        slabs, groups, accumulators = self.fragment_shape
        return early_loads(early_candidates(self.epi_loads, frozenset(self.epi_inputs)), slabs, groups,
                           self.fragment.halves, accumulators)

    @property
    def fragment_shape(self) -> tuple[int, int, int]:
        """A wgmma consumer thread's accumulator fragment: (64-row slabs, 8-column groups, registers)."""
        k = self.kernel
        slabs = max(1, k.tile_m // (64 * consumer_warpgroups(k.warps, k.warp_specialized)))
        groups = k.tile_n // 8
        return slabs, groups, slabs * self.fragment.registers(groups)

    @property
    def cluster_split(self) -> bool:
        """The split blocks of a tile form a cluster and add their partials there (split innermost)."""
        return self.split_mode == "cluster"

    @property
    def atomic_store(self) -> bool:
        """The epilogue adds into the output atomically (split-K's partial sums, or a scatter-add)."""
        return self.split_mode == "atomic" or self.store is Store.ATOMIC_ADD

    @property
    def zeroed_output(self) -> bool:
        """The launcher zeroes the output first: split-K's partial sums add into it (a scatter-add keeps
        the target's prior contents)."""
        return self.split_mode == "atomic" and self.store is Store.WRITE

    @property
    def batch_axes(self) -> tuple[str, ...]:
        return tuple(batch_axis(i) for i in range(len(self.batch)))

    def batches(self, s: Mapping[str, Any]) -> Any:
        """How many products the kernel computes (1 when not batched)."""
        total: Any = 1
        for e in self.batch:
            total = total * s[e]
        return total

    @property
    def b_kmajor(self) -> bool:
        """B is contiguous along k (its stage tiles are [BN][BK], else [BK][BN])."""
        return self.b.positions[-1].axis == "k"

    @property
    def a_kmajor(self) -> bool:
        """A is contiguous along k (its stage tiles are [BM][BK], else [BK][BM]: an A stored [k m])."""
        return self.a.positions[-1].axis == "k"

    @property
    def bm(self) -> int:
        return self.kernel.tile_m

    @property
    def bn(self) -> int:
        return self.kernel.tile_n

    @property
    def bk(self) -> int:
        return self.kernel.tile_k

    # -- the grid (sizes may be ints or z3 terms)
    def tiles_m(self, s: Mapping[str, Any]) -> Any:
        return cdiv(s[self.m], self.bm)

    def tiles_n(self, s: Mapping[str, Any]) -> Any:
        return cdiv(s[self.n], self.bn)

    def k_tiles(self, s: Mapping[str, Any]) -> Any:
        return cdiv(s[self.k], self.bk)

    def k_tiles_per_split(self, s: Mapping[str, Any]) -> Any:
        return cdiv(self.k_tiles(s), self.kernel.split_k)

    def tiles(self, s: Mapping[str, Any]) -> Any:
        per_batch = self.tiles_m(s) * self.tiles_n(s) * self.kernel.split_k
        return per_batch * self.batches(s) if self.batch else per_batch

    def decode(self, linear: Any, s: Mapping[str, Any], let: Any = None
               ) -> tuple[dict[str, Any], Any, Any, Any]:
        """(batch coordinates by axis, tm, tn, split) of a linear block index: batch z = linear /
        (tiles per batch), outermost, then `tile_of` within the batch. Not batched: ({}, tile_of)."""
        if not self.batch:
            return {}, *(self.tile_of(linear, s) if let is None else self.tile_of(linear, s, let))
        let = let or (lambda _name, value: value)
        per_batch = let("tiles_per_batch", self.tiles_m(s) * self.tiles_n(s) * self.kernel.split_k)
        z = let("batch", floordiv(linear, per_batch))
        within = let("in_batch", linear - z * per_batch)
        return self.batch_coordinates(z, s, let), *self.tile_of(within, s, let)

    def batch_coordinates(self, z: Any, s: Mapping[str, Any], let: Any = None) -> dict[str, Any]:
        """The batch axes' coordinates of linear batch z (the last batch index varies fastest)."""
        return batch_coordinates(self.batch, z, s, let)

    def grid(self, s: Mapping[str, Any], sm_count: int) -> Any:
        """Blocks launched: one per tile, or, when persistent, one per block the GPU holds at once
        (`sm_count`: for a cluster kernel, the blocks of the clusters that fit), a multiple of the
        cluster so both blocks of a cluster walk the same pairs of tiles."""
        t = self.tiles(s)
        if self.kernel.persistent and isinstance(t, int):
            c = self.kernel.cluster_m
            return max(c, min(t, sm_count) // c * c)
        return t

    def tile_of(self, linear: Any, s: Mapping[str, Any], let: Any = None) -> tuple[Any, Any, Any]:
        """The (tm, tn, split) a linear tile index stands for, by the raster order.

        `let(name, value)` names intermediate values (the emitter turns them into C constants)."""
        let = let or (lambda _name, value: value)
        tm_count = let("tiles_m", self.tiles_m(s))
        tn_count = let("tiles_n", self.tiles_n(s))
        per_split = let("tiles_per_split", tm_count * tn_count)
        if self.cluster_split:  # a tile's splits are consecutive blocks, one cluster: the split is the rank
            pid = let("pid", floordiv(linear, self.kernel.split_k))
            split = let("split", linear - pid * self.kernel.split_k)
        else:
            split = let("split", floordiv(linear, per_split))
            pid = let("pid", linear - split * per_split)
        c = self.kernel.cluster_m
        if c > 1:
            # a cluster's blocks take consecutive indices: index i is block i % c of the pair of tiles
            # i / c, which the raster walks over a grid of tile rows / c (the rules prove it divides)
            rank = let("cluster_rank", pid - floordiv(pid, c) * c)
            pid = let("pair", floordiv(pid, c))
            tm_count = let("pairs_m", floordiv(tm_count, c))
        g = self.kernel.group_m
        if self.kernel.raster == "column":
            tm_count, tn_count = tn_count, tm_count
        if g > 1:
            width = g * tn_count
            group = let("group", floordiv(pid, width))
            first = let("group_first", group * g)
            size = let("group_rows", minimum(tm_count - first, g))
            within = let("within", pid - group * width)
            a = first + within - floordiv(within, size) * size
            b = floordiv(within, size)
        else:
            a = floordiv(pid, tn_count)
            b = pid - a * tn_count
        tm, tn = (b, a) if self.kernel.raster == "column" else (a, b)
        if c > 1:
            tm = tm * c + rank
        return tm, tn, split

    @property
    def epilogue_pairs(self) -> bool:
        """The epilogue stores the adjacent outputs (m, n), (m, n+1) as one 2-element vector when both
        are inside and the pair's element offset is even: the mma.sync and wgmma direct-store epilogues
        (their fragments hold column pairs), not under split-K's atomic adds, and only along a
        contiguous n in f32/bf16/f16; a scatter-add's pairs (f32) are added by one vector reduction."""
        k = self.kernel
        if k.mma == "fma" or (k.mma == "wgmma" and k.store == "tma"):
            return False
        return self.pair_store(self.out, self.store is Store.ATOMIC_ADD)

    @property
    def pair_axis(self) -> str:
        """The tile axis along which the epilogue's pairs are adjacent: n (the fragments' column pairs), or a
        cluster split's reduced pairs (`ClusterSplitReduction.pair_axis`, m for a transposed product)."""
        return self.reduction.pair_axis if self.reduction is not None else "n"

    def pair_store(self, access: Access, atomic: bool = False) -> bool:
        """Whether a direct store of `access` writes the epilogue's pairs (along `pair_axis`) as one vector
        (`epilogue_pairs` for the output; an extra output's, `extra_outs`, in every tensor-core epilogue,
        the TMA-store one included, which stores the extra outputs directly)."""
        if self.kernel.mma == "fma":
            return False
        contiguous = access.positions[-1].kind == "axis" and access.positions[-1].axis == self.pair_axis
        types = ("f32",) if atomic else ("f32", "bf16", "f16")
        return self.split_mode != "atomic" and contiguous and access.dtype in types

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """Every vector access the kernel makes of global memory (not TMA's, which the emitted tensor
        maps declare): the operands' ldg/cp.async vectors and the epilogue's pairs. The launch
        checks each tensor's base alignment from this list."""
        out: list[VectorAccess] = []
        k = self.kernel
        for access, vec, move in ((self.a, k.a_vector, k.a_move), (self.b, k.b_vector, k.b_move)):
            if vec > 1 and move in ("ldg", "cp.async"):
                out.append(VectorAccess(access.tensor, vec, f"the plan loads {access.tensor} with {vec}-element vectors"))
        stored = ([self.out] if self.epilogue_pairs else []) + [x for _, x in self.extra_outs if self.pair_store(x)]
        out += [VectorAccess(x.tensor, 2, f"the epilogue stores pairs of adjacent {x.tensor} elements as one vector")
                for x in stored]
        out += pair_vector_accesses(self)  # and the epilogue's pair loads (habu/lower/epilogue_pairs.py)
        return tuple(out)

    def tile_origin(self, tm: Any, tn: Any) -> tuple[Any, Any]:
        """(m0, n0): the first output row and column of tile (tm, tn). The interpreter computes a block's
        rows and columns from here and the emitter prints it (`m0`, `n0`)."""
        return tm * self.bm, tn * self.bn

    def k_origin(self, begin: Any, step: Any) -> Any:
        """k0 of the `step`-th k tile of a split whose tiles begin at tile `begin`: the first column of k
        its loads read. The interpreter loads each tile from here and the emitter prints it."""
        return begin * self.bk + step * self.k_step

    def k_range(self, split: Any, s: Mapping[str, Any]) -> tuple[Any, Any]:
        """The k tiles [begin, end) summed by a split."""
        kps = self.k_tiles_per_split(s)
        begin = split * kps
        end = minimum(begin + kps, self.k_tiles(s))
        return begin, end

    def tile_k_range(self, split: Any, s: Mapping[str, Any], tm: Any, tn: Any) -> tuple[Any, Any]:
        """The k tiles [begin, end) output tile (tm, tn) of a split sums: the split's (`k_range`), narrowed by the
        lowering's `window` to those whose terms the model does not make zero. The producer and consumers loop
        over it, the interpreter runs it."""
        begin, end = self.k_range(split, s)
        if not self.window:
            return begin, end
        m0, n0 = self.tile_origin(tm, tn)
        return self.window.tiles(begin, end, m0, n0, self.bm, self.bn, self.bk, s)


def _substitute_acc(expr: Expr, target: str, replacement: Expr) -> Expr:
    if isinstance(expr, Load):
        return replacement if expr.tensor == target else expr
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(_substitute_acc(a, target, replacement) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, _substitute_acc(expr.body, target, replacement))
    return expr


def lower_contraction(model: Model, kernel: ContractionKernel,
                      storage: Mapping[str, str] | None = None) -> ContractionLowering:
    chain, columns = kernel_chain(model, kernel.nodes)  # (the column nodes summing the chain's end: its epilogue's)
    nodes = [next(eq for eq in model.nodes if eq.target == t) for t in chain]
    c: Contraction | None = kernel_contraction(nodes[0], kernel)  # (swap_ab: m runs along the output's columns)
    if c is None:
        raise ValueError(f"{kernel.nodes[0]} is not a contraction")
    m_var, n_var, k_var = c.m, c.n, c.k
    axis_m = IndexVar("m", m_var.extent)
    axis_n = IndexVar("n", n_var.extent)
    extent_of_axis = {"m": m_var.extent, "n": n_var.extent, "k": k_var.extent}
    axis_of = {m_var: "m", n_var: "n", k_var: "k"}
    batch_vars = {v: IndexVar(batch_axis(i), v.extent) for i, v in enumerate(c.batch)}
    for v, ax in batch_vars.items():
        axis_of[v] = ax.name
        extent_of_axis[ax.name] = v.extent

    def access(decl, indices, axes) -> Access:
        acc = access_for(decl, indices, axes, extent_of_axis, storage)
        # a block's batch coordinates are always inside: no mask (a TMA map keeps the full dimension)
        return replace(acc, masks=tuple(b for b in acc.masks if not is_batch_axis(b.axis))) if batch_vars else acc

    a = access(model.tensor(c.a.load.tensor), c.a.load.indices, axis_of)
    b = access(model.tensor(c.b.load.tensor), c.b.load.indices, axis_of)
    # the epilogue: the accumulator (times the product's constant factors), then each fused node
    epilogue: Expr = Load(ACC, ())
    if c.scale is not None:
        epilogue = Op("mul", (epilogue, c.scale))
    prev = nodes[0]
    pos_axes = [batch_vars.get(v) or (axis_m if v == m_var else axis_n) for v in prev.lhs]
    values = [epilogue]  # each node's value, over the accumulator and the epilogue's loads
    for eq in nodes[1:]:
        mapping = {v: pos_axes[i] for i, v in enumerate(eq.lhs)}
        body = conditions_on_axes(rename_vars(eq.rhs, mapping))  # (a causal mask compares the axes)
        epilogue = _substitute_acc(body, prev.target, epilogue)
        values.append(epilogue)
        prev = eq
    epi_loads: list[tuple[Load, Access]] = []
    axis_of_epi = {axis_m: "m", axis_n: "n", **{ax: ax.name for ax in batch_vars.values()}}
    from habu.spec.ir import loads as all_loads

    outputs = {t.name for t in model.outputs}
    inputs = {t.name for t in model.inputs}
    written = {eq.target for eq in model.nodes}  # (an input a node writes in place, C of C += A·B, is not read early)
    stored = [j for j, eq in enumerate(nodes[:-1]) if eq.target in outputs]  # the chain's other outputs
    for value in (*(values[j] for j in stored), epilogue):
        for ld in all_loads(value):
            if ld.tensor == ACC or any(ld == e for e, _ in epi_loads):
                continue
            epi_loads.append((ld, access(model.tensor(ld.tensor), ld.indices, axis_of_epi)))
    first_axes = [axis_of_epi[ax] for ax in pos_axes]  # the axis of each position of the first node's lhs

    def stored_access(eq: Equation) -> Access:
        eq_axes = {v: first_axes[i] for i, v in enumerate(eq.lhs)}
        return access(model.tensor(eq.target), eq.store_indices, eq_axes)  # a scatter's stored element (IX[m] n)

    last: Equation = nodes[-1]
    out = stored_access(last)
    extra_outs = tuple((values[j], stored_access(nodes[j])) for j in stored)
    for _, extra in extra_outs:  # the field check compares them in the output's box
        if extra.extents != out.extents:
            raise ValueError(f"{extra.tensor} is stored over {extra.extents}, {out.tensor} over {out.extents}: "
                             "a contraction's outputs share their extents")
    tables = tuple(dict.fromkeys(t for t in (c.a.gather, c.b.gather, c.a.k_gather, c.b.k_gather) if t))
    unscheduled = ContractionLowering(
        kernel=kernel, m=m_var.extent, n=n_var.extent, k=k_var.extent, a=a, b=b, out=out,
        epilogue=epilogue, epi_loads=tuple(epi_loads), k_step=kernel.tile_k, split_mode="none",
        index_width=kernel.index_width, tables=tables, a_src=a, b_src=b, batch=tuple(v.extent for v in c.batch),
        store=Store.WRITE if last.scatter is None else Store.ATOMIC_ADD, extra_outs=extra_outs,
        column_sum=_summing(model, chain, columns, storage, axis_m, axis_n, epi_loads) if columns else None,
        epi_inputs=tuple(dict.fromkeys(a.tensor for _, a in epi_loads if a.tensor in inputs and a.tensor not in written)),
        epi_pairable=tuple(i for i, (_, a) in enumerate(epi_loads) if pairable(a, model.sizes)),
        zero_window=k_window(model, c, axis_of, (*(v for v, _ in extra_outs), epilogue), last.target))
    return with_kernel(unscheduled, kernel)


def _summing(model: Model, chain: tuple[str, ...], columns: tuple[str, ...], storage: Mapping[str, str] | None,
             axis_m: IndexVar, axis_n: IndexVar, epi_loads: list[tuple[Load, Access]]) -> EpilogueColumnSum:
    """The column nodes' sum (habu/lower/column_epilogue.py), of the chain's end or of one of the epilogue's loads
    at the element (`summed_tensor`)."""
    cs = column_sum_for(model, columns, storage)
    summed = summed_tensor(model, chain, columns)
    if summed is None:
        raise ValueError(f"{columns[0]} does not sum what the kernel of {chain[0]} holds at each element")
    if summed == chain[-1]:
        return cs
    load = Load(summed, (axis_m, axis_n))
    if not any(ld == load for ld, _ in epi_loads):
        raise ValueError(f"the epilogue of {chain[0]} does not read {summed} at its element")
    return replace(cs, summand=load)


def with_kernel(lw: ContractionLowering, kernel: ContractionKernel, costing: bool = False) -> ContractionLowering:
    """The lowering of the same region under another schedule: only the schedule's parts change
    (the search costs tens of thousands of candidates of one region this way). `costing`: only what
    the cost model reads — no pipeline and no shared-memory operand maps (None), which the search
    does not need to rank 100,000 candidates (they took half its enumeration time); such a lowering
    is never proven or printed."""
    assert lw.a_src is not None and lw.b_src is not None
    if kernel.swap_ab != lw.kernel.swap_ab:  # the accesses' axes are the orientation's: lower the model again
        raise ValueError("with_kernel keeps the product's orientation: lower a swap_ab schedule from the model")
    a, b = lw.a_src, lw.b_src
    pre: list[StageLowering] = []
    batch = tuple(zip(lw.batch_axes, lw.batch, strict=True))  # a batched operand's buffer keeps its batch axes
    if kernel.a_move == "staged":
        a, stage = staged(a, "m", lw.m, lw.k, lw.stage_suffix[0], batch)
        pre.append(stage)
    if kernel.b_move == "staged":  # one tensor as both operands, both staged: B's copy a buffer of its own
        twin = kernel.a_move == "staged" and lw.a_src.tensor == lw.b_src.tensor
        b, stage = staged(b, "n", lw.n, lw.k, lw.stage_suffix[1] + ("_b" if twin else ""), batch)
        pre.append(stage)
    cluster = kernel.split_k > 1 and kernel.split_reduce == "cluster"
    last = lw.out.positions[-1]  # pairs along the output's contiguous axis (m where the product is transposed)
    reduction = (cluster_reduction_for(kernel.split_k, kernel.tile_m, kernel.tile_n,
                                       consumer_warpgroups(kernel.warps, kernel.warp_specialized),
                                       "m" if last.kind == "axis" and last.axis == "m" else "n")
                 if cluster and kernel.mma == "wgmma" else None)
    tma_store = None if costing else tma_store_for(kernel, a.dtype, b.dtype, lw.out.dtype, b.positions[-1].axis == "k",
                                                   _staged_count(lw))
    return replace(lw, kernel=kernel, a=a, b=b, k_step=kernel.tile_k, window=scheduled_window(lw.zero_window, kernel),
                   split_mode="cluster" if cluster else "atomic" if kernel.split_k > 1 else "none",
                   reduction=reduction, index_width=kernel.index_width,
                   pre=tuple(pre),
                   pipeline=None if costing else pipeline_for(kernel, a.dtype, b.positions[-1].axis, a.positions[-1].axis,
                                                                 b.dtype),
                   operands=None if costing else operands_for(kernel, a, b, fma_thread_grid(kernel)),
                   tma_store=tma_store, column_sum=placed(lw.column_sum, tma_store, kernel.tile_n, kernel.tile_m))


def _twin_layout(extra: Access, out: Access) -> bool:
    """An extra output stored as the chain's end is: its type, positions, extents and strides (one box shape, one
    origin, a tensor map of the same layout)."""
    return (extra.dtype, extra.positions, extra.extents, extra.strides) == (out.dtype, out.positions, out.extents,
                                                                            out.strides)


def _staged_count(lw: ContractionLowering) -> int:
    """Outputs the TMA-store epilogue stages a box: the extra outputs too where each has the chain end's layout
    (`_twin_layout`) and the buffers hold them all."""
    twins = all(_twin_layout(x, lw.out) for _, x in lw.extra_outs)
    return staged_outputs(len(lw.extra_outs)) if twins and lw.extra_outs else 1


def fma_thread_grid(kernel: ContractionKernel) -> tuple[int, int, int, int] | None:
    """How the SIMT path spreads a tile over threads: (TX threads along n, TY along m, TN, TM outputs
    per thread), or None when the tile does not divide evenly."""
    threads = 32 * kernel.warps
    tx = 16
    while tx > 1 and (kernel.tile_n % tx or threads % tx):
        tx //= 2
    ty = threads // tx
    if kernel.tile_n % tx or kernel.tile_m % ty:
        return None
    return tx, ty, kernel.tile_n // tx, kernel.tile_m // ty


def epilogue_is_linear(lowering: ContractionLowering) -> bool:
    """Split-K adds partial results, so the epilogue must be acc · constant (or acc itself)."""
    e = lowering.epilogue
    while isinstance(e, Op) and e.fn == "mul":
        e = e.args[0]
    return isinstance(e, Load) and e.tensor == ACC and not lowering.epi_loads


def tma_order(access: Access) -> tuple[str, ...]:
    """The axes of a TMA operand's tensor-map dimensions, innermost first (its positions reversed):
    (k, m) for A[m k], (n, k) for B[k n], (k, m, batch0) for Q[b i d]."""
    return tuple(p.axis for p in reversed(access.positions))


def tma_box(access: Access, row_axis: str, box_rows: int, box_k: int, box_n: int = 0) -> tuple[int, ...]:
    """A TMA box, innermost first: `box_k` along k, `box_rows` along `row_axis`, 1 per batch (and, for
    the output's store box, `box_n` along n)."""
    sizes = {"k": box_k, "n": box_n, row_axis: box_rows}
    return tuple(sizes.get(a, 1) for a in tma_order(access))


def tma_coordinates(access: Access, by_axis: Mapping[str, Any]) -> tuple[Any, ...]:
    """A box's coordinates in the operand's tensor map, innermost first, from each axis's value."""
    return tuple(by_axis[a] for a in tma_order(access))


__all__ = ["ACC", "Bound", "ContractionLowering", "batch_axis", "epilogue_is_linear", "is_batch_axis",
           "lower_contraction", "tma_box", "tma_coordinates", "tma_order", "with_kernel"]
