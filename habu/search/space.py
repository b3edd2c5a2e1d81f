"""The plan space: a good default without search (`default_plan`), every candidate (`enumerate_plans`),
and user pins (`--pin tile=128x128x64 --pin B=tma`).

The default is analytic, and each kernel path owns its part (habu/paths/: `default`, asked by the
registry's `default_kernel` in the paths' order of preference): tensor cores where the element type
allows (wgmma, then mma.sync, then fma), TMA where a descriptor is legal (16-byte row strides, no
gather on sm_90a), cp.async with the widest aligned vector otherwise, split-K only when the output
grid cannot fill the GPU. The search space of a region is its paths' tables (`region_space`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields, replace

from habu.errors import UsageError
from habu.lower.grouped_wgrad import walk_refusal
from habu.lower.pipeline import lag_phases_apart, lag_refusal
from habu.paths import (
    FAMILY_PINS,
    ContractionPath,
    attention,
    contraction_path,
    default_kernel,
    family_kernel,
    grouped,
    path_for,
    region_space,
)
from habu.paths.analytic import node_of
from habu.paths.contraction import batch_innermost, tma_store_fits
from habu.paths.l2_keep import stream_weights
from habu.plan.fields import FieldError, Mma, Move, Store, kernel_fields, pin_table
from habu.plan.grouped_pair import pair_positions
from habu.plan.grouped_wgrad import as_grouped_wgrad
from habu.plan.patterns import Region, default_regions, kernel_contraction, stored_nodes
from habu.plan.plan import (
    KERNEL_KINDS,
    MMAS,
    AttentionKernel,
    ContractionKernel,
    GroupedKernel,
    Kernel,
    Plan,
)
from habu.plan.storage import storage_dtypes
from habu.search.cuts import default_partition, fuse_column_kernels, split_refused_columns
from habu.spec.ir import Model
from habu.target import Target


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


def default_kernels(model: Model, target: Target, sizes: dict[str, int],
                    regions: tuple[Region, ...] | None = None) -> tuple[Kernel, ...]:
    """Each region's analytic default, from the first path that builds it (habu/paths/)."""
    return tuple(default_kernel(model, r, target, sizes) for r in regions or default_regions(model))


def make_plan(model: Model, target: Target, kernels: tuple[Kernel, ...], sizes: dict[str, int],
              rewrites: tuple[str, ...] = ()) -> Plan:
    """A plan of `model` (as written); `kernels` compute the nodes of `model` after `rewrites`."""
    from habu.plan.rewrite import apply_rewrites

    graph = apply_rewrites(model, rewrites)
    shape = tuple((e.name, sizes[e.name]) for e in model.extents if e.name in sizes)
    stored = {n for k in kernels for n in stored_nodes(graph, k.nodes)}
    dtypes = storage_dtypes(graph)
    storage = tuple((t.name, dtypes[t.name]) for t in graph.intermediates if t.name in stored)
    return Plan(model=model.name, model_hash=model.canonical_hash(), target=target.name, shape=shape,
                kernels=kernels, storage=storage, rewrites=tuple(rewrites))


