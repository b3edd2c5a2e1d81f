"""The host side of launches that needs no GPU: argument packing, tensor-map arguments, targets."""

from __future__ import annotations

import ctypes

import pytest

from habu.emit_cuda import driver
from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.driver import DriverError, KernelArgs, arch_for, pack_args, tensormap_args
from habu.emit_cuda.kernel import CudaKernel, Param, TmaSpec
from tests.emit_cuda.fakes import BASE, info


def _read(args: KernelArgs, i: int, ctype) -> int:
    pointers = (ctypes.c_void_p * len(args.values)).from_address(args.address)
    return ctype.from_address(pointers[i]).value


def test_pointers_and_sizes_are_packed_in_parameter_order():
    k = CudaKernel("k", "", (Param("p_X", "ptr", "X", "f32"), Param("s_N", "size", extent="N"),
                             Param("p_Y", "ptr", "Y", "f32", writes=True)), 128, 0, None)
    args = pack_args(k, {"X": info((10,), ptr=BASE), "Y": info((10,), ptr=BASE + 4096)}, {"N": 2**40 + 3})
    assert _read(args, 0, ctypes.c_uint64) == BASE
    assert _read(args, 1, ctypes.c_int64) == 2**40 + 3
    assert _read(args, 2, ctypes.c_uint64) == BASE + 4096


def test_structures_are_passed_by_their_address():
    class TensorMapLike:  # what a cuda.bindings CUtensorMap offers
        def __init__(self):
            self.buf = (ctypes.c_uint8 * 128)(*range(128))

        def getPtr(self):
            return ctypes.addressof(self.buf)

    tm = TensorMapLike()
    args = KernelArgs([tm, ctypes.c_int64(7)])
    pointers = (ctypes.c_void_p * 2).from_address(args.address)
    assert pointers[0] == tm.getPtr()
    assert bytes((ctypes.c_uint8 * 128).from_address(pointers[0])) == bytes(range(128))


def test_unknown_parameter_kind():
    k = CudaKernel("k", "", (Param("x", "texture"),), 32, 0, None)
    with pytest.raises(DriverError, match="unknown kind 'texture'"):
        pack_args(k, {}, {})


def test_tensormap_arguments_innermost_first():
    spec = TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128)
    a = tensormap_args(spec, info((4096, 512), "bf16"), {"M": 4096, "K": 512})
    assert a.dtype == "BFLOAT16" and a.address == BASE
    assert a.dims == (512, 4096)
    assert a.strides == (1024,)  # bytes between rows
    assert a.box == (64, 128) and a.swizzle == "128B"


def test_tensormap_three_dimensions_and_swizzles():
    spec = TmaSpec("X", "f32", ("C", "B", "A"), (32, 8, 1), 0)
    a = tensormap_args(spec, info((2, 3, 64), "f32"), {"A": 2, "B": 3, "C": 64})
    assert a.dims == (64, 3, 2) and a.strides == (256, 768) and a.swizzle == "NONE" and a.dtype == "FLOAT32"
    for span, name in ((32, "32B"), (64, "64B")):
        assert tensormap_args(TmaSpec("X", "f32", ("C", "B", "A"), (8, 8, 1), span), info((2, 3, 64), "f32"),
                              {"A": 2, "B": 3, "C": 64}).swizzle == name


def test_tensormap_row_stride_must_be_16_bytes():
    spec = TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128)
    with pytest.raises(ArgumentError, match=r"A: TMA needs every row stride to be a multiple of 16 bytes; "
                                            r"the stride along #M is 1022 B"):
        tensormap_args(spec, info((4096, 511), "bf16"), {"M": 4096, "K": 511})


def test_tensormap_may_span_less_than_the_array_but_not_more():
    spec = TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128)
    with pytest.raises(DriverError, match="spans"):
        tensormap_args(spec, info((4096, 512), "bf16"), {"M": 4096, "K": 1024})
    # a staged buffer: K = 511 logical columns in rows of 512
    args = tensormap_args(spec, info((4096, 512), "bf16"), {"M": 4096, "K": 511})
    assert args.dims == (511, 4096) and args.strides == (1024,)


