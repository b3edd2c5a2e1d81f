"""An exact differential check of a compiled plan: small-integer inputs, an exact reference, and
every element of every output compared bit for bit.

With operands drawn from the nonzero integers in [-r, r] every product is an integer, and as long
as every partial sum stays below 2^24 in magnitude a float32 accumulator holds it exactly, in any
summation order (split-K, atomics, warp shuffles, tensor-core trees). The reference (the model's
float64 semantics on the same integers) is then exact too, and a correct kernel's output is the
reference rounded once to the output's dtype (round to nearest even, as `cvt.rn` does): a 16-bit
output whose integers exceed its exact range (256 for bf16, 2048 for f16) is compared after that one
rounding. Any other difference, in any element, is a bug, not round-off.

`applicability` decides, from the model alone, whether this holds: a model that uses exp, rsqrt,
erf, tanh, division or a non-integer constant (softmax, RMSNorm, GELU) is not integer-exact, and the
result says so (`exact: not applicable (uses exp)`); such plans keep only the tolerance golden.

This module is the pure part (analysis, inputs, reference, comparison); `habu.timing.exact_gpu`
runs it on the device with red zones around every buffer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from math import prod

import numpy as np

from habu.errors import HabuError
from habu.plan.rewrite import RewriteError, apply_rewrites
from habu.spec.evaluate import Evaluator
from habu.spec.ir import Compare, Const, Expr, Load, Model, NegInf, Op, Reduce, Size, walk
from habu.spec.reference import Float64
from habu.timing.multiplicity import scatter_multiplicity

F32_EXACT = 2**24  # every integer of magnitude up to 2^24 is a float32
EXACT_INTEGERS = {"bf16": 2**8, "f16": 2**11, "f32": F32_EXACT, "f64": 2**53}  # |n| <= this: exact in the dtype
VALUE_RANGES = (3, 2, 1)  # the largest input range that keeps every value exact is used
BIT_DTYPES = {"bf16": np.uint16, "f16": np.uint16, "f32": np.uint32, "f64": np.uint64}
_EXACT_FUNCTIONS = {"add", "sub", "mul", "neg", "abs", "max", "min"}


class ExactCheckError(HabuError):
    """A compiled plan's output differs from the exact reference, or it wrote outside its buffers."""


class ExactTimeout(ExactCheckError):
    """The plan's kernels did not finish within the check's timeout (a hang)."""


class NotExact(Exception):
    """Why a model's values are not all integers (raised inside the bound analysis)."""


# ----------------------------------------------------------------------------- applicability


@dataclass(frozen=True)
class Applicability:
    """Whether a model (with a plan's intermediate storage) can be checked bit-exactly, and how."""

    exact: bool
    reason: str = ""  # why not (when not exact)
    value_range: int = 0  # floating-point inputs are nonzero integers in [-value_range, value_range]
    peak: int = 0  # the largest magnitude any value reaches (a bound)
    rounded: tuple[str, ...] = ()  # outputs beyond their dtype's exact integers: rounded once at the store

    def describe(self) -> str:
        if not self.exact:
            return f"exact: not applicable ({self.reason})"
        text = f"exact: inputs in ±1..±{self.value_range}, |values| <= {self.peak}"
        if self.rounded:
            text += f"; {', '.join(self.rounded)} rounded once to the output dtype"
        return text


def selects(e: Op) -> bool:
    """`where(c, x, y)` with c a condition on indices: an exact selection of x or y."""
    return e.fn == "where" and isinstance(e.args[0], Compare)


