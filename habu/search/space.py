"""The plan space: a good default without search (`default_plan`), every candidate (`enumerate_plans`),
and user pins (`--pin tile=128x128x64 --pin B=tma`).

The default is analytic: tensor cores where the element type allows, TMA where a descriptor is legal
(16-byte row strides, no gather on sm_90a), cp.async with the widest aligned vector otherwise,
split-K only when the output grid cannot fill the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields, replace

from habu.errors import UsageError
from habu.lower.rows import column_functions, lower_rows
from habu.paths import ContractionPath, contraction_path, path_for
from habu.paths.columns import default_kernel as default_column_kernel
from habu.paths.wgmma import wgmma_warps_stages
from habu.plan.fields import FieldError, Move, kernel_fields, pin_table
from habu.plan.patterns import (
    Region,
    as_column_reduction,
    as_contraction,
    column_node,
    default_regions,
    row_local,
)
from habu.plan.plan import (
    KERNEL_KINDS,
    MMAS,
    ColumnKernel,
    ContractionKernel,
    GeneralKernel,
    Kernel,
    MapKernel,
    Plan,
    RowKernel,
)
from habu.plan.storage import dtype_bytes, dtype_of, storage_dtypes
from habu.spec.ir import Equation, Extent, Load, Model, walk
from habu.target import Target

TENSOR_CORE_DTYPES = ("bf16", "f16")
INT31 = 2**31 - 1


# ----------------------------------------------------------------------------- helpers


def node_of(model: Model, target: str) -> Equation:
    return next(eq for eq in model.nodes if eq.target == target)


def concrete_sizes(model: Model, sizes: dict[str, int] | None = None) -> dict[str, int]:
    """Every extent's size: the declared one, the given one, or a runtime extent's upper bound."""
    out: dict[str, int] = {}
    for e in model.extents:
        if sizes and e.name in sizes:
            out[e.name] = sizes[e.name]
        elif e.size is not None:
            out[e.name] = e.size
        else:
            out[e.name] = e.hi - e.hi % e.multiple
    return out


def max_vector(row_elems: int | None, elem_bytes: int, multiple: int = 1, limit_bytes: int = 16) -> int:
    """The widest vector (elements) whose accesses stay aligned: row length and 16 bytes divide it."""
    v = max(1, limit_bytes // elem_bytes)
    while v > 1:
        if row_elems is not None and row_elems % v == 0:
            return v
        if row_elems is None and multiple % v == 0:
            return v
        v //= 2
    return 1


def needs_64bit(model: Model, sizes: dict[str, int]) -> bool:
    for t in (*model.inputs, *model.outputs, *model.intermediates):
        n = 1
        for e in t.extents:
            n *= sizes[e]
        if n > INT31:
            return True
    return False


# ----------------------------------------------------------------------------- defaults per kernel family


def default_contraction(model: Model, region: Region, target: Target, sizes: dict[str, int],
                        mma: str | None = None) -> ContractionKernel:
    """The analytic default; `mma` forces the instruction (and the defaults that go with it)."""
    c = as_contraction(node_of(model, region.nodes[0]))
    assert c is not None
    a_t, b_t = c.a.load.tensor, c.b.load.tensor
    a_dt, b_dt = dtype_of(model, a_t), dtype_of(model, b_t)
    tensor_cores = a_dt in TENSOR_CORE_DTYPES and a_dt == b_dt
    M, N, K = sizes[c.m.extent], sizes[c.n.extent], sizes[c.k.extent]
    a_kmajor = c.a.k_pos == len(c.a.load.indices) - 1
    b_kmajor = c.b.k_pos == len(c.b.load.indices) - 1
    b_decl = model.tensor(b_t)
    # a B contiguous along n (a (K, N) weight) feeds wgmma directly: TMA boxes read transposed
    b_n_major_tma = (not b_kmajor and c.b.gather is None and len(c.b.load.indices) == 2 and target.tma
                     and dtype_bytes(model, b_t) == 2 and (sizes[b_decl.extents[-1]] * 2) % 16 == 0)
    if mma is None:
        if tensor_cores and target.wgmma and a_kmajor and (b_kmajor or b_n_major_tma) and K >= 64:
            mma = "wgmma"
        elif tensor_cores and target.mma_sync:
            mma = "mma.sync"
        else:
            mma = "fma"
    tile, warps, stages = contraction_path(mma).default_schedule(M, N, target)

    def movement(op, tile_along_inner: int) -> tuple[str, int]:
        decl = model.tensor(op.load.tensor)
        eb = dtype_bytes(model, op.load.tensor)
        inner = sizes[decl.extents[-1]]  # row length in elements (row-major storage)
        contiguous_k = op.k_pos == len(op.load.indices) - 1
        vec = max_vector(inner, eb)
        while tile_along_inner % vec:
            vec //= 2
        if op.gather is None and target.tma and (inner * eb) % 16 == 0 and mma == "wgmma" and contiguous_k:
            return "tma", vec
        if op is c.b and mma == "wgmma" and b_n_major_tma:
            return "tma", vec
        rows = sizes[(c.m if op is c.a else c.n).extent]
        if mma == "wgmma" and target.tma and contiguous_k and (inner * eb) % 16 and rows <= target.max_grid_yz:
            # rows not 16-byte aligned (Triton #10927's K = 511): stage them to aligned rows, then TMA
            # (the staging pass launches a block row per row: grid.y, at most 65535)
            return "staged", vec
        if target.cp_async and vec * eb >= 4 and mma != "fma" and (contiguous_k or mma != "wgmma"):
            return "cp.async", vec
        return "ldg", vec if mma != "fma" else 1

    inner_tile = {"a": tile[2] if c.a.k_pos == 1 else tile[0], "b": tile[2] if c.b.k_pos == 1 else tile[1]}
    a_move, a_vec = movement(c.a, inner_tile["a"])
    b_move, b_vec = movement(c.b, inner_tile["b"])
    tiles = -(-M // tile[0]) * -(-N // tile[1])
    split = 1
    out_dt = model.tensor(region.output).dtype
    if len(region.nodes) == 1 and out_dt is not None and out_dt.name == "f32":
        while tiles * split * 2 <= target.sm_count and -(-K // tile[2]) >= 8 * split * 2:
            split *= 2
    eb = max(dtype_bytes(model, a_t), dtype_bytes(model, b_t))
    swizzle = 128 if tile[2] * eb >= 128 else (64 if tile[2] * eb >= 64 else 0)
    # TMA stores where the output is a plain row-major (m, n) matrix with 16-byte rows and the
    # schedule leaves room (H200, 4096³: bf16 GEMM 0.90 -> 0.99x cuBLAS, f32 GGEMM 184.5 -> 181.1 µs)
    first, last = node_of(model, region.nodes[0]), node_of(model, region.output)
    out_decl = model.tensor(region.output)
    out_e = dtype_bytes(model, region.output)
    plain_out = (target.tma and first.lhs[:1] == (c.m,) and len(last.lhs) == 2 and len(out_decl.extents) == 2
                 and out_e in (2, 4) and (sizes[out_decl.extents[-1]] * out_e) % 16 == 0)
    kernel = ContractionKernel(
        nodes=region.nodes, tile_m=tile[0], tile_n=tile[1], tile_k=tile[2], warps=warps, stages=stages,
        mma=mma, a_move=a_move, b_move=b_move, a_vector=a_vec, b_vector=b_vec, split_k=split,
        # grouped raster: 16 tile rows share B in L2 on tall problems (H200, 2026-11-30, MoE 8192x14336x4096:
        # 701 TFLOP/s with 16, 684 with 8), 8 otherwise
        raster="row", group_m=16 if -(-M // tile[0]) >= 64 else 8, persistent=False,
        warp_specialized=mma == "wgmma" and target.setmaxnreg,
        swizzle=swizzle if "tma" in (a_move, b_move) or mma == "wgmma" else 0,
        accumulator="f32", index_width=64 if needs_64bit(model, sizes) else 32,
    )
    return replace(kernel, store="tma") if plain_out and _tma_store_fits(model, kernel, target) else kernel


# a row of at most this many bytes is cached in one block's shared memory by default
ROW_CACHE_BYTES = 200 * 1024


def _row_extent(model: Model, region: Region) -> Extent:
    """The extent a row region's rows run along (its columns)."""
    last = node_of(model, region.output)
    axes = row_local(last)
    c_ext = axes[1] if axes else last.lhs[-1].extent
    return next(e for e in model.extents if e.name == c_ext)


