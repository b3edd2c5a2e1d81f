"""The finite-field check of a plan against its model.

For each trial (a fresh seed from a real generator, recorded in the certificate):
1. draw every input as a virtual random tensor over GF(p) (index tensors: random indices in range);
2. pick the blocks to execute: for the kernel that writes an output, the first, second and last
   tile along each grid dimension (every tile class: the first, an interior one, the ragged last),
   all of their split-K slices; for earlier kernels, every block whose result those read;
3. run the lowered kernels on those blocks (`habu.prove.interp`);
4. evaluate the model's GF(p) semantics on the same elements and compare every one.

Why the chosen tiles stand for all: within a kernel, a block's code depends on its tile index only
through the affine offsets m0 = tm·BM, n0 = tn·BN and through the masks, so two tiles with the same
mask pattern run the same arithmetic on different addresses. `tile_classes_covered` proves with z3
that every tile of the grid has the mask pattern of a checked tile. Address arithmetic at the full
shape (the int32 wrap included) is executed for real on the checked tiles, whose offsets include the
largest ones (the last tile), and proven for all tiles by the rule checker.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from habu.lower import ColumnLowering, ContractionLowering, RowLowering, lower_plan
from habu.lower.general import GeneralLowering, Store
from habu.lower.stores import stored_accesses
from habu.plan.plan import Plan
from habu.prove.deadline import check_deadline
from habu.prove.demand import demand, demanded_box, stored_boxes, wider_box
from habu.prove.interp import (
    FIELD_CHECK_FIELDS as FIELD_CHECK_FIELDS,  # what the check reads of a contraction
)
from habu.prove.interp import Memory, PlanFault, element_at, run_kernel
from habu.prove.interp_general import loop_volume
from habu.prove.kinds import kind_proof
from habu.prove.virtual import GroupedVirtualTensor, PairVirtualTensor, VirtualTensor, key_for
from habu.spec.evaluate import BoxTensor, EvalError, Evaluator
from habu.spec.field import DEFAULT_PRIME, PrimeField
from habu.spec.field_exp import PRIME_P, PRIME_Q, ExpField, check_exp_arguments
from habu.spec.ir import Gather, Model, Reduce, walk
from habu.version import __version__

DEFAULT_TRIALS = 3


@dataclass
class Mismatch:
    tensor: str
    element: tuple[int, ...]
    got: int | None  # None: never written
    expected: int
    trial: int
    count: int  # how many checked elements differ

    def describe(self, p: int, field_name: str | None = None) -> str:
        where = f"{self.tensor}[{', '.join(map(str, self.element))}]"
        if self.got is None:
            return f"{where} was never written (trial {self.trial}; {self.count} checked elements differ)"
        return (f"{where} differs: the plan gives {self.got}, the model {self.expected} over {field_name or f'GF({p})'} "
                f"(trial {self.trial}; {self.count} checked elements differ)")


@dataclass
class Certificate:
    """What a finite-field check did and what it shows."""

    passed: bool
    prime: int
    trials: int
    seeds: list[int]
    shape: dict[str, int]
    checked: dict[str, int]  # output -> elements compared per trial
    blocks: dict[str, str]  # kernel -> which blocks ran
    degree: int
    bound: float  # probability that a wrong plan passes all trials (at the checked elements)
    seconds: float
    failure: str | None = None
    notes: list[str] = field(default_factory=list)
    witness: dict[str, int] | None = None  # the reduced shape checked, when not the full one
    # what the certificate is about (habu.prove.trust refuses it for anything else): the plan's key,
    # the model's canonical hash and the Habu version that made it
    plan_key: str | None = None
    model_hash: str | None = None
    habu_version: str | None = None
    field_name: str | None = None  # the field checked over, when not GF(prime): Z_q × GF(p) for an online softmax

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    def bound_to(self, plan: Plan) -> Certificate:
        """The same check, bound to `plan`: only for a plan the check is the same for (the same
        kernels with guards added, or the same field key)."""
        from dataclasses import replace

        return replace(self, plan_key=plan.key)

    def summary(self) -> str:
        if not self.passed:
            return f"FAILED: {self.failure}"
        at = "" if self.witness is None else \
            " at witness " + ", ".join(f"{k}={v}" for k, v in self.witness.items() if self.shape.get(k) != v)
        return (f"passed {self.trials} trials over {self.field_name or f'GF({self.prime})'}{at}, seeds {self.seeds}; "
                f"{sum(self.checked.values())} output elements per trial; a wrong plan passes with "
                f"probability at most {self.bound:.1e} (degree {self.degree}); {self.seconds:.2f} s")


# ----------------------------------------------------------------------------- which elements


def degree(model: Model, sizes: Mapping[str, int]) -> int:
    """A bound on the degree of every output as a polynomial in the inputs and the values of the
    uninterpreted functions, plus the degrees of those functions' arguments (Schwartz–Zippel)."""
    deg: dict[str, int] = {}
    extra = 0

    def node_degree(e, ds: list[int]) -> int:
        """The degree of `e` from its children's (`ds`, in order)."""
        nonlocal extra
        from habu.spec.functions import FUNCTIONS
        from habu.spec.ir import Compare, Const, Load, NegInf, Op, Size

        if isinstance(e, Const | Size | Compare | NegInf):  # a condition is exactly 0 or 1
            return 0
        if isinstance(e, Load):
            return deg.get(e.tensor, 1)
        if isinstance(e, Op):
            kind = FUNCTIONS[e.fn].field
            if kind in ("add", "sub"):
                return max(ds)
            if kind in ("mul", "div", "div0"):
                return sum(ds)
            if kind == "neg":
                return ds[0]
            if kind == "where":  # an exact selection by a condition on indices
                return max(ds[1], ds[2])
            extra += sum(ds)  # the argument must agree first
            return 1
        assert isinstance(e, Reduce)
        if e.op == "sum":
            return ds[0]
        n = 1
        for v in e.vars:
            n *= sizes[v.extent]
        return n * max(ds[0], 1)

    def d(root) -> int:
        """`node_degree` folded over the tree bottom-up, iteratively (chains of any length)."""
        from habu.spec.ir import Op

        def children(e) -> tuple:
            return tuple(e.args) if isinstance(e, Op) else (e.body,) if isinstance(e, Reduce) else ()

        done: list[int] = []
        stack: list[tuple[object, bool]] = [(root, False)]
        while stack:
            e, expanded = stack.pop()
            kids = children(e)
            if expanded or not kids:
                n = len(kids)
                ds = done[len(done) - n:] if n else []
                del done[len(done) - n:]
                done.append(node_degree(e, ds))
            else:
                stack.append((e, True))
                stack.extend((k, False) for k in reversed(kids))
        return done[0]

    for eq in model.nodes:
        deg[eq.target] = d(eq.rhs)
    return max(1, max((deg[t.name] for t in model.outputs), default=1) + extra)