def _expr_bound(e: Expr, bounds: Mapping[str, int], sizes: Mapping[str, int], peaks: list[int],
                infinite: frozenset[str] = frozenset()) -> int:
    """A bound on |e| when every input is an integer within its bound; NotExact when e need not be
    an integer."""
    if isinstance(e, Const):
        if e.value.denominator != 1:
            raise NotExact(f"uses the constant {float(e.value):g}")
        b = abs(int(e.value))
    elif isinstance(e, Size):
        b = sizes[e.extent]
    elif isinstance(e, Load):
        if e.tensor in infinite:
            raise NotExact(f"computes with the −∞ values of {e.tensor}")
        b = bounds[e.tensor]
    elif isinstance(e, Compare):  # a condition on indices: exactly 0 or 1
        b = 1
    elif isinstance(e, NegInf):
        raise NotExact("computes with −∞")
    elif isinstance(e, Op) and selects(e):  # where(c, x, y) selects one of two exact values
        b = max(_expr_bound(a, bounds, sizes, peaks, infinite) for a in e.args[1:])
    elif isinstance(e, Op):
        if e.fn == "div":
            raise NotExact("uses division")
        if e.fn not in _EXACT_FUNCTIONS:
            raise NotExact(f"uses {e.fn}")
        args = [_expr_bound(a, bounds, sizes, peaks, infinite) for a in e.args]
        if e.fn in ("add", "sub"):
            b = args[0] + args[1]
        elif e.fn == "mul":
            b = args[0] * args[1]
        else:  # neg, abs, max, min: no larger than the largest argument
            b = max(args)
    else:
        assert isinstance(e, Reduce)
        body = _expr_bound(e.body, bounds, sizes, peaks, infinite)
        b = body * prod(sizes[v.extent] for v in e.vars) if e.op == "sum" else body
    peaks.append(b)
    return b


def tensor_bounds(model: Model, sizes: Mapping[str, int], value_range: int,
                  indices: Mapping[str, np.ndarray] | None = None) -> dict[str, int]:
    """A bound on the magnitude of every tensor's elements (inputs within ±value_range; index tensors
    do not count), or NotExact. `indices`: the index tensors' values the check runs with (a scatter's
    duplicates are then counted, habu.timing.multiplicity; without them every store may land on one
    element)."""
    bounds: dict[str, int] = {t.name: value_range for t in model.inputs if not t.is_index}
    infinite: set[str] = set()  # tensors that hold −∞ (a masked score): no later node may compute with them
    peaks: list[int] = []
    for eq in model.nodes:
        rhs = eq.rhs
        if isinstance(rhs, Op) and selects(rhs) and any(isinstance(a, NegInf) for a in rhs.args[1:]):
            infinite.add(eq.target)  # where(c, x, −∞): −∞ is stored, exactly
            rhs = next(a for a in rhs.args[1:] if not isinstance(a, NegInf))
        value = _expr_bound(rhs, bounds, sizes, peaks, frozenset(infinite))
        if eq.scatter is not None:
            # the most points of the domain that store to one element, on top of the target's prior
            # contents; every partial sum of the atomics is within this
            value = bounds[eq.target] + value * scatter_multiplicity(eq, sizes, indices)
            peaks.append(value)
        bounds[eq.target] = value
    bounds["<peak>"] = max([value_range, *peaks])
    return bounds


def not_exact_reason(model: Model) -> str | None:
    """Why the model's values need not be integers on integer inputs (a function such as exp first,
    then division, then a non-integer constant), or None."""
    funcs, divides, consts = [], False, []
    for eq in model.nodes:
        for e in walk(eq.rhs):
            if isinstance(e, Op) and e.fn == "div":
                divides = True
            elif isinstance(e, Op) and e.fn not in _EXACT_FUNCTIONS and not selects(e) and e.fn not in funcs:
                funcs.append(e.fn)
            elif isinstance(e, Const) and e.value.denominator != 1:
                consts.append(e.value)
    if funcs:
        return "uses " + ", ".join(funcs)
    if divides:
        return "uses division"
    if consts:
        return f"uses the constant {float(consts[0]):g}"
    return None


