"""The emitted CUDA of every example's default plan and of a seeded sample of legal plans, hashed.

`python -m tests.emit_cuda.emitted_snapshot --write` records the hashes in
tests/data/emitted_sources.json; `test_emitted_sources.py` compares the current emitter with them, so a
refactor that changes a kernel's text (on purpose or not) shows up as a named plan whose source moved,
and compares each example's default plan with the recorded one, so a change of a default shows up too
(`--defaults` records the defaults again after a change on purpose).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
from pathlib import Path

from tests.conftest import EXAMPLES, ROOT

SNAPSHOT = ROOT / "tests" / "data" / "emitted_sources.json"
ARCHS = ("sm_90a", "sm_80")
SEED = 20261201
PER_MODEL = 20


def _runtime_sizes(model):
    return {e.name: 4096 for e in model.extents if not e.is_static} or None


def cases():
    """(id, model, plan, arch) for every example's default plan and a seeded sample of legal plans."""
    from habu.paths.emit import emit_plan  # noqa: F401  (import errors surface here, not mid-loop)
    from habu.prove.rules import failures, obligations
    from habu.search.space import default_plan, enumerate_plans
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    rng = random.Random(SEED)
    for path in EXAMPLES:
        for model in load_program(path).models.values():
            sizes = _runtime_sizes(model)
            for arch in ARCHS:
                yield f"{path.name}:{model.name}:{arch}:default", model, default_plan(model, TARGETS[arch], sizes), arch
                plans = list(itertools.islice(enumerate_plans(model, TARGETS[arch], sizes), 0, 200_000, 53))
                rng.shuffle(plans)
                taken = 0
                for plan in plans:
                    if taken >= PER_MODEL:
                        break
                    if failures(obligations(model, plan, sizes)):
                        continue
                    taken += 1
                    yield f"{path.name}:{model.name}:{arch}:{plan.key}", model, plan, arch


def recorded_plans():
    """(id, model, plan, arch) of every plan recorded in the snapshot (the sampler above, run once)."""
    import json

    from habu.plan.plan import Plan
    from habu.spec.parser import load_program

    programs = {}
    for cid, entry in json.loads(SNAPSHOT.read_text()).items():
        example, model_name, arch, _ = cid.split(":")
        if example not in programs:
            programs[example] = load_program(ROOT / "examples" / example)
        yield cid, programs[example].models[model_name], Plan.from_json(entry["plan"]), arch


def digest(model, plan, arch) -> str:
    from habu.paths.emit import emit_plan
    from habu.target import TARGETS

    h = hashlib.sha256()
    for kernel in emit_plan(model, plan, TARGETS[arch]).kernels:
        h.update(kernel.name.encode() + b"\0" + kernel.source.encode() + b"\0")
    return h.hexdigest()


def default_cases():
    """(id, model, plan, arch) of every example's default plan as the search picks it now."""
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    for path in EXAMPLES:
        for model in load_program(path).models.values():
            for arch in ARCHS:
                plan = default_plan(model, TARGETS[arch], _runtime_sizes(model))
                yield f"{path.name}:{model.name}:{arch}:default", model, plan, arch


def plan_choices(plan_json: dict) -> dict:
    """What a plan chooses: its JSON without the model's hash (which moves with the language, not the plan)."""
    return {k: v for k, v in plan_json.items() if k != "model_hash"}


def current() -> dict[str, dict]:
    return {cid: {"plan": plan.to_json(), "sha256": digest(model, plan, arch)} for cid, model, plan, arch in cases()}


def rehashed() -> dict[str, dict]:
    """The recorded plans with the digests the emitter prints now (an intended change of the emitted
    text, without sampling again: the sampler takes 15-20 minutes on a loaded 2-core machine)."""
    return {cid: {"plan": plan.to_json(), "sha256": digest(model, plan, arch)}
            for cid, model, plan, arch in recorded_plans()}


def with_current_defaults() -> dict[str, dict]:
    """The recorded sample, rehashed, with every example's default plan recorded again (a default that
    changed on purpose, or a new example)."""
    sampled = {cid: entry for cid, entry in rehashed().items() if not cid.endswith(":default")}
    return sampled | {cid: {"plan": plan.to_json(), "sha256": digest(model, plan, arch)}
                      for cid, model, plan, arch in default_cases()}


USAGE = ("usage: python -m tests.emit_cuda.emitted_snapshot --write (sample again) | --rehash (same plans) | "
         "--defaults (same sample, the examples' default plans recorded again)")

if __name__ == "__main__":
    modes = {"--write": current, "--rehash": rehashed, "--defaults": with_current_defaults}
    chosen = [modes[a] for a in sys.argv[1:] if a in modes]
    if len(chosen) != 1:
        sys.exit(USAGE)
    data = chosen[0]()
    Path(SNAPSHOT).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{len(data)} emitted plans recorded in {SNAPSHOT}")
