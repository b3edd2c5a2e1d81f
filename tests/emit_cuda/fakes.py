"""Stand-ins for GPU arrays and a small model with a two-kernel plan, for tests without a GPU."""

from __future__ import annotations

from types import SimpleNamespace

from habu.emit_cuda.arrays import ArrayInfo, row_major
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param, TmaSpec
from habu.lower.access import VectorAccess
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Extent, Model, TensorDecl

BASE = 0x7F00_0000_0000  # a well-aligned fake device address


class FakeCAI:
    """An object that only has `__cuda_array_interface__` (no DLPack), like a numba device array."""

    def __init__(self, shape, typestr="<f4", ptr=BASE, strides=None, readonly=False, version=3):
        self.__cuda_array_interface__ = {"version": version, "shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides}


def info(shape, dtype="f32", ptr=BASE, device=0, strides=None, readonly=False) -> ArrayInfo:
    shape = tuple(shape)
    return ArrayInfo(ptr, shape, strides or row_major(shape), dtype, device, readonly)


def gemm_model() -> Model:
    """C[m n] = Σ k A[m k]·B[k n], with an index tensor IX over #S into #M."""
    extents = (Extent("M", 4096), Extent("K", None, 16, 65536, 16), Extent("N", None), Extent("S", None))
    inputs = (TensorDecl("A", ("M", "K"), DTYPES["bf16"]), TensorDecl("B", ("K", "N"), DTYPES["bf16"]),
              TensorDecl("IX", ("S",), DTYPES["i32"], range="M"))
    outputs = (TensorDecl("C", ("M", "N"), DTYPES["f32"]),)
    return Model("gemm", "equation", extents, inputs, outputs, (TensorDecl("T", ("M", "N"), None),), ())


def gemm_plan() -> EmittedPlan:
    """A loads through TMA, B with 8-element vectors (from a stand-in lowering), C and T plainly."""
    tma = TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128)
    lowering = SimpleNamespace(  # what ContractionLowering.vector_accesses lists for such a plan
        vector_accesses=lambda: (VectorAccess("B", 8, "the plan loads B with 8-element vectors"),))
    k0 = CudaKernel("k0", "", (Param("tm_A", "tensormap", "A", "bf16", tma=tma), Param("p_B", "ptr", "B", "bf16"),
                               Param("p_T", "ptr", "T", "f32", writes=True), Param("p_IX", "ptr", "IX", "i32"),
                               Param("s_K", "size", extent="K"), Param("s_N", "size", extent="N")),
                    256, 0, lowering, zero=("T",))
    k1 = CudaKernel("k1", "", (Param("p_T", "ptr", "T", "f32"), Param("p_C", "ptr", "C", "f32", writes=True)),
                    128, 0, None)
    return EmittedPlan((k0, k1), (("T", "f32", ("M", "N")),))


def gemm_arrays(k: int = 512, n: int = 64, s: int = 32) -> dict[str, ArrayInfo]:
    return {"A": info((4096, k), "bf16"), "B": info((k, n), "bf16", BASE + 0x100000),
            "IX": info((s,), "i32", BASE + 0x200000)}
