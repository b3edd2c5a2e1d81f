"""The kernel paths, as plug-ins: one module each, listed here (see docs/ARCHITECTURE.md, "Adding a
kernel path", and `KernelPath` in habu/paths/base.py).

`PATHS` is the one list of paths: emission (habu/paths/emit.py), the search space and the cost
model (habu/search/) ask `path_for(kernel)`, the first path that takes a kernel. The rules
(habu/prove/rules.py) sit below this package and ask the same path's `support`
(habu/lower/support.py); `register` keeps the two lists in step.
"""

from __future__ import annotations

from habu.lower import support as _support
from habu.paths import columns, fma, general, map, mma_sync, rows, wgmma
from habu.paths.base import KernelPath
from habu.paths.contraction import ContractionPath
from habu.plan.plan import Kernel

# the built-in paths, in the order they are asked (and the search walks the contraction paths)
PATHS: list[KernelPath] = [fma.PATH, mma_sync.PATH, wgmma.PATH, rows.PATH, map.PATH, columns.PATH,
                           general.PATH]


def path_for(kernel: Kernel) -> KernelPath:
    """The first path that takes `kernel`."""
    for p in PATHS:
        if p.accepts(kernel):
            return p
    raise ValueError(f"no kernel path takes a {type(kernel).__name__} with mma={getattr(kernel, 'mma', None)}")


def contraction_path(mma: str) -> ContractionPath:
    """The first contraction path of the instruction `mma` (the analytic default's schedule)."""
    return next(p for p in PATHS if isinstance(p, ContractionPath) and p.mma == mma)


def path_named(name: str) -> KernelPath:
    return next(p for p in PATHS if p.name == name)


def register(path: KernelPath) -> None:
    """Add a path at run time, asked first (so it may take kernels a built-in path takes), or replace
    the one of its name; its `support` goes to the rules' list with it."""
    PATHS[:] = [path, *(p for p in PATHS if p.name != path.name)]
    _support.register(path.support)


def unregister(name: str) -> None:
    """Remove the path `name` and its support."""
    PATHS[:] = [p for p in PATHS if p.name != name]
    _support.unregister(name)


__all__ = ["PATHS", "ContractionPath", "KernelPath", "contraction_path", "path_for", "path_named", "register", "unregister"]
