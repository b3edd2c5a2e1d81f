"""Checking a compiled model's arguments before any launch: shapes, types, devices, layout, alignment.

The kernels were proven for the model's declared extents, row-major tensors and aligned base
addresses; an argument that breaks one of those would make a proven kernel read out of bounds or
fault. Everything here is pure Python, so it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from habu.emit_cuda.arrays import ELEMENT_BYTES, ArgumentError, ArrayInfo, row_major
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan
from habu.spec.ir import Extent, Model


@dataclass(frozen=True)
class TensorContract:
    """What one tensor of the plan must be."""

    name: str
    dtype: str
    extents: tuple[str, ...]  # outermost first
    role: str  # "input", "output" or "intermediate"
    used: bool = True  # some kernel reads or writes it
    align: int = 1  # bytes the base address must be a multiple of
    align_why: str = ""  # e.g. "the plan loads B with TMA"
    index_range: str | None = None  # an index tensor: the extent its values index into


@dataclass(frozen=True)
class Contract:
    """The arguments a compiled plan accepts."""

    model: str
    extents: tuple[Extent, ...]
    tensors: tuple[TensorContract, ...]

    def tensor(self, name: str) -> TensorContract | None:
        return next((t for t in self.tensors if t.name == name), None)

    def extent(self, name: str) -> Extent:
        return next(e for e in self.extents if e.name == name)

    def without_alignment(self) -> Contract:
        """The same contract with no alignment needs (what every member of a kernel set shares)."""
        return replace(self, tensors=tuple(replace(t, align=1, align_why="") for t in self.tensors))


# ----------------------------------------------------------------------------- building a contract


def _vector_needs(kernel: CudaKernel) -> dict[str, tuple[int, str]]:
    """Elements per vector access of each tensor: the lowering's list of the vector loads and stores
    the kernel makes (`vector_accesses`), the one the emitter prints them from."""
    out: dict[str, tuple[int, str]] = {}
    listed = getattr(kernel.lowering, "vector_accesses", None)
    for v in listed() if listed is not None else ():
        if v.elements > out.get(v.tensor, (1, ""))[0]:
            out[v.tensor] = (v.elements, v.why)
    return out


def _alignment(plan: EmittedPlan) -> dict[str, tuple[int, str]]:
    """The base-address alignment each tensor needs: 16 B under TMA, else its widest vector."""
    need: dict[str, tuple[int, str]] = {}

    def want(tensor: str, nbytes: int, why: str) -> None:
        if nbytes > need.get(tensor, (1, ""))[0]:
            need[tensor] = (nbytes, why)

    for k in plan.kernels:
        for p in k.params:
            if p.kind == "tensormap" and p.tensor:
                want(p.tensor, 16, f"the plan loads {p.tensor} with TMA")
            elif p.kind == "ptr" and p.tensor:
                want(p.tensor, ELEMENT_BYTES.get(p.dtype or "", 1), "")
        for tensor, (vec, why) in _vector_needs(k).items():
            dtype = next((p.dtype for p in k.params if p.tensor == tensor and p.dtype), None)
            want(tensor, vec * ELEMENT_BYTES.get(dtype or "", 1), why)
    return need


def contract_of(model: Model, plan: EmittedPlan) -> Contract:
    """The contract of one emitted plan of `model` (the model the plan was emitted for)."""
    used = {p.tensor for k in plan.kernels for p in k.params if p.tensor}
    align = _alignment(plan)
    tensors = []
    for role, decls in (("input", model.inputs), ("output", model.outputs)):
        for d in decls:
            a, why = align.get(d.name, (1, ""))
            tensors.append(TensorContract(d.name, d.dtype.name if d.dtype else "f32", d.extents, role,
                                          d.name in used, a, why, d.range))
    for name, dtype, extents in plan.intermediates:
        tensors.append(TensorContract(name, dtype, tuple(extents), "intermediate", name in used))
    return Contract(model.name, model.extents, tuple(tensors))


# ----------------------------------------------------------------------------- checking


def _extents_text(extents: Iterable[str]) -> str:
    return "( " + " ".join(f"#{e}" for e in extents) + " )"


def _bind_shape(c: Contract, t: TensorContract, info: ArrayInfo, sizes: dict[str, int],
                source: dict[str, str]) -> None:
    if len(info.shape) != len(t.extents):
        raise ArgumentError(f"{t.name}: expected {len(t.extents)} dimensions {_extents_text(t.extents)}, "
                            f"got shape {info.shape}")
    for n, e in zip(info.shape, t.extents, strict=True):
        ext = c.extent(e)
        if e in sizes:
            continue
        if ext.is_static:
            sizes[e] = ext.size or 0
        elif not ext.admits(n):
            raise ArgumentError(f"{t.name}: size {n} along #{e} is outside its declared range "
                                f"({ext.describe()})")
        else:
            sizes[e], source[e] = n, t.name
    expected = tuple(sizes[e] for e in t.extents)
    if info.shape != expected:
        bound = [f"#{e} = {sizes[e]} from {source[e]}" for e, n in zip(t.extents, info.shape, strict=True)
                 if n != sizes[e] and e in source and source[e] != t.name]
        note = f" ({', '.join(bound)})" if bound else ""
        raise ArgumentError(f"{t.name}: expected shape {expected} {_extents_text(t.extents)}, "
                            f"got {info.shape}{note}")


INDEX_TYPES = ("i16", "i32", "i64")  # what an index tensor may be given as (converted when not the kernel's)


def converts_index(t: TensorContract, info: ArrayInfo) -> bool:
    """True when an index tensor comes in another integer type than the kernel reads (torch's int64
    where the kernel loads i32): the runtime checks its values and hands the kernel a converted copy."""
    return t.index_range is not None and info.dtype != t.dtype and info.dtype in INDEX_TYPES


def index_values_for_kernel(t: TensorContract, values: Any, range_size: int) -> np.ndarray:
    """An index tensor's host values, checked to lie in 0..range_size-1 (ArgumentError naming the
    tensor otherwise, before any narrowing could wrap them), in the type the kernel reads."""
    assert t.index_range is not None
    check_index_range(t.name, values, range_size, t.index_range)
    return np.ascontiguousarray(values, dtype=np.dtype(f"int{ELEMENT_BYTES[t.dtype] * 8}"))


def _check_layout(t: TensorContract, info: ArrayInfo, device: list[tuple[int, str]]) -> None:
    converted = converts_index(t, info)
    if info.dtype != t.dtype and not converted:
        also = " (or i16/i32/i64: index tensors are converted after their values are checked)" \
            if t.index_range is not None else ""
        raise ArgumentError(f"{t.name}: expected {t.dtype}{also}, got {info.dtype}")
    if not info.on_cuda:
        raise ArgumentError(f"{t.name}: is in {info.device_type} memory, not on a CUDA device")
    if info.device is not None:
        if device and device[0][0] != info.device:
            raise ArgumentError(f"{t.name}: is on CUDA device {info.device}, but {device[0][1]} is on "
                                f"device {device[0][0]}; all arrays must be on one device")
        device.append((info.device, t.name))
    want = row_major(info.shape)
    if any(n > 1 and s != w for n, s, w in zip(info.shape, info.strides, want, strict=True)):
        raise ArgumentError(f"{t.name}: expected contiguous row-major strides {want}, got {info.strides} "
                            "(pass a contiguous copy)")
    if t.role == "output" and info.readonly:
        raise ArgumentError(f"{t.name}: is read-only, but the plan writes it")
    if t.align > 1 and info.ptr % t.align and not converted:  # a converted copy is freshly allocated
        why = f" ({t.align_why})" if t.align_why else ""
        raise ArgumentError(f"{t.name}: base address {info.ptr:#x} is not {t.align}-byte aligned{why}")


def check_arguments(contract: Contract, arrays: Mapping[str, ArrayInfo],
                    sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """Check every array against the contract; return the size of every extent.

    Inputs the plan uses must be present; outputs may be absent (the runtime allocates them).
    Runtime extents are bound from the first array that has them (or from `sizes`), and every
    later array must agree. Raises ArgumentError naming the tensor and what was expected.
    """
    bound: dict[str, int] = {}
    source: dict[str, str] = {}
    for name, n in (sizes or {}).items():
        ext = next((e for e in contract.extents if e.name == name), None)
        if ext is None or not ext.admits(n):
            what = "not an extent of the model" if ext is None else f"outside its range ({ext.describe()})"
            raise ArgumentError(f"#{name} = {n}: {what}")
        bound[name], source[name] = n, f"#{name} = {n}"
    for name in arrays:
        t = contract.tensor(name)
        if t is None or t.role == "intermediate":
            names = ", ".join(x.name for x in contract.tensors if x.role != "intermediate")
            what = "an intermediate the runtime allocates" if t else f"not a tensor of {contract.model}"
            raise ArgumentError(f"{name}: {what} (pass: {names})")
    device: list[tuple[int, str]] = []
    for t in contract.tensors:
        info = arrays.get(t.name)
        if info is None:
            if t.role == "input" and t.used:
                raise ArgumentError(f"{t.name}: missing (an input of {contract.model}: {t.dtype} "
                                    f"{_extents_text(t.extents)})")
            continue
        _bind_shape(contract, t, info, bound, source)
        _check_layout(t, info, device)
    for e in contract.extents:
        if e.is_static:
            bound.setdefault(e.name, e.size or 0)
    missing = [e.name for e in contract.extents if e.name not in bound
               and any(e.name in t.extents for t in contract.tensors if t.used or t.role == "output")]
    if missing:
        raise ArgumentError(f"cannot tell the size of {', '.join('#' + m for m in missing)} from the arrays "
                            "given: pass an array that has it")
    return bound


def check_index_range(name: str, values: Any, range_size: int, range_extent: str = "") -> None:
    """Check that every value of an index tensor (a host array) is in 0..range_size-1."""
    v = np.asarray(values)
    bad = (v < 0) | (v >= range_size)
    if not bad.any():
        return
    at = np.unravel_index(int(np.argmax(bad)), v.shape) if v.ndim else ()
    where = ", ".join(str(int(i)) for i in at)
    into = f" (an index into #{range_extent})" if range_extent else ""
    raise ArgumentError(f"{name}: values must be in 0..{range_size - 1}{into}: "
                        f"found {v[at]} at {name}[{where}]")


__all__ = ["INDEX_TYPES", "Contract", "TensorContract", "check_arguments", "check_index_range", "contract_of",
           "converts_index", "index_values_for_kernel"]
