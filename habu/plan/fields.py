"""The plan fields' vocabulary and their metadata: one table that every reader of a plan derives from.

Each schedule field of a kernel carries a `FieldSpec` in its dataclass metadata: a doc line, the
values it may take (a closed set, or a range and a multiple), what reads it (the finite-field
check, only the lowering it changes, or only the emitted code), the pin keys that set it, and
whether JSON leaves it out at its default. From the table come: JSON reading and validation
(`Plan.from_json`), the pin parser (`habu.search.space.apply_pins`), the `plan-fields` rule (a plan
built in Python is checked too) and the fields that key a shared finite-field certificate
(`habu.prove.interp.FIELD_CHECK_FIELDS`).

Closed vocabularies are `StrEnum`s: a member is its string (equal, same hash, same JSON), so
plans read and print exactly as before.
"""

from __future__ import annotations

import enum
import typing
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any


class Mma(enum.StrEnum):
    """The multiply instruction."""

    FMA = "fma"
    MMA_SYNC = "mma.sync"
    WGMMA = "wgmma"


class Move(enum.StrEnum):
    """How an operand's tiles reach shared memory."""

    LDG = "ldg"
    CP_ASYNC = "cp.async"
    TMA = "tma"
    TMA_GATHER4 = "tma-gather4"
    STAGED = "staged"


class Raster(enum.StrEnum):
    """The order in which blocks walk the tile grid."""

    ROW = "row"
    COLUMN = "column"


class Store(enum.StrEnum):
    """How a contraction's output tile reaches global memory."""

    DIRECT = "direct"
    TMA = "tma"


class SplitReduce(enum.StrEnum):
    """How the split_k blocks of one output tile combine their partial sums."""

    ATOMIC = "atomic"  # f32 atomic adds into an output zeroed first (a linear epilogue)
    CLUSTER = "cluster"  # a thread-block cluster adds them through distributed shared memory (any epilogue)


class Accumulator(enum.StrEnum):
    """The accumulator's element type (the emitters accumulate in f32 only)."""

    F32 = "f32"


class Reader(enum.StrEnum):
    """What reads a field: which plans may share one finite-field certificate follows from it."""

    PROOF = "proof"  # the finite-field check reads it: it keys a shared certificate
    LOWERING = "lowering"  # it changes the lowering (staging passes), which the certificate key compares whole
    EMISSION = "emission-only"  # only the emitted code reads it: no element any lane reads or writes changes


class FieldError(ValueError):
    """A field's value is not one it may take."""


class _Keep(enum.Enum):
    KEEP = "keep"


# a field's `unguarded` value when every value it may take holds for every size of the runtime
# extents (the fallback member of a checked kernel set keeps it)
KEEP = _Keep.KEEP
_UNDECLARED = object()  # `unguarded` not given: `unguarded_changes` refuses the kernel class


@dataclass(frozen=True)
class FieldSpec:
    """What one schedule field may hold, and who reads it."""

    doc: str
    reader: Reader
    allowed: tuple[Any, ...] | None = None  # a closed set of values (an enum's members when the type is one)
    lo: int | None = None  # integers: the smallest allowed value
    hi: int | None = None  # integers: the largest allowed value
    multiple: int | None = None  # integers: a multiple of this
    pins: tuple[str, ...] = ()  # `--pin KEY=VALUE` keys that set this field
    json_optional: bool = False  # left out of JSON at its default (a field added after plan format 1)
    # the value a guarded kernel takes in the unguarded fallback member of a checked kernel set (one
    # that needs no condition on runtime extents), or KEEP; every field must say (habu/compile.py)
    unguarded: Any = _UNDECLARED

    def describe(self, kind: type) -> str:
        """The allowed values, in words: 'one of fma, mma.sync, wgmma', 'a whole number ≥ 1', ..."""
        if kind is bool:
            return "true or false"
        if self.allowed_values(kind):
            return "one of " + ", ".join(str(v) for v in self.allowed_values(kind))
        words = "a whole number"
        if self.lo is not None and self.hi is not None:
            words += f" in {self.lo}..{self.hi}"
        elif self.lo is not None:
            words += f" ≥ {self.lo}"
        elif self.hi is not None:
            words += f" ≤ {self.hi}"
        if self.multiple:
            words += f", a multiple of {self.multiple}"
        return words

    def problem(self, value: Any, kind: type) -> str | None:
        """Why `value` is not allowed (in words), or None when it is."""
        if kind is bool:
            return None if isinstance(value, bool) else f"expected {self.describe(kind)}"
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return f"expected {self.describe(kind)}"
        if self.allowed_values(kind):
            return None if value in self.allowed_values(kind) else f"expected {self.describe(kind)}"
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi) \
                or (self.multiple and value % self.multiple):
            return f"expected {self.describe(kind)}"
        return None

    def parse(self, text: str, kind: type) -> Any:
        """A pin's (or any string's) value of this field; FieldError when it is not allowed."""
        value: Any
        if kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                value = True
            elif low in ("0", "false", "no", "off"):
                value = False
            else:
                raise FieldError(f"expected {self.describe(kind)}")
        elif kind is int:
            try:
                value = int(text.strip())
            except ValueError:
                raise FieldError(f"expected {self.describe(kind)}") from None
        else:
            value = text.strip()
            if value not in self.allowed_values(kind):
                raise FieldError(f"expected {self.describe(kind)}")
            value = kind(value)
        why = self.problem(value, kind)
        if why:
            raise FieldError(why)
        return value

    def allowed_values(self, kind: type) -> tuple[Any, ...]:
        return self.allowed if self.allowed is not None else tuple(kind) if isinstance(kind, enum.EnumMeta) else ()