def default_rows(model: Model, region: Region, target: Target, sizes: dict[str, int],
                 multiples: dict[str, int]) -> RowKernel:
    extent = _row_extent(model, region)
    c_ext, static = extent.name, extent.size
    eb = max(dtype_bytes(model, t.name) for t in model.inputs if c_ext in t.extents) if model.inputs else 4
    vec = max_vector(static, eb, multiples.get(c_ext, 1))
    cols = sizes[c_ext]
    index_width = 64 if needs_64bit(model, sizes) else 32

    def kernel(threads: int, rows: int = 1, cache: bool = True, share: int = 1, prefetch: bool = False) -> RowKernel:
        return RowKernel(nodes=region.nodes, rows_per_block=rows, threads=threads, vector=vec, cache_row=cache,
                         index_width=index_width, cluster=share, prefetch=prefetch)

    def in_registers(threads: int) -> bool:
        return lower_rows(model, kernel(threads)).register_chunks(sizes) > 0

    threads = 32  # enough threads that each holds about four 16-byte chunks of the row
    while threads < 1024 and threads * vec * 4 < cols:
        threads *= 2
    # fewer threads, if that keeps the row in registers (H200, 2026-12-01: RMSNorm 8192x65536 535 µs
    # with 512 threads in registers, 598 with 1024 through shared memory)
    fewer = threads
    while fewer > 32 and not in_registers(fewer):
        fewer //= 2
    if in_registers(fewer) and not in_registers(threads):
        threads = fewer
    # short rows: a warp per row, four rows per block, no block-wide barriers (softmax at 4096 columns
    # took 59.5 µs this way, 37.6 with 128 threads per row: only rows of at most 32 chunks)
    rows = 4 if threads == 32 else 1
    # a runtime width is cached when its widest row (the extent's `hi`) fits
    cache = max(cols, extent.hi if static is None else cols) * eb <= ROW_CACHE_BYTES
    share = 1
    # a static row too long for one block is shared by a cluster of blocks, about 32768 columns and
    # 512 threads each, its part kept in registers (H200, 2026-12-01, 2048 x 131072 bf16: softmax
    # 659.5 -> 433.1 µs, RMSNorm 480.3 -> 300.5, uncached before; torch 557.5 and 427.5)
    if not cache and static is not None and target.tma:
        share = 2
        while share < 8 and static // share > 32768:
            share *= 2
        if static % (share * vec) == 0 and static // share * eb <= ROW_CACHE_BYTES:
            threads, rows, cache = 512, 1, True
        else:
            share = 1
    # a block whose row in registers fills the SM's registers, and which computes a special function
    # of every column, loads its next row while it computes this one (H200, 2026-12-01, 8192 rows:
    # softmax at 32768 columns 322.9 -> 296.4 µs, LayerNorm 284.6 -> 287.2; it lost where the SM
    # holds two blocks, which overlap by themselves: softmax at 16384 138.1 -> 151.9, and for RMSNorm
    # at 32768 columns 264.5 -> 284.0)
    prefetch = False
    if static is not None and share == 1 and rows == 1 and cache and target.cp_async:
        lw = lower_rows(model, kernel(threads))
        prefetch = lw.one_block_per_sm(sizes) and column_functions(lw.expression()) > 0
    return kernel(threads, rows, cache, share, prefetch)


