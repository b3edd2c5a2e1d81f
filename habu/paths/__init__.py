"""The kernel paths, as plug-ins: one module each, listed here (see docs/ARCHITECTURE.md, "Adding a
kernel path", and `KernelPath` in habu/paths/base.py).

`PATHS` is the one list of paths: emission (habu/paths/emit.py), the search space and the cost
model (habu/search/) ask `path_for(kernel)`, the first path that takes a kernel. The analytic
default asks `default_kernel(region)`: the paths of the region's family by their `preference`, the
first whose `default` gives a kernel on the target; `region_space` is that path's search space (for
a contraction, every instruction's path that is offered). The rules (habu/prove/rules.py) sit below
this package and ask the same path's `support` (habu/lower/support.py); `register` keeps the two
lists in step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.lower import support as _support
from habu.lower.column_epilogue import schedule_refusal
from habu.lower.general import chain_refusal
from habu.paths import attention, columns, fma, general, grouped, map, mma_sync, rows, wgmma
from habu.paths.analytic import node_of
from habu.paths.base import KernelPath
from habu.paths.contraction import SKINNY_ROWS, ContractionFacts, ContractionPath, reads_early
from habu.plan.column_epilogue import kernel_chain
from habu.plan.fields import Mma
from habu.plan.patterns import Region, as_column_reduction, as_contraction, transposed_rows
from habu.plan.plan import MMAS, ContractionKernel, GeneralKernel, Kernel
from habu.spec.ir import IndexVar, Model
from habu.target import Target

# the built-in paths, in the order they are asked (and the search walks the contraction paths)
PATHS: list[KernelPath] = [fma.PATH, mma_sync.PATH, wgmma.PATH, rows.PATH, map.PATH, columns.PATH,
                           grouped.PATH, attention.PATH, general.PATH]


def path_for(kernel: Kernel) -> KernelPath:
    """The first path that takes `kernel`."""
    for p in PATHS:
        if p.accepts(kernel):
            return p
    raise ValueError(f"no kernel path takes a {type(kernel).__name__} with mma={getattr(kernel, 'mma', None)}")


def contraction_path(mma: str) -> ContractionPath:
    """The first contraction path of the instruction `mma` (the analytic default's schedule)."""
    return next(p for p in PATHS if isinstance(p, ContractionPath) and p.mma == mma)


def by_preference(family: str) -> list[KernelPath]:
    """The paths of `family` in the order the analytic default asks them (higher `preference`
    first, equal ones in the registry's order)."""
    return sorted((p for p in PATHS if p.family == family), key=lambda p: -p.preference)


def default_kernel(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Kernel:
    """The analytic default of `region`: the first path (by preference) that builds it on `target`; a
    general region whose node is a contraction with a scatter-add store or an operand gathered on its
    reduction axis (GGEMM's backward) takes the contraction where a GPU-tested path builds one (`default_contraction`)."""
    if region.kind == "general" and (k := default_contraction(model, region, target, sizes)) is not None:
        return k
    if region.kind == "general" and len(region.nodes) == 3 \
            and (k := attention.PATH.default(model, region, target, sizes)) is not None:
        return k  # a softmax-weighted sum with its row statistics (habu/plan/attention_fused.py): no other family
    if (k := elementwise_vectors(model, region, target, sizes)) is not None:
        return k
    if region.kind == "grouped" and len(region.nodes) == 3 \
            and (k := grouped.PATH.pair_default(model, region.nodes, target, sizes)) is not None:
        return k  # gate, up and the node of both in one grouped kernel (`--pin pair=fused`)
    for p in by_preference(region.kind):
        kernel = p.default(model, region, target, sizes)
        if kernel is not None:
            return kernel
    if region.kind == "grouped":  # a grouped GEMM the grouped path cannot build: the general family's
        return general.PATH.default(model, Region("general", region.nodes), target, sizes)
    raise ValueError(f"no kernel path builds a {region.kind} region on {target.name}")


def elementwise_vectors(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> GeneralKernel | None:
    """The general kernel of a row region that only maps elements (no reduction, no scatter, one stored
    node: earlier nodes inlined), where it moves vectors of 8, 4 or 2 consecutive elements
    (`loopless_vector`: static extents, aligned rows); None elsewhere (a map region keeps its map
    kernel: its lanes take `vector` elements already). The row kernel moves one element an access: H200, 4096 × 14336 bf16 (2026-12-02, docs/PERF.md), GELU's derivative 167.3 µs as
    a row kernel (53% of copy) against 108.4 µs moving 16-byte vectors, GELU 105.4 against 78.8 µs."""
    if region.kind != "rows" or chain_refusal(model, region.nodes, inlined=len(region.nodes)) is not None:
        return None  # (the last node too must map elements only)
    kernel = general.PATH.default(model, Region("general", region.nodes), target, sizes)
    return kernel if kernel.vector > 1 else None


def default_contraction(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Kernel | None:
    """The default of a general region whose node the contraction family builds on a GPU-tested path: a
    scatter-add store into an f32 target (`dA[IX[m] k] += Σ n …`, f32 atomicAdd epilogue; wgmma, or the SIMT
    path for f32 operands) or an operand gathered on the reduction axis (`Σ m dO[m n]·A[IX[m] k]`, staged;
    wgmma). Default since their exact GPU checks passed (H200, 2026-12-02, tests/gpu/test_ggemm_backward.py:
    duplicates in IX, ragged shapes); the mma.sync forms stay general unless pinned (`--pin
    family=contraction`) or searched."""
    kernel = family_kernel(model, region, "contraction", target, sizes)
    eq = node_of(model, region.nodes[0])
    tested = (Mma.WGMMA, Mma.FMA) if eq.scatter is not None else (Mma.WGMMA,)
    if not isinstance(kernel, ContractionKernel) or kernel.mma not in tested:
        return None
    target_dtype = model.tensor(eq.target).dtype
    if eq.scatter is not None and (target_dtype is None or target_dtype.name != "f32"
                                   or not isinstance(eq.scatter[-1], IndexVar)):
        return None  # a scatter adds with f32 atomicAdd only (`scatter-accumulates`); rows scattered, as GPU-tested
    return kernel


def region_space(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Iterator[Kernel]:
    """Every candidate kernel for one fusion region, in canonical order: the default's path's
    variants; for a contraction, those of each instruction's first path that is offered on `target`."""
    base = default_kernel(model, region, target, sizes)
    if not isinstance(base, ContractionKernel):
        yield from path_for(base).region_variants(model, region, base, target, sizes)
        if region.kind == "grouped" and not isinstance(base, GeneralKernel) and len(base.nodes) == 1:
            # the fallback stays a candidate (a fused pair's three nodes are no general kernel's)
            yield general.PATH.default(model, Region("general", region.nodes), target, sizes)
        elif region.kind == "general" and (g := family_kernel(model, region, "grouped", target, sizes)) is not None:
            yield from grouped.PATH.region_variants(model, region, g, target, sizes)  # P[r], scatter, f32 A
        elif region.kind == "general" and family_kernel(model, region, "contraction", target, sizes) is not None:
            yield from region_space(model, Region("contraction", region.nodes), target, sizes)  # k gather, scatter
        if region.kind in ("rows", "general") and len(region.nodes) == 1 \
                and (region.kind == "general" or transposed_rows(model, _node(model, region))) \
                and (c := family_kernel(model, region, "columns", target, sizes)) is not None:
            # a few long rows (or a general kernel's reduction over trailing axes): their reduction split
            # over the grid as a transposed column reduction
            yield from columns.PATH.region_variants(model, Region("columns", region.nodes), c, target, sizes)
        if region.kind == "columns" and len(region.nodes) == 1 and transposed_rows(model, _node(model, region)):
            # the row family's kernels stay candidates (its clusters share a row among 8 blocks)
            as_rows = Region("rows", region.nodes)
            yield from rows.PATH.region_variants(model, as_rows, rows.PATH.default(model, as_rows, target, sizes),
                                                 target, sizes)
        if region.kind == "general" and (a := attention.PATH.default(model, region, target, sizes)) is not None:
            yield from attention.PATH.region_variants(model, region, a, target, sizes)  # the fused attention
        if region.kind == "rows" and isinstance(base, GeneralKernel):  # (`elementwise_vectors`)
            for own in by_preference(region.kind):  # the row family's kernels stay candidates
                if (row_kernel := own.default(model, region, target, sizes)) is not None:
                    yield from own.region_variants(model, region, row_kernel, target, sizes)
                    break
        return
    if region.kind == "general":  # the general kernel stays a candidate beside the contraction default
        yield general.PATH.default(model, region, target, sizes)
    tensor_cores = base.mma != Mma.FMA  # the default took a tensor-core instruction
    facts = ContractionFacts.of(model, region, target, sizes)
    skinny = facts.m <= SKINNY_ROWS
    # a column sum in the epilogue (habu/plan/column_epilogue.py) takes the wgmma TMA-store epilogue's whole,
    # unsplit tiles: the rest would be refused (`supported-path`)
    summed = bool(kernel_chain(model, region.nodes)[1])
    if base.mma == Mma.WGMMA and _prefetches(model, replace(base, epilogue_prefetch=True)):
        yield replace(base, epilogue_prefetch=True)  # the epilogue's matrix tiles into the L2 first (a hint)
    if base.mma == Mma.WGMMA and not base.epilogue_early and reads_early(model, replace(base, epilogue_early=True)):
        yield replace(base, epilogue_early=True)  # the epilogue's loads of model inputs at each tile's start
    if getattr(base, "epilogue_early", False):
        yield replace(base, epilogue_early=False)  # the default's early loads, left in the epilogue
    if base.mma == Mma.WGMMA and base.warp_specialized:  # the operands' L2 policies (hints)
        yield replace(base, keep_operands=not base.keep_operands)
        yield replace(base, stream_b=not base.stream_b)  # A's loads evict-last and B's evict-first, or plain
    for mma in MMAS:
        path = path_for(replace(base, mma=mma))
        if isinstance(path, ContractionPath) and path.offered(target, tensor_cores):
            yield from (k for k in path.variants(base, target, skinny=skinny)
                        if not summed or schedule_refusal(k) is None)


def _prefetches(model: Model, kernel: ContractionKernel) -> bool:
    """Whether the kernel's epilogue loads a matrix tile the producer would prefetch (`epilogue_prefetch`)."""
    from habu.lower import lower

    try:
        return bool(lower(model, kernel).prefetches)  # type: ignore[attr-defined]
    except ValueError:
        return False


FAMILY_PINS = ("grouped", "general", "contraction", "columns", "attention")  # `--pin family=…`


def family_kernel(model: Model, region: Region, family: str, target: Target, sizes: dict[str, int]) -> Kernel | None:
    """The kernel `--pin family=` gives a region, or None where that family does not take it: `grouped`
    builds every one-node region the grouped path can (a general region's grouped GEMM with a row factor,
    a scatter-add combine or an f32 A, which the default leaves to the general kernel); `general` builds a
    grouped region with the general family (the fallback the search keeps as a candidate); `columns` builds a
    one-node row or general region whose node is a transposed column reduction (`O[b] = Σ i X[b i]`, the
    reduced axes trailing) with the column family, its rows split over the grid; `attention` builds a
    softmax-weighted sum (a general region of the model without the `attention:T` rewrite) with the fused
    attention kernel."""
    if family == "grouped" and region.kind in ("grouped", "general"):
        return grouped.PATH.default(model, region, target, sizes)
    if family == "general" and (region.kind == "grouped" or isinstance(
            default_contraction(model, region, target, sizes), ContractionKernel)):
        return general.PATH.default(model, Region("general", region.nodes), target, sizes)
    c = as_contraction(node_of(model, region.nodes[0])) if region.kind == "general" and len(region.nodes) == 1 else None
    if family == "contraction" and c is not None:
        # a contraction the default leaves to the general family: an operand gathered on the reduction
        # axis (staged: the wgmma, mma.sync and SIMT paths read a staging pass's buffer), a scatter-add
        # store (`dA[IX[m] k] += Σ n …`, f32 atomicAdd epilogue)
        kernel = default_kernel(model, Region("contraction", region.nodes), target, sizes)
        staged = isinstance(kernel, ContractionKernel) and "staged" in (kernel.a_move, kernel.b_move)
        return kernel if staged or (c.a.k_gather is None and c.b.k_gather is None) else None
    if family == "columns" and region.kind == "columns":
        return columns.PATH.default(model, region, target, sizes)  # (the default's already)
    if family == "columns" and region.kind in ("rows", "general") and len(region.nodes) == 1:
        # a row statistic `O[b] = Σ i X[b i]` (or over several trailing axes, `Σ i j X[b i j]`, which is a
        # general kernel of a thread per output) as a transposed column reduction: its rows split over the grid
        col = as_column_reduction(_node(model, region))
        if col is not None and col.transposed:
            return columns.PATH.default(model, Region("columns", region.nodes), target, sizes)
    if family == "attention" and region.kind == "general":
        return attention.PATH.default(model, region, target, sizes)
    return None


def _node(model: Model, region: Region):
    return next(eq for eq in model.nodes if eq.target == region.nodes[0])


def path_named(name: str) -> KernelPath:
    return next(p for p in PATHS if p.name == name)


def register(path: KernelPath) -> None:
    """Add a path at run time, asked first (so it may take kernels a built-in path takes), or replace
    the one of its name; its `support` goes to the rules' list with it."""
    PATHS[:] = [path, *(p for p in PATHS if p.name != path.name)]
    _support.register(path.support)


def unregister(name: str) -> None:
    """Remove the path `name` and its support."""
    PATHS[:] = [p for p in PATHS if p.name != name]
    _support.unregister(name)


__all__ = ["FAMILY_PINS", "PATHS", "ContractionPath", "KernelPath", "by_preference", "contraction_path",
           "default_contraction", "default_kernel", "family_kernel", "path_for", "path_named", "region_space", "register",
           "unregister"]
