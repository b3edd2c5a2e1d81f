"""The six contractions of an FFN training step, one at a time (issue 21: where the step's time goes at
4096 tokens), each Habu's default plan for that contraction alone against `torch.matmul` of the same
layout in the same run:

    python -m habu.bench.step_gemms_speed [--tokens 4096] [--only fwd1,dw1] [--pins "persistent=true;..."]

The forward `X·W1` and `G·W2` (the weight read n-major), the input gradients `dT·W1ᵀ` and `dY·W2ᵀ` (both
operands k-major), and the weight gradients `Xᵀ·dT` and `Gᵀ·dY` (both m/n-major: the contraction runs over
the tokens); and `dg-gelu`, the backward's GELU derivative fused into `dY·W2ᵀ`'s epilogue (it reads the
saved pre-activation T; torch runs the GEMM, then `gelu_backward`). D 4096, H 14336, bf16 in and out, f32
accumulation. Each plan is proven (rules and one
finite-field trial on the witness), then checked against torch's product in f32 on the same inputs
(relative Frobenius error within the bf16 tolerance) before it is timed; CUDA events, the median of 30,
input sets rotated past the L2. Self-checking: exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda, torch

D, H = 4096, 14336


@dataclass(frozen=True)
class StepGemm:
    name: str
    equation: str  # the model's equation: O over A and B
    a_axes: str  # A's extents, in storage order
    b_axes: str
    o_axes: str
    t_axes: str = ""  # the epilogue's own input T (the GELU derivative's), if any

    def torch_product(self, a, b, t=None, fused_op: bool = False):
        """torch's matmul of the same stored layouts (transposed views, as autograd calls it), times the
        GELU derivative at `t` where the model has one (`fused_op`: as autograd runs it, `gelu_backward`)."""
        lhs = a if self.a_axes[0] == self.o_axes[0] else a.mT
        rhs = b if self.b_axes[1] == self.o_axes[1] else b.mT
        product = lhs @ rhs
        if not self.t_axes:
            return product
        if fused_op:
            return torch().ops.aten.gelu_backward(product, t)
        return product * gelu_derivative(t)


def gelu_derivative(t):
    """d/dt of t·Φ(t): Φ(t) + t·φ(t), for a numpy array or a torch tensor."""
    if isinstance(t, np.ndarray):
        cdf = 0.5 * (1 + np.vectorize(math.erf)(t / math.sqrt(2)))
        return cdf + t * np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + torch().special.erf(t / math.sqrt(2)))
    return cdf + t * torch().exp(-0.5 * t * t) / math.sqrt(2 * math.pi)


GEMMS = (
    StepGemm("fwd1", "O[b h] = Σ d A[b d] · W[d h]", "BD", "DH", "BH"),
    StepGemm("fwd2", "O[b d] = Σ h A[b h] · W[h d]", "BH", "HD", "BD"),
    StepGemm("dx1", "O[b d] = Σ h A[b h] · W[d h]", "BH", "DH", "BD"),
    StepGemm("dg", "O[b h] = Σ d A[b d] · W[h d]", "BD", "HD", "BH"),
    StepGemm("dw1", "O[d h] = Σ b A[b d] · W[b h]", "BD", "BH", "DH"),
    StepGemm("dw2", "O[h d] = Σ b A[b h] · W[b d]", "BH", "BD", "HD"),
    StepGemm("dg-gelu", "O[b h] = (Σ d A[b d] · W[h d]) · (0.5 · (1 + erf(T[b h] · 0.7071067811865476)) "
             "+ T[b h] · 0.3989422804014327 · exp(−(0.5 · T[b h] · T[b h])))", "BD", "HD", "BH", "BH"),
)


def model_text(g: StepGemm, tokens: int, d: int = D, h: int = H) -> str:
    ext = {"B": tokens, "D": d, "H": h}

    def shape(axes: str) -> str:
        return " ".join(f"#{x}" for x in axes)

    return (" ".join(f"{ext[x]} EXTENT: #{x}" for x in "BDH")
            + f"\nbf16 TENSOR: A ( {shape(g.a_axes)} )  bf16 TENSOR: W ( {shape(g.b_axes)} )"
            + (f"  bf16 TENSOR: T ( {shape(g.t_axes)} )" if g.t_axes else "")
            + f"  bf16 TENSOR: O ( {shape(g.o_axes)} )\nMODEL: STEP-{g.name.upper()}  {g.equation} ;\n")


def parse_pins(text: str) -> list[dict[str, str]]:
    """'' (the default) and each ';'-separated variant of ','-separated key=value pins."""
    variants: list[dict[str, str]] = []
    for chunk in text.split(";"):
        pins = dict(p.split("=", 1) for p in chunk.split(",") if p.strip())
        if pins not in variants:
            variants.append(pins)
    return variants


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--only", default="", help="comma-separated names: " + ",".join(g.name for g in GEMMS))
    ap.add_argument("--pins", default="", help="variants besides the default: ';' between, ',' inside")
    args = ap.parse_args(argv)
    t = torch()
    chosen = [g for g in GEMMS if not args.only or g.name in args.only.split(",")]
    flops = 2 * args.tokens * D * H
    failed = False
    print(f"FFN step contractions, {args.tokens} tokens, D {D}, H {H}, bf16 (µs, median of CUDA events)")
    print(f"{'gemm':<5} {'plan':<40} {'habu':>8} {'torch':>8} {'× torch':>8} {'TFLOP/s':>8}  check")
    with tempfile.TemporaryDirectory() as tmp:
        for g in chosen:
            path = Path(tmp) / f"{g.name}.habu"
            path.write_text(model_text(g, args.tokens))
            torch_us = None
            for pins in [{}] + [p for p in parse_pins(args.pins) if p]:
                try:
                    built = build(str(path), f"STEP-{g.name.upper()}", {}, pins, witness=True)
                except Exception as exc:  # a variant this contraction refuses: say so, go on
                    print(f"{g.name:<5} {pins!s:<40} refused: {str(exc).splitlines()[0][:100]}")
                    continue
                nsets = sets_for(2 * (args.tokens * D + 2 * args.tokens * H + D * H))
                sets = [make_inputs(built.model, built.sizes, 100 + i) for i in range(nsets)]
                outs = [poisoned_outputs(built.model, built.sizes) for _ in range(nsets)]
                got = built.compiled(**sets[0], **outs[0])
                want = g.torch_product(sets[0]["A"].float(), sets[0]["W"].float(),
                                       sets[0]["T"].float() if g.t_axes else None)
                rel = float((got.float() - want).norm() / want.norm())
                ok = rel < 1e-2 and not bool(t.isnan(got).any())
                failed = failed or not ok
                k = built.plan.kernels[0]
                label = (f"{k.tile_m}x{k.tile_n}x{k.tile_k} s{k.stages}"
                         + (" pers" if k.persistent else "") + (f" c{k.cluster_m}" if k.cluster_m > 1 else "")
                         + (f" {pins}" if pins else ""))
                if not ok:
                    print(f"{g.name:<5} {label:<40} check FAILED: rel error {rel:.2e}")
                    continue
                us = time_cuda(lambda i, c=built.compiled, s=sets, o=outs: c(**s[i], **o[i]), nsets)["median_us"]
                if torch_us is None:
                    torch_us = time_cuda(lambda i, s=sets, g=g: g.torch_product(s[i]["A"], s[i]["W"], s[i].get("T"), True), nsets)["median_us"]
                print(f"{g.name:<5} {label:<40} {us:8.1f} {torch_us:8.1f} {torch_us / us:8.2f} "
                      f"{flops / us / 1e6:8.1f}  rel {rel:.1e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