def default_map(model: Model, region: Region, target: Target, sizes: dict[str, int],
                multiples: dict[str, int]) -> MapKernel:
    last = node_of(model, region.output)
    inner = last.lhs[-1].extent if last.lhs else None
    static = next((e.size for e in model.extents if e.name == inner), None) if inner else 1
    vec = max_vector(static, 4, multiples.get(inner, 1) if inner else 1) if last.lhs else 1
    return MapKernel(nodes=region.nodes, threads=256, vector=vec,
                     index_width=64 if needs_64bit(model, sizes) else 32)


def default_general(model: Model, region: Region, sizes: dict[str, int]) -> GeneralKernel:
    """The general family's kernel: 256 threads, one output element each."""
    return GeneralKernel(nodes=region.nodes, threads=256, index_width=64 if needs_64bit(model, sizes) else 32)


def default_columns(model: Model, region: Region, target: Target, sizes: dict[str, int],
                    multiples: dict[str, int]) -> ColumnKernel:
    """The column family's kernel (habu/paths/columns.py, `default_kernel`): 16-byte loads of the widest
    row-column operand where the row length allows."""
    col = as_column_reduction(column_node(model, region.nodes))
    assert col is not None
    rows, cols = sizes[col.r.extent], sizes[col.n.extent]
    static = next((e.size for e in model.extents if e.name == col.n.extent), None)
    wide = [dtype_bytes(model, ld.tensor) for ld in _loads(col.node) if ld.indices == (col.r, col.n)]
    vec = max_vector(static, max(wide, default=4), multiples.get(col.n.extent, 1))
    out_f32 = dtype_of(model, region.output) == "f32"
    base = default_column_kernel(region.nodes, rows, cols, max(wide, default=4), out_f32, col.op, vec, target, 32)
    wide_rows = rows + base.rows_per_split + base.threads * base.unroll  # the rows a thread computes, masked or not
    narrow = not needs_64bit(model, sizes) and wide_rows * cols + cols <= INT31
    return replace(base, index_width=32 if narrow else 64)