def choice(doc: str, reader: Reader, *, default: Any = MISSING, allowed: tuple[Any, ...] | None = None,
           lo: int | None = None, hi: int | None = None, multiple: int | None = None, pins: tuple[str, ...] = (),
           json_optional: bool = False, unguarded: Any = _UNDECLARED) -> Any:
    """A schedule field of a kernel dataclass, with its `FieldSpec`."""
    spec = FieldSpec(doc, reader, allowed, lo, hi, multiple, pins, json_optional, unguarded)
    if default is MISSING:
        return field(metadata={"doc": doc, "spec": spec})
    return field(default=default, metadata={"doc": doc, "spec": spec})


@dataclass(frozen=True)
class KernelField:
    """One field of a kernel class: its name, its Python type and its spec (None: `nodes`)."""

    name: str
    kind: type
    spec: FieldSpec | None
    default: Any

    def problem(self, value: Any) -> str | None:
        return None if self.spec is None else self.spec.problem(value, self.kind)

    def parse(self, text: str) -> Any:
        assert self.spec is not None
        return self.spec.parse(text, self.kind)

    def describe(self) -> str:
        return "" if self.spec is None else self.spec.describe(self.kind)


@cache
def kernel_fields(cls: type) -> tuple[KernelField, ...]:
    """The field table of a kernel class, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        kind = hints[f.name]
        spec = f.metadata.get("spec")
        out.append(KernelField(f.name, kind if spec is not None else object, spec, f.default))
    return tuple(out)


def coerce_enums(obj: Any) -> None:
    """In a frozen kernel's __post_init__: strings of a closed vocabulary become its enum members
    (so `replace(k, mma="wgmma")` holds `Mma.WGMMA`); an unknown value is a FieldError naming the
    field and the allowed values."""
    for kf in _enum_fields(type(obj)):
        value = getattr(obj, kf.name)
        if type(value) is not kf.kind:
            try:
                object.__setattr__(obj, kf.name, kf.kind(value))
            except ValueError:
                raise FieldError(f"{kf.name} must be {kf.describe()}, got {value!r}") from None


@cache
def _enum_fields(cls: type) -> tuple[KernelField, ...]:
    return tuple(kf for kf in kernel_fields(cls) if isinstance(kf.kind, enum.EnumMeta))


def field_problems(kernel: Any) -> list[tuple[KernelField, Any, str]]:
    """(field, value, why) for every field of `kernel` outside its allowed values."""
    out = []
    for kf in kernel_fields(type(kernel)):
        value = getattr(kernel, kf.name)
        why = kf.problem(value)
        if why:
            out.append((kf, value, why))
    return out


def fields_read_by(cls: type, reader: Reader) -> tuple[str, ...]:
    """The fields of `cls` that `reader` reads (`nodes`, the region itself, counts as PROOF)."""
    return tuple(kf.name for kf in kernel_fields(cls)
                 if (kf.spec is None and reader is Reader.PROOF) or (kf.spec is not None and kf.spec.reader is reader))


def unguarded_changes(cls: type) -> dict[str, Any]:
    """The fields a guarded kernel of `cls` changes in the unguarded fallback member, and their
    values (every field not KEEP). A field that does not declare `unguarded` is a FieldError: a new
    field cannot be left out of the fallback by mistake."""
    out: dict[str, Any] = {}
    for kf in kernel_fields(cls):
        if kf.spec is None:
            continue
        if kf.spec.unguarded is _UNDECLARED:
            raise FieldError(f"{cls.__name__}.{kf.name} does not declare its unguarded value (choice(..., "
                             "unguarded=VALUE or KEEP), habu/plan/fields.py)")
        if kf.spec.unguarded is not KEEP:
            out[kf.name] = kf.spec.unguarded
    return out


def pin_table(classes: tuple[type, ...]) -> dict[str, tuple[str, ...]]:
    """Pin key -> the fields (of any of `classes`) it sets."""
    out: dict[str, tuple[str, ...]] = {}
    for cls in classes:
        for kf in kernel_fields(cls):
            for key in kf.spec.pins if kf.spec else ():
                if kf.name not in out.get(key, ()):
                    out[key] = (*out.get(key, ()), kf.name)
    return out