# ----------------------------------------------------------------------------- the check


def virtual_inputs(model: Model, sizes: Mapping[str, int], field: PrimeField, seed: int,
                   lengths: frozenset[str] = frozenset()) -> dict[str, VirtualTensor]:
    """The trial's inputs; `lengths`: the value ranges of index tensors that bound a mask (`length_ranges`)."""
    out = {}
    for t in model.inputs:
        shape = tuple(sizes[e] for e in t.extents)
        modulus = sizes[t.range] if t.is_index else field.p
        if isinstance(field, ExpField) and not t.is_index:
            out[t.name] = PairVirtualTensor(t.name, shape, field.q, field.p, key_for(seed, t.name))
        elif t.grouped:
            out[t.name] = GroupedVirtualTensor(t.name, shape, modulus, key_for(seed, t.name))
        else:
            out[t.name] = VirtualTensor(t.name, shape, modulus, key_for(seed, t.name), index=t.is_index,
                                        length=t.is_index and t.range in lengths)
    return out


def field_key(model: Model, plan: Plan, sizes: Mapping[str, int], lowerings: list | None = None) -> str:
    """Plans with the same key run the same finite-field check: the same model, shape, rewrites,
    storage and lowered accesses, tile for tile. The search checks one plan per key."""

    lowerings = lowerings if lowerings is not None else lower_plan(model, plan)
    parts: list[object] = [model.canonical_hash(), sorted(dict(plan.shape).items()), sorted(dict(sizes).items()),
                           plan.rewrites, plan.storage]
    parts += [kind_proof(lw).field_key(lw) for lw in lowerings]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _scatter_contraction(lw: object) -> bool:
    """A contraction's scatter-add epilogue: the check runs every row tile (any row may land on any target
    row), so it checks on the witness shape rather than the full one."""
    return isinstance(lw, ContractionLowering) and lw.store is Store.ATOMIC_ADD


