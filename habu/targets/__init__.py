"""The GPU targets Habu knows: one file each in this package, registered here.

Adding a target is one new file (a copy of `sm_80.py` with what differs) and its name in
`BUILT_IN_FILES` below; everything else (the rules, the search, the cost model, NVRTC, the capability
map) reads the `Target` object. `register` adds one at run time (a test's toy target does).

Compute capabilities without a description (decision of issue 18): a device maps to the target whose
`compute_capability` is its own, and to nothing else. In particular 8.6 and 8.9 (RTX 30xx/40xx, A10,
A40, L4, L40) are *not* sm_80: their cubins would run (sm_80 SASS runs on every 8.x part), but a block
there gets 99 KB of shared memory, not the A100's 163 KB, so a plan proven against sm_80's limits may
not launch, and sm_80's ceilings (the A100's) would rank plans for another machine. Habu refuses such
a device with a message that says what to do (add `sm_86.py` with its limits) instead of mapping it.
"""

from __future__ import annotations

from importlib import import_module

from habu.errors import UsageError
from habu.targets.description import SETMAXNREG_RULES, TMA_RULES, Ceilings, Target

# the registration list: the target files (modules of this package, each defining TARGET), in order
BUILT_IN_FILES = ("sm_80", "sm_90a", "sm_100a")
BUILT_IN: tuple[Target, ...] = tuple(import_module(f"habu.targets.{f}").TARGET for f in BUILT_IN_FILES)

DEFAULT_TARGET = "sm_90a"

TARGETS: dict[str, Target] = {}  # by name, in registration order (one dict, shared by every importer)

HOW_TO_ADD = ('to add one, copy habu/targets/sm_80.py with the part\'s limits and register it '
              '(docs/ARCHITECTURE.md, "Adding a target")')

# parts whose capability is close to a described one, and why they are not mapped to it
NOT_DESCRIBED: dict[tuple[int, int], str] = {
    (8, 6): "RTX 30xx, A10, A40, A2",
    (8, 9): "RTX 40xx, L4, L40",
}


def register(target: Target) -> Target:
    """Make `target` known by its name (a second target of one name is refused)."""
    if target.name in TARGETS:
        raise ValueError(f"a target named {target.name!r} is already registered")
    TARGETS[target.name] = target
    return target


def unregister(name: str) -> None:
    """Forget a target `register` added (tests that register a toy target clean up with this)."""
    del TARGETS[name]


for _target in BUILT_IN:
    register(_target)


def target_named(name: str) -> Target:
    t = TARGETS.get(name) or TARGETS.get(name.lower())
    if t is None:
        note = next((_why_not(cc) for cc in NOT_DESCRIBED if _arch_of(cc) == name.lower()), None)
        raise UsageError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})"
                         + (f": {note}" if note else f"; {HOW_TO_ADD}"))
    return t


def target_for_capability(major: int, minor: int) -> str:
    """The name of the target a device of compute capability major.minor runs; a `UsageError` that
    says what to do where Habu has no description of it (the first registered target of a capability
    wins where two share one)."""
    for t in TARGETS.values():
        if t.compute_capability == (major, minor):
            return t.name
    if (major, minor) in NOT_DESCRIBED:
        raise UsageError(_why_not((major, minor)))
    known = ", ".join(f"{t.name} ({t.compute_capability[0]}.{t.compute_capability[1]})" for t in TARGETS.values())
    raise UsageError(f"no Habu target describes compute capability {major}.{minor} (targets: {known}); {HOW_TO_ADD}")


def _arch_of(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def _why_not(cc: tuple[int, int]) -> str:
    major, minor = cc
    return (f"Habu has no description of compute capability {major}.{minor} ({_arch_of(cc)}: "
            f"{NOT_DESCRIBED[cc]}): a block "
            "there gets at most 99 KB of shared memory, not sm_80's 163 KB, so plans proven for sm_80 may not "
            f"launch. To use it, add habu/targets/{_arch_of(cc)}.py (a copy of sm_80.py with 99 KB per block, "
            "100 KB per SM, its SM count and ceilings) and register it (docs/ARCHITECTURE.md, \"Adding a target\")")


def nvrtc_arch(name: str) -> str | None:
    """The --gpu-architecture for a target name or for a registered target's own NVRTC arch; None
    for anything else."""
    if name in TARGETS:
        return TARGETS[name].nvrtc_arch
    return name if any(t.nvrtc_arch == name for t in TARGETS.values()) else None


def compile_archs() -> tuple[str, ...]:
    """What `nvrtc_arch` accepts: every target name and NVRTC arch."""
    return tuple(dict.fromkeys(n for t in TARGETS.values() for n in (t.name, t.nvrtc_arch)))


__all__ = ["BUILT_IN", "BUILT_IN_FILES", "DEFAULT_TARGET", "NOT_DESCRIBED", "SETMAXNREG_RULES", "TARGETS", "TMA_RULES", "Ceilings",
           "Target", "compile_archs", "nvrtc_arch", "register", "target_for_capability", "target_named",
           "unregister"]
