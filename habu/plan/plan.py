"""Plans: how a model is computed. Frozen, hashable, printed and stored as JSON.

A plan is a list of kernels, one per fusion region of the model, each with its schedule. Every
field carries a one-line doc (`field_docs`) so the compilation report can explain the plan.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

from habu.errors import HabuError

PLAN_FORMAT = 1


def doc(text: str, default: Any = MISSING) -> Any:
    if default is MISSING:
        return field(metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


MOVEMENTS = ("ldg", "cp.async", "tma", "tma-gather4", "staged")
MMAS = ("fma", "mma.sync", "wgmma")
RASTERS = ("row", "column")
STORES = ("direct", "tma")
CLUSTERS = (1, 2)
ROW_CLUSTERS = (1, 2, 4, 8)  # blocks of a cluster that share one row (portable cluster sizes)


@dataclass(frozen=True)
class ContractionKernel:
    """A tiled contraction T[m n] = Σ k A·B, with the elementwise nodes after it as its epilogue."""

    kind: ClassVar[str] = "contraction"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes: the contraction, then its epilogue")
    tile_m: int = doc("rows of the output tile one block computes")
    tile_n: int = doc("columns of the output tile one block computes")
    tile_k: int = doc("depth of one step of the k loop")
    warps: int = doc("warps per block (with warp specialisation, one warpgroup of them loads)")
    stages: int = doc("shared-memory pipeline depth: k tiles in flight")
    mma: str = doc("the multiply instruction: fma (SIMT), mma.sync (m16n8k16) or wgmma (m64nNk16)")
    a_move: str = doc("how A's tiles reach shared memory: ldg (predicated loads), cp.async, tma, tma-gather4, "
                      "staged (a pre-pass copies the rows, gathered, to 16-byte-aligned rows read with TMA)")
    b_move: str = doc("how B's tiles reach shared memory")
    a_vector: int = doc("elements per global access of A (ldg / cp.async)")
    b_vector: int = doc("elements per global access of B (ldg / cp.async)")
    split_k: int = doc("blocks sharing one output tile, each summing a slice of k (partials added atomically)")
    raster: str = doc("order in which blocks walk the tile grid: row (n fastest) or column (m fastest)")
    group_m: int = doc("grouped rasterisation: tile rows walked together so B tiles stay in L2 (1: none)")
    persistent: bool = doc("one block per SM looping over tiles, instead of one block per tile")
    warp_specialized: bool = doc("a producer warpgroup issues loads while consumer warpgroups multiply")
    swizzle: int = doc("shared-memory swizzle span in bytes (0, 32, 64, 128) for TMA / wgmma tiles")
    accumulator: str = doc("accumulator element type", "f32")
    index_width: int = doc("bits of the integers offsets are computed in: 32 (proved not to wrap) or 64", 32)
    store: str = doc("how the output tile reaches global memory: direct (each thread stores its registers) or tma "
                     "(through shared memory in boxes, bulk tensor stores that drain while the next tile runs)",
                     "direct")
    cluster_m: int = doc("blocks of a thread-block cluster along m: they compute vertically adjacent tiles and "
                         "share B's tile, each loading a part and multicasting it to all (1: no cluster)", 1)


@dataclass(frozen=True)
class RowKernel:
    """Row-local nodes (normalisations, softmax, their elementwise neighbours): blocks own rows."""

    kind: ClassVar[str] = "rows"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes, in order")
    rows_per_block: int = doc("rows one block owns (one warp-group of threads per row)")
    threads: int = doc("threads working on one row")
    vector: int = doc("elements per global access")
    cache_row: bool = doc("keep the row in registers/shared memory between passes (one read of x)")
    index_width: int = doc("bits of the integers offsets are computed in", 32)
    cluster: int = doc("blocks of a thread-block cluster that share one row, each a contiguous 1/cluster of its "
                       "columns; they combine their reductions through distributed shared memory", 1)
    prefetch: bool = doc("persistent blocks (one per resident slot) walk the rows, each copying its next row "
                         "into shared memory (cp.async) while it computes this one from registers", False)


@dataclass(frozen=True)
class MapKernel:
    """Elementwise nodes fused into one pass over their elements."""

    kind: ClassVar[str] = "map"
    nodes: tuple[str, ...] = doc("the model's nodes this kernel computes, in order")
    threads: int = doc("threads per block")
    vector: int = doc("elements per access (a lane handles this many consecutive elements)")
    index_width: int = doc("bits of the integers offsets are computed in", 32)


Kernel = ContractionKernel | RowKernel | MapKernel
KERNEL_KINDS: dict[str, type] = {k.kind: k for k in (ContractionKernel, RowKernel, MapKernel)}


@dataclass(frozen=True)
class Plan:
    """How one model is computed on one target, for one shape (or one guarded shape range)."""

    model: str = doc("the model's name")
    model_hash: str = doc("the model's canonical hash: a plan is only valid for this computation")
    target: str = doc("the GPU architecture the kernels are built for")
    shape: tuple[tuple[str, int], ...] = doc("the extents' sizes the plan was made for")
    kernels: tuple[Kernel, ...] = doc("the kernels, in launch order; each computes one fusion region")
    storage: tuple[tuple[str, str], ...] = doc("element type of each intermediate written between kernels", ())
    guards: tuple[str, ...] = doc("conditions on runtime extents under which this plan is valid", ())
    rewrites: tuple[str, ...] = doc("algebraic rewrites applied to the model before it is cut into kernels "
                                    "(inline:P, factor:T); the kernels name the rewritten model's nodes", ())

    # -- JSON
    def to_json(self) -> dict:
        out = {
            "format": PLAN_FORMAT,
            "model": self.model,
            "model_hash": self.model_hash,
            "target": self.target,
            "shape": {k: v for k, v in self.shape},
            "kernels": [{"kind": k.kind, **_kernel_dict(k)} for k in self.kernels],
            "storage": {k: v for k, v in self.storage},
            "guards": list(self.guards),
        }
        if self.rewrites:  # absent when none, so plans without rewrites keep their keys
            out["rewrites"] = list(self.rewrites)
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @property
    def key(self) -> str:
        """A short stable id of the plan (its JSON, hashed)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def from_json(data: Any, where: str = "plan") -> Plan:
        try:
            if not isinstance(data, dict):
                raise TypeError("the plan must be a JSON object")
            if data.get("format") != PLAN_FORMAT:
                raise ValueError(f"unknown plan format {data.get('format')!r} (this Habu reads {PLAN_FORMAT})")
            kernels = []
            for i, kd in enumerate(data["kernels"]):
                kind = kd.get("kind")
                cls = KERNEL_KINDS.get(kind)
                if cls is None:
                    raise ValueError(f"kernel {i}: unknown kind {kind!r}")
                kernels.append(_kernel_from(cls, kd, f"kernel {i}"))
            return Plan(
                model=str(data["model"]),
                model_hash=str(data["model_hash"]),
                target=str(data["target"]),
                shape=tuple((str(k), _int(v, f"shape {k}")) for k, v in data["shape"].items()),
                kernels=tuple(kernels),
                storage=tuple((str(k), str(v)) for k, v in data.get("storage", {}).items()),
                guards=tuple(str(g) for g in data.get("guards", [])),
                rewrites=_strings(data.get("rewrites", []), "rewrites"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise HabuError(f"{where}: not a valid Habu plan: {what}") from None


def _strings(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{what} must be a list of strings, got {v!r}")
    return tuple(v)


def _kernel_dict(k: Kernel) -> dict:
    d = asdict(k)
    d["nodes"] = list(k.nodes)
    if d.get("store") == "direct":
        del d["store"]  # the default, absent so plans from before the field keep their keys
    if d.get("cluster_m") == 1:
        del d["cluster_m"]  # likewise
    if isinstance(k, RowKernel) and k.cluster == 1:
        del d["cluster"]  # likewise
    if isinstance(k, RowKernel) and not k.prefetch:
        del d["prefetch"]  # likewise
    return d


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an integer, got {v!r}")
    return v


def _kernel_from(cls: type, kd: dict, where: str) -> Kernel:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in kd:
            if f.default is not MISSING:
                continue
            raise ValueError(f"{where}: missing field {f.name!r}")
        v = kd[f.name]
        if f.name == "nodes":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise TypeError(f"{where}: nodes must be a list of node names")
            v = tuple(v)
        elif f.type in ("int",):
            v = _int(v, f"{where}: {f.name}")
        elif f.type in ("bool",):
            if not isinstance(v, bool):
                raise TypeError(f"{where}: {f.name} must be true or false, got {v!r}")
        elif f.type in ("str",) and not isinstance(v, str):
            raise TypeError(f"{where}: {f.name} must be a string, got {v!r}")
        kwargs[f.name] = v
    extra = set(kd) - {f.name for f in fields(cls)} - {"kind"}
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    return cls(**kwargs)


def field_docs(obj: Any) -> list[tuple[str, Any, str]]:
    """(name, value, doc) for every field of a plan or kernel."""
    return [(f.name, getattr(obj, f.name), f.metadata.get("doc", "")) for f in fields(obj)]


def with_fields(k: Kernel, **changes: Any) -> Kernel:
    return replace(k, **changes)
