"""The Python API: from a .habu file to a proven, compiled callable.

    import habu
    ggemm = habu.build("examples/ggemm.habu", K=511)       # prove, emit, compile (NVRTC)
    out = ggemm(A=a, B=b, IX=ix)                             # torch / cupy / any DLPack or CAI arrays
    habu.tune("examples/ggemm.habu", budget="10m", M=4096)  # search; the best plans go to the database
    ggemm = habu.load("examples/ggemm.habu", M=4096)        # the tuned plan

A model with runtime extents becomes a checked kernel set: each member carries the guards under
which its proof holds, and every call picks the first member whose guards hold for its shapes.
"""

from __future__ import annotations

from pathlib import Path

from habu.target import target_named


def build(path: str | Path, model: str | None = None, *, target: str | None = None,
          pins: dict[str, str] | None = None, trials: int = 3, check: bool = True, grad: bool = False,
          check_indices: str = "device",
          **shape: int):
    """Prove the default (or pinned) plan for `model`, emit it and return a `CompiledModel`.

    `grad`: instead, the model and its derived backward (habu.spec.grad) compiled as a callable that
    torch.autograd differentiates (`habu.torch_grad.GradModel`; the float64 reference on the CPU); `pins` then
    pin the backward's plan.

    `check`: when this machine has a GPU of the target's kind, first run every member of the set
    once on small-integer inputs and compare each output element bit for bit with the exact
    reference, with guard bytes around every buffer (habu.timing.exact; models that use exp,
    rsqrt, division... are not integer-exact and are not checked). A failure raises
    ExactCheckError. Needs torch; `check=False` skips it. `check_indices`: "device" (index values checked
    in the kernels, reported by `habu.check_errors()`; no host round trip, capturable in a CUDA graph) or
    "host" (also copied and checked on the host before every launch, for debugging): see CompiledModel."""
    from habu.compile import compile_model, kernel_set
    from habu.emit_cuda.runtime import CompiledModel
    from habu.gpu_info import current_arch
    from habu.paths.emit import emit
    from habu.spec.parser import load_program

    if grad:
        from habu.torch_grad import build_grad

        return build_grad(path, model, target=target, trials=trials, backward_pins=pins, **shape)
    program = load_program(path)
    m = program.pick(model)
    tgt = target_named(target or current_arch())
    compiled = compile_model(program, m.name, dict(shape), tgt, dict(pins or {}), trials,
                             hint="choose other plan fields with pins={...}, or a shape that satisfies the rule")
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(proof, tgt) for proof in compiled.proofs]),
                          arch=tgt.name, check_indices=check_indices)
    if check and _runs_here(tgt.name):
        from habu.timing.exact import kept_types
        from habu.timing.exact_gpu import check_built

        check_built(built, compiled.model, [kept_types(p) for p in compiled.plans])
    return built


def _runs_here(target: str) -> bool:
    """True when GPU 0 runs `target`'s code (the exact check can launch the plan here)."""
    from habu.gpu_info import current_arch, device_info

    return device_info() is not None and current_arch() == target


def tune(path: str | Path, model: str | None = None, *, budget: str | int = "90s", target: str | None = None,
         db: str | Path | None = None, top_k: int = 5, seed: int = 0, no_gpu: bool = False, jobs: int | None = None,
         ray: str | None = None, out: str | Path | None = None, log=None, **shape: int):
    """Search `model`'s plans at this shape (every runtime extent given) within `budget` ("90s", "10m",
    "1h" or a number of candidates) and keep the best verified ones in the plan database, where
    `load` finds them; the winner's plan, CUDA and report go to `out` (default out/search/<model>).
    The same run as `habu search` (see `habu.tuning.tune` for the options); returns a
    `habu.tuning.TuneResult` (its `interrupted` is set when Ctrl-C ended it). A search that verified
    no plan raises HabuError."""
    from habu.tuning import tune as _tune

    return _tune(path, model, shape=shape, target=target, budget=budget, db=db, top_k=top_k, seed=seed,
                 no_gpu=no_gpu, jobs=jobs, ray=ray, out=out, log=log)


_warned: set[str] = set()


