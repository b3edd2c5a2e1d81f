"""What every emitter shares: kernel parameters, offsets and masks of an access, float expressions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.kernel import Param, TmaSpec
from habu.lower.access import Access
from habu.lower.contraction import is_batch_axis
from habu.spec.functions import FUNCTIONS
from habu.spec.ir import (
    Compare,
    Const,
    Expr,
    Gather,
    IndexAffine,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    NegInf,
    Op,
    Reduce,
    Size,
)

CTYPE = {"bf16": "habu::bf16", "f16": "habu::f16", "f32": "float", "f64": "double", "i32": "int",
         "i64": "long long", "i16": "short", "i8": "signed char"}
LOAD = {"bf16": "habu::load_bf16", "f16": "habu::load_f16", "f32": "habu::load_f", "f64": "habu::load_f"}
STORE = {"bf16": "habu::store_bf16", "f16": "habu::store_f16", "f32": "habu::store_f"}


def index_code(model: Model, table: str) -> int:
    """The bit an index tensor's out-of-range value sets in the error word: its place among the model's
    index tensors (`habu.emit_cuda.checks.index_tensors` reads the bits back by the same order)."""
    names = [d.name for d in model.inputs if d.is_index]
    code = names.index(table)
    if code >= 32:
        raise ValueError(f"{table}: a model may check at most 32 index tensors")
    return code


class TableReader:
    """An index tensor's value at a coordinate as C (`table(name, coordinate)`), and the index check of
    an access's mask (`check`): `habu::index_ok`, which raises the module's error words
    (`habu_index_errors`, habu/memory/index.cuh) on a value outside the indexed axis."""

    def __init__(self, sig: Signature, model: Model, it: str):
        self.sig, self.model, self.it = sig, model, it

    def __call__(self, name: str, coordinate: str) -> str:
        p = self.sig.pointer(name, self.model.tensor(name).dtype.name)  # type: ignore[union-attr]
        return f"({self.it}){p}[{coordinate}]"

    def check(self, name: str, coordinate: Any, size: Any) -> str:
        p = self.sig.pointer(name, self.model.tensor(name).dtype.name)  # type: ignore[union-attr]
        at = coordinate if isinstance(coordinate, str) else c(coordinate)
        return (f"habu::index_ok((long long){p}[{at}], (long long)({c(size)}), {index_code(self.model, name)}u, "
                f"(long long)({at}))")


@dataclass
class Signature:
    """The parameters of one kernel, collected while its body is emitted."""

    model: Model
    params: list[Param] = field(default_factory=list)
    static: dict[str, int] = field(default_factory=dict)  # extents fixed at compile time

    def pointer(self, tensor: str, dtype: str, writes: bool = False) -> str:
        name = f"p_{_ident(tensor)}"
        for i, p in enumerate(self.params):
            if p.kind == "ptr" and p.tensor == tensor:
                if writes and not p.writes:
                    self.params[i] = Param(p.name, "ptr", tensor, dtype, writes=True)
                return name
        self.params.append(Param(name, "ptr", tensor, dtype, writes=writes))
        return name

    def size(self, extent: str) -> Any:
        """An extent's size: a literal when static, a kernel parameter when known only at run time."""
        if extent in self.static:
            return self.static[extent]
        name = f"s_{extent}"
        if not any(p.kind == "size" and p.extent == extent for p in self.params):
            self.params.append(Param(name, "size", extent=extent))
        return CExpr(name)

    def sizes(self) -> SizeView:
        return SizeView(self)

    def tensormap(self, spec: TmaSpec) -> str:
        """The parameter of a tensor map of `spec`: one per tensor and box (a kernel that warms the next kernel's
        boxes of a tensor it loads itself in other boxes has two maps of it)."""
        maps = [p for p in self.params if p.kind == "tensormap" and p.tensor == spec.tensor]
        same = next((p for p in maps if p.tma == spec), None)
        if same is not None:
            return same.name
        name = f"tm_{_ident(spec.tensor)}" + (f"_{len(maps)}" if maps else "")
        self.params.append(Param(name, "tensormap", spec.tensor, spec.dtype, tma=spec))
        return name

    def declaration(self) -> str:
        out = []
        for p in self.params:
            if p.kind == "ptr":
                const = "" if p.writes else "const "
                out.append(f"{const}{CTYPE[p.dtype or 'f32']}* __restrict__ {p.name}")
            elif p.kind == "size":
                out.append(f"long long {p.name}")
            else:
                out.append(f"const __grid_constant__ habu::TensorMap {p.name}")
        return ", ".join(out)