def verify_plan(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None, trials: int = DEFAULT_TRIALS,
                seeds: list[int] | None = None, prime: int = DEFAULT_PRIME,
                witness: bool | None = None, lowerings: list | None = None) -> Certificate:
    """Run the finite-field check; never raises for a wrong plan (the certificate says why).

    `witness`: check on a reduced shape with every tile class (see habu.prove.witness). The default
    does so for plans of several kernels, whose earlier kernels must otherwise be run in full;
    a single kernel is checked at the full shape (only its sample tiles run)."""
    start = time.perf_counter()
    full = dict(plan.shape)
    if sizes:
        full.update(sizes)
    missing = [e.name for e in model.extents if e.name not in full]
    if missing:
        raise ValueError(f"verify_plan needs sizes for {missing}")
    seeds = list(seeds) if seeds else [secrets.randbits(63) for _ in range(trials)]
    lowerings = lowerings if lowerings is not None else lower_plan(model, plan)
    from habu.plan.rewrite import planned_model

    graph = planned_model(model, plan)  # what the kernels compute; the reference evaluates `model`
    names = [f"kernel {i} ({'+'.join(k.nodes)})" for i, k in enumerate(plan.kernels)]
    s = full
    coverage: list[str] = []
    exp_kind = any(kind_proof(lw).exp_field for lw in lowerings)  # its check is costly at full shape
    if witness or (witness is None and (len(plan.kernels) > 1 or exp_kind or any(map(_scatter_contraction, lowerings)))):
        from habu.prove.witness import prove_coverage, split_coverage, tiled_axes, witness_sizes

        w = witness_sizes(graph, names, lowerings, full)
        if w != full:
            coverage = prove_coverage(tiled_axes(names, lowerings), full, w) + \
                split_coverage(names, lowerings, full, w)
            s = w
    outputs = {t.name for t in model.outputs}
    blocks_text: dict[str, str] = {}
    out_boxes: dict[str, tuple[np.ndarray, ...]] = {}
    selections: dict[int, object] = {}
    keeps: dict[int, object] = {}
    deg = degree(model, s)
    cert = Certificate(True, prime, len(seeds), seeds, dict(full), {}, blocks_text, deg, 1.0, 0.0,
                       plan_key=plan.key, model_hash=model.canonical_hash(), habu_version=__version__)
    if s != full:
        cert.witness = dict(s)
        cert.notes.extend(coverage)
    exp = False
    try:
        chosen: dict[int, tuple[np.ndarray, ...]] = {}  # the output box each selection computes
        for i, lw in enumerate(lowerings):
            kind_proof(lw).precheck(names[i], lw, s)
            if any(t in outputs for t in stored_boxes(graph, lw, plan.kernels[i].nodes, ())):
                sel, box, text = kind_proof(lw).final_selection(lw, s)
                selections[i] = sel
                keeps[i] = kind_proof(lw).final_keep(lw, s)
                chosen[i] = box
                out_boxes.update({t: b for t, b in stored_boxes(graph, lw, plan.kernels[i].nodes, box).items()
                                  if t in outputs})
                blocks_text[names[i]] = text
        rows = {t: (len(lw.leading), lw.kernel.rows_per_block) for k, lw in zip(plan.kernels, lowerings, strict=True)
                if isinstance(lw, RowLowering) for t in k.nodes}
        columns = {t: (lw.c, lw.tile) for k, lw in zip(plan.kernels, lowerings, strict=True)
                   if isinstance(lw, ColumnLowering) for t in k.nodes}
        vectors = {t: lw.vector for k, lw in zip(plan.kernels, lowerings, strict=True)
                   if isinstance(lw, GeneralLowering) and lw.vector > 1 for t in k.nodes}
        tiles = {a.tensor: tuple(j for j, q in enumerate(a.positions) if q.kind == "axis" and q.axis in ("m", "n"))
                 for lw in lowerings if isinstance(lw, ContractionLowering) and lw.window for a in stored_accesses(lw)}
        boxes = demand(graph, out_boxes, s, rows, columns, vectors, tiles)
        widened = False
        for i, lw in enumerate(lowerings):
            # an output a later kernel reads: its kernel runs every block that later kernel needs too
            need = demanded_box(graph, lw, plan.kernels[i].nodes, boxes, s)
            if i in selections and need is not None and wider_box(need, chosen[i]):
                sel, keep, text = kind_proof(lw).box_selection(lw, need, s)
                selections[i], keeps[i] = sel, keep
                # compared where the reference evaluates them
                out_boxes.update({t: b for t, b in stored_boxes(graph, lw, plan.kernels[i].nodes, need).items()
                                  if t in outputs})
                blocks_text[names[i]] = f"{text} (widened: the rows its blocks compute, what later kernels read)"
                widened = True
        # an output compared over a box widened above: the reference evaluates that box too (RMSNorm's recompute
        # backward at 70 rows compared dX over every row, which a later kernel's Σ over rows needs of %s1, where
        # the reference held the sampled rows only: "read outside the evaluated box")
        ref_boxes = boxes if graph is model and not widened else demand(model, out_boxes, s)
        for i, lw in enumerate(lowerings):
            if i in selections:
                continue
            need = demanded_box(graph, lw, plan.kernels[i].nodes, boxes, s)
            if need is None:
                blocks_text[names[i]] = "none (no checked output depends on it)"
                selections[i] = None
                continue
            sel, keep, text = kind_proof(lw).box_selection(lw, need, s)
            selections[i] = sel
            keeps[i] = keep
            blocks_text[names[i]] = text
        for tensor, box in out_boxes.items():
            cert.checked[tensor] = int(np.prod([len(b) for b in box]))
        exp = any(kind_proof(lw).exp_field for lw in lowerings)  # an online softmax: exp as a homomorphism
        if exp:
            check_exp_arguments(model)
            cert.field_name = f"Z_{PRIME_Q} × GF({PRIME_P})"
            cert.notes.append(f"checked over Z_{PRIME_Q} × GF({PRIME_P}) (exp(a + b) = exp(a)·exp(b) exact; "
                              "docs/VERIFY.md states the bound per trial)")
        lengths = frozenset(r for lw in lowerings for r in kind_proof(lw).length_ranges(lw))
        for trial, seed in enumerate(seeds):
            check_deadline(f"before trial {trial + 1} of the finite-field check")
            field_ = ExpField(seed=seed) if exp else PrimeField(prime, seed)
            inputs = virtual_inputs(model, s, field_, seed, lengths)
            mem = Memory(inputs, field_, s)
            for i, lw in enumerate(lowerings):
                sel = selections[i]
                if sel is None:
                    continue
                run_kernel(names[i], lw, s, mem, kind_proof(lw).blocks(lw, s, sel), keeps.get(i))
            for i, lw in enumerate(lowerings):
                for stored in stored_accesses(lw):
                    wt = mem.written.get(stored.tensor)
                    if wt is not None and not wt.accumulate:
                        dup, counts = wt.multiply_written()
                        if len(dup):
                            mem.fault(f"{names[i]} writes {element_at(stored, int(dup[0]), s)} (offset {int(dup[0])}) "
                                      f"{int(counts[0])} times (a race between blocks: the last write wins)")
            check_deadline("before the reference evaluation")
            ref = Evaluator(model, s, field_, ref_boxes).run(inputs)
            check_deadline("in the reference evaluation")  # (not interrupted inside: a pass past the budget is not kept)
            bad = _compare(model, out_boxes, ref, mem, s, trial + 1)
            if bad is not None or mem.faults:
                cert.passed = False
                parts = [bad.describe(prime, field_.name if exp else None)] if bad is not None else \
                    ["the checked values agree, but a kernel faults"]
                parts += mem.faults[:3]
                cert.failure = "; ".join(parts)
                break
        if cert.passed and any(t.is_index for t in model.inputs):
            check_deadline("before the out-of-range index run")
            failure, note = check_index_masking(model, lowerings, names, selections, keeps, s, prime, seeds[0])
            if failure:
                cert.passed, cert.failure = False, failure
            else:
                cert.notes.append(note)
    except PlanFault as fault:
        cert.passed = False
        cert.failure = str(fault)
    except EvalError as err:
        cert.passed = False
        cert.failure = f"the reference could not be evaluated: {err.message}"
    per_trial = deg * deg / PRIME_Q + deg / PRIME_P if exp else deg / prime  # exp: C(k, 2)·D/q + d/p, k·D ≤ d²
    cert.bound = min(1.0, per_trial) ** len(seeds) if cert.passed else 1.0
    cert.seconds = time.perf_counter() - start
    return cert


