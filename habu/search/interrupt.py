"""Ctrl-C during a search, never lost.

Python raises KeyboardInterrupt wherever the main thread is when the signal's handler runs, and that may be
inside a finalizer: z3's `AstRef.__del__` runs at any allocation, and CPython prints an exception raised in a
finalizer ("Exception ignored in: <function AstRef.__del__ ...> KeyboardInterrupt") and drops it. `habu
search` then ran its whole budget after a Ctrl-C, stored what it verified and exited 0 (reproduced, 1 run in
13 of tests/search/test_search.py's Ctrl-C test under a CI load, session 37). While a search runs, SIGINT's
handler latches the interrupt (and raises it, except inside a finalizer, where it would be printed and dropped),
and the search asks the latch between steps (`raise_if_interrupted`): an interrupt that arrived in a finalizer is
raised there, before any result of the proofs is kept.

A ctypes callback is the other place an exception is printed and dropped ("Exception ignored on calling ctypes
callback function", with its traceback): numba's LLVM calls back into Python while the field check compiles
(CI, stop 44: a Ctrl-C landed in llvmlite's `_raw_object_cache_notify`). No frame marks a callback, so while the
latch is armed `sys.unraisablehook` drops a KeyboardInterrupt the latch has already seen: it is raised again at
the next step, and nothing is printed.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class InterruptLatch:
    """Whether SIGINT arrived since the latch was armed (each arrival also raises KeyboardInterrupt, as
    Python's own handler does)."""

    def __init__(self) -> None:
        self.seen = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        if in_finalizer(frame):  # raised there, it would be printed as ignored and dropped: raised at the next step
            return
        raise KeyboardInterrupt

    def raise_if_interrupted(self) -> None:
        if self.seen:
            raise KeyboardInterrupt


def in_finalizer(frame: FrameType | None, depth: int = 8) -> bool:
    """Whether `frame` or one of the `depth` frames below it runs a `__del__` (z3's AstRef.__del__ calls
    Z3_dec_ref: the handler sees that frame, the finalizer one below)."""
    while frame is not None and depth > 0:
        if frame.f_code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth - 1
    return False


LATCH = InterruptLatch()


def quiet_latched_unraisable(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable-exception hook that drops a KeyboardInterrupt the latch has seen (it is raised again at
    the next step) and hands everything else to `previous`."""

    def hook(unraisable: Any) -> None:  # a sys.UnraisableHookArgs
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and LATCH.seen:
            return
        previous(unraisable)

    return hook


@contextmanager
def latched_interrupts() -> Iterator[InterruptLatch]:
    """SIGINT latched (`LATCH`) inside the block, where Python's KeyboardInterrupt handler is the one installed
    and this is the main thread; elsewhere (SIGINT ignored, a worker thread) nothing changes and the latch stays
    clear."""
    LATCH.seen = False
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield LATCH
        return
    previous = signal.signal(signal.SIGINT, LATCH.handler)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = quiet_latched_unraisable(previous_hook)
    try:
        yield LATCH
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt where a Ctrl-C arrived inside the latched block (and was perhaps swallowed)."""
    LATCH.raise_if_interrupted()


__all__ = ["LATCH", "InterruptLatch", "in_finalizer", "latched_interrupts", "quiet_latched_unraisable", "raise_if_interrupted"]
