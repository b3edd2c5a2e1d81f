"""Checking the command line's output paths before any work is done.

A command that proves, compiles or searches for minutes must not fail afterwards on `-o` pointing
into a file or at a directory: each output path is checked first, and nothing is created by the
check itself (the command creates what it writes once it has something to write).
"""

from __future__ import annotations

import os
from pathlib import Path

from habu.errors import UsageError


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its nearest ancestor that exists."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _creatable(path: Path, option: str, what: str) -> None:
    """`path` can be made in its directory: the nearest existing ancestor of that directory is a
    writable directory (the missing directories between are created by the command)."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise UsageError(f"{option} {path}: cannot write the {what} there: {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot write the {what} there: {base} is not writable")


def output_file(path: Path, option: str, suffix: str | None = None, what: str = "output file") -> None:
    """`path` can be written as a file (missing directories are created later); `suffix` names an example."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name"
                         + (f" such as {path / ('out' + suffix)}" if suffix else ""))
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path} exists and is not writable")
    _creatable(path, option, what)


def output_dir(path: Path, option: str, what: str = "output directory") -> None:
    """`path` is a directory or can be created as one."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file; give a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{option} {path} is not writable")
        return
    _creatable(path, option, what)


__all__ = ["output_dir", "output_file"]
