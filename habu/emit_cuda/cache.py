"""A compile cache on disk, safe for many processes at once.

An entry is `<key>.cubin` and `<key>.json` (log, resources, the cubin's sha256). The key hashes the
source, the architecture, the compiler and its version, the options, and the contents of the
include directories (the device header is part of every source). Each file is written to a
temporary file in the cache directory and moved into place with `os.replace`, the sidecar last;
a reader that finds no sidecar, a corrupt one, or a cubin whose hash differs treats it as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from habu.emit_cuda.nvrtc import INCLUDE_DIR, Cubin, Resources, compile_cuda, compiler_version, options

CACHE_FORMAT = 1


def cache_dir() -> Path:
    """`$HABU_CACHE`, else `$XDG_CACHE_HOME/habu/cubins`, else `~/.cache/habu/cubins`."""
    if env := os.environ.get("HABU_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "habu" / "cubins"


def _tree_digest(dirs: Sequence[str | Path]) -> str:
    """A hash of every file (path and contents) under the include directories."""
    h = hashlib.sha256()
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            continue
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str, name: str, arch: str, compiler: str, options: Sequence[str],
              include_dirs: Sequence[str | Path] = ()) -> str:
    """The sha256 naming one compile: everything the cubin and its report depend on."""
    parts = {"format": CACHE_FORMAT, "source": source, "name": name, "arch": arch, "compiler": compiler,
             "options": list(options), "headers": _tree_digest(include_dirs)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(directory: Path, key: str) -> Cubin | None:
    """The cached entry, or None when it is absent or incomplete."""
    try:
        meta = json.loads((directory / f"{key}.json").read_text())
        image = (directory / f"{key}.cubin").read_bytes()
        if meta.get("format") != CACHE_FORMAT or meta["sha256"] != hashlib.sha256(image).hexdigest():
            return None
        return Cubin(image, meta["arch"], meta["log"], Resources(**meta["resources"]), meta["compiler"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(directory: Path, key: str, cubin: Cubin) -> None:
    """Write an entry: the cubin first, then the sidecar that makes it visible."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / f"{key}.cubin", cubin.cubin)
    meta = {"format": CACHE_FORMAT, "sha256": hashlib.sha256(cubin.cubin).hexdigest(), "arch": cubin.arch,
            "log": cubin.log, "compiler": cubin.compiler, "resources": asdict(cubin.resources)}
    _write_atomic(directory / f"{key}.json", json.dumps(meta, indent=1).encode())


def compile_cached(source: str, name: str, arch: str, include_dirs: Sequence[str | Path] = (INCLUDE_DIR,),
                   extra_options: Sequence[str] = (),
                   directory: str | Path | None = None) -> tuple[Cubin, bool]:
    """`compile_cuda`, through the cache: the cubin, and whether it came from the cache."""
    _key, cubin, hit = compile_entry(source, name, arch, include_dirs, extra_options, directory)
    return cubin, hit


def compile_entry(source: str, name: str, arch: str, include_dirs: Sequence[str | Path] = (INCLUDE_DIR,),
                  extra_options: Sequence[str] = (),
                  directory: str | Path | None = None) -> tuple[str, Cubin, bool]:
    """`compile_cached` with the cache key: a cubin compiled on one machine can be stored under its
    key in another machine's cache (`store`), where the same compile then finds it."""
    root = Path(directory) if directory is not None else cache_dir()
    opts = options(arch, (), extra_options)  # include paths enter the key by their contents
    key = cache_key(source, name, arch, compiler_version(), opts, include_dirs)
    hit = load(root, key)
    if hit is not None:
        return key, hit, True
    cubin = compile_cuda(source, name, arch, include_dirs, extra_options)
    store(root, key, cubin)
    return key, cubin, False


__all__ = ["cache_dir", "cache_key", "compile_cached", "compile_entry", "load", "store"]


def prefill_cache(cubins: list[tuple[str, Any]] | None) -> None:
    """Store cubins compiled elsewhere (a pool's CPU workers) in this machine's compile cache."""
    if not cubins:
        return
    root = cache_dir()
    for key, cubin in cubins:
        if load(root, key) is None:
            store(root, key, cubin)
