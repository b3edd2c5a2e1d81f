"""The MoE backward's expert-weight gradients alone (issue 21; habu/lower/grouped_wgrad.py), each of Habu's plan
variants against torch's loop over the experts in the same run:

    python -m habu.bench.wgrad_speed [--tokens 4096] [--only dw1,dw1-bf16,dw2] [--pins "wgrad_persistent=true;..."]

The forms are the derived Mixtral backward's (examples/moe_mixtral.habu, `habu grad`): `dw1` is
`O[E[r] h d] += A[r h] · X[IX[r] d]` with A the f32 cotangent (two bf16 parts on the tensor cores; dW1 and dW3),
`dw1-bf16` the same with a bf16 A (`--pin storage=bf16`'s), `dw2` is `O[E[r] d h] += DY[IX[r] d] · P[r] · S[r h]`
with the f32 output gradient gathered and scaled by the router weight. Uniform top-2 routing over 8 experts, rows
sorted by expert; D 4096, H 14336. torch's baseline is what its autograd runs for the expert loop: per expert,
`A[rows].T @ B[rows]` in bf16 (cuBLAS, f32 accumulation) added into O. Each plan is proven (rules and a
finite-field trial at the witness), then checked against the float64 product of the same inputs (relative
Frobenius error within 1e-5 for an f32 A's two parts, 1e-2 for a bf16 one) before it is timed; CUDA-event
medians. O (1.9 GB in f32 for dW1) is past the L2 by itself, so one input set is timed. Self-checking: exits 1 if a
check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habu.bench.run import build
from habu.bench.step_gemms_speed import parse_pins
from habu.timing.harness import time_cuda, torch

D, H, EXPERTS, TOPK = 4096, 14336, 8, 2


@dataclass(frozen=True)
class WgradForm:
    name: str
    equation: str
    a_dtype: str  # the operand along m (gathered by IX where the equation says so)
    m: str  # the extents of O's last two axes: m (A's columns) then n (B's)
    n: str
    a_gathered: bool  # A's rows gathered by IX (else A is a routed row's own)
    row_factor: bool  # times P[r]

    def model_text(self, tokens: int, d: int = D, h: int = H, experts: int = EXPERTS) -> str:
        ext = {"D": d, "H": h}
        a_rows = "#T" if self.a_gathered else "#R"
        b_rows = "#R" if self.a_gathered else "#T"  # the other operand: the tokens' X, or a routed row's S
        factor = "f32 TENSOR: P ( #R )  " if self.row_factor else ""
        return (f"{tokens} EXTENT: #T {tokens * TOPK} EXTENT: #R {experts} EXTENT: #G "
                f"{ext[self.m]} EXTENT: #{self.m} {ext[self.n]} EXTENT: #{self.n}\n"
                f"{self.a_dtype} TENSOR: A ( {a_rows} #{self.m} )  bf16 TENSOR: B ( {b_rows} #{self.n} )  {factor}"
                f"f32 TENSOR: O ( #G #{self.m} #{self.n} )\n"
                "ITENSOR: IX ( #R #T )  GROUPS: E ( #R #G )\n"
                f"MODEL: {self.name.upper()}  {self.equation} ;\n")

    def operands(self, a: Any, b: Any, ix: Any, p: Any) -> tuple[Any, Any]:
        """(A's rows, B's rows) of every routed row, as the model reads them (A times P[r] where it says so); numpy
        arrays or torch tensors."""
        at = ix.long() if hasattr(ix, "long") else ix
        rows_a = a[at] if self.a_gathered else a
        rows_b = b if self.a_gathered else b[at]
        if self.row_factor:
            rows_a = rows_a * p[:, None]
        return rows_a, rows_b

    def inputs(self, a: Any, b: Any, ix: Any, e: Any, p: Any) -> dict[str, Any]:
        """The model's inputs but O, by name."""
        return {"A": a, "B": b, "IX": ix, "E": e, **({"P": p} if self.row_factor else {})}


FORMS = (
    WgradForm("dw1", "O[E[r] h d] += A[r h] · B[IX[r] d]", "f32", "H", "D", False, False),
    WgradForm("dw1-bf16", "O[E[r] h d] += A[r h] · B[IX[r] d]", "bf16", "H", "D", False, False),
    WgradForm("dw2", "O[E[r] d h] += A[IX[r] d] · P[r] · B[r h]", "f32", "D", "H", True, True),
)