class SizeView(Mapping[str, Any]):
    """Extent sizes for the lowering's formulas: ints where static, C names where not."""

    def __init__(self, sig: Signature):
        self.sig = sig

    def __getitem__(self, key: str) -> Any:
        return self.sig.size(key)

    def __iter__(self):
        return iter(e.name for e in self.sig.model.extents)

    def __len__(self) -> int:
        return len(self.sig.model.extents)


def _ident(name: str) -> str:
    """A C identifier for a tensor name: %3 (an intermediate) -> t3, @A (a staged copy) -> staged_A,
    $G (the per-launch counters of the kernel writing G) -> counters_G."""
    if name.startswith("$"):
        return "counters_" + _ident(name[1:])
    if name.startswith("%"):
        return "t" + _ident(name[1:])
    if name.startswith("@"):
        return "staged_" + _ident(name[1:])
    # anything else that C does not allow (Y.scale, made by a rewrite) is spelt by its code: Y_2e_scale
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else f"_{ord(ch):x}_" for ch in name)


def references(code: str, name: str) -> bool:
    """Whether C code `code` names the variable `name` (a whole identifier): an emitter declares a
    variable only where the code it prints reads it (NVRTC warns of one declared but never referenced)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", code) is not None


def index_type(width: int) -> str:
    return "int" if width == 32 else "long long"


class CIndex:
    """Index arithmetic as C text, for `Access.offset` and `Access.mask` (the lowering's one definition)."""

    def __init__(self, width: int, table: Callable[[str, str], str] | None = None):
        self.type = index_type(width)
        self._table = table

    def cast(self, x: Any) -> str:
        return f"({self.type})({x if isinstance(x, str) else c(x) if isinstance(x, CExpr) else str(x)})"

    def mul(self, a: str, b: str) -> str:
        return f"{a} * {b}"

    def add(self, a: str, b: str) -> str:
        return f"{a} + {b}"

    def zero(self) -> str:
        return "0"

    def table(self, name: str, coordinate: str) -> str:
        if self._table is None:
            raise ValueError(f"a gather through {name} where no index tensor is read")
        return self._table(name, coordinate)

    def index_ok(self, name: str, coordinate: Any, size: Any, guard: Any) -> str:
        check = getattr(self._table, "check", None)
        if check is None:
            raise ValueError(f"an index check of {name} where the emitter gave no TableReader")
        return check(name, coordinate, size)

    def lt(self, a: str, b: Any) -> str:
        return f"({a}) < {c(b)}"

    def le(self, a: str, b: Any) -> str:
        return f"({a}) <= {c(b)}"

    def all(self, parts: list[str]) -> str:
        return " && ".join(parts) if parts else "true"


def access_offset(access: Access, coord: Mapping[str, str], sizes: Mapping[str, Any], width: int,
                  table: Callable[[str, str], str], axes: tuple[str, ...] | None = None) -> str:
    """The element offset of an access as C, printed from the lowering's `Access.offset`.
    `table(name, coordinate)` gives the C expression of an index tensor's value at a coordinate. A
    batched contraction's batch axes are read at the C constants of their names (`tile_setup`)."""
    batch = {p.axis: p.axis for p in access.positions if p.kind == "axis" and is_batch_axis(p.axis)}
    return access.offset({**batch, **coord} if batch else coord, sizes, CIndex(width, table), axes)


def access_mask(access: Access, coord: Mapping[str, str], sizes: Mapping[str, Any],
                table: Callable[[str, str], str] | None = None) -> str:
    """The access's bounds predicate as C, printed from the lowering's `Access.mask`; an access with
    index checks (a gather or scatter) needs `table`, a `TableReader`, which prints them."""
    return access.mask(coord, sizes, CIndex(32, table))


def float_literal(v: Fraction) -> str:
    f = float(v)
    text = repr(f)
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text + "f"


def float_expr(e: Expr, leaf: Callable[[Load], str], sizes: Mapping[str, Any],
               reduce: Callable[[Reduce], str] | None = None, table: Callable[[str, str], str] | None = None,
               names: Mapping[str, str] | None = None) -> str:
    """An IR expression as C float arithmetic; `leaf` renders loads, `reduce` reductions, `table`
    an index tensor's value in a condition (`TableReader`), `names` the C of an index variable in a condition
    where it is not the coordinate of its name (a vector's element j: the last axis + j)."""
    if isinstance(e, Const):
        return float_literal(e.value)
    if isinstance(e, Size):
        return f"(float)({c(sizes[e.extent])})"
    if isinstance(e, Load):
        return leaf(e)
    if isinstance(e, Reduce):
        if reduce is None:
            raise ValueError("a reduction where none is expected")
        return reduce(e)
    if isinstance(e, Compare):
        return f"({condition_code(e, sizes, table, names)} ? 1.0f : 0.0f)"
    if isinstance(e, NegInf):
        return "(-__int_as_float(0x7f800000))"
    assert isinstance(e, Op)
    if e.fn == "where" and isinstance(e.args[0], Compare):  # selects; the other side is not used
        x, y = (float_expr(a, leaf, sizes, reduce, table, names) for a in e.args[1:])
        return f"({condition_code(e.args[0], sizes, table, names)} ? {x} : {y})"
    args = [float_expr(a, leaf, sizes, reduce, table, names) for a in e.args]
    infix = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if e.fn in infix:
        return f"({args[0]} {infix[e.fn]} {args[1]})"
    if e.fn == "neg":
        return f"(-{args[0]})"
    assert e.fn in FUNCTIONS
    if e.fn == "div0":  # a · (1/b): a divisor shared by many elements is one reciprocal (math.cuh `f_rcp0`)
        one = isinstance(e.args[0], Const) and e.args[0].value == 1
        return f"habu::f_rcp0({args[1]})" if one else f"({args[0]} * habu::f_rcp0({args[1]}))"
    return f"habu::f_{e.fn}({', '.join(args)})"


def condition_code(e: Compare, sizes: Mapping[str, Any], table: Callable[[str, str], str] | None = None,
                   names: Mapping[str, str] | None = None) -> str:
    """A condition on indices as C (its index variables are the kernel's coordinates, by name, or the C
    `names` gives one; sums in 64 bits). A gather `LEN[b]` reads the index tensor at its one coordinate (in
    bounds: b ranges over LEN's domain); its value is only compared, never used as an address."""
    rename = names or {}

    def term(ix: IndexExpr) -> str:
        if isinstance(ix, IndexVar):
            return rename.get(ix.name, ix.name)
        if isinstance(ix, IndexConst):
            return str(ix.value)
        assert isinstance(ix, Gather) and table is not None and isinstance(ix.indices[0], IndexVar)
        return table(ix.tensor, rename.get(ix.indices[0].name, ix.indices[0].name))

    def side(a: IndexAffine) -> str:
        parts = [f"{k} * (long long){term(ix)}" for k, ix in a.terms]
        parts += [f"{k} * (long long)({c(sizes[x])})" for k, x in a.sizes]
        return "(" + " + ".join([*parts, f"{a.const}LL"]) + ")"

    op = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[e.op]
    return f"({side(e.left)} {op} {side(e.right)})"


def load_value(dtype: str, pointer: str, offset: str) -> str:
    if dtype in LOAD:
        return f"{LOAD[dtype]}({pointer} + ({offset}))"
    return f"(float)({pointer}[{offset}])"


def store_value(dtype: str, pointer: str, offset: str, value: str) -> str:
    return f"{STORE[dtype]}({pointer} + ({offset}), {value});"


# programmatic dependent launch: every kernel lets the plan's next kernel begin launching at once, and
# waits for the previous kernel of its stream before it reads or writes global memory (the runtime
# launches a plan's later kernels with the attribute that lets them start early; the first kernel of
# a plan is launched after the caller's work, as usual). The wgmma kernel may start its main loop first
# when no earlier kernel of the plan writes its operands (`emit_wgmma`).
GRID_LAUNCH = "  habu::grid_dependency_launch();  // the plan's next kernel may begin launching\n"
GRID_WAIT = "  habu::grid_dependency_wait();  // what the plan's earlier kernels wrote is visible from here\n"


def header(title: str, lines: list[str]) -> str:
    body = "\n".join(f"// {ln}" for ln in lines)
    return f"// {title}\n{body}\n#include \"habu/habu.cuh\"\n"
