"""z3's global context, made whole before any proof runs; Ctrl-C never swallowed by z3.

z3 builds its global context lazily, on the first term or solver. A Ctrl-C that lands inside that
constructor (it is slow on a loaded machine) leaves a half-built `Context` without its `owner`
attribute, whose `__del__` then prints "Exception ignored ... Traceback" at exit: the user sees a
traceback after a clean "habu: interrupted". So the context is built here, at import, with SIGINT
held back until it exists; an interrupt that arrived meanwhile is raised right after.
"""

from __future__ import annotations

import signal
import threading

import z3


def make_main_context() -> z3.Context:
    """z3's global context, built with Ctrl-C deferred (when called on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return z3.main_ctx()
    pending: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    except ValueError:  # not in the main interpreter
        return z3.main_ctx()
    try:
        ctx = z3.main_ctx()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending and callable(previous):
        previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt
    return ctx


# z3 installs its own SIGINT handler while a check runs and answers `unknown` ("interrupted from
# keyboard"): Python never sees the Ctrl-C, and the search went on as if an obligation were undecided.
INTERRUPTED = "interrupted from keyboard"


def check(solver: z3.Solver) -> z3.CheckSatResult:
    """`solver.check()`, except that a check z3 stopped for Ctrl-C raises KeyboardInterrupt."""
    result = solver.check()
    if result == z3.unknown and solver.reason_unknown() == INTERRUPTED:
        raise KeyboardInterrupt
    return result


# z3's own Ctrl-C handler (installed around each check) cancels the check, but when the check finishes
# anyway the Ctrl-C is gone: `habu search` once ran its whole 60 s budget after a Ctrl-C (CI, two test
# processes on two cores). Off, Python's handler keeps the signal and raises KeyboardInterrupt as the check
# returns: never lost, and late by at most one query (each has a 10 s limit, habu.prove.obligation).
z3.set_param("ctrl_c", False)
MAIN_CONTEXT = make_main_context()
