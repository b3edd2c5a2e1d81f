"""What a search is given and what it gives back: the budget (a time or a number of candidates), the
running counts (`Stats`), scored plans and the search's result."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from habu.db import Key, Record
from habu.errors import UsageError
from habu.plan.plan import Kernel, Plan

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


@dataclass(frozen=True)
class Budget:
    seconds: float | None = None
    trials: int | None = None  # candidates proven (rules + finite field)

    @staticmethod
    def parse(text: str) -> Budget:
        t = text.strip().lower().replace(" ", "")
        if t.isdigit():
            return Budget(trials=int(t))
        if t.endswith("trials") and t[:-6].isdigit():
            return Budget(trials=int(t[:-6]))
        m = _DURATION.match(t)
        if not t or not m or not any(m.groups()):
            raise UsageError(f"--budget takes a duration (90s, 10m, 1h, 1h30m) or a number of candidates, got {text!r}")
        h, mi, s = (int(x) if x else 0 for x in m.groups())
        return Budget(seconds=float(3600 * h + 60 * mi + s))

    def describe(self) -> str:
        return f"{self.seconds:.0f} s" if self.seconds is not None else f"{self.trials} candidates"


@dataclass
class Stats:
    generated: int = 0
    partitions: int = 0  # fusion partitions tried
    pruned_rules: int = 0
    pruned_field: int = 0
    verified: int = 0
    compiled: int = 0
    timed: int = 0
    failed: int = 0
    best_us: float | None = None  # measured, the whole plan
    best_predicted_us: float | None = None
    roofline_us: float | None = None
    baseline: str | None = None  # what the baseline is ("torch A[IX] @ B.T"), timed in the same run
    baseline_us: float | None = None
    baseline_failure: str | None = None  # why there is no baseline figure ("none" when the model has none)
    first_verified_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    region: str = ""
    # where the time went, in seconds: the driver's own steps ("driver send", "driver waits for
    # proofs", "driver waits for GPUs") and the summed steps of the proof tasks ("proof rules",
    # "proof field", "proof compile") and of the GPU timing ("gpu load", "gpu check", "gpu time")
    spent: dict[str, float] = field(default_factory=dict)
    abandoned: int = 0  # proofs the end of the time budget stopped (not waited for)
    refused_slow: int = 0  # proven, and refused without a GPU: ptxas spilled or serialized its wgmma
    last_slow: str | None = None  # why the last of them was refused
    field_checks: int = 0  # finite-field checks run; the other candidates shared one (same lowering)
    field_shared: int = 0

    def add(self, what: str, seconds: float | None) -> None:
        if seconds is not None:
            self.spent[what] = self.spent.get(what, 0.0) + seconds

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Scored:
    kernel: Kernel
    predicted_s: float
    measured_us: float | None = None
    measurement: dict | None = None
    certificate: dict | None = None
    resources: dict | None = None
    rewrites: tuple[str, ...] = ()  # the algebraic rewrites the candidate's kernels are built on
    tie_break: tuple[float, ...] = ()  # the finer terms that order equal predictions (`cost.tie_break`)


def predicted_better(score: float, tie: tuple[float, ...], best: float, best_tie: tuple[float, ...] | None) -> bool:
    """Without a GPU: a candidate predicted `score` seconds (finer terms `tie`) replaces a best predicted
    `best` when it is predicted faster, or equal with better finer terms (`cost.tie_break`)."""
    tied = abs(score - best) <= 1e-9 * max(abs(best), 1e-30)
    return (score < best and not tied) or (tied and best_tie is not None and bool(tie) and tie < best_tie)


@dataclass
class SearchResult:
    best: Plan | None  # the best verified plan; None when no plan was verified (nothing was stored)
    records: list[Record]
    stats: Stats
    key: Key
    measured: bool
    timeline: list[dict]  # every candidate that reached the GPU: for the roofline plot
    interrupted: bool = False  # stopped by Ctrl-C (what was verified by then is stored)
    lost: str | None = None  # why the search ended early: the cluster was lost (what was verified is stored)