def check_index_masking(model: Model, lowerings, names, selections, keeps, sizes: Mapping[str, int], prime: int,
                        seed: int) -> tuple[str | None, str]:
    """Run the checked blocks once more with index tensors that hold out-of-range values (one in four:
    just past the end, -1, a million off either way): every access through them must stay inside its tensors (the
    index checks of the lowering's masks, `Access.checks`, mask those elements and raise the kernel's
    error words). Returns (failure, note); the values are not compared (a masked gather reads zero).
    Such values may leave a kernel writing nothing (a grouping whose values are out of range and out of
    order gives every group no rows): a later kernel then reads its output's buffer unwritten, which the
    runtime allocated before the launches, in bounds; that is not a failure here."""
    field_ = PrimeField(prime, seed)
    inputs = virtual_inputs(model, sizes, field_, seed)
    for t in model.inputs:
        if t.is_index:
            v = inputs[t.name]
            inputs[t.name] = VirtualTensor(v.name, v.shape, v.modulus, v.key, index=True, out_of_range=True)
    mem = Memory(inputs, field_, sizes, allocated=frozenset(a.tensor for lw in lowerings for a in stored_accesses(lw)))
    for i, lw in enumerate(lowerings):
        sel = selections[i]
        if sel is None:
            continue
        if isinstance(sel, set) and len(sel) > 2 and keeps.get(i) is None:
            # a contraction's sampled tiles: its first and last stand for the rest here (whether a masked
            # index is read through does not depend on the tile; the values are not compared)
            ordered = sorted(sel)
            sel = {ordered[0], ordered[-1]}
        keep = keeps.get(i)
        if isinstance(lw, GeneralLowering):
            keep = _block_ends(lw, sel, keep, sizes)
        run_kernel(names[i], lw, sizes, mem, kind_proof(lw).blocks(lw, sizes, sel), keep)
    outside = [f for f in mem.faults if "out of bounds" in f or "outside the elements" in f]
    if outside:
        return ("with out-of-range index values, a kernel accesses memory outside its tensors: "
                + "; ".join(outside[:3])), ""
    first = mem.index_errors[0] if mem.index_errors else None
    seen = (f"{mem.index_error_count} masked, the first {first[1]}[{first[2]}] = {first[3]} in {first[0]}"
            if first else "none met by the checked blocks")
    return None, f"out-of-range index values stay inside every tensor ({seen})"


