"""Habu: a superoptimizer for GPU machine-learning kernels."""

__version__ = "0.1.0"