def _loads(eq: Equation) -> list[Load]:
    return [x for x in walk(eq.rhs) if isinstance(x, Load)]


def _multiples(model: Model) -> dict[str, int]:
    return {e.name: (e.size if e.size is not None else e.multiple) for e in model.extents}


def default_kernels(model: Model, target: Target, sizes: dict[str, int],
                    regions: tuple[Region, ...] | None = None) -> tuple[Kernel, ...]:
    regions = regions or default_regions(model)
    out: list[Kernel] = []
    mult = _multiples(model)
    for r in regions:
        if r.kind == "contraction":
            out.append(default_contraction(model, r, target, sizes))
        elif r.kind == "rows":
            out.append(default_rows(model, r, target, sizes, mult))
        elif r.kind == "general":
            out.append(default_general(model, r, sizes))
        elif r.kind == "columns":
            out.append(default_columns(model, r, target, sizes, mult))
        else:
            out.append(default_map(model, r, target, sizes, mult))
    return tuple(out)


def make_plan(model: Model, target: Target, kernels: tuple[Kernel, ...], sizes: dict[str, int],
              rewrites: tuple[str, ...] = ()) -> Plan:
    """A plan of `model` (as written); `kernels` compute the nodes of `model` after `rewrites`."""
    from habu.plan.rewrite import apply_rewrites

    graph = apply_rewrites(model, rewrites)
    shape = tuple((e.name, sizes[e.name]) for e in model.extents if e.name in sizes)
    stored = {k.nodes[-1] for k in kernels}
    dtypes = storage_dtypes(graph)
    storage = tuple((t.name, dtypes[t.name]) for t in graph.intermediates if t.name in stored)
    return Plan(model=model.name, model_hash=model.canonical_hash(), target=target.name, shape=shape,
                kernels=kernels, storage=storage, rewrites=tuple(rewrites))


