"""Habu: a superoptimizer for GPU machine-learning kernels."""

__version__ = "0.1.0"


def build(*args, **kwargs):
    """Prove, emit and compile a model into a callable (see `habu.api.build`)."""
    from habu.api import build as _build

    return _build(*args, **kwargs)
