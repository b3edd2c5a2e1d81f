"""Compiling CUDA C++ to a cubin: NVRTC (cuda-python), or `nvcc` where NVRTC cannot be loaded.

The sources Habu emits include only its own device header (`habu/emit_cuda/include`); the NVRTC
wheel ships no CUDA system headers, so nothing else may be included. Every compile asks ptxas for
its resource report (`-v`), which is parsed into `Resources` per kernel.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from habu.errors import HabuError
from habu.targets import compile_archs, nvrtc_arch

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
LOG_LINES = 40  # lines of the compiler log a CompileError shows


class CompileError(HabuError):
    """The compiler rejected a kernel Habu generated (an internal error; the log says why)."""


class CompilerUnavailable(HabuError):
    """Neither NVRTC nor nvcc can be used on this machine."""


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""

    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    smem: int = 0  # static shared memory bytes
    stack: int = 0  # stack frame bytes
    # ptxas serialised the kernel's wgmma instructions (C7512 or C7515: a wait after each, no overlap of the
    # tensor cores with anything): correct, and a performance defect the proof cannot see
    wgmma_serialized: bool = False

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    def describe(self) -> str:
        """One line, e.g. '168 registers, 0 spills, 1024 B static smem'."""
        spills = f"{self.spill_stores + self.spill_loads} B spilled" if self.spills else "0 spills"
        text = f"{self.registers} registers, {spills}, {self.smem} B static smem"
        text += f", {self.stack} B stack" if self.stack else ""
        return text + (", wgmma serialized by ptxas" if self.wgmma_serialized else "")


@dataclass(frozen=True)
class Cubin:
    """A compiled kernel image and what the compiler said about it."""

    cubin: bytes
    arch: str
    log: str  # the compiler's log, with ptxas's resource report
    resources: Resources  # of the kernel compiled for
    compiler: str  # e.g. "nvrtc 13.5" or "nvcc 13.0.88"


# ----------------------------------------------------------------------------- ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized.*?function '([^']+)'")


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Resources of every entry function in a ptxas `-v` report, by name."""
    found: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        if m := _SERIALIZED.search(line):  # ptxas's performance note names the function (C7512, C7515)
            found.setdefault(m.group(1), {})["wgmma_serialized"] = True
            continue
        if m := _ENTRY.search(line) or _PROPS.search(line):
            current = m.group(1)
            continue
        if current is None:
            continue
        if m := _FRAME.search(line):
            found.setdefault(current, {}).update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := _USED.search(line):
            entry = found.setdefault(current, {})
            entry["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                entry["smem"] = int(s.group(1))
    return {name: Resources(**fields) for name, fields in found.items() if "registers" in fields}


def entry_names(log: str) -> list[str]:
    """The entry functions a ptxas `-v` report compiled, in its order."""
    return list(dict.fromkeys(m.group(1) for m in _ENTRY.finditer(log)))


def resources_of(log: str, name: str) -> Resources:
    """The named kernel's resources (the only kernel's, if the name is not in the report)."""
    table = parse_ptxas(log)
    if name in table:
        return table[name]
    return next(iter(table.values())) if len(table) == 1 else Resources()


# ----------------------------------------------------------------------------- options


def options(arch: str, include_dirs: Sequence[str | Path], extra: Sequence[str] = ()) -> list[str]:
    """NVRTC command-line options (nvcc accepts the same spellings). `arch`: a target's name or its
    NVRTC arch (habu/targets/)."""
    gpu_arch = nvrtc_arch(arch)
    if gpu_arch is None:
        raise HabuError(f"cannot compile for {arch!r} (architectures: {', '.join(compile_archs())})")
    opts = [f"--gpu-architecture={gpu_arch}", "-std=c++17", "--ptxas-options=-v", "-lineinfo"]
    opts += [f"--include-path={d}" for d in include_dirs]
    return opts + list(extra)


def _tail(log: str) -> str:
    lines = log.strip().splitlines()
    shown = "\n".join(lines[:LOG_LINES])
    return shown + (f"\n... ({len(lines) - LOG_LINES} more lines)" if len(lines) > LOG_LINES else "")


# ----------------------------------------------------------------------------- NVRTC


@cache
def _nvrtc() -> Any:
    """cuda-python's NVRTC module, or None when it (or libnvrtc) cannot be loaded."""
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()
        return nvrtc if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None
    except Exception:  # ImportError, or the shared library not found
        return None


@cache
def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return f"nvcc {m.group(1) if m else 'unknown'}"


def compiler_version() -> str:
    """The compiler `compile_cuda` will use, with its version: part of every cache key."""
    nvrtc = _nvrtc()
    if nvrtc is not None:
        _, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc {major}.{minor}"
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        return _nvcc_version(nvcc)
    raise CompilerUnavailable(
        "no CUDA compiler: NVRTC could not be loaded and nvcc is not on PATH; "
        "install NVRTC with `pip install nvidia-cuda-nvrtc`")


def _check(nvrtc: Any, result: Any, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"NVRTC {what} failed: {text.decode(errors='replace')}")


def _compile_nvrtc(nvrtc: Any, source: str, name: str, opts: list[str]) -> tuple[bytes, str, bool]:
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(nvrtc, err, "nvrtcGetProgramLogSize")
        buf = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\x00").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return b"", log, False
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        image = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
        return image, log, True
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_nvcc(nvcc: str, source: str, name: str, opts: list[str]) -> tuple[bytes, str, bool]:
    with tempfile.TemporaryDirectory(prefix="habu-nvcc-") as tmp:
        src, out = Path(tmp) / f"{name}.cu", Path(tmp) / f"{name}.cubin"
        src.write_text(source)
        run = subprocess.run([nvcc, "-cubin", *opts, "-o", str(out), str(src)],
                             capture_output=True, text=True, check=False)
        log = (run.stdout + run.stderr).replace(str(src), f"{name}.cu")
        if run.returncode != 0 or not out.exists():
            return b"", log, False
        return out.read_bytes(), log, True


def compile_cuda(source: str, name: str, arch: str, include_dirs: Sequence[str | Path] = (INCLUDE_DIR,),
                 extra_options: Sequence[str] = ()) -> Cubin:
    """Compile `source` for `arch`; `name` is the kernel whose resources are reported.

    Uses NVRTC; falls back to `nvcc` on PATH when NVRTC cannot be loaded. Raises CompileError with
    the first lines of the compiler log when the source does not compile.
    """
    compiler = compiler_version()
    opts = options(arch, include_dirs, extra_options)
    nvrtc = _nvrtc()
    if nvrtc is not None:
        image, log, ok = _compile_nvrtc(nvrtc, source, name, opts)
    else:
        image, log, ok = _compile_nvcc(shutil.which("nvcc") or "nvcc", source, name, opts)
    if not ok:
        raise CompileError(f"{compiler} could not compile kernel {name} for {arch}:\n{_tail(log)}")
    return Cubin(image, arch, log, resources_of(log, name), compiler)


__all__ = ["INCLUDE_DIR", "CompileError", "CompilerUnavailable", "Cubin", "Resources", "compile_cuda",
           "compiler_version", "entry_names", "options", "parse_ptxas", "resources_of"]