def _tma_store_fits(model: Model, k: ContractionKernel, target: Target) -> bool:
    """Whether a schedule leaves TMA stores possible: wgmma, no split-K, whole boxes along n, and the
    two epilogue buffers per consumer within shared memory."""
    from habu.lower.support import contraction_smem

    c = as_contraction(node_of(model, k.nodes[0]))
    assert c is not None
    out_e = dtype_bytes(model, k.nodes[-1])
    layout = contraction_smem(replace(k, store="tma"), dtype_of(model, c.a.load.tensor), dtype_of(model, c.b.load.tensor))
    return (k.mma == "wgmma" and k.split_k == 1 and k.tile_n % (128 // out_e) == 0
            and layout.total <= target.smem_per_block)


def default_plan(model: Model, target: Target, sizes: dict[str, int] | None = None,
                 pins: dict[str, str] | None = None) -> Plan:
    """A good plan without search (an analytic heuristic), with the user's pins applied."""
    s = concrete_sizes(model, sizes)
    rewrites = _pinned_rewrites(model, (pins or {}).get("rewrite"))
    from habu.plan.rewrite import apply_rewrites

    graph = apply_rewrites(model, rewrites)
    kernels = default_kernels(graph, target, s)
    if pins:
        regions = default_regions(graph)
        if "mma" in pins:
            if pins["mma"] not in MMAS:
                raise UsageError(f"--pin mma={pins['mma']}: expected one of {', '.join(MMAS)} "
                                 "(contraction kernel field mma)")
            kernels = tuple(default_contraction(graph, r, target, s, pins["mma"]) if r.kind == "contraction" else k
                            for r, k in zip(regions, kernels, strict=True))
        kernels = tuple(apply_pins(graph, k, pins, target) for k in kernels)
        _check_pins_apply(pins, kernels)
        if "store" not in pins:  # the default's TMA stores, unless a pin left no room for them
            kernels = tuple(replace(k, store="direct") if isinstance(k, ContractionKernel) and k.store == "tma"
                            and not _tma_store_fits(graph, k, target) else k for k in kernels)
    return make_plan(model, target, kernels, {k: v for k, v in s.items() if _fixed(model, k, sizes)}, rewrites)


# the kernel fields each plan-choice pin sets, from the field table (operand movements and rewrites
# are checked where they apply; `tile` sets tile_m, tile_n and tile_k at once)
PIN_FIELDS = {"tile": ("tile_m", "tile_n", "tile_k"), **pin_table(tuple(KERNEL_KINDS.values()))}


def _check_pins_apply(pins: dict[str, str], kernels: tuple[Kernel, ...]) -> None:
    """A pin no kernel of the plan has a field for is a mistake, not something to ignore silently
    (`--pin threads=64` on a GEMM: threads are a row or map kernel's choice)."""
    for key in pins:
        wanted = PIN_FIELDS.get(key.lower())
        if wanted and not any(f in {x.name for x in fields(k)} for k in kernels for f in wanted):
            kinds = ", ".join(sorted({k.kind for k in kernels}))
            owners = sorted({kind for kind, cls in KERNEL_KINDS.items() if any(f in {x.name for x in fields(cls)}
                                                                                for f in wanted)})
            raise UsageError(f"--pin {key}: no kernel of this plan has that choice (it is a choice of "
                             f"{' or '.join(owners)} kernels; this plan's kernels: {kinds})")


def _pinned_rewrites(model: Model, value: str | None) -> tuple[str, ...]:
    """`--pin rewrite=factor:Y` (several joined with +), checked against what applies to the model."""
    if not value:
        return ()
    from habu.plan.rewrite import RewriteError, applicable, apply_rewrites

    names = tuple(v.strip() for v in value.split("+") if v.strip())
    try:
        apply_rewrites(model, names)
    except RewriteError as err:
        offered = ", ".join(applicable(model)) or "none"
        raise UsageError(f"--pin rewrite={value}: {err.message} (rewrites that apply to {model.name}: {offered})"
                         ) from None
    return names


def _fixed(model: Model, extent: str, sizes: dict[str, int] | None) -> bool:
    e = model.extent(extent)
    return e.is_static or bool(sizes and extent in sizes)


# ----------------------------------------------------------------------------- pins


PIN_KEYS = (*PIN_FIELDS, "rewrite")


def parse_pins(items: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--pin takes KEY=VALUE, got {item!r} (keys: {', '.join(PIN_KEYS)}, or an "
                             "operand tensor's name with a movement: ldg, cp.async, tma, tma-gather4)")
        pins[key.strip().replace("-", "_") if key.strip().lower() in ("split-k",) else key.strip()] = value.strip()
    return pins


def _pin_value(kernel: Kernel, name: str, key: str, value: str, part: str | None = None) -> object:
    """A pin's value (or `part` of it) of one field of `kernel`, parsed and checked by the field table."""
    kf = next(f for f in kernel_fields(type(kernel)) if f.name == name)
    try:
        return kf.parse(value if part is None else part)
    except FieldError as err:
        what = f"{name} = {part}: " if part is not None else ""
        raise UsageError(f"--pin {key}={value}: {what}{err} ({kernel.kind} kernel field {name})") from None


def apply_pins(model: Model, kernel: Kernel, pins: dict[str, str], target: Target | None = None) -> Kernel:
    changes: dict[str, object] = {}
    names = {f.name for f in fields(kernel)}
    operands: dict[str, str] = {}
    gathered: set[str] = set()
    if isinstance(kernel, ContractionKernel):
        c = as_contraction(node_of(model, kernel.nodes[0]))
        assert c is not None
        operands = {c.a.load.tensor: "a", c.b.load.tensor: "b"}
        gathered = {side for side, op in (("a", c.a), ("b", c.b)) if op.gather}
    for key, value in pins.items():
        k = key.lower()
        if not isinstance(kernel, ContractionKernel) and (key in model_tensors(model) or k in ("a", "b")):
            continue  # a movement pin: it is for the model's contraction, not for this row or map kernel
        if key in operands or (k in ("a", "b") and isinstance(kernel, ContractionKernel) and key not in model_tensors(model)):
            side = operands.get(key, k)
            move = _pin_value(kernel, f"{side}_move", key, value)
            if move == Move.TMA and side in gathered and target is not None and target.tma_gather4:
                move = Move.TMA_GATHER4  # TMA on gathered rows is the gather4 form, where the target has it
            changes[f"{side}_move"] = move
            continue
        if key in model_tensors(model):
            raise UsageError(f"--pin {key}=...: {key} is not an operand of a contraction in this model")
        if k == "tile" and "tile_m" in names:
            parts = value.lower().split("x")
            if len(parts) != 3:
                raise UsageError(f"--pin tile={value}: expected BMxBNxBK, e.g. 128x128x64")
            for part, name in zip(parts, ("tile_m", "tile_n", "tile_k"), strict=True):
                changes[name] = _pin_value(kernel, name, key, value, part)
        elif k in PIN_FIELDS:
            for name in PIN_FIELDS[k]:
                if name in names:
                    changes[name] = _pin_value(kernel, name, key, value)
        elif k != "rewrite":
            raise UsageError(f"--pin {key}: unknown key (keys: {', '.join(PIN_KEYS)}, or an operand's name)")
    # a block of more than a warp works on one row: a pinned thread count brings one row per block
    if isinstance(kernel, RowKernel) and changes.get("threads", 32) != 32 \
            and changes.setdefault("rows_per_block", 1) != 1:
        raise UsageError(f"--pin rows={changes['rows_per_block']} needs threads=32: several rows per block "
                         "are a warp each")
    if "tile_m" in changes and changes.get("mma", getattr(kernel, "mma", None)) == "wgmma":
        # a pinned tile brings its own warps and depth unless they are pinned too
        warps, stages = wgmma_warps_stages(int(changes["tile_m"]), int(changes["tile_n"]))  # type: ignore[call-overload]
        changes.setdefault("warps", warps)
        changes.setdefault("stages", stages)
    return replace(kernel, **changes) if changes else kernel


def model_tensors(model: Model) -> set[str]:
    return {t.name for t in (*model.inputs, *model.outputs)}


# ----------------------------------------------------------------------------- the space


def contraction_space(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Iterator[ContractionKernel]:
    base = default_contraction(model, region, target, sizes)
    c = as_contraction(node_of(model, region.nodes[0]))
    assert c is not None
    tc = base.mma != "fma"
    for mma in MMAS:  # each instruction's first path (habu/paths/) gives its variants
        path = path_for(replace(base, mma=mma))
        if isinstance(path, ContractionPath) and path.offered(target, tc):
            yield from path.variants(base, target)  # type: ignore[misc]


def region_space(model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Iterator[Kernel]:
    """Every candidate kernel for one fusion region, in canonical order."""
    mult = _multiples(model)
    if region.kind == "contraction":
        yield from contraction_space(model, region, target, sizes)
    elif region.kind == "rows":
        base = default_rows(model, region, target, sizes, mult)
        yield from path_for(base).variants(base, target, _row_extent(model, region).size)
    elif region.kind == "general":
        base = default_general(model, region, sizes)
        yield from path_for(base).variants(base, target)
    elif region.kind == "columns":
        base = default_columns(model, region, target, sizes, mult)
        col = as_column_reduction(column_node(model, region.nodes))
        assert col is not None
        yield from path_for(base).variants(base, target, sizes[col.r.extent])
    else:
        base = default_map(model, region, target, sizes, mult)
        yield from path_for(base).variants(base, target)


def enumerate_plans(model: Model, target: Target, sizes: dict[str, int] | None = None) -> Iterator[Plan]:
    """Candidate plans for the default fusion, in a fixed canonical order, each once.

    Kernels of different regions run as separate launches, so their times add: the space is walked
    one region at a time with the other regions at their defaults (the search tunes each region on
    its own). Candidates are not yet proven: `habu.prove` rejects those that break a rule."""
    s = concrete_sizes(model, sizes)
    regions = default_regions(model)
    defaults = default_kernels(model, target, s, regions)
    fixed = {k: v for k, v in s.items() if _fixed(model, k, sizes)}
    yield make_plan(model, target, defaults, fixed)
    for i, r in enumerate(regions):
        for k in region_space(model, r, target, s):
            if k == defaults[i]:
                continue
            kernels = (*defaults[:i], k, *defaults[i + 1:])
            yield make_plan(model, target, kernels, fixed)


__all__ = ["apply_pins", "concrete_sizes", "default_plan", "enumerate_plans", "parse_pins", "region_space"]
