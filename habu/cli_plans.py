"""`habu plans ls|show|rm|export|import`: the plan database from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from habu.errors import HabuError

if TYPE_CHECKING:
    from habu.db import Entry, Key, Record
    from habu.spec.ir import Model
    from habu.spec.program import Program

DbOpt = Annotated[Path | None, typer.Option("--db", help="The plan database (default: $HABU_DB or the cache dir).")]

plans_app = typer.Typer(help="The plan database: list, show, remove, export and import tuned plans.",
                        no_args_is_help=True)


def output_console(stderr: bool = False):
    """A rich console; piped or redirected output gets wide lines instead of an 80-column wrap,
    so ids and plans stay on one line for grep and scripts."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=240)


def this_machine() -> dict[str, str]:
    """What a key made on this machine now would say: the GPU, the SM count and the versions."""
    from habu.emit_cuda.nvrtc import compiler_version
    from habu.gpu_info import device_info
    from habu.version import __version__

    info = device_info() or {}
    try:
        nvrtc = compiler_version()
    except Exception:
        nvrtc = "unavailable"
    return {"gpu": info.get("gpu", "none"), "sm_count": str(int(info.get("sm_count", 0))), "habu": __version__,
            "nvrtc": nvrtc, "driver": info.get("driver", "none")}


def staleness(entry: Entry, here: dict[str, str]) -> str:
    """'current', or why a lookup on this machine would not use the entry."""
    k = entry.key
    if k.digest() != entry.digest:
        return "CORRUPT: its key does not match its id (never used)"
    mine = {"gpu": k.target.gpu, "sm_count": str(k.target.sm_count), "habu": k.versions.habu,
            "nvrtc": k.versions.nvrtc, "driver": k.versions.driver}
    differ = [f"{name} {mine[name]}" for name in mine if mine[name] != here[name]]
    return "current" if not differ else "STALE: " + ", ".join(differ)


def existing_db(db: Path | None) -> Path | None:
    """The database a reading command opens, or None where there is none yet: reading never creates
    the file or its directories."""
    from habu.db import default_path

    path = Path(db) if db else default_path()
    return path if path.is_file() else None


def missing_db(db: Path | None) -> HabuError:
    from habu.db import default_path

    return HabuError(f"no plan database at {Path(db) if db else default_path()} (habu search creates it)")


@plans_app.command("ls")
def plans_ls(db: DbOpt = None) -> None:
    """Every entry: model, shape, GPU, versions, best time, and whether this machine would use it
    (STALE: made on another GPU or with other versions, which a lookup here never uses)."""
    import time

    from rich.table import Table

    from habu.db import PlanDB
    from habu.search.report import plan_summary

    path = existing_db(db)
    if path is None:
        import sys

        from habu.db import default_path

        print(f"no plan database at {Path(db) if db else default_path()}: nothing stored yet", file=sys.stderr)
        return
    problems: list[str] = []  # entries that cannot be read: listed as warnings, the others shown
    with PlanDB(path) as plans:
        entries = plans.entries(problems)
        table = Table(title=str(plans.path))
    here = this_machine()
    for col in ("id", "model", "shape", "target", "habu nvrtc driver", "best", "plan", "updated", "status"):
        table.add_column(col, no_wrap=col in ("id", "model", "shape"))
    for e in entries:
        best = e.records[0] if e.records else None
        why = unreadable_plan(best.plan) if best else None
        if why:
            problems.append(f"entry {e.digest[:12]}: its best plan is unreadable ({why}); remove it with habu plans rm")
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.updated))
        status = (f"{best.median_us:.1f} µs" if best and best.median_us else
                  ("unmeasured" if best else "failures only"))
        v = e.key.versions
        table.add_row(e.digest[:12], e.key.model, " ".join([*(f"{k}={v}" for k, v in e.key.shape),
                                                            *(f"{k}={lo}..{hi}" for k, lo, hi in e.key.ranges)]),
                      f"{e.key.target.arch} {e.key.target.gpu}", f"{v.habu} {v.nvrtc} {v.driver}",
                      status, plan_summary(best.plan) if best else "", when, staleness(e, here))
    output_console().print(table)
    import sys

    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)


def unreadable_plan(plan: object) -> str | None:
    """Why a stored plan cannot be read (not a plan, an unknown field or value), or None."""
    from habu.plan.plan import Plan

    try:
        Plan.from_json(plan, "the plan")
    except HabuError as err:
        return err.message
    return None