def _overflow(bounds: Mapping[str, int], storage: Mapping[str, str]) -> str | None:
    """Which value would not be an exact integer where the plan keeps it, or None."""
    if bounds["<peak>"] > F32_EXACT:
        return f"values reach {bounds['<peak>']}, beyond float32's exact integers (2^24)"
    for name, dt in storage.items():
        limit = EXACT_INTEGERS.get(dt, F32_EXACT)
        b = bounds.get(name, bounds["<peak>"])  # an intermediate of a rewritten graph: any value may land there
        if b > limit:
            return f"the intermediate {name} is stored in {dt}, exact only up to {limit}, and reaches {b}"
    return None


@dataclass(frozen=True, eq=False)  # (eq: a Mapping's, equal to a dict of the same items)
class KeptTypes(Mapping[str, str]):
    """Where a plan keeps values and in which type (a mapping: name -> dtype), with the plan's rewrites:
    an intermediate a rewrite introduces (`dB.g`, `dA.mm`) is bounded on the rewritten graph, which
    defines it, not by the model's peak."""

    types: tuple[tuple[str, str], ...]
    rewrites: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> str:
        return dict(self.types)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self.types))

    def __len__(self) -> int:
        return len(dict(self.types))


def kept_types(plan) -> KeptTypes:
    """Where a plan keeps values, and in which type: its stored intermediates, and each contraction
    kernel's accumulator (named `<accumulator of kernel N>`: any partial sum lands there); with the
    plan's rewrites (see `KeptTypes`)."""
    kept = dict(plan.storage)
    for i, k in enumerate(plan.kernels):
        acc = getattr(k, "accumulator", None)
        if acc is not None and acc != "f32":
            kept[f"<accumulator of kernel {i}>"] = acc
    return KeptTypes(tuple(kept.items()), tuple(getattr(plan, "rewrites", ())))


def plan_bounds(model: Model, sizes: Mapping[str, int], value_range: int,
                rewrites: tuple[str, ...] = (), indices: Mapping[str, np.ndarray] | None = None) -> dict[str, int]:
    """`tensor_bounds` of the model and, under rewrites, of the graph the plan's kernels compute (its
    intermediates bounded by their own equations; every tensor and the peak the larger of the two)."""
    bounds = tensor_bounds(model, sizes, value_range, indices)
    try:
        graph = apply_rewrites(model, rewrites) if rewrites else model
    except RewriteError:  # (applied to the plan's narrowed model only): its intermediates keep the peak
        return bounds
    if graph is not model:
        for name, b in tensor_bounds(graph, sizes, value_range, indices).items():
            bounds[name] = max(b, bounds.get(name, 0))
    return bounds


def applicability(model: Model, sizes: Mapping[str, int], storage: Mapping[str, str] | None = None,
                  indices: Mapping[str, np.ndarray] | None = None) -> Applicability:
    """Can this model be checked exactly at these sizes? `storage`: the plan's element type of each
    intermediate written between kernels (it must hold that intermediate's integers exactly); a
    `KeptTypes` (`kept_types(plan)`) also carries the plan's rewrites, whose intermediates are bounded
    on the rewritten graph (a plain mapping bounds an intermediate the model lacks by the model's peak).
    `indices`: the index tensors the check feeds the kernels (`index_inputs`): a scatter's bound then
    counts its actual duplicates instead of assuming every store lands on one element."""
    rewrites = storage.rewrites if isinstance(storage, KeptTypes) else ()
    storage = dict(storage or {})
    why = not_exact_reason(model)
    if why is not None:
        return Applicability(False, why)
    for r in VALUE_RANGES:
        try:
            bounds = plan_bounds(model, sizes, r, rewrites, indices)
        except NotExact as err:  # −∞ in arithmetic (a masked score read by a later node)
            return Applicability(False, str(err))
        if _overflow(bounds, storage) is not None:
            continue
        rounded = tuple(t.name for t in model.outputs
                        if bounds[t.name] > EXACT_INTEGERS.get(t.dtype.name if t.dtype else "f32", F32_EXACT))
        return Applicability(True, "", r, bounds["<peak>"], rounded)
    return Applicability(False, f"{_overflow(plan_bounds(model, sizes, 1, rewrites, indices), storage)} even with inputs in ±1")


