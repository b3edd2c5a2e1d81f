"""The exact check on the device: red-zoned buffers, one launch under a timeout, every output
element compared bit for bit with the exact reference (see `habu.timing.exact`).

Every input and output buffer is the middle of a larger allocation whose first and last
`GUARD_BYTES` hold `GUARD_PATTERN`; outputs start as all-ones bytes (a NaN in every float dtype).
After the launch: the guards must be untouched, the inputs unchanged (except those updated in
place), and every output element equal to the reference. Intermediates the runtime allocates
itself are not guarded.

torch makes the device arrays, as in the rest of habu.timing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from habu.emit_cuda.arrays import ELEMENT_BYTES
from habu.emit_cuda.call_plan import poisoned_intermediates
from habu.spec.ir import Model
from habu.spec.reference import Float64
from habu.timing.exact import (
    GUARD_PATTERN,
    ExactCheckError,
    ExactResult,
    ExactTimeout,
    GuardedLayout,
    applicability,
    compare_outputs,
    exact_reference,
    index_inputs,
    integer_inputs,
    to_bits,
    wait_for,
)
from habu.timing.harness import TORCH_DTYPE, torch

POISON_BYTE = 0xFF  # all-ones: NaN in bf16, f16, f32 and f64


class DeviceFloat64(Float64):
    """float64 with contractions on the GPU (exact for these integers: every partial sum is far
    below 2^53); a large GEMM's reference then costs milliseconds, not seconds of CPU."""

    def __init__(self, device: str = "cuda"):
        self.device = device

    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray:
        t = torch()
        ops = [t.from_numpy(np.asarray(o, dtype=np.float64, order="C").copy()).to(self.device) for o in operands]
        return t.einsum(subscripts, *ops).cpu().numpy()


class GuardedTensor:
    """A device tensor in the middle of a buffer with guard bytes on both sides."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, device: str, fill_byte: int | None = None):
        t = torch()
        self.name, self.shape, self.dtype = name, shape, dtype
        self.layout = GuardedLayout(name, prod(shape) * ELEMENT_BYTES[dtype])
        self.buffer = t.full((self.layout.total,), GUARD_PATTERN, dtype=t.uint8, device=device)
        inner = self.buffer[self.layout.inner]
        if fill_byte is not None:
            inner.fill_(fill_byte)
        self.tensor = inner.view(getattr(t, TORCH_DTYPE[dtype])).reshape(shape)

    def damage(self) -> list[str]:
        before, after = self.layout.guards(self.buffer)
        return self.layout.damage(before.cpu().numpy(), after.cpu().numpy())

    def bits(self) -> np.ndarray:
        """The data's bytes as unsigned integers of the element's width, in the tensor's shape."""
        raw = self.buffer[self.layout.inner].cpu().numpy()
        return raw.view(np.dtype(f"<u{ELEMENT_BYTES[self.dtype]}")).reshape(self.shape)


@dataclass
class Witness:
    """Small-integer inputs and the exact outputs they give."""

    value_range: int
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]  # float64, by output
    input_bytes: dict[str, Any]  # each input in its dtype, as a flat uint8 device tensor
    expected_bits: dict[str, np.ndarray]  # each output's reference in its dtype, as unsigned bit patterns


def _dtype(decl: Any) -> str:
    return decl.dtype.name if decl.dtype else "f32"


