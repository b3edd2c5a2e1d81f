"""Sizes no plan can serve, refused before anything is proven or allocated.

A tensor larger than the target's device memory (or a model whose tensors together are) can never
run; a reduction axis longer than the finite-field check can hold in the host's memory cannot be
checked (the check reads a reduction whole for each output element it evaluates, and an extent that
large also freezes the witness, which keeps every extent of a tensor past 2^31 elements). Both used
to surface late: numpy asked for 8 TiB at #C = 2^40 (a traceback), and a GEMM at 2^20 cubed ran for
minutes in the check. Grid limits are the rule `grid-dims` (a plan's grid, refused with the rule).

`size_problems` lists what is wrong (one line each, naming the tensor, the extents and the limit);
`check_sizes` raises the first as a `UsageError` (`error: ...`, exit 1).
"""

from __future__ import annotations

from collections.abc import Mapping

from habu.errors import UsageError
from habu.spec.ir import Model, Reduce, walk
from habu.targets import Target

# the longest reduction the finite-field check evaluates: its boxes hold int64 indices and field
# values along the axis (a few arrays of 8 bytes per element per row: 2^26 is 512 MiB each)
CHECK_AXIS_MAX = 2**26
INDEX_BYTES = 4  # an index tensor's elements (int32) and an intermediate's, where the plan picks the type


def human_bytes(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _power(n: int) -> str:
    return f"{n} (2^{n.bit_length() - 1})" if n > 1 and n & (n - 1) == 0 else str(n)


def reduced_extents(model: Model) -> set[str]:
    """The extents some equation sums or maxes over."""
    out: set[str] = set()
    for eq in model.nodes:
        for e in walk(eq.rhs):
            if isinstance(e, Reduce):
                out.update(v.extent for v in e.vars)
    return out


def size_problems(model: Model, sizes: Mapping[str, int | None], target: Target) -> list[str]:
    """What makes these sizes impossible on `target` (empty when nothing does). Extents without a
    size (a runtime extent not given) are not judged."""
    problems: list[str] = []
    total = 0
    judged = True
    for t in (*model.inputs, *model.outputs):
        dims = [sizes.get(e) for e in t.extents]
        if any(d is None for d in dims):
            judged = False
            continue
        elements = 1
        for d in dims:
            elements *= int(d)  # type: ignore[arg-type]
        width = t.dtype.bytes if t.dtype is not None else INDEX_BYTES
        nbytes = elements * width
        total += nbytes
        if nbytes > target.device_memory:
            shape = ", ".join(f"#{e} = {_power(int(sizes[e]))}" for e in t.extents)  # type: ignore[arg-type]
            problems.append(f"tensor {t.name} ({shape}) has {_power(elements)} elements of {width} byte(s), "
                            f"{human_bytes(nbytes)}: more than {target.name}'s device memory "
                            f"({human_bytes(target.device_memory)})")
    if judged and not problems and total > target.device_memory:
        problems.append(f"the tensors of {model.name} take {human_bytes(total)} together: more than "
                        f"{target.name}'s device memory ({human_bytes(target.device_memory)})")
    for e in sorted(reduced_extents(model)):
        n = sizes.get(e)
        if n is not None and n > CHECK_AXIS_MAX:
            problems.append(f"#{e} = {_power(int(n))} is reduced over, and the finite-field check evaluates a "
                            f"reduction whole: at most {_power(CHECK_AXIS_MAX)} elements along a reduced extent")
    return problems


def check_sizes(model: Model, sizes: Mapping[str, int | None], target: Target, note: str = "") -> None:
    """Raise a `UsageError` naming the first size these limits refuse (`note` follows it)."""
    problems = size_problems(model, sizes, target)
    if problems:
        raise UsageError(f"{model.name}: {problems[0]}{note}")


__all__ = ["CHECK_AXIS_MAX", "check_sizes", "human_bytes", "reduced_extents", "size_problems"]