@pytest.mark.parametrize("cc, arch", [((8, 0), "sm_80"), ((9, 0), "sm_90a"), ((10, 0), "sm_100a")])
def test_arch_for(cc, arch):
    assert arch_for(*cc) == arch


@pytest.mark.parametrize("cc", [(8, 6), (8, 9)])
def test_regression_arch_for_8_6_is_not_sm_80(cc):
    """The driver ran 8.x parts as sm_80 while target_for_capability called them sm_86 (unknown):
    an A10's blocks get 99 KB of shared memory, not sm_80's 163 KB, so sm_80's proofs do not hold
    there. Both maps are now one (habu.targets), which refuses the part and says what to do."""
    with pytest.raises(DriverError, match=rf"compute capability {cc[0]}\.{cc[1]} .*99 KB.*habu/targets/sm_{cc[0]}{cc[1]}\.py"):
        arch_for(*cc)


def test_arch_for_unknown_part():
    with pytest.raises(DriverError, match=r"compute capability 7\.5"):
        arch_for(7, 5)


def test_device_count_never_raises():
    assert driver.device_count() >= 0


@pytest.mark.skipif(driver.device_count() > 0, reason="a CUDA device is present")
def test_no_driver_is_a_clear_error():
    with pytest.raises(DriverError, match="CUDA driver"):
        driver.init()


def test_compiled_signature_must_match_the_params(monkeypatch):
    k = CudaKernel("k", "", (Param("p_X", "ptr", "X", "f32"), Param("tm_A", "tensormap", "A"),
                             Param("s_N", "size", extent="N")), 128, 0, None)
    monkeypatch.setattr(driver, "param_sizes", lambda fn, count=4096: [8, 128, 8])
    driver.check_params(k, None)
    monkeypatch.setattr(driver, "param_sizes", lambda fn, count=4096: None)  # the driver cannot say
    driver.check_params(k, None)
    monkeypatch.setattr(driver, "param_sizes", lambda fn, count=4096: [8, 8])
    with pytest.raises(DriverError, match=r"kernel k: its compiled parameters are \[8, 8\] bytes, but its Params "
                                          r"\(p_X, tm_A, s_N\) say \[8, 128, 8\]"):
        driver.check_params(k, None)


class _RecordingDriver:
    """cuda.bindings.driver's types and enums, with the calls recorded instead of made."""

    def __init__(self):
        from cuda.bindings import driver as real

        self.real, self.calls = real, []

    def __getattr__(self, name):
        if not name.startswith("cu"):
            return getattr(self.real, name)

        def call(*args):
            self.calls.append((name, args))
            return (self.real.CUresult.CUDA_SUCCESS,)

        return call


def test_launch_passes_sizes_dependent_smem_and_opts_in_once(monkeypatch):
    fake = _RecordingDriver()
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver, "_smem_opted_in", {})
    k = CudaKernel("k", "", (Param("p_X", "ptr", "X", "f32"), Param("s_N", "size", extent="N")), 128, 32 * 1024,
                   None, smem_per=("N", 4))
    fn = fake.CUfunction(0xF00D)
    x = info((10,), ptr=BASE)
    driver.launch(k, fn, {"X": x}, {"N": 1024}, (3, 1, 1), stream=0x77)  # 36 KiB: no opt-in
    driver.launch(k, fn, {"X": x}, {"N": 16384}, (3, 1, 1))  # 96 KiB
    driver.launch(k, fn, {"X": x}, {"N": 8192}, (3, 1, 1))  # 64 KiB: already allowed
    driver.launch(k, fn, {"X": x}, {"N": 1024}, (0, 1, 1))  # an empty grid launches nothing
    names = [name for name, _ in fake.calls]
    assert names == ["cuLaunchKernel", "cuFuncSetAttribute", "cuLaunchKernel", "cuLaunchKernel"]
    launch_args = fake.calls[0][1]
    assert launch_args[:8] == (fn, 3, 1, 1, 128, 1, 1, 32 * 1024 + 4096)
    assert int(launch_args[8]) == 0x77 and isinstance(launch_args[9], int) and launch_args[10] == 0
    assert fake.calls[1][1][2] == 32 * 1024 + 4 * 16384


