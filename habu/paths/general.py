"""The general path: any equation node, one thread per output element, reductions as loops in f32 (the
fallback every model has; habu/lower/general.py lowers it, habu/emit_cuda/emit_general.py prints it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_general import emit_general
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.general import GeneralLowering, lower_general
from habu.lower.support import GENERAL
from habu.paths.analytic import INT31, index_width
from habu.paths.base import KernelPath
from habu.plan.patterns import Region
from habu.plan.plan import GeneralKernel, Kernel
from habu.plan.storage import storage_dtypes
from habu.spec.ir import Model
from habu.target import Target


class GeneralPath(KernelPath):
    support = GENERAL

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> GeneralKernel:
        """256 threads, one output element each; 64-bit indices where a tensor's offsets need them, or
        where the thread index or a loop counter passes 2^31 − 1 at the widest sizes (a scatter over
        R·H·D elements whose tensors are each smaller: the Qwen3 MoE backward's dW1)."""
        kernel = GeneralKernel(nodes=region.nodes, threads=256, index_width=index_width(model, sizes))
        elements, vector = loopless_shape(model, kernel, target, sizes)
        kernel = replace(kernel, elements=elements, vector=vector)
        if elements * vector > 1:  # a large grid without loops: a reader of the last-written first
            kernel = replace(kernel, reverse=reads_previous_output(model, kernel))
        if kernel.index_width == 32 and not thread_indices_fit(model, kernel, sizes):
            kernel = replace(kernel, index_width=64)
        return kernel

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        assert isinstance(base, GeneralKernel)
        for threads in (64, 128, 256, 512, 1024):
            yield replace(base, threads=threads)
        for elements in (2, 4, 8):  # several elements a thread: more loads in flight
            yield replace(base, elements=elements)
        for vector in (2, 4, 8):  # consecutive elements moved at once (the rules refuse where they cannot be)
            yield replace(base, vector=vector)
            yield replace(base, vector=vector, elements=2)

    def smem_bytes(self, lowering: GeneralLowering) -> int:  # type: ignore[override]
        return 0

    def registers(self, lowering: GeneralLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: GeneralLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_general(name, model, lowering, static)


# elements a thread of a general kernel without reduction loops (a gathered copy, a scatter-add) takes by
# default, where the grid keeps LOOPLESS_WAVES blocks per SM. H200, GGEMM's backward at 4096³ (2026-12-02,
# 05:40 run): the f32 scatter-add of 16.7 M elements 122.3 µs with one element a thread, 94.9 with 4, 94.3
# with 8; the bf16 gathered copy 80.0 µs with one, 37.4 with 8 (one element a thread is latency-bound: one
# load each, 62 waves of resident threads). Both exact on the GPU (bit for bit at 4096³, and at ragged shapes)
LOOPLESS_ELEMENTS = 8
LOOPLESS_WAVES = 4


def loopless_shape(model: Model, kernel: GeneralKernel, target: Target, sizes: dict[str, int]) -> tuple[int, int]:
    """(elements, vector) a thread of a kernel whose node reduces nothing takes: where its grid keeps at
    least `LOOPLESS_WAVES` blocks an SM moving the widest vector its accesses allow (`loopless_vector`),
    that vector and the most elements (8, 4, 2) that keep the grid so; else one element (`LOOPLESS_ELEMENTS`
    where the grid keeps its blocks with 8 a thread). (1, 1) for a scalar output; a kernel with reduction loops
    takes one element, a vector of them where the grid keeps its blocks so (GQA attention's backward sums its
    query heads' dK and dV, `Σ r dK.in[r b g j e]`: one loop of R for 4 columns, 16-byte loads; it ran
    scalar, 19–20 µs each at 16 × 1k on an H100, session 63)."""
    lw = lower_general(model, kernel)
    if not lw.extents:
        return 1, 1
    numel = 1
    for e in lw.extents:
        numel *= sizes.get(e, 0) or 0
    enough = LOOPLESS_WAVES * target.sm_count
    vector = loopless_vector(model, kernel, sizes)
    if lw.loops:  # a vector of elements, each loop run once for all of them, where the grid keeps its blocks
        return 1, (vector if vector > 1 and numel // (kernel.threads * vector) >= enough else 1)
    if vector > 1 and numel // (kernel.threads * vector) >= enough:
        return next(e for e in (8, 4, 2, 1) if e == 1 or numel // (kernel.threads * e * vector) >= enough), vector
    return (LOOPLESS_ELEMENTS if numel // (kernel.threads * LOOPLESS_ELEMENTS) >= enough else 1), 1


def loopless_vector(model: Model, kernel: GeneralKernel, sizes: dict[str, int]) -> int:
    """The widest vector (8, 4 or 2 consecutive elements, at most 16 bytes an access) the kernel's accesses
    allow at these sizes (`vector_refusal`, `vector_conditions`); 1 where none fits or the output's extents
    are not all static (a vector's divisibility would hold at one size only). H200, GGEMM's backward at
    4096³ (2026-12-02 08:00 run, exact): the bf16 gathered copy 37.6 -> 15.6 µs with 8 a thread; the f32
    scatter-add 94.9 -> 91.3 µs with 4 (its atomics' read-modify-write of dA past the L2 stays the cost)."""
    for n in (8, 4, 2):
        lw = lower_general(model, replace(kernel, vector=n), storage_dtypes(model))  # intermediates as stored
        if lw.vector_refusal() is not None or not all(model.extent(e).is_static for e in lw.extents):
            continue
        if all(bool(holds) for _, _, holds, _ in lw.vector_conditions(sizes)):
            return n
    return 1


def reads_previous_output(model: Model, kernel: GeneralKernel) -> bool:
    """Whether the kernel reads a node the model computes (an intermediate the kernel before it wrote): its
    blocks then take their pieces from the last (`reverse`), reading what was written last while it may
    still sit in the L2 (f32 scatter-add at 4096³ after its product: 91.3 -> 89.6 µs, 08:00 run)."""
    lw = lower_general(model, kernel)
    computed = {e.target for e in model.nodes}
    return any(acc.tensor in computed for _, acc in lw.loads)


def thread_indices_fit(model: Model, kernel: GeneralKernel, sizes: dict[str, int]) -> bool:
    """Whether the general kernel's 32-bit thread index (the last launched thread's element) and loop
    counters stay within 2^31 − 1 at the widest sizes (a runtime extent at its `hi`), as the int32 rule
    bounds them (`_general_launch`, habu/prove/rules_fields.py)."""
    widest = {e.name: e.size if e.size is not None else max(e.hi, sizes.get(e.name, 0)) for e in model.extents}
    lw = lower_general(model, kernel)
    if lw.thread_map.largest(lw.grid(widest), kernel.threads) > INT31:
        return False
    return all(widest[extent] <= INT31 for _, extent in lw.loops)


PATH = GeneralPath()
