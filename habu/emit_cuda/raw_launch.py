"""cuLaunchKernel called through ctypes with the GIL kept, for a packed call's launches.

cuda-python's binding releases the GIL around every driver call and converts its eleven arguments each time;
`ctypes.PyDLL` keeps the GIL (as torch's own launches do) and, with the argument types declared and the
arguments made once as ctypes objects (`arguments`, per stream), converts nothing. H200 host, one
RMSNorm launch (session 42): 4.3 µs a launch against cuda-python's 5.1 (ctypes.CDLL, which releases the GIL,
5.7). The driver library is the one cuda-python loaded (the same process-wide libcuda), found by name; where it
cannot be opened this way (another platform's name), `raw_launcher` returns None and calls keep cuda-python's
binding. While a launch blocks (a full launch queue), other Python threads wait, as they do for torch's.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

_LIBRARIES = ("libcuda.so.1", "libcuda.so")
_ARGTYPES = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
_launcher: Any = None
_looked = False


def raw_launcher(d: Any) -> Any:
    """libcuda's cuLaunchKernel through `ctypes.PyDLL` with its argument types declared, or None: where the
    library cannot be opened, or `d` is not cuda-python's driver module (a stand-in driver in tests must see
    every launch)."""
    global _launcher, _looked
    if d is not sys.modules.get("cuda.bindings.driver"):
        return None
    if not _looked:
        _looked = True
        for name in _LIBRARIES:
            try:
                fn = ctypes.PyDLL(name).cuLaunchKernel
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = _ARGTYPES, ctypes.c_int
            _launcher = fn
            break
    return _launcher


def arguments(head: tuple, stream: int, params_address: int) -> tuple:
    """cuLaunchKernel's eleven arguments as ctypes objects, made once for a launch and a stream: `head` the
    eight before the stream (cuda-python's CUfunction, the grid, the block, the dynamic shared memory), `stream`
    a raw handle, `params_address` the packed `void*[]`."""
    function, *dims = head
    return (ctypes.c_void_p(int(function)), *(ctypes.c_uint(v) for v in dims), ctypes.c_void_p(stream or None),
            ctypes.c_void_p(params_address), ctypes.c_void_p(None))


__all__ = ["arguments", "raw_launcher"]