def test_an_early_launch_asks_for_programmatic_stream_serialization(monkeypatch):
    fake = _RecordingDriver()
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver, "_smem_opted_in", {})
    k = CudaKernel("k", "", (Param("p_X", "ptr", "X", "f32"),), 256, 1024, None)
    fn = fake.CUfunction(0xF00D)
    assert driver.launch(k, fn, {"X": info((10,), ptr=BASE)}, {}, (7, 2, 1), stream=0x77, early=True)
    ((name, args),) = fake.calls
    config = args[0]
    assert name == "cuLaunchKernelEx" and args[1] is fn and isinstance(args[2], int) and args[3] == 0
    assert (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX) == (7, 2, 1, 256)
    assert config.sharedMemBytes == 1024 and int(config.hStream) == 0x77 and config.numAttrs == 1
    attr = config.attrs[0]
    assert attr.id == fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1


def test_a_persistent_cluster_grid_counts_the_clusters_that_fit(monkeypatch):
    """A GPC with an odd SM count leaves one SM without a partner: a grid of sm_count blocks in
    clusters of 2 would run its last cluster in a second wave. The driver's occupancy says how many."""
    from types import SimpleNamespace

    from cuda.bindings import driver as real

    asked = []

    def occupancy(function, config):
        asked.append((config.blockDimX, config.sharedMemBytes))
        return real.CUresult.CUDA_SUCCESS, 62
    fake = SimpleNamespace(CUlaunchConfig=real.CUlaunchConfig, cuOccupancyMaxActiveClusters=occupancy,
                           CUresult=real.CUresult)
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver, "allow_smem", lambda *a: None)
    dev = SimpleNamespace(sm_count=132)
    plain = CudaKernel("k1", "", (), 384, 200_000, None)
    clustered = CudaKernel("k2", "", (), 384, 200_000, None, cluster=2)
    assert driver.resident_blocks(plain, 7, 200_000, dev) == 132 and not asked
    assert driver.resident_blocks(clustered, 8, 200_000, dev) == 124
    assert asked == [(384, 200_000)]
    assert driver.resident_blocks(clustered, 8, 200_000, dev) == 124 and len(asked) == 1  # kept per function


def test_a_persistent_row_grid_counts_the_blocks_an_sm_holds(monkeypatch):
    """Row kernels that prefetch their next row are persistent: their grid is every block the GPU
    holds at once (two of 512 threads an SM for softmax at 16384 columns), not one per SM; and a
    kernel no SM can hold is an error, not a grid of zero blocks."""
    from types import SimpleNamespace

    from cuda.bindings import driver as real

    from habu.paths.emit import emit_plan
    from habu.search.space import default_plan, parse_pins
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    per_sm = [2]

    def occupancy(function, threads, smem):
        return real.CUresult.CUDA_SUCCESS, per_sm[0]
    fake = SimpleNamespace(cuOccupancyMaxActiveBlocksPerMultiprocessor=occupancy, CUresult=real.CUresult)
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver, "allow_smem", lambda *a: None)
    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"C": 16384})
    plan = default_plan(m, TARGETS["sm_90a"], {"C": 16384}, parse_pins(["threads=512", "row_prefetch=true"]))
    (k,) = emit_plan(m, plan, TARGETS["sm_90a"]).kernels
    dev = SimpleNamespace(sm_count=132)
    slots = driver.resident_blocks(k, 11, k.smem, dev)
    assert slots == 264 and k.grid({"R": 8192, "C": 16384}, slots) == (264, 1, 1)
    per_sm[0] = 0
    with pytest.raises(driver.DriverError, match="no block of 512 threads"):
        driver.resident_blocks(k, 12, k.smem, dev)
