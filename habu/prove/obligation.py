"""What a rule produces: an obligation about one kernel of a plan, and the context it is built in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from habu.lower.access import Access
from habu.plan.plan import Plan
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model
from habu.target import Target

INT31 = 2**31 - 1


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    source: str


@dataclass
class Obligation:
    rule: Rule
    kernel: str
    tensor: str | None
    statement: str  # what must hold, in words
    formula: Any  # z3 BoolRef, or a Python bool for purely structural facts
    detail: str = ""  # the offending value, in words, when it fails
    status: str = "open"  # proved, violated, guarded, runtime-check
    counterexample: dict[str, int] | None = None
    how: str = ""

    def describe(self) -> str:
        who = f" ({self.tensor})" if self.tensor else ""
        return f"[{self.rule.name}] {self.kernel}{who}: {self.statement}"


@dataclass
class Context:
    model: Model
    plan: Plan
    target: Target
    ext: dict[str, Any]  # extent name -> z3 Int (or int)
    domain: list[Any]  # constraints on runtime extents
    storage: dict[str, str] = field(default_factory=dict)
    quick: bool = False  # structural rules only: skip building the solver's access formulas

    def dtype_bytes(self, access: Access) -> int:
        return DTYPES[access.dtype].bytes


# the rule every index computed in 32 bits answers to: offsets, and the lanes that feed them
INT32_OFFSETS = Rule("int32-offsets", "offsets, partial products and thread/lane indices fit the index width",
                     "T15: vLLM PR #34279, Liger #1246, Triton #6346")
