"""Index values found out of range on the device: the error words every Habu module carries.

A gather or scatter's index check (`habu.lower.access.IndexCheck`, printed as `habu::index_ok`) masks an
element whose index value lies outside the indexed axis and raises the module's sticky error words
(`habu_index_errors`, habu/emit_cuda/include/habu/memory/index.cuh): a bit per index tensor, and the
first bad value with its position and the axis size. The call path never reads them (no device-to-host
copy, no synchronisation: a call can be captured in a CUDA graph); `check_errors` does, after
synchronising every context that holds a Habu module, and raises `IndexValueError` — the message the host
check gives — then zeroes them. docs/ARCHITECTURE.md ("Index values") says when Habu calls it itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from habu.emit_cuda.arrays import ArgumentError

SYMBOL = b"habu_index_errors"
WORDS = 8  # u32 words: flags, first code + 1, position lo/hi, value lo/hi, size lo/hi


class IndexValueError(ArgumentError):
    """An index tensor held a value outside the axis it indexes (found by a kernel on the device)."""


@dataclass(frozen=True)
class ErrorWords:
    """One loaded module's error words: where they are, and what their codes name."""

    model: str
    kernel: str
    index_tensors: tuple[tuple[str, str], ...]  # by code: (index tensor, the extent it indexes into)
    device: Any  # driver.Device
    address: int


_registry: list[ErrorWords] = []


def register(words: ErrorWords) -> None:
    _registry.append(words)


def registered() -> tuple[ErrorWords, ...]:
    return tuple(_registry)


def forget(words: Sequence[ErrorWords]) -> None:
    """Stop watching these words (their module was unloaded)."""
    gone = {id(w) for w in words}
    _registry[:] = [w for w in _registry if id(w) not in gone]


def describe(words: ErrorWords, raw: np.ndarray) -> str | None:
    """The error the words hold, as the host check says it (None: no error). Pure: tested without a GPU."""
    raw = np.asarray(raw, dtype=np.uint32)
    flags, first = int(raw[0]), int(raw[1])
    if not flags and not first:
        return None

    def u64(lo: int, hi: int) -> int:
        return int(raw[lo]) | (int(raw[hi]) << 32)

    def signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v

    names = words.index_tensors
    code = first - 1 if first else next(i for i in range(32) if flags >> i & 1)
    name, extent = names[code] if code < len(names) else (f"index tensor {code}", "")
    size = u64(6, 7)
    into = f" (an index into #{extent})" if extent else ""
    text = (f"{name}: values must be in 0..{size - 1}{into}: found {signed(u64(4, 5))} at {name}[{signed(u64(2, 3))}]"
            if first else f"{name}: a value outside its range{into}")
    if first and size == 0:  # habu::grouping_ok (habu/grouped/schedule.cuh): a grouping out of order
        text = (f"{name}: a grouping's values must never decrease (GROUPS:): found {signed(u64(4, 5))} at "
                f"{name}[{signed(u64(2, 3))}], among the rows of another group")
    others = [names[i][0] if i < len(names) else f"index tensor {i}" for i in range(32)
              if flags >> i & 1 and i != code]
    also = f"; {', '.join(others)} also held values out of range" if others else ""
    return (f"{text} (found on the device by kernel {words.kernel} of {words.model}, which masked the elements "
            f"it indexes: nothing outside the tensors was read or written; results that depend on them are not "
            f"valid{also})")


def collect(device_ordinal: int | None = None) -> list[str]:
    """Synchronise every context holding a watched module (or only `device_ordinal`'s), read each module's
    error words, zero the ones that are set and return their messages."""
    from habu.emit_cuda import driver

    words = [w for w in _registry if device_ordinal is None or w.device.ordinal == device_ordinal]
    if not words:
        return []
    d = driver.init()
    out: list[str] = []
    synced: set[int] = set()
    zeros = np.zeros(WORDS, np.uint32)
    for w in words:
        with driver.current(w.device):
            if w.device.ordinal not in synced:
                driver.check(d.cuCtxSynchronize(), "cuCtxSynchronize")
                synced.add(w.device.ordinal)
            raw = np.zeros(WORDS, np.uint32)
            driver.check(d.cuMemcpyDtoH(raw.ctypes.data, d.CUdeviceptr(w.address), raw.nbytes), "cuMemcpyDtoH")
            text = describe(w, raw)
            if text is not None:
                driver.check(d.cuMemcpyHtoD(d.CUdeviceptr(w.address), zeros.ctypes.data, zeros.nbytes),
                             "cuMemcpyHtoD")
                out.append(text)
    return out


def check_errors(device: int | None = None) -> None:
    """Raise `IndexValueError` when a Habu kernel met an index value out of range since the last check
    (on every device, or on `device`). Synchronises those devices first; zeroes the words it reports."""
    found = collect(device)
    if found:
        more = f" (and {len(found) - 1} more kernel(s) reported index errors)" if len(found) > 1 else ""
        raise IndexValueError(found[0] + more)


__all__ = ["ErrorWords", "IndexValueError", "check_errors", "collect", "describe", "register"]
