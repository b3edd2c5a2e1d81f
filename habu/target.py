"""Compatibility: GPU targets live in `habu/targets/` (one file each); this module re-exports what
many modules import from here."""

from __future__ import annotations

from habu.targets import DEFAULT_TARGET, TARGETS, Target, target_for_capability, target_named

__all__ = ["DEFAULT_TARGET", "TARGETS", "Target", "target_for_capability", "target_named"]
