#!/usr/bin/env python3
"""Render the cloud launcher config and the KubeRay manifest from cluster/config.env.

    python cluster/render.py                 # writes cluster/generated/*.yaml
    python cluster/render.py --out DIR       # elsewhere
    HABU_GPU_WORKERS_MAX=8 python cluster/render.py   # any setting overridden from the environment

config.env is plain `NAME=${NAME:-default}  # comment` lines (bash sources the same file), so a
setting has one home whichever way the pool is started.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)=\$\{(?P=name):-(?P<default>[^}]*)\}\s*(#.*)?$")


class ConfigError(Exception):
    pass


def read_config(path: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every setting of config.env: the environment's value when set, else the file's default."""
    env = os.environ if environ is None else environ
    settings: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m is None:
            raise ConfigError(f"{path}:{n}:1: error: expected NAME=${{NAME:-default}}, got: {raw}")
        default = m["default"].strip().strip('"')
        settings[m["name"]] = env.get(m["name"]) or default
    return settings


def render(template: Path, settings: dict[str, str]) -> str:
    try:
        return Template(template.read_text()).substitute(settings)
    except KeyError as exc:
        raise ConfigError(f"{template}: error: ${{{exc.args[0]}}} is not set in config.env") from None
    except ValueError as exc:
        raise ConfigError(f"{template}: error: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=HERE / "config.env")
    ap.add_argument("--out", type=Path, default=HERE / "generated")
    args = ap.parse_args(argv)
    try:
        settings = read_config(args.config)
        args.out.mkdir(parents=True, exist_ok=True)
        for template in sorted((HERE / "templates").glob("*.yaml")):
            target = args.out / template.name
            target.write_text(render(template, settings))
            print(f"wrote {target}")
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
