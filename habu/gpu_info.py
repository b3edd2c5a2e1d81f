"""What GPU this is, through the driver API (no torch): the part of a plan-database key that
says where plans were measured."""

from __future__ import annotations

from functools import cache

from habu.errors import UsageError
from habu.target import DEFAULT_TARGET, target_for_capability


@cache
def device_info(ordinal: int = 0) -> dict | None:
    """{gpu, sm_count, arch, driver} of a CUDA device, or None when there is none."""
    try:
        from cuda.bindings import driver as d

        (err,) = d.cuInit(0)
        if err != d.CUresult.CUDA_SUCCESS:
            return None
        err, count = d.cuDeviceGetCount()
        if err != d.CUresult.CUDA_SUCCESS or count <= ordinal:
            return None
        _, dev = d.cuDeviceGet(ordinal)
        _, name = d.cuDeviceGetName(256, dev)
        attr = d.CUdevice_attribute
        _, sms = d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        _, major = d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        _, version = d.cuDriverGetVersion()
    except Exception:
        return None
    arch = device_arch(int(major), int(minor))
    gpu = device_name(name)
    return {"gpu": gpu, "sm_count": int(sms), "arch": arch, "driver": f"{version // 1000}.{(version % 1000) // 10}"}


def device_arch(major: int, minor: int) -> str:
    """The target of a compute capability; for a part Habu has no description of, its sm_XY name
    (GPU pools skip it; `target_named` says why and what to do)."""
    try:
        return target_for_capability(major, minor)
    except UsageError:
        return f"sm_{major}{minor}"


def device_name(raw: bytes | str) -> str:
    """cuDeviceGetName fills a fixed buffer: the name ends at the first NUL (then padding)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes | bytearray) else str(raw)
    return text.split("\x00", 1)[0].strip()


def current_arch() -> str:
    """The target every command and API call builds for unless told otherwise (compile, emit, search,
    `habu.build`, `habu.load`): GPU 0's architecture, or DEFAULT_TARGET where there is no GPU."""
    info = device_info()
    return info["arch"] if info else DEFAULT_TARGET
