"""CUDA emitters, device headers, NVRTC and the driver runtime.

Each emitter module registers its kernel kind's launch geometry (habu.emit_cuda.geometry) at import;
these imports fill the registry before any kernel is launched or exported."""

from habu.emit_cuda import (  # noqa: F401
    emit_attention,
    emit_attention_wgmma,
    emit_columns,
    emit_fma,
    emit_general,
    emit_grouped,
    emit_grouped_wgrad,
    emit_map,
    emit_rows,
    emit_stage,
)
