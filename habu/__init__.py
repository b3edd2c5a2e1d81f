"""Habu: a superoptimizer for GPU machine-learning kernels."""

from habu.version import __version__

__all__ = ["__version__", "build", "check_errors", "load", "tune"]


def build(*args, **kwargs):
    """Prove, emit and compile a model into a callable (see `habu.api.build`)."""
    from habu.api import build as _build

    return _build(*args, **kwargs)


def load(*args, **kwargs):
    """The tuned plan from the plan database, compiled (see `habu.api.load`)."""
    from habu.api import load as _load

    return _load(*args, **kwargs)


def tune(*args, **kwargs):
    """Search the plans of a model within a budget and store the best (see `habu.api.tune`)."""
    from habu.api import tune as _tune

    return _tune(*args, **kwargs)


def check_errors(device: int | None = None) -> None:
    """Raise the index error a Habu kernel found on the device since the last check (an index value
    outside the axis it indexes: masked, nothing out of bounds was touched), as an ArgumentError naming
    the tensor, the value and its position. Synchronises the devices that hold Habu kernels (or only
    `device`); see `habu.emit_cuda.device_errors` and docs/ARCHITECTURE.md, "Index values"."""
    from habu.emit_cuda.device_errors import check_errors as _check

    _check(device)
