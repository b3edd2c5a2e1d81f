"""Build a model's plan into a callable on the current GPU: prove, emit, compile, load."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from habu.emit_cuda.runtime import CompiledModel
from habu.gpu_info import current_arch
from habu.paths.emit import emit
from habu.plan.plan import Plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.ir import Model
from habu.spec.parser import load_program
from habu.target import TARGETS


@dataclass
class Built:
    model: Model
    plan: Plan
    compiled: CompiledModel
    sizes: dict[str, int]


def device_target() -> str:
    """The target of CUDA device 0 (the default target when there is none)."""
    return current_arch()


def build(path: str, model_name: str, sizes: Mapping[str, int] | None = None, pins: Mapping[str, str] | None = None,
          trials: int = 1, plan: Plan | None = None, check_indices: bool | str = True, witness: bool | None = None) -> Built:
    """Prove (rules + a finite-field trial), emit and load a plan; raises if the plan is not proven. `witness`:
    as `habu.prove.prove` takes it (True: check on the reduced witness shape even for a one-kernel plan)."""
    return build_model(load_program(path).models[model_name], sizes, pins, trials, plan, check_indices, witness)


def build_model(base: Model, sizes: Mapping[str, int] | None = None, pins: Mapping[str, str] | None = None,
                trials: int = 1, plan: Plan | None = None, check_indices: bool | str = True,
                witness: bool | None = None) -> Built:
    """`build` of a model in hand (a derived backward, a generated model)."""
    target = TARGETS[device_target()]
    sizes = dict(sizes or {})
    for e in base.extents:
        if not e.is_static and e.name not in sizes:
            raise ValueError(f"give a size for runtime extent #{e.name}")
    model = base.with_sizes(sizes)
    plan = plan or default_plan(model, target, sizes, dict(pins or {}))
    proof = prove(model, plan, sizes, trials=trials, witness=witness)
    if not proof.ok:
        why = [o.describe() + ": " + o.detail for o in proof.violations] or [proof.certificate.failure]  # type: ignore[union-attr]
        raise AssertionError(f"plan not proven: {why}")
    compiled = CompiledModel(model, emit(proof, target), arch=target.name, check_indices=check_indices)
    full = {e.name: e.size for e in model.extents}
    return Built(model, plan, compiled, full)  # type: ignore[arg-type]
