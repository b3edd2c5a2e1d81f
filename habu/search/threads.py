"""One BLAS thread for the proofs that run in the search process itself.

The finite-field check does many small integer contractions; OpenBLAS (numpy's) splits each over
every CPU by default, and on a loaded machine its threads spin and wait on each other. Issue 23
measured 62-177 proofs in 60 s in the default in-process mode on 2 CPUs against 621-945 with
OPENBLAS_NUM_THREADS=1. Worker processes get the variables before numpy loads (`ProcessExecutor`);
the search process has numpy loaded already, so its BLAS is told at run time: through threadpoolctl
when it is installed, else through OpenBLAS's own `*_set_num_threads` in the loaded library (what
threadpoolctl does for OpenBLAS), and the variables are set too for anything loaded later.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_")
_GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_")


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries this process has loaded (numpy's bundled one among them)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return []
    return sorted(paths)


def _symbol(lib: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


class BlasThreads:
    """Limits this process's BLAS to `n` threads until `restore()` (what was set before comes back)."""

    def __init__(self, n: int = 1):
        self.how = "none"
        self._restore: list[Any] = []
        self._env = {var: os.environ.get(var) for var in BLAS_THREAD_VARS}
        for var in BLAS_THREAD_VARS:
            os.environ.setdefault(var, str(n))  # for a BLAS loaded later, and for spawned workers
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            self._by_ctypes(n)
        else:
            limiter = threadpool_limits(limits=n, user_api="blas")
            self._restore.append(limiter.restore_original_limits)
            self.how = "threadpoolctl"

    def _by_ctypes(self, n: int) -> None:
        for path in _loaded_openblas():
            with contextlib.suppress(OSError):
                lib = ctypes.CDLL(path)
                setter, getter = _symbol(lib, _SETTERS), _symbol(lib, _GETTERS)
                if setter is None:
                    continue
                before = int(getter()) if getter is not None else None
                setter(n)
                self.how = "openblas"
                if before is not None:
                    self._restore.append(lambda s=setter, b=before: s(b))

    def threads(self) -> int | None:
        """The thread count the loaded OpenBLAS reports now (None: no OpenBLAS found)."""
        for path in _loaded_openblas():
            with contextlib.suppress(OSError):
                getter = _symbol(ctypes.CDLL(path), _GETTERS)
                if getter is not None:
                    return int(getter())
        return None

    def restore(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()
        for var, value in self._env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


__all__ = ["BLAS_THREAD_VARS", "BlasThreads"]
