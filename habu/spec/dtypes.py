"""Element types a tensor can be stored in: one table, one row each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """A storage element type."""

    name: str
    bits: int
    kind: str  # "float" or "int"
    cuda: str  # the C++ type the emitter uses
    numpy: str | None  # numpy dtype name, where numpy has one
    mantissa_bits: int = 0  # explicit fraction bits (floats): sets golden-check tolerances

    @property
    def bytes(self) -> int:
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def unit_roundoff(self) -> float:
        """2^-(p) where p is the fraction bits + 1: the relative rounding error of one store."""
        return 2.0 ** -(self.mantissa_bits + 1) if self.is_float else 0.0

    def __str__(self) -> str:
        return self.name


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("f64", 64, "float", "double", "float64", 52),
        DType("f32", 32, "float", "float", "float32", 23),
        DType("tf32", 32, "float", "float", "float32", 10),
        DType("f16", 16, "float", "__half", "float16", 10),
        DType("bf16", 16, "float", "__nv_bfloat16", None, 7),
        DType("f8e4m3", 8, "float", "__nv_fp8_e4m3", None, 3),
        DType("f8e5m2", 8, "float", "__nv_fp8_e5m2", None, 2),
        DType("i8", 8, "int", "int8_t", "int8"),
        DType("i16", 16, "int", "int16_t", "int16"),
        DType("i32", 32, "int", "int32_t", "int32"),
        DType("i64", 64, "int", "int64_t", "int64"),
    )
}

DEFAULT_TENSOR_DTYPE = DTYPES["f32"]
DEFAULT_INDEX_DTYPE = DTYPES["i32"]
INDEX_DTYPES = ("i16", "i32", "i64")

# What the CUDA backend compiles (habu/emit_cuda/common.py: CTYPE for loads, STORE for stores; the
# test tests/spec/test_dtypes.py keeps these in step with it). tf32 and the f8 types are named by
# the language but no kernel reads or writes them yet: declaring such a tensor is an error.
READABLE_DTYPES = ("f64", "f32", "bf16", "f16", "i8", "i16", "i32", "i64")
WRITABLE_DTYPES = ("f32", "bf16", "f16")


def dtype_summary() -> str:
    """One line naming the element types and what each kind of tensor may hold (for `habu words`)."""
    return (f"element types: {' '.join(READABLE_DTYPES)} (before TENSOR:, default {DEFAULT_TENSOR_DTYPE}); "
            f"outputs: {' '.join(WRITABLE_DTYPES)}; index tensors: {' '.join(INDEX_DTYPES)} "
            f"(default {DEFAULT_INDEX_DTYPE})")


def dtype_named(name: str) -> DType | None:
    return DTYPES.get(name.lower())


def activation_dtype(inputs, written: frozenset[str] = frozenset()) -> str:
    """The float type a model's matrices share: the 16-bit type of every float input of rank ≥ 2 (the
    activations and weights) when they share one, else f32. Vectors (a bias, a row statistic, a router
    weight, a saved f32 normaliser), f32 statistics over some of another input's axes (attention's saved row
    maximum R1[b g r i] of Q[b g r i e]: `_statistic`) and inputs the model also writes (`written`: an f32 residual stream
    added into, `Y[IX[r] d] += …`) do not decide it; a model of vectors only looks at all of them."""
    floats = [t for t in inputs if t.dtype is not None and not t.is_index and t.name not in written]
    deciding = [t for t in floats if len(t.extents) > 1 and not _statistic(t, floats)] or floats
    names = {t.dtype.name for t in deciding}
    return next(iter(names)) if len(names) == 1 and names <= {"bf16", "f16"} else "f32"


def _statistic(t, floats) -> bool:
    """An f32 input over a proper subset of another float input's axes: a saved statistic (a row maximum or
    sum over the last axis of the scores), not one of the model's matrices (session 63: attention's f32
    R1/R2, rank 4, made a bf16 backward keep f32 intermediates, whose products then ran on the FMA pipes)."""
    return t.dtype.name == "f32" and over_fewer_axes(t.extents, [u.extents for u in floats])


def over_fewer_axes(extents: tuple[str, ...], others) -> bool:
    """Whether a tensor over `extents` runs over a proper subset of the axes of one of `others` (extent tuples):
    a statistic of it (a row's maximum R1[b g r i] of the scores [b g r i j]), not a matrix of its own."""
    return any(set(extents) < set(o) for o in others)