@plans_app.command("show")
def plans_show(entry: Annotated[str, typer.Argument(help="An entry id (or its start).")], db: DbOpt = None) -> None:
    """One entry: its key, its plans with timings and certificates, its failures."""
    import json
    from dataclasses import asdict

    from habu.db import PlanDB

    path = existing_db(db)
    if path is None:
        raise missing_db(db)
    with PlanDB(path) as plans:
        e = plans.find(entry)
    print(json.dumps({"id": e.digest, "key": asdict(e.key), "records": [asdict(r) for r in e.records],
                      "failures": e.failures}, indent=1))


@plans_app.command("rm")
def plans_rm(entry: Annotated[str, typer.Argument(help="An entry id (or its start).")], db: DbOpt = None) -> None:
    """Remove an entry."""
    from habu.db import PlanDB

    path = existing_db(db)
    if path is None:
        raise missing_db(db)
    with PlanDB(path) as plans:
        plans.find(entry)
        n = plans.remove(entry)
    print(f"removed {n} entr{'y' if n == 1 else 'ies'}")


@plans_app.command("export")
def plans_export(file: Annotated[Path, typer.Argument(help="The file to write (JSON).")],
                 entries: Annotated[list[str] | None, typer.Argument(help="Entry ids (default: all).")] = None,
                 db: DbOpt = None) -> None:
    """Write entries to a portable file a team can share."""
    from habu.cli_paths import output_file
    from habu.db import PlanDB

    output_file(file, "habu plans export", suffix=".json")
    path = existing_db(db)
    if path is None:
        raise missing_db(db)
    with PlanDB(path) as plans:
        n = plans.export(file, entries)
    print(f"exported {n} entries to {file}")


SourceOpt = Annotated[list[Path] | None, typer.Option(
    "--source", help="A .habu file defining the exported models (repeatable; default: each plan's recorded "
                     "source, where that file still defines its model). Every plan is proven again against it.")]


@plans_app.command("import")
def plans_import(file: Annotated[Path, typer.Argument(help="A file written by habu plans export.")],
                 source: SourceOpt = None, db: DbOpt = None) -> None:
    """Merge an exported file into the database (keeping the best plans of both), all or nothing:
    the file is checked against the export schema and every plan is proven again first."""
    from habu.db import PlanDB

    check = ImportCheck(file, list(source or []))
    with PlanDB(db) as plans:
        n = plans.import_(file, check)
    print(f"imported {n} entries into {plans.path}")


class ImportCheck:
    """Proves each imported plan again against its model, found in the .habu files given (or the
    one the plan's provenance names) by the key's model hash."""

    def __init__(self, export: Path, sources: list[Path]):
        self.export = export
        self.sources = sources
        self.programs: dict[Path, Program] = {}

    def _program(self, path: Path) -> Program:
        from habu.spec.parser import load_program

        if path not in self.programs:
            self.programs[path] = load_program(path)
        return self.programs[path]

    def model_for(self, key: Key, record: Record) -> Model | None:
        """The model, bound to the key's shape, whose canonical hash is the key's; None if no source has it."""
        from habu.compile import bind_shape

        recorded = record.provenance.get("source") if isinstance(record.provenance, dict) else None
        candidates = list(self.sources)
        if not candidates and isinstance(recorded, str) and Path(recorded).is_file():
            candidates.append(Path(recorded))
        for path in candidates:
            program = self._program(path)
            for m in program.models.values():
                try:
                    bound = bind_shape(m, dict(key.shape))
                except (HabuError, KeyError):
                    continue
                if bound.canonical_hash() == key.model_hash:
                    return bound
        return None

    def __call__(self, key: Key, record: Record) -> None:
        from habu.api import checked_plan

        where = f"{self.export}: {key.model} {' '.join(f'{k}={v}' for k, v in key.shape)}"
        model = self.model_for(key, record)
        if model is None:
            given = ", ".join(str(s) for s in self.sources) or "none given, and the plan's recorded source does not"
            raise HabuError(f"{where}: no .habu file defines its model (hash {key.model_hash[:12]}; --source: "
                            f"{given}); give the file with --source so its plans can be proven again")
        try:
            checked_plan(model, key, record)
        except HabuError as err:
            raise HabuError(f"{where}: refused: {err.message}", notes=err.notes) from None
        except Exception as exc:  # a plan crafted to crash the prover is refused like any bad plan
            raise HabuError(f"{where}: refused: its plan cannot be proven ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