def default_plan(model: Model, target: Target, sizes: dict[str, int] | None = None,
                 pins: dict[str, str] | None = None) -> Plan:
    """A good plan without search (an analytic heuristic), with the user's pins applied."""
    s = concrete_sizes(model, sizes)
    if not {"rewrite", "family"} & set(pins or {}):  # a decode or a long prefill: the fused kernel
        chosen = attention.PATH.default_pins(model, target, s)
        if _mma_sync_only(pins or {}):  # the user's tile is the mma.sync loop's: its default, not the wgmma pins
            chosen = {k: v for k, v in chosen.items() if k == "family"}
        if (pins or {}).get("bm", "128") != "128":  # ping-pong takes two consumer warpgroups (128 rows)
            chosen.pop("pingpong", None)
        pins = {**chosen, **(pins or {})} or pins
    rewrites = _pinned_rewrites(model, (pins or {}).get("rewrite"), (pins or {}).get("family"))
    if not {"rewrite", "family"} & set(pins or {}):
        rewrites = _cheaper_scatters(model, target, s, rewrites)
    if "storage" in (pins or {}):  # the plan's storage type, after every other rewrite (habu/plan/storage_pin.py)
        rewrites = (*rewrites, _pinned_storage(model, rewrites, pins["storage"]))  # type: ignore[index]
    from habu.plan.rewrite import apply_rewrites

    graph = apply_rewrites(model, rewrites)
    regions = default_partition(graph, target, s)
    kernels = stream_weights(graph, default_kernels(graph, target, s, regions), target, s)  # habu/paths/l2_keep.py
    if "family" not in (pins or {}):  # an MoE model: the grouped family (its choices pinned)
        chosen = grouped.PATH.default_pins(graph, regions, target, s)
        if any(key in GROUPED_PINS for key in (pins or {})):  # the user's grouped choices: the family, not the loop
            chosen = {k: v for k, v in chosen.items() if k == "family"}
        pins = {**chosen, **(pins or {})}
    if pins:
        if "mma" in pins:
            if pins["mma"] not in MMAS:
                raise UsageError(f"--pin mma={pins['mma']}: expected one of {', '.join(MMAS)} "
                                 "(contraction kernel field mma)")
            forced = contraction_path(pins["mma"])
            kernels = tuple(forced.default(graph, r, target, s, forced=True) or k if "contraction" in (r.kind, k.kind) else k
                            for r, k in zip(regions, kernels, strict=True))  # forced: never None
        if "family" in pins:
            kernels = _pinned_family(graph, regions, kernels, pins["family"], target, s)
        if "pair" in pins:
            kernels = _pinned_pair(graph, regions, kernels, pins["pair"], target, s)
        rest = pins
        if pins.get("main_loop") == "wgmma":  # on the grouped kernels the wgmma loop can run, with its tile
            kernels = _pinned_wgmma(graph, kernels, target, s)
            rest = {key: v for key, v in pins.items() if key != "main_loop"}
        _check_operand_pins(graph, pins, kernels)
        kernels = tuple(apply_pins(graph, k, rest, target) for k in kernels)
        _check_pins_apply(pins, kernels)
        _check_vector_pin(pins, kernels)
        if any(key.lower() in WGRAD_FIELDS for key in pins) and not any(weight_gradient(graph, k) for k in kernels):
            key = next(key for key in pins if key.lower() in WGRAD_FIELDS)
            raise UsageError(f"--pin {key}: no kernel of this plan is a grouped weight gradient "
                             "(O[E[r] m n] += A[r m] · B[r n], E a grouping): it is their choice")
        _check_wgmma_hints(pins, kernels, target)
        if "store" not in pins:  # the default's TMA stores, unless a pin left no room for them
            kernels = tuple(replace(k, store="direct") if getattr(k, "store", None) == "tma"
                            and not tma_store_fits(graph, k, target) else k for k in kernels)
    if pins:  # a column sum a pinned schedule cannot print goes back to its kernel; one a pinned tile allows joins
        kernels = fuse_column_kernels(graph, split_refused_columns(graph, kernels, target, s), s)
        kernels = tuple(_lag_where_it_holds(graph, k) for k in kernels)
    plan = _warm_where_it_holds(model, make_plan(model, target, kernels, {k: v for k, v in s.items()
                                                                          if _fixed(model, k, sizes)}, rewrites))
    return replace(plan, lanes=_pinned_lanes(graph, kernels, pins["lanes"])) if "lanes" in (pins or {}) else plan


def _pinned_lanes(model: Model, kernels: tuple[Kernel, ...], value: str) -> int:
    """`--pin lanes=2`: the kernels that share no tensor side by side on a second stream (habu/plan/lanes.py), or a
    UsageError saying why not."""
    from habu.plan.lanes import plan_accesses, side_by_side

    if value not in ("1", "2"):
        raise UsageError(f"--pin lanes={value}: expected 1 or 2 (the streams the plan's kernels launch on)")
    if value == "2" and not side_by_side(plan_accesses(model, kernels)):
        raise UsageError(f"--pin lanes=2: every kernel of the plan of {model.name} reads what the one before it "
                         "writes: nothing can run beside another")
    return int(value)


