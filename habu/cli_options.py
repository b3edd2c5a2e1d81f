"""The options the `habu` commands share, and the --shape parser."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from habu.errors import UsageError
from habu.targets import TARGETS

FileArg = Annotated[Path, typer.Argument(help="A .habu file.", show_default=False)]
ShapeOpt = Annotated[list[str] | None, typer.Option(
    "--shape", help="Extent sizes, e.g. K=511,M=256 (the option may be repeated: --shape K=511 --shape M=256).")]


def extents_of(model, sizes: dict[str, int]) -> dict[str, int]:
    """The sizes of `sizes` that `model` has: a derived backward model keeps only the forward's extents it reads
    (a histogram's gradient has no #R), and a --shape written for the forward model holds for it."""
    names = {e.name for e in model.extents}
    return {k: v for k, v in sizes.items() if k in names}


def parse_shape(text: str | list[str] | None, known: list[str] | None = None) -> dict[str, int]:
    """`K=511,M=256` (or `#K=511`) into {'K': 511, 'M': 256}; a list holds the values of a repeated
    --shape, read as one comma-separated text (an extent given twice is an error)."""
    sizes: dict[str, int] = {}
    if not text:
        return sizes
    if not isinstance(text, str):
        text = ",".join(text)
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lstrip("#")
        if not sep or not name or not value.strip().lstrip("-").isdigit():
            raise UsageError(f"--shape takes NAME=SIZE pairs separated by commas, got {part!r}")
        n = int(value)
        if n < 1 or n > 2**40:
            raise UsageError(f"--shape {name}={n}: a size must be between 1 and 2^40")
        if known is not None:
            match = [k for k in known if k == name] or [k for k in known if k.lower() == name.lower()]
            if not match:
                raise UsageError(f"--shape names extent #{name}, which the model does not have "
                                 f"(it has {', '.join('#' + k for k in known)})")
            name = match[0]
        if name in sizes:
            raise UsageError(f"--shape gives #{name} twice ({name}={sizes[name]} and {name}={n})")
        sizes[name] = n
    return sizes


TargetOpt = Annotated[str, typer.Option("--target", help=f"GPU target: {', '.join(TARGETS)} (habu/targets/).")]
# compile and emit build for this machine's GPU by default, as search does (sm_90a where there is none)
MachineTargetOpt = Annotated[str | None, typer.Option(
    "--target", help=f"GPU target: {', '.join(TARGETS)} (habu/targets/); default: this machine's GPU, else sm_90a.")]
PinOpt = Annotated[list[str] | None, typer.Option("--pin", help="Fix a plan choice: tile=128x128x64, mma=wgmma, "
                                                                 "stages=4, B=tma, A=cp.async, split_k=2, rewrite=factor:Y, ...")]
