"""The plan-database key of a model on this machine: one definition, used by the search when it stores
a plan and by `habu.load` / `habu run` when they look one up."""

from __future__ import annotations

from collections.abc import Mapping

from habu.db import Key, Versions
from habu.db import Target as DbTarget
from habu.spec.ir import Model
from habu.target import Target
from habu.version import __version__


def database_key(model: Model, sizes: Mapping[str, int], target: Target, gpu: Mapping[str, object] | None,
                 direction: str = "forward", ranges: tuple[tuple[str, int, int], ...] = ()) -> Key:
    """The key: the model's canonical hash and name, its shape and dtypes, the target with the GPU's
    name and SM count (`habu.gpu_info.device_info`, or none), the Habu, NVRTC and driver versions,
    whether `model` is a forward model or a derived backward one (`direction`), and `ranges`: a size
    bucket's (habu/plan/buckets.py), its extents then left out of the shape."""
    from habu.emit_cuda.nvrtc import compiler_version

    try:
        nvrtc = compiler_version()
    except Exception:  # no NVRTC here: the key says so, and never matches one made with it
        nvrtc = "unavailable"
    info = dict(gpu or {})
    ranged = {name for name, _, _ in ranges}
    shape = tuple((e.name, int(sizes[e.name]) if e.name in sizes else e.size) for e in model.extents
                  if e.name not in ranged)
    dtypes = tuple((t.name, t.dtype.name if t.dtype else "f32") for t in (*model.inputs, *model.outputs))
    return Key(model.canonical_hash(), model.name, shape, dtypes,
               DbTarget(target.name, str(info.get("gpu", "none")), int(info.get("sm_count", 0))),  # type: ignore[arg-type]
               Versions(__version__, nvrtc, str(info.get("driver", "none"))), direction=direction,
               ranges=tuple(ranges))


__all__ = ["database_key"]