MASKING_WORK = 1 << 24  # a general kernel's lanes × loop iterations past which the out-of-range run thins it


def _block_ends(lw: GeneralLowering, blocks: object, keep: np.ndarray | None, sizes: Mapping[str, int]
                ) -> np.ndarray | None:
    """The elements of a general kernel the out-of-range run computes: all it checked, or where those lanes'
    loops make more than `MASKING_WORK` steps, each checked block's first and last (a gathered weight read by
    every routed row's loop over the hidden width: the Mixtral backward spent 82 s here, as long as a trial). A
    block's lanes read the index tables at their own coordinates; its ends keep every block's rows (the
    gathered axes lead the flat order), the loops are run whole, the values are not compared."""
    chosen = np.asarray(blocks, dtype=np.int64).ravel()
    numel = int(lw.numel(sizes))
    lanes = np.asarray(keep, dtype=np.int64) if keep is not None else None
    count = len(lanes) if lanes is not None else len(chosen) * lw.per_block
    if count * loop_volume(lw, sizes) <= MASKING_WORK:
        return keep
    if lanes is None:
        firsts = chosen * lw.per_block
        return np.unique(np.concatenate([firsts, np.minimum(firsts + lw.per_block, numel) - 1]))
    lanes = np.unique(lanes)
    block = lanes // lw.per_block
    starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
    ends = np.r_[starts[1:], len(lanes)] - 1
    return np.unique(np.concatenate([lanes[starts], lanes[ends]]))


def _compare(model: Model, out_boxes, ref, mem: Memory, sizes, trial: int) -> Mismatch | None:
    for tensor, box in out_boxes.items():
        expected = ref[tensor]
        # the reference's own box, or (a contraction's extra output compared where a later kernel reads its
        # output, inside the box the reference evaluated) the elements of `box` in it
        same = isinstance(expected, BoxTensor) and all(np.array_equal(c, b) for c, b in zip(expected.coords, box, strict=True))
        data = expected.data if same else expected[np.ix_(*box)]
        grids = np.meshgrid(*box, indexing="ij")
        decl = model.tensor(tensor)
        dims = [sizes[e] for e in decl.extents]
        flat = np.ravel_multi_index(tuple(g.ravel() for g in grids), dims) if dims else np.zeros(1, np.int64)
        wt = mem.written.get(tensor)
        if wt is None:
            got, found = np.zeros(flat.shape, np.int64), np.zeros(flat.shape, bool)
        else:
            got, found = wt.read(flat)
        exp = np.asarray(data).ravel()
        wrong = ~found | (got != exp)
        if np.any(wrong):
            k = int(np.nonzero(wrong)[0][0])
            element = tuple(int(g.ravel()[k]) for g in grids)
            return Mismatch(tensor, element, int(got[k]) if found[k] else None, int(exp[k]), trial,
                            int(wrong.sum()))
    return None


def gathers_in(model: Model) -> list[str]:
    out = []
    for eq in model.nodes:
        for x in walk(eq.rhs):
            if hasattr(x, "indices"):
                for ix in x.indices:  # type: ignore[attr-defined]
                    if isinstance(ix, Gather) and ix.tensor not in out:
                        out.append(ix.tensor)
    return out