class ExactChecker:
    """The exact check of plans of one model at one shape (the witness is made once per input range)."""

    def __init__(self, model: Model, sizes: Mapping[str, int], seed: int = 0, device: str = "cuda"):
        self.model, self.sizes, self.seed, self.device = model, dict(sizes), seed, device
        self._witnesses: dict[int, Witness] = {}
        self.indices = index_inputs(model, self.sizes, seed)  # the witness's index tensors, whatever the range

    def witness(self, value_range: int) -> Witness:
        if value_range not in self._witnesses:
            t = torch()
            inputs = integer_inputs(self.model, self.sizes, value_range, self.seed)
            expected = exact_reference(self.model, self.sizes, inputs, DeviceFloat64(self.device))
            as_bytes = {}
            for decl in self.model.inputs:
                typed = t.from_numpy(np.ascontiguousarray(inputs[decl.name])).to(getattr(t, TORCH_DTYPE[_dtype(decl)]))
                as_bytes[decl.name] = typed.to(self.device).reshape(-1).view(t.uint8)
            dtypes = {d.name: _dtype(d) for d in self.model.outputs}
            bits = {name: to_bits(v, dtypes[name]) for name, v in expected.items()}
            self._witnesses[value_range] = Witness(value_range, inputs, expected, as_bytes, bits)
        return self._witnesses[value_range]

    def prepare(self, storage: Mapping[str, str] | None = None) -> None:
        """Make the witness now (the timing worker does it while starting, outside a plan's timeout)."""
        found = applicability(self.model, self.sizes, storage, self.indices)
        if found.exact:
            self.witness(found.value_range)

    def check(self, compiled: Any, storage: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> ExactResult:
        """Run `compiled` once on the witness in red-zoned buffers and compare every output element."""
        found = applicability(self.model, self.sizes, storage, self.indices)
        if not found.exact:
            return ExactResult(True, False, found.describe())
        w = self.witness(found.value_range)
        t = torch()
        inputs = {d.name: d for d in self.model.inputs}
        buffers: dict[str, GuardedTensor] = {}
        for decl in self.model.inputs:
            g = GuardedTensor(decl.name, tuple(self.sizes[e] for e in decl.extents), _dtype(decl), self.device)
            g.buffer[g.layout.inner].copy_(w.input_bytes[decl.name])
            buffers[decl.name] = g
        for decl in self.model.outputs:
            if decl.name not in inputs:  # an output updated in place is its input's buffer
                buffers[decl.name] = GuardedTensor(decl.name, tuple(self.sizes[e] for e in decl.extents),
                                                   _dtype(decl), self.device, POISON_BYTE)
        t.cuda.synchronize()
        with poisoned_intermediates():  # an intermediate element read before any kernel wrote it is a NaN
            compiled(**{name: g.tensor for name, g in buffers.items()})
        done = t.cuda.Event()
        done.record()
        if not wait_for(done.query, timeout_s):
            raise ExactTimeout(f"the plan's kernels did not finish within {timeout_s:g} s (a hang); "
                                  "this process's GPU context may stay busy until it exits")
        damage = [d for g in buffers.values() for d in g.damage()]
        outputs = {d.name for d in self.model.outputs}
        for decl in self.model.inputs:
            g = buffers[decl.name]
            if decl.name not in outputs and not t.equal(g.buffer[g.layout.inner], w.input_bytes[decl.name]):
                damage.append(f"{decl.name}: the input was modified")
        dtypes = {d.name: _dtype(d) for d in self.model.outputs}
        got = {name: buffers[name].bits() for name in w.expected}
        mismatch = compare_outputs(w.expected_bits, got, dtypes)
        result = ExactResult(mismatch is None and not damage, True, found.describe(), mismatch, damage)
        if not result.ok:
            result.summary = result.reason()
        return result


def check_built(compiled: Any, model: Model, storages: list[Mapping[str, str]], timeout_s: float = 60.0,
                seed: int = 0) -> list[ExactResult]:
    """The exact check of every member of a built kernel set, each at one shape that selects it
    (the model's own shape when every extent is static); raises ExactCheckError on a failure."""
    from habu.timing.exact import witness_sizes

    try:
        import torch as _torch  # noqa: F401
    except ImportError:
        raise ExactCheckError("the exact check makes its device arrays with torch, which is not installed "
                              "(pip install torch), or build with check=False") from None
    members = compiled.kernel_set.members
    grid = getattr(compiled.kernel_set, "grid", None)  # a bucketed set: try each bucket's smallest size
    starts = {axis[0].extent: [b.lo for b in axis] for axis in grid.axes} if grid is not None else None
    found = witness_sizes(model, compiled.kernel_set.index, len(members), buckets=starts)
    if model.runtime_extents and len(found) < len(members):
        import sys

        missed = ", ".join(str(i) for i in range(len(members)) if i not in found)
        print(f"habu: warning: the exact check found no shape near 512 that selects member(s) {missed} of "
              f"{model.name}'s kernel set; those members are not checked", file=sys.stderr)
    results = []
    for member, sizes in sorted(found.items()):
        result = ExactChecker(model, sizes, seed).check(compiled, storages[member], timeout_s)
        if not result.ok:
            where = f" (kernel-set member {member})" if len(members) > 1 else ""
            shown = ", ".join(f"{k}={v}" for k, v in sorted(sizes.items()))
            raise ExactCheckError(f"the plan for {model.name}{where} fails the exact check at {shown}: "
                                  f"{result.reason()}",
                                  notes=("habu.build(..., check=False) skips this check",))
        results.append(result)
    compiled.release_prepared()  # the witness buffers are gone: drop the launches packed for them
    return results