def _lag_where_it_holds(model: Model, kernel: Kernel) -> Kernel:
    """A pinned consumer lag kept on a persistent kernel only where its tiles are long enough at every size of k
    (`lag_phases_apart` at their fewest k tiles, the `pipeline-schedule` rule); in step elsewhere, as on the
    kernels the pin cannot stagger."""
    if not isinstance(kernel, ContractionKernel) or not kernel.consumer_lag or not kernel.persistent:
        return kernel
    c = kernel_contraction(node_of(model, kernel.nodes[0]), kernel)
    assert c is not None
    k = model.extent(c.k.extent)
    fewest = -(-(k.size if k.size is not None else k.lo) // kernel.tile_k)  # k tiles of the smallest k
    return kernel if lag_phases_apart(fewest, kernel.consumer_lag, kernel.stages) else replace(kernel, consumer_lag=0)


def _warm_where_it_holds(model: Model, plan: Plan) -> Plan:
    """A pinned `warm_next` kept on the kernels whose next kernel streams a model input by TMA (`warm_target`);
    0 on the others (the plan's last kernel, one followed by a row kernel), where it would warm nothing."""
    if not any(getattr(k, "warm_next", 0) for k in plan.kernels):
        return plan
    from habu.lower import lower_whole

    lowered = lower_whole(model, plan).kernels
    return replace(plan, kernels=tuple(replace(k, warm_next=0) if getattr(k, "warm_next", 0) and lw.warm is None
                                       else k for k, lw in zip(plan.kernels, lowered, strict=True)))


SPLITS = ("scatter:", "gather:")  # the rewrites that take a scatter or a gather out of a wgmma contraction


def _cheaper_scatters(model: Model, target: Target, sizes: dict[str, int], rewrites: tuple[str, ...]) -> tuple[str, ...]:
    """`rewrites` and each `scatter:T` (a contraction's scatter-add out of its epilogue: habu/plan/scatter_split.py)
    that the cost model predicts faster at these sizes, both plans at their default kernels: GGEMM's backward dA
    at 4096³ (its 64 MB f32 target past the L2), not at 1024³; likewise each `gather:T` (an operand gathered
    on the reduction axis copied out first instead of staged: habu/plan/gather_split.py): GGEMM's backward
    dB at 4096³ (H200, 2026-12-02 08:00: 180.7 µs with the copy moving 16-byte vectors, 213.2 staged). Not
    under a `rewrite` or `family` pin (`--pin family=contraction` keeps the scatter epilogue and the staged
    operand, `--pin rewrite=scatter:dA` takes the split)."""
    from habu.plan.rewrite import applicable, apply_rewrites
    from habu.search.cost import plan_cost

    def seconds(names: tuple[str, ...]) -> float:
        kernels = default_kernels(apply_rewrites(model, names), target, sizes)
        plan = make_plan(model, target, kernels, sizes, names)
        return sum(c.seconds for c in plan_cost(model, plan, target, sizes))

    graph = apply_rewrites(model, rewrites)
    if not any(name.startswith(SPLITS) for name in applicable(graph)):
        return rewrites
    fused = {k.nodes[-1] for k in default_kernels(graph, target, sizes)
             if isinstance(k, ContractionKernel) and k.mma == Mma.WGMMA}
    for name in applicable(graph):
        # only where the default computes the node with the wgmma contraction's scatter epilogue (a row
        # scatter into an f32 target: `default_contraction`), the case measured and GPU-checked; others
        # (the SIMT path's f32 dA, a general kernel) keep their default
        if name.startswith(SPLITS) and name.partition(":")[2] in fused \
                and seconds((*rewrites, name)) < seconds(rewrites):
            rewrites = (*rewrites, name)
    return rewrites


# pins that choose a grouped kernel's family, loop or tile: with one, the user's plan replaces the MoE default
GROUPED_PINS = ("family", "pair", "main_loop", "bm", "bn", "bk", "warps_m", "warps_n")

# the kernel fields each plan-choice pin sets, from the field table (operand movements and rewrites
# are checked where they apply; `tile` sets tile_m, tile_n and tile_k at once)
PIN_FIELDS = {"tile": ("tile_m", "tile_n", "tile_k"), **pin_table(tuple(KERNEL_KINDS.values()))}


def _pinned_family(model: Model, regions: tuple[Region, ...], kernels: tuple[Kernel, ...], family: str,
                   target: Target, sizes: dict[str, int]) -> tuple[Kernel, ...]:
    """`--pin family=grouped`: every region the grouped family can build takes it (the MoE combine
    `Y[IX[r] d] += P[r] · Σ h …` included); `family=general`: grouped regions take the general kernel;
    `family=contraction`: a contraction the default leaves general (an operand gathered on the reduction
    axis, a scatter-add store: GGEMM's backward) takes the contraction family's default; `family=columns`: a
    one-node reduction over trailing axes (`O[b] = Σ i X[b i]`) takes the column family."""
    if family not in FAMILY_PINS:
        raise UsageError(f"--pin family={family}: expected one of {', '.join(FAMILY_PINS)}")
    chosen = [family_kernel(model, r, family, target, sizes) for r in regions]
    if all(c is None for c in chosen):
        raise UsageError(f"--pin family={family}: no region of {model.name} can be computed by the {family} family "
                         f"on {target.name}")
    return tuple(c or k for c, k in zip(chosen, kernels, strict=True))


def _pinned_pair(model: Model, regions: tuple[Region, ...], kernels: tuple[Kernel, ...], value: str,
                 target: Target, sizes: dict[str, int]) -> tuple[Kernel, ...]:
    """`--pin pair=fused`: each pair of grouped GEMMs over the same rows and the node of both (gate, up and
    SwiGLU; habu.plan.grouped_pair) becomes one grouped kernel with two accumulators; `split` keeps them apart."""
    if value not in ("fused", "split"):
        raise UsageError(f"--pin pair={value}: expected fused or split")
    if value == "split":
        return kernels
    fused = [(i, grouped.PATH.pair_default(model, tuple(n for r in regions[i:i + 3] for n in r.nodes), target, sizes))
             for i in pair_positions(model, regions)]
    fused = [(i, k) for i, k in fused if k is not None]
    if not fused:
        raise UsageError(f"--pin pair=fused: {model.name} has no two grouped GEMMs of the same rows followed by a "
                         f"node of both (gate, up, SwiGLU) that one grouped kernel computes on {target.name}")
    out = list(kernels)
    for i, k in reversed(fused):
        out[i:i + 3] = [k]
    return tuple(out)


def _pinned_wgmma(model: Model, kernels: tuple[Kernel, ...], target: Target,
                  sizes: dict[str, int] | None = None) -> tuple[Kernel, ...]:
    """`--pin main_loop=wgmma`: each grouped kernel the wgmma main loop can run takes it with its default
    tile (`GroupedPath.wgmma_kernel`; other pins then change the tile); the others (an f32 A, a fused pair)
    keep mma.sync. A plan with no such kernel is a mistake."""
    out = tuple((grouped.PATH.wgmma_kernel(model, k, target, sizes) or k) if isinstance(k, GroupedKernel) else
                (attention.PATH.wgmma_kernel(model, k, target) or k) if isinstance(k, AttentionKernel) else k
                for k in kernels)  # an attention kernel (--pin family=attention): the FA3-style loop
    if not any(isinstance(k, GroupedKernel | AttentionKernel) and k.main_loop == "wgmma" for k in out):
        raise UsageError(f"--pin main_loop=wgmma: no grouped or attention kernel of {model.name} can run the wgmma "
                         f"main loop on {target.name} (it needs wgmma and TMA; a grouped GEMM bf16 A and W, one GEMM "
                         "a kernel; fused attention (--pin family=attention) bf16 Q, K, V of head widths in 64s)")
    return out


# the wgmma loop's choices (no other loop prints them), and the pin keys that set them
WGMMA_FIELDS = ("consumer_lag", "epilogue_prefetch", "epilogue_early", "warm_next", "keep_operands", "stream_b")
WGMMA_HINTS = tuple(key for key, names in PIN_FIELDS.items() if set(names) <= set(WGMMA_FIELDS))


def _check_wgmma_hints(pins: dict[str, str], kernels: tuple[Kernel, ...], target: Target) -> None:
    """A wgmma choice pinned on (not false, not 0) where no contraction of the plan runs the wgmma loop is a choice
    no kernel makes (`--pin stream_b=true` on sm_80): refused, not recorded in a plan that ignores it."""
    for key, value in pins.items():
        if key.lower() in WGMMA_HINTS and value.strip().lower() not in ("false", "0") \
                and not any(getattr(k, "mma", None) == "wgmma" for k in kernels):
            loops = ", ".join(sorted({str(getattr(k, "mma", "")) for k in kernels if getattr(k, "mma", None)}))
            raise UsageError(f"--pin {key}={value}: a choice of the wgmma loop, which no contraction of this plan runs "
                             f"(on {target.name}: {loops or 'no contraction'})")


def _check_operand_pins(model: Model, pins: dict[str, str], kernels: tuple[Kernel, ...]) -> None:
    """A movement pin names a tensor some contraction of the plan reads as an operand (each contraction takes the
    pins of its own operands: `--pin K=staged` stages K wherever a product reads it)."""
    read: set[str] = set()
    for k in kernels:
        if "a_move" in {f.name for f in fields(k)}:
            c = kernel_contraction(node_of(model, k.nodes[0]), k)  # type: ignore[arg-type]
            read |= {c.a.load.tensor, c.b.load.tensor} if c is not None else set()
    for key in pins:
        if key in model_tensors(model) and key not in read:
            raise UsageError(f"--pin {key}=...: {key} is not an operand of a contraction in this model")


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


def _pinned_rewrites(model: Model, value: str | None, family: str | None = None) -> tuple[str, ...]:
    """`--pin rewrite=factor:Y` (several joined with +), checked against what applies to the model, and then the
    `split:` rewrites that apply after them; without the pin, the rewrites a default takes (`split:T`, habu.plan.rewrite.default_rewrites), but not
    `attention:T` under `--pin family=attention` (the fused kernel computes the softmax-weighted sum whole)."""
    from habu.plan.rewrite import RewriteError, applicable, apply_rewrites, default_rewrites

    if not value and family == "attention":  # a training forward's statistics join the sum (`fused:T`) first
        fused = tuple(n for n in applicable(model) if n.startswith("fused:"))
        after = apply_rewrites(model, fused) if fused else model
        return fused + tuple(n for n in applicable(after) if n.startswith("split:"))
    if not value:
        return default_rewrites(model)

    names = tuple(v.strip() for v in value.split("+") if v.strip())
    try:
        after = apply_rewrites(model, names)
    except RewriteError as err:
        offered = ", ".join(applicable(model)) or "none"
        raise UsageError(f"--pin rewrite={value}: {err.message} (rewrites that apply to {model.name}: {offered})"
                         ) from None
    # then the splits of the contractions the pinned rewrites leave inside larger expressions (no contraction
    # family takes such a node: `rewrite=attention:O` left the scores `where(…, Σ e Q·K·s, −∞)` a scalar general
    # kernel, session 64), as a default takes them
    return names + tuple(n for n in applicable(after) if n.startswith("split:") and n not in names)


def _pinned_storage(model: Model, rewrites: tuple[str, ...], value: str) -> str:
    """`--pin storage=bf16`: the rewrite `storage:bf16` after `rewrites`, or a UsageError saying why not."""
    from habu.plan.rewrite import apply_rewrites
    from habu.plan.storage_pin import TYPES, storage_part

    if value not in TYPES:
        raise UsageError(f"--pin storage={value}: expected one of {', '.join(TYPES)} (the type every matrix the plan "
                         "stores between kernels takes)")
    if storage_part(apply_rewrites(model, rewrites), value) is None:
        raise UsageError(f"--pin storage={value}: the plan of {model.name} stores no matrix in another type")
    return f"storage:{value}"


def _fixed(model: Model, extent: str, sizes: dict[str, int] | None) -> bool:
    e = model.extent(extent)
    return e.is_static or bool(sizes and extent in sizes)


# ----------------------------------------------------------------------------- pins


PLAN_PINS = ("rewrite", "family", "pair", "storage", "lanes")  # keys that choose for the whole plan, not a kernel
PIN_KEYS = (*PIN_FIELDS, *PLAN_PINS)


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


def _mma_sync_only(pins: dict[str, str]) -> bool:
    """Whether the pins choose an attention kernel only the mma.sync loop runs (its loop pinned, query tiles of 16
    or 32 rows, KV tiles sliced over warps): the default's wgmma pins (a long prefill's, a decode's:
    `AttentionPath.default_pins`) then give way to the mma.sync kernel's default instead of a refusal."""
    return (pins.get("main_loop") == "mma.sync" or pins.get("bm", "64") not in ("64", "128")
            or pins.get("kv_warps", "1") != "1")


def _pinned_orientation(kernel: Kernel, pins: dict[str, str]) -> Kernel:
    """A contraction kernel in the orientation `swap_ab` pins (`--pin swap_ab=1`): where it differs from the
    kernel's, the same tiles transposed — tile sides, operand movements and vectors exchanged — before the other
    pins apply (an operand's movement pin names the tensor, whichever side it moves to)."""
    key = next((k for k in pins if k.lower() in ("swap_ab", "swap")), None)
    if key is None or not isinstance(kernel, ContractionKernel):
        return kernel
    swap = _pin_value(kernel, "swap_ab", key, pins[key])
    if swap == kernel.swap_ab:
        return kernel
    swapped = kernel.transposed()
    if swapped.swap_ab and swapped.store == Store.TMA and not any(k.lower() == "store" for k in pins):
        # a TMA store writes rows along the kernel's n, the tokens once transposed: the output's columns run
        # along its m, so the transposed tile stores its registers (unless a store pin says otherwise)
        swapped = replace(swapped, store=Store.DIRECT)
    path = path_for(swapped)  # the warps the transposed tile takes on the kernel's path (its depth kept)
    brought = path.tile_schedule(swapped.tile_m, swapped.tile_n) if isinstance(path, ContractionPath) else None
    return replace(swapped, warps=brought[0]) if brought is not None else swapped


def apply_pins(model: Model, kernel: Kernel, pins: dict[str, str], target: Target | None = None) -> Kernel:
    changes: dict[str, object] = {}
    names = {f.name for f in fields(kernel)}
    operands: dict[str, str] = {}
    gathered: set[str] = set()
    moves_operands = "a_move" in names  # a kernel of operands whose movement a pin sets (a contraction)
    if moves_operands:
        kernel = _pinned_orientation(kernel, pins)
        c = kernel_contraction(node_of(model, kernel.nodes[0]), kernel)  # the sides as the pinned orientation has them
        assert c is not None
        operands = {c.a.load.tensor: "a", c.b.load.tensor: "b"}
        gathered = {side for side, op in (("a", c.a), ("b", c.b)) if op.gather}
    for key, value in pins.items():
        k = key.lower()
        if not moves_operands and (key in model_tensors(model) or k in ("a", "b")):
            continue  # a movement pin: it is for the model's contraction, not for this row or map kernel
        if key in operands or (k in ("a", "b") and moves_operands and key not in model_tensors(model)):
            side = operands.get(key, k)
            move = _pin_value(kernel, f"{side}_move", key, value)
            if move == Move.TMA and side in gathered and target is not None and target.tma_gather4:
                move = Move.TMA_GATHER4  # TMA on gathered rows is the gather4 form, where the target has it
            changes[f"{side}_move"] = move
            continue
        if key in model_tensors(model):
            continue  # another contraction's operand (`_check_operand_pins`: some contraction of the plan reads it)
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
        elif k not in PLAN_PINS:
            raise UsageError(f"--pin {key}: unknown key (keys: {', '.join(PIN_KEYS)}, or an operand's name)")
    # a block of more than a warp works on one row: a pinned thread count brings one row per block
    if "rows_per_block" in names and changes.get("threads", 32) != 32 \
            and changes.setdefault("rows_per_block", 1) != 1:
        raise UsageError(f"--pin rows={changes['rows_per_block']} needs threads=32: several rows per block "
                         "are a warp each")
    # a pinned KV tile of a sliced decode brings its warps (16 keys or more each) unless they are pinned too
    if isinstance(kernel, AttentionKernel) and "bn" in changes and "kv_warps" not in changes and kernel.kv_warps > 1:
        changes["kv_warps"] = max(1, min(kernel.kv_warps, int(changes["bn"]) // 16))  # type: ignore[call-overload]
    # one operand's boxes go ahead: a pinned side ahead takes the default's other side back unless both are pinned
    for side, other in (("a_ahead", "b_ahead"), ("b_ahead", "a_ahead")):
        if changes.get(side) is True and other in names and other not in changes:
            changes[other] = False
    # a pinned thread count brings its own register bound: the default's two blocks an SM were for its threads
    if "blocks_per_sm" in names and "threads" in changes:
        changes.setdefault("blocks_per_sm", 1)
    if "tile_m" in changes:
        # a pinned tile brings its own warps and depth (as the path says) unless they are pinned too
        path = path_for(replace(kernel, mma=changes["mma"]) if "mma" in changes else kernel)
        tile_m, tile_n = changes["tile_m"], changes["tile_n"]
        assert isinstance(tile_m, int) and isinstance(tile_n, int)
        brought = path.tile_schedule(tile_m, tile_n) if isinstance(path, ContractionPath) else None
        if brought is not None:
            changes.setdefault("warps", brought[0])
            changes.setdefault("stages", brought[1])
    # a consumer lag is for kernels with warpgroups to stagger (`lag_refusal`): the others keep theirs in step, as a
    # skinny product of one consumer warpgroup has nothing to stagger
    lag = changes.get("consumer_lag")
    if lag and isinstance(kernel, ContractionKernel) and lag_refusal(replace(kernel, **changes), lag) is not None:  # type: ignore[arg-type]
        changes["consumer_lag"] = 0
    vector_key = next((k for k in pins if k.lower() == "vector"), None)
    if moves_operands and vector_key is None:
        changes.update(_pinned_move_vectors(model, replace(kernel, **changes), changes))  # type: ignore[arg-type]
    elif moves_operands:
        changes.update(_boxed_vectors(kernel, replace(kernel, **changes)))  # type: ignore[arg-type]
    if isinstance(kernel, GroupedKernel) and not weight_gradient(model, kernel):  # (its product ignores them)
        changes = {name: v for name, v in changes.items() if name not in WGRAD_FIELDS}
    elif isinstance(kernel, GroupedKernel) and kernel.wgrad_persistent and "wgrad_persistent" not in changes \
            and walk_refusal(replace(kernel, **changes)) is not None:  # type: ignore[arg-type]
        changes["wgrad_persistent"] = False  # the default's walk gives way to pinned copies or a tile it cannot hold
    return replace(kernel, **changes) if changes else kernel


def _pinned_move_vectors(model: Model, after: ContractionKernel, changes: dict[str, object]) -> dict[str, int]:
    """The vectors of operands whose movement a pin set (and no pin their vector): the path's (`vector`: a staged
    one on mma.sync reads its buffer's padded rows 16 bytes at a time), except one read in place whose innermost
    index is a batch axis (`A[m k s]`): an element at a time (no vector runs along a batch axis)."""
    c = kernel_contraction(node_of(model, after.nodes[0]), after)
    path = path_for(after)
    assert c is not None and isinstance(path, ContractionPath)
    out: dict[str, int] = {}
    for side, op in (("a", c.a), ("b", c.b)):
        if f"{side}_move" in changes:
            move, vector = str(getattr(after, f"{side}_move")), getattr(after, f"{side}_vector")
            in_place = move in ("ldg", "cp.async") and batch_innermost(c, op)
            out[f"{side}_vector"] = 1 if in_place else path.vector(move, vector)
    return out


def _boxed_vectors(before: ContractionKernel, after: ContractionKernel) -> dict[str, int]:
    """A pinned vector is the width of an operand's ldg or cp.async reads: an operand read by TMA in whole boxes
    keeps the vector it had (`_check_vector_pin`: some kernel of the plan must read by vectors)."""
    return {f"{side}_vector": getattr(before, f"{side}_vector") for side in _boxed_sides(after)}


def _boxed_sides(kernel: ContractionKernel) -> tuple[str, ...]:
    path = path_for(kernel)
    assert isinstance(path, ContractionPath)
    return tuple(side for side in ("a", "b") if path.reads_boxes(str(getattr(kernel, f"{side}_move"))))


def _check_vector_pin(pins: dict[str, str], kernels: tuple[Kernel, ...]) -> None:
    """`--pin vector=...` where every kernel with a vector is a contraction reading both operands by TMA: nothing
    would read by it (it was recorded in the plan and never used)."""
    key = next((k for k in pins if k.lower() == "vector"), None)
    if key is None:
        return
    takers = [k for k in kernels if any(f.name in ("vector", "a_vector") for f in fields(k))]
    if takers and all(isinstance(k, ContractionKernel) and len(_boxed_sides(k)) == 2 for k in takers):
        k = takers[0]
        raise UsageError(f"--pin {key}={pins[key]}: the contraction reads both operands by TMA in whole boxes "
                         f"(A {k.a_move}, B {k.b_move}); a vector is the width of an ldg or cp.async read (pin "
                         "A=... or B=... to one of those too)")


WGRAD_FIELDS = ("wgrad_copy", "wgrad_index_ring", "wgrad_persistent")  # a grouped weight gradient's own choices


def weight_gradient(model: Model, kernel: Kernel) -> bool:
    """Whether `kernel` computes a grouped weight gradient (`O[E[r] m n] += A[r m]·B[r n]`, habu/plan/grouped_wgrad.py)."""
    eq = next((e for e in model.nodes if e.target == kernel.nodes[0]), None)
    return isinstance(kernel, GroupedKernel) and len(kernel.nodes) == 1 and eq is not None \
        and as_grouped_wgrad(model, eq) is not None


def model_tensors(model: Model) -> set[str]:
    return {t.name for t in (*model.inputs, *model.outputs)}


# ----------------------------------------------------------------------------- the space


def enumerate_plans(model: Model, target: Target, sizes: dict[str, int] | None = None) -> Iterator[Plan]:
    """Candidate plans for the default fusion, in a fixed canonical order, each once.

    Kernels of different regions run as separate launches, so their times add: the space is walked
    one region at a time with the other regions at their defaults (the search tunes each region on
    its own). Candidates are not yet proven: `habu.prove` rejects those that break a rule."""
    s = concrete_sizes(model, sizes)
    regions = default_partition(model, target, s)
    defaults = default_kernels(model, target, s, regions)
    fixed = {k: v for k, v in s.items() if _fixed(model, k, sizes)}
    yield make_plan(model, target, defaults, fixed)
    for i, r in enumerate(regions):
        for k in region_space(model, r, target, s):
            if k == defaults[i]:
                continue
            kernels = (*defaults[:i], k, *defaults[i + 1:])
            yield make_plan(model, target, kernels, fixed)
    for i in pair_positions(model, regions):  # gate, up and SwiGLU in one grouped kernel (`--pin pair=fused`)
        base = grouped.PATH.pair_default(model, tuple(n for r in regions[i:i + 3] for n in r.nodes), target, s)
        for k in grouped.PATH.variants(base, target) if base is not None else ():
            yield make_plan(model, target, (*defaults[:i], k, *defaults[i + 3:]), fixed)


__all__ = ["apply_pins", "concrete_sizes", "default_kernels", "default_plan", "enumerate_plans", "make_plan",
           "node_of", "parse_pins", "region_space", "relower"]


def relower(model: Model, plan: Plan, k: Kernel, fallback):
    """The lowering of kernel `k` alone, with the plan's storage (cheap enough to cost every
    candidate of a region); `fallback` where it does not lower."""
    from habu.lower import lower

    try:
        return lower(model, k, dict(plan.storage))
    except Exception:
        return fallback