def torch_loop(form: WgradForm, a: Any, b: Any, ix: Any, p: Any, bounds: list[int], o: Any) -> Any:
    """torch autograd's expert loop: each expert's rows' product in bf16 (cuBLAS), added into O (f32)."""
    rows_a, rows_b = form.operands(a, b, ix, p)
    for g in range(len(bounds) - 1):
        lo, hi = bounds[g], bounds[g + 1]
        if hi > lo:
            o[g] += (rows_a[lo:hi].bfloat16().T @ rows_b[lo:hi].bfloat16()).float()
    return o


def measure(form: WgradForm, path: Path, tokens: int, variants: list[dict[str, str]], routed: tuple) -> bool:
    """Check and time `form`'s plan under each of `variants` (pins) and torch's loop once; print a line each. False
    where a check fails."""
    t = torch()
    ix, e, p, offsets = routed
    bounds = [0, *offsets.tolist()]
    rows = tokens * TOPK
    g = t.Generator(device="cuda").manual_seed(1)
    a = t.randn((tokens if form.a_gathered else rows, D if form.m == "D" else H), generator=g, device="cuda")
    a = a if form.a_dtype == "f32" else a.bfloat16()
    b = t.randn((rows if form.a_gathered else tokens, D if form.n == "D" else H), generator=g, device="cuda").bfloat16()
    o0 = t.zeros((EXPERTS, a.shape[1], b.shape[1]), device="cuda")
    rows_a, rows_b = form.operands(a.double(), b.double(), ix, p.double())
    want = o0.double().clone()
    for grp in range(EXPERTS):
        want[grp] += rows_a[bounds[grp]:bounds[grp + 1]].T @ rows_b[bounds[grp]:bounds[grp + 1]]
    del rows_a, rows_b
    ins = form.inputs(a, b, ix, e, p)
    tol = 1e-5 if form.a_dtype == "f32" else 1e-2
    flops = 2 * rows * D * H
    torch_ms = None
    ok_all = True
    for pins in variants:
        try:
            built = build(str(path), form.name.upper(), {}, pins, witness=True)
        except Exception as exc:  # a variant this form refuses: say so, go on
            print(f"{form.name:<9} {pins!s:<48} refused: {str(exc).splitlines()[0][:100]}")
            continue
        k = built.plan.kernels[0]
        label = (f"{k.bm}x{k.bn} s{k.stages} {k.wgrad_copy}" + (" walk" if k.wgrad_persistent else "")
                 + ("" if k.wgrad_index_ring else " no-ring") + (f" {pins}" if pins else ""))
        out = built.compiled(**ins, O=o0.clone())
        got = (out["O"] if isinstance(out, dict) else out).double()
        rel = float((got - want).norm() / want.norm())
        del got
        if not rel < tol:  # (NaN fails too: a poisoned or unwritten element)
            ok_all = False
            print(f"{form.name:<9} {label:<48} check FAILED: rel error {rel:.2e}")
            continue
        o = o0.clone()
        ms = time_cuda(lambda i, c=built.compiled, o=o: c(**ins, O=o), 1, reps=10)["median_us"] / 1e3
        if torch_ms is None:
            torch_ms = time_cuda(lambda i, o=o: torch_loop(form, a, b, ix, p, bounds, o), 1, reps=10)["median_us"] / 1e3
        print(f"{form.name:<9} {label:<48} {ms:8.2f} {torch_ms:8.2f} {torch_ms / ms:8.2f} {flops / ms / 1e9:8.1f}  "
              f"rel {rel:.1e}", flush=True)
    return ok_all


def main(argv: list[str] | None = None) -> int:
    from habu.bench.moe_speed import routing

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--only", default="", help="comma-separated forms: " + ",".join(f.name for f in FORMS))
    ap.add_argument("--pins", default="", help="variants besides the default: ';' between, ',' inside")
    args = ap.parse_args(argv)
    routed = routing(args.tokens, TOPK, EXPERTS, "uniform", seed=0)
    variants = [{}] + [q for q in parse_pins(args.pins) if q]
    print(f"MoE weight gradients, {args.tokens} tokens ({args.tokens * TOPK} routed rows), D {D}, H {H}, {EXPERTS} "
          "experts (ms, median of CUDA events; TFLOP/s counted once, not per part)")
    print(f"{'form':<9} {'plan':<48} {'habu':>8} {'torch':>8} {'× torch':>8} {'TFLOP/s':>8}  check")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for form in (f for f in FORMS if not args.only or f.name in args.only.split(",")):
            path = Path(tmp) / f"{form.name}.habu"
            path.write_text(form.model_text(args.tokens))
            ok = measure(form, path, args.tokens, variants, routed) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