def load(path: str | Path, model: str | None = None, *, db: str | Path | None = None, check_indices: str = "device",
         **shape: int):
    """The best plan the database holds for this model, shape, GPU and toolchain, compiled.

    On a miss it uses the default plan and warns once per model and shape; it never tunes at run
    time (`habu search` does). Entries made on another GPU or with other versions are never used, and
    the stored plan is proven again (once per process) before it is compiled: see `checked_plan`."""
    import sys

    from habu.compile import bind_shape
    from habu.db import PlanDB, Record
    from habu.emit_cuda.runtime import CompiledModel
    from habu.gpu_info import current_arch
    from habu.paths.emit import emit
    from habu.spec.grad_program import with_backward
    from habu.spec.parser import load_program

    program = with_backward(load_program(path), model)  # a backward model by its name, NAME-GRAD
    m = bind_shape(program.pick(model), dict(shape))
    tgt = target_named(current_arch())
    from habu.plan.buckets import BucketGrid

    grid = BucketGrid.of(m)
    if grid.axes:
        return _load_buckets(program, m, grid, tgt, db, dict(shape), check_indices)
    with PlanDB(db) as plans:
        key = lookup_key(m, tgt)
        entry, stale = plans.lookup(key)
    best: Record | None = entry.records[0] if entry and entry.records else None
    if best is None:
        tag = f"{m.name}{dict(shape)}"
        if tag not in _warned:
            _warned.add(tag)
            extra = f" ({len(stale)} entries for other GPUs or versions exist, not used)" if stale else ""
            print(f"habu: warning: no tuned plan for {m.name} {dict(shape) or ''} on {key.target.gpu}{extra}; "
                  f"using the default plan (run habu search to tune it)", file=sys.stderr)
        return build(path, m.name, target=tgt.name, check_indices=check_indices, **shape)
    proof = checked_plan(m, key, best)
    return CompiledModel(m, emit(proof, tgt), arch=tgt.name, check_indices=check_indices)


def _load_buckets(program, m, grid, tgt, db, shape: dict[str, int], check_indices: str = "device"):
    """`load` of a model with a bucketed runtime extent: each size bucket's best stored plan (filed
    under the bucket's key by `habu search`), proven again for its bucket; a bucket with none gets
    its default plan (one warning per model and shape names them)."""
    import sys

    from habu.compile import Compiled, compile_set, kernel_set
    from habu.db import PlanDB
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.plan.buckets import cell_ranges, describe_ranges

    plans, proofs, missing = [], [], []
    with PlanDB(db) as stored:
        for cell in grid.cells():
            ranges = cell_ranges(cell)
            key = lookup_key(m, tgt, ranges)
            entry, _stale = stored.lookup(key)
            if entry is None or not entry.records:
                missing.append(ranges)
                p, q = compile_set(program, m, ranges, shape, tgt, {}, trials=3, hint=None)
                plans += p
                proofs += q
                continue
            proof = checked_plan(m, key, entry.records[0])
            plans.append(proof.plan)
            proofs.append(proof)
    tag = f"{m.name}{shape}"
    if missing and tag not in _warned:
        _warned.add(tag)
        print(f"habu: warning: no tuned plan for {m.name} {shape or ''} on {lookup_key(m, tgt).target.gpu} for "
              f"{len(missing)} of {len(grid)} size buckets ({'; '.join(describe_ranges(r) for r in missing)}); "
              "using their default plans (run habu search to tune them)", file=sys.stderr)
    compiled = Compiled(m, plans, proofs, grid)
    return CompiledModel(m, kernel_set(compiled, [emit(p, tgt) for p in proofs]), arch=tgt.name,
                         check_indices=check_indices)


def checked_plan(model, key, record):
    """The proof of a stored record's plan, proven again before it is used: the rules and a one-trial
    finite-field check at the key's shape (kept in this process: a plan is re-proven once), its
    guards compared with the ones its rules produce, and its certificate bound to this plan, this
    model and the Habu version of its key. A `PlanRefused` error (naming the rule and the kernel)
    otherwise."""
    from habu.plan.plan import Plan
    from habu.prove.trust import PlanRefused, check_certificate, reprove

    plan = Plan.from_json(record.plan, f"the stored plan for {model.name}")
    if plan.target != key.target.arch:
        raise PlanRefused(f"plan {plan.key} is built for {plan.target}, but is filed under {key.target.arch}")
    shape = dict(key.shape)
    if dict(plan.shape) != {k: v for k, v in shape.items() if k in dict(plan.shape)}:
        raise PlanRefused(f"plan {plan.key} was made for the shape {dict(plan.shape)}, but is filed under {shape}")
    if tuple(plan.ranges) != tuple(key.ranges):
        raise PlanRefused(f"plan {plan.key} was made for the sizes {list(plan.ranges) or 'declared'}, but is filed "
                          f"under the size bucket {list(key.ranges) or 'of the declared ranges'}")
    proof = reprove(model, plan, shape, trials=1, holds=guard_holds(shape))
    if record.certificate is None:
        raise PlanRefused(f"plan {plan.key} is stored without a finite-field certificate: it was never verified")
    check_certificate(record.certificate, plan, model, version=key.versions.habu)
    return proof


def guard_holds(sizes):
    """Whether a guard holds at these sizes (False for one Habu does not evaluate)."""
    from habu.emit_cuda.guards import GuardError, eval_guard

    def holds(guard: str) -> bool:
        try:
            return eval_guard(guard, sizes)
        except GuardError:
            return False

    return holds


def lookup_key(model, target, ranges=()):
    """The database key a search on this machine would have stored under (`habu.search.keys`); with
    `ranges`, a size bucket's (habu/plan/buckets.py)."""
    from habu.gpu_info import device_info
    from habu.search.keys import database_key
    from habu.spec.grad_program import direction

    return database_key(model, {e.name: e.size for e in model.extents if e.size is not None}, target,
                        device_info(), direction=direction(model), ranges=ranges)