# ----------------------------------------------------------------------------- inputs and reference


def index_inputs(model: Model, sizes: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """The index tensors of `integer_inputs`: random in range, with duplicates (the last element repeats
    the first); a grouping's sorted. Drawn from their own stream, so they are the same whatever the value
    range (`applicability` counts a scatter's duplicates on them before the range is chosen)."""
    rng = np.random.default_rng([seed, 1])
    out: dict[str, np.ndarray] = {}
    for t in model.inputs:
        if not t.is_index:
            continue
        assert t.range is not None
        v = rng.integers(0, sizes[t.range], size=tuple(sizes[e] for e in t.extents), dtype=np.int64)
        if t.grouped:  # a grouping's values never decrease (GROUPS:); unchosen groups stay empty
            v = np.sort(v)
        elif v.size >= 2:
            v.reshape(-1)[-1] = v.reshape(-1)[0]
        out[t.name] = v
    return out


def integer_inputs(model: Model, sizes: Mapping[str, int], value_range: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Host inputs: floating-point tensors of nonzero integers in [-value_range, value_range] (float32,
    exact in every dtype the kernels read); index tensors as `index_inputs` draws them."""
    rng = np.random.default_rng(seed)
    indices = index_inputs(model, sizes, seed)
    out: dict[str, np.ndarray] = {}
    for t in model.inputs:
        shape = tuple(sizes[e] for e in t.extents)
        if t.is_index:
            out[t.name] = indices[t.name]
        else:
            magnitude = rng.integers(1, value_range + 1, size=shape)
            sign = rng.choice(np.array([-1, 1]), size=shape)
            out[t.name] = (magnitude * sign).astype(np.float32)
    return out


def exact_reference(model: Model, sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray],
                    domain: Float64 | None = None) -> dict[str, np.ndarray]:
    """Every output in float64 (exact on these integers); raises if a value is not an integer (the
    applicability analysis was wrong)."""
    ref = Evaluator(model, dict(sizes), domain or Float64()).run(dict(inputs))
    shapes = {d.name: tuple(sizes[e] for e in d.extents) for d in model.outputs}
    # The evaluator holds a scalar as one element of shape (1,); compare it in its declared shape ().
    ref = {name: data.reshape(shapes[name]) if name in shapes else data for name, data in ref.items()}
    for name, data in ref.items():
        finite = data[~np.isneginf(data)]  # (a masked score stored as −∞: exact, `selects`)
        if not np.all(np.isfinite(finite)) or not np.array_equal(finite, np.round(finite)):
            raise AssertionError(f"the exact reference of {name} is not all integers")
    return ref


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (round to nearest even), as uint16 bit patterns."""
    values = np.asarray(values, dtype=np.float32)
    bits = np.ascontiguousarray(values).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).reshape(values.shape)


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Exact float64 values converted to `dtype` (round to nearest even), as unsigned bit patterns."""
    values = np.asarray(values)
    if dtype == "bf16":
        bits = bf16_bits(values.astype(np.float32))
    elif dtype in ("f16", "f32", "f64"):
        typed = np.ascontiguousarray(values.astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[dtype]))
        bits = typed.view(BIT_DTYPES[dtype])
    else:
        raise ValueError(f"no exact comparison for {dtype} outputs")
    return bits.reshape(values.shape)


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 values of bit patterns of `dtype` (for messages)."""
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if dtype == "f32":
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return bits.astype(np.uint64).view(np.float64)


# ----------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Mismatch:
    """The first element (row-major order) of an output that differs from the exact reference."""

    output: str
    index: tuple[int, ...]
    got: float
    want: float
    differing: int  # how many elements of this output differ
    unwritten: int  # how many of them still hold the poison pattern

    def describe(self) -> str:
        where = f"{self.output}[{', '.join(map(str, self.index))}]"
        got = "never written (still the NaN poison)" if np.isnan(self.got) else f"got {self.got:g}"
        more = f"; {self.differing} elements differ" + (f", {self.unwritten} never written" if self.unwritten else "")
        return f"{where}: {got}, want {self.want:g}{more}"

    def as_dict(self) -> dict:
        return {"output": self.output, "index": list(self.index), "got": _json_float(self.got),
                "want": _json_float(self.want), "differing": self.differing, "unwritten": self.unwritten}


def _json_float(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


def first_mismatch(output: str, got_bits: np.ndarray, want_bits: np.ndarray, dtype: str,
                   poison_bits: int | None = None) -> Mismatch | None:
    """Compare every element's bits; the first difference, or None. The equation's values are real numbers,
    which have one zero: +0 and −0 are the same value (IEEE equality: a row factor P[r] < 0 applied after its
    sum is −0 where the reference, with P inside the sum, adds +0 and −0 terms to +0); every other pair of
    bit patterns must be equal."""
    if got_bits.shape != want_bits.shape:
        raise ValueError(f"{output}: shape {got_bits.shape} != {want_bits.shape}")
    differ = got_bits != want_bits
    sign = SIGN_BITS.get(dtype)
    if sign is not None and differ.any():
        magnitude = ~np.asarray(sign, dtype=got_bits.dtype)
        differ &= ~(((got_bits & magnitude) == 0) & ((want_bits & magnitude) == 0))
    if not differ.any():
        return None
    flat = int(np.flatnonzero(differ)[0])
    index = tuple(int(i) for i in np.unravel_index(flat, got_bits.shape)) if got_bits.ndim else ()
    got = from_bits(got_bits.reshape(-1)[flat:flat + 1], dtype)[0]
    want = from_bits(want_bits.reshape(-1)[flat:flat + 1], dtype)[0]
    unwritten = int((got_bits[differ] == poison_bits).sum()) if poison_bits is not None else 0
    return Mismatch(output, index, float(got), float(want), int(differ.sum()), unwritten)


SIGN_BITS = {"bf16": 0x8000, "f16": 0x8000, "f32": 0x80000000, "f64": 0x8000000000000000}  # a float's sign bit
POISON_BITS = {"bf16": 0xFFFF, "f16": 0xFFFF, "f32": 0xFFFFFFFF, "f64": 0xFFFFFFFFFFFFFFFF}  # all-ones: a NaN


# ----------------------------------------------------------------------------- red zones

GUARD_BYTES = 4096  # a multiple of 16 (TMA's base alignment) and of every element size
GUARD_PATTERN = 0xA5  # one byte, repeated: no float, index or poison value is made of it


@dataclass(frozen=True)
class GuardedLayout:
    """A buffer of `nbytes` with `guard` bytes of a known pattern before and after it."""

    name: str
    nbytes: int
    guard: int = GUARD_BYTES

    @property
    def total(self) -> int:
        return 2 * self.guard + self.nbytes

    @property
    def inner(self) -> slice:
        return slice(self.guard, self.guard + self.nbytes)

    def guards(self, buffer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bytes before and after the data in a whole buffer (uint8)."""
        return buffer[: self.guard], buffer[self.guard + self.nbytes:]

    def damage(self, before: np.ndarray, after: np.ndarray) -> list[str]:
        """What the kernel wrote into the guards (empty when untouched)."""
        found = []
        for side, data in (("before", before), ("after", after)):
            hit = np.flatnonzero(data != GUARD_PATTERN)
            if hit.size == 0:
                continue
            if side == "before":
                first = self.guard - int(hit[-1])  # the write nearest the data, in bytes before it
                found.append(f"{self.name}: {hit.size} guard bytes overwritten before the buffer "
                             f"(nearest {first} bytes before element 0)")
            else:
                found.append(f"{self.name}: {hit.size} guard bytes overwritten after the buffer "
                             f"(first {int(hit[0])} bytes past its end)")
        return found


# ----------------------------------------------------------------------------- results


@dataclass
class ExactResult:
    """What the exact check found for one plan."""

    ok: bool
    applicable: bool
    summary: str  # Applicability.describe(), or the failure
    mismatch: Mismatch | None = None
    damage: list[str] = field(default_factory=list)  # red zones written, inputs changed

    def reason(self) -> str:
        """The failure as one line (the first wrong element, or the red zones written)."""
        parts = []
        if self.mismatch is not None:
            parts.append("exact check: " + self.mismatch.describe())
        if self.damage:
            parts.append("out-of-bounds write: " + "; ".join(self.damage))
        return " | ".join(parts) or self.summary

    def as_dict(self) -> dict:
        return {"ok": self.ok, "applicable": self.applicable, "summary": self.summary,
                "mismatch": self.mismatch.as_dict() if self.mismatch else None, "damage": list(self.damage)}


def compare_outputs(want_bits: Mapping[str, np.ndarray], got_bits: Mapping[str, np.ndarray],
                    dtypes: Mapping[str, str]) -> Mismatch | None:
    """The first wrong element over all outputs (in the model's output order), or None; both sides
    are bit patterns (`to_bits` of the exact reference, and the device's bytes)."""
    for name, want in want_bits.items():
        dt = dtypes[name]
        found = first_mismatch(name, got_bits[name], want, dt, POISON_BITS.get(dt))
        if found is not None:
            return found
    return None


def wait_for(done, timeout_s: float, clock=None, sleep=None) -> bool:
    """Poll `done()` until it is true (True) or `timeout_s` has passed (False): a launch that never
    finishes becomes a failed check, not a hung process."""
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    deadline = clock() + timeout_s
    delay = 1e-4
    while not done():
        if clock() >= deadline:
            return False
        sleep(delay)
        delay = min(2 * delay, 0.05)
    return True


def _candidate_sizes(lo: int, hi: int, multiple: int, limit: int = 12) -> list[int]:
    """Sizes a runtime extent admits, nearest a moderate 512 first: a few consecutive multiples (to
    meet divisibility guards both ways) and multiples near powers of two."""
    first = -(-lo // multiple) * multiple
    found = {first + i * multiple for i in range(8)}
    for p in (2**k for k in range(4, 17)):
        near = -(-p // multiple) * multiple
        found |= {near - multiple, near, near + multiple}
    admitted = sorted(n for n in found if lo <= n <= hi)
    return sorted(admitted, key=lambda n: (abs(n - 512), n))[:limit]


def witness_sizes(model: Model, member_of, members: int, max_tries: int = 512,
                  buckets: Mapping[str, list[int]] | None = None) -> dict[int, dict[str, int]]:
    """For each member of a kernel set (`member_of(sizes)` picks one), sizes of the runtime extents
    at which it runs, with the static extents' sizes: the shapes the exact check runs a built set at.
    A member no tried size selects is missing from the result. `buckets`: sizes to try first for a
    bucketed extent (each size bucket's smallest, habu/plan/buckets.py: a set whose members are
    buckets is reached at every bucket, however far from 512)."""
    import itertools

    static = {e.name: e.size for e in model.extents if e.size is not None}
    runtime = [e for e in model.extents if e.size is None]
    lists = [list(dict.fromkeys([*(buckets or {}).get(e.name, []), *_candidate_sizes(e.lo, e.hi, e.multiple)]))
             for e in runtime]
    found: dict[int, dict[str, int]] = {}
    for combo in itertools.islice(itertools.product(*lists), max_tries):
        sizes = static | {e.name: n for e, n in zip(runtime, combo, strict=True)}
        try:
            member = member_of(sizes)
        except HabuError:
            continue
        found.setdefault(member, sizes)
        if len(found) == members:
            break
    return found
