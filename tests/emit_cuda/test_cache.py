"""The on-disk compile cache: keys, hits and misses, torn entries, and many processes at once."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from pathlib import Path

import pytest

from habu.emit_cuda import cache, nvrtc
from habu.emit_cuda.cache import cache_dir, cache_key, compile_cached

KERNELS = {
    "a": 'extern "C" __global__ void ka(float* x) { x[threadIdx.x] += 1.f; }',
    "b": 'extern "C" __global__ void kb(float* x) { x[threadIdx.x] *= 3.f; }',
    "c": 'extern "C" __global__ void kc(int* x) { x[threadIdx.x] ^= 5; }',
}
ARCH = {"a": "sm_90a", "b": "sm_90a", "c": "sm_80"}


def _compile(directory: Path, which: str = "a"):
    return compile_cached(KERNELS[which], f"k{which}", ARCH[which], (), (), directory)


def _same(a, b) -> bool:
    """The same compile (the log differs in its compile time)."""
    return (a.cubin, a.arch, a.resources, a.compiler) == (b.cubin, b.arch, b.resources, b.compiler)


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_miss_then_hit(tmp_path):
    first, hit = _compile(tmp_path)
    assert not hit
    second, hit = _compile(tmp_path)
    assert hit
    assert second == first  # the log too: it is stored
    key = cache_key(KERNELS["a"], "ka", "sm_90a", nvrtc.compiler_version(), nvrtc.options("sm_90a", ()))
    assert _entries(tmp_path) == {f"{key}.cubin", f"{key}.json"}


def test_key_depends_on_everything_that_changes_the_cubin(tmp_path):
    base = dict(source="s", name="k", arch="sm_90a", compiler="nvrtc 13.5", options=["-lineinfo"])
    k = cache_key(**base)
    assert k == cache_key(**base)
    for change in (dict(source="t"), dict(arch="sm_80"), dict(compiler="nvrtc 13.6"), dict(options=[]),
                   dict(name="j")):
        assert cache_key(**{**base, **change}) != k
    (tmp_path / "habu.cuh").write_text("// v1\n")
    with_header = cache_key(**base, include_dirs=[tmp_path])
    (tmp_path / "habu.cuh").write_text("// v2\n")
    assert cache_key(**base, include_dirs=[tmp_path]) != with_header


def test_torn_entries_are_misses(tmp_path):
    cubin, _ = _compile(tmp_path)
    (sidecar,) = tmp_path.glob("*.json")
    (image,) = tmp_path.glob("*.cubin")
    for tear in (lambda: sidecar.write_text("{ not json"), sidecar.unlink,
                 lambda: image.write_bytes(b"\x7fELF truncated")):
        tear()
        again, hit = _compile(tmp_path)
        assert not hit and _same(again, cubin)
        assert _compile(tmp_path)[1]  # rewritten whole


def test_cache_directory_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HABU_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("HABU_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "habu" / "cubins"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "habu" / "cubins"


def test_default_directory_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("HABU_CACHE", str(tmp_path))
    compile_cached(KERNELS["b"], "kb", "sm_90a", ())
    assert len(list(tmp_path.glob("*.cubin"))) == 1


def test_failed_write_leaves_no_temporary_file(monkeypatch, tmp_path):
    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        _compile(tmp_path)
    assert _entries(tmp_path) == set()


def _child(directory: str, which: str, barrier, results) -> None:
    barrier.wait()
    cubin, hit = _compile(Path(directory), which)
    results.put((which, hashlib.sha256(cubin.cubin).hexdigest(), cubin.resources, hit))


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_concurrent_processes(tmp_path):
    ctx = mp.get_context("spawn")
    jobs = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(str(tmp_path), w, barrier, results)) for w in jobs]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in jobs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for which in "abc":
        digests = {(d, r) for w, d, r, _ in got if w == which}
        assert len(digests) == 1, f"kernel {which}: processes disagree"
    names = _entries(tmp_path)
    assert len(names) == 6 and all(n.endswith((".cubin", ".json")) for n in names)  # no temporary files
    for which in "abc":  # what the racing processes left is a valid entry
        assert _compile(tmp_path, which)[1]
