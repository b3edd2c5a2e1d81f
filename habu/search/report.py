"""What a search shows: the live progress line, the table of top plans, the roofline plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from habu.db import Record
from habu.search.loop import Budget, SearchResult, Stats


def progress_text(stats: Stats, budget: Budget) -> str:
    if budget.seconds is not None:
        left = f"{max(0.0, budget.seconds - stats.elapsed):5.0f} s left"
    else:
        left = f"{max(0, (budget.trials or 0) - stats.verified - stats.pruned_field)} candidates left"
    best = f"{stats.best_us:.1f} µs" if stats.best_us else (
        f"~{stats.best_predicted_us:.1f} µs predicted" if stats.best_predicted_us else "—")
    roof = ""
    if stats.best_us and stats.roofline_us:
        roof = f" ({100 * stats.roofline_us / stats.best_us:.0f}% of roofline)"
    where = f"{stats.region}: " if stats.region else ""
    if stats.best_us and stats.baseline_us:
        roof += f" {stats.baseline_us / stats.best_us:.2f}× baseline"
    return (f"{stats.elapsed:5.0f}s ({left}) {where}gen {stats.generated} rules-pruned {stats.pruned_rules} "
            f"field-pruned {stats.pruned_field} verified {stats.verified} compiled {stats.compiled} "
            f"timed {stats.timed} failed {stats.failed}{f' slow {stats.refused_slow}' if stats.refused_slow else ''} "
            f"best {best}{roof}")


class Progress:
    """A one-line live display (rich) of the search's counters."""

    def __init__(self, budget: Budget, console: Console | None = None):
        self.budget = budget
        self.console = console or Console(stderr=True)
        self.live: Any = None
        self.last = 0.0

    def __enter__(self) -> Progress:
        from rich.live import Live

        if self.console.is_terminal:
            self.live = Live("", console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __call__(self, stats: Stats) -> None:
        text = progress_text(stats, self.budget)
        if self.live is not None:
            self.live.update(text)
        elif stats.elapsed - self.last >= 5.0:  # a log line every few seconds when not on a terminal
            self.last = stats.elapsed
            self.console.print(text, highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)


# the kernel fields plan_summary prints in its own words (any other field that tells two plans apart is
# printed as name=value by `distinguishing_fields`)
SUMMARISED = {
    "contraction": {"kind", "nodes", "mma", "tile_m", "tile_n", "tile_k", "stages", "a_move", "b_move", "split_k",
                    "split_reduce", "persistent", "group_m", "raster", "store", "cluster_m", "index_width"},
    "rows": {"kind", "nodes", "threads", "rows_per_block", "vector", "cache_row", "cluster", "prefetch"},
    "columns": {"kind", "nodes", "threads", "column_threads", "vector", "rows_per_split", "unroll"},
    "grouped": {"kind", "nodes", "bm", "bn", "bk", "warps_m", "warps_n", "index_width"},
    "attention": {"kind", "nodes", "bm", "bn", "index_width"},
    "general": {"kind", "nodes", "threads", "index_width"},
    "map": {"kind", "nodes", "threads", "vector"},
}


def distinguishing_fields(plans: list[dict]) -> list[set[str]]:
    """For each kernel position, the fields outside plan_summary's own words whose values differ among
    `plans` (kernels of one kind at that position): printed so that no two rows of a table read alike."""
    out: list[set[str]] = []
    for i in range(max((len(p["kernels"]) for p in plans), default=0)):
        kernels = [p["kernels"][i] for p in plans if i < len(p["kernels"])]
        names = set().union(*(k.keys() for k in kernels)) - set().union(*(SUMMARISED.get(k["kind"], set())
                                                                           for k in kernels))
        out.append({n for n in names if len({repr(k.get(n)) for k in kernels}) > 1})
    return out


def plan_summary(plan: dict, show: list[set[str]] | None = None) -> str:
    """One line naming a plan's choices; `show`: per kernel, further fields to print as name=value."""
    parts = []
    for i, k in enumerate(plan["kernels"]):
        if k["kind"] == "contraction":
            parts.append(f"{k['mma']} {k['tile_m']}x{k['tile_n']}x{k['tile_k']} s{k['stages']} A:{k['a_move']} "
                         f"B:{k['b_move']}" + (f" split{k['split_k']}" if k["split_k"] > 1 else "")
                         + (" in-cluster" if k["split_k"] > 1 and k.get("split_reduce") == "cluster" else "")
                         + (" persistent" if k["persistent"] else "") + f" g{k['group_m']}"
                         + (f" {k['raster']}-raster" if k.get("raster", "row") != "row" else "")
                         + (f" store:{k['store']}" if k.get("store", "direct") != "direct" else "")
                         + (f" cluster:{k['cluster_m']}" if k.get("cluster_m", 1) > 1 else "")
                         + ("" if k.get("index_width", 32) == 32 else f" i{k['index_width']}"))
        elif k["kind"] == "rows":
            parts.append(f"rows {k['threads']}x{k['rows_per_block']} v{k['vector']}"
                         + (" cached" if k["cache_row"] else "")
                         + (f" cluster:{k['cluster']}" if k.get("cluster", 1) > 1 else "")
                         + (" prefetch" if k.get("prefetch") else ""))
        elif k["kind"] == "columns":
            parts.append(f"columns {k['threads']}t/{k['column_threads']}c v{k['vector']} "
                         f"split{k['rows_per_split']} u{k['unroll']}")
        elif k["kind"] == "grouped":
            parts.append(f"grouped {k['bm']}x{k['bn']}x{k['bk']} w{k['warps_m']}x{k['warps_n']}"
                         + ("" if k.get("index_width", 32) == 32 else f" i{k['index_width']}"))
        elif k["kind"] == "attention":
            parts.append(f"attention {k['bm']}x{k['bn']} (fused)"
                         + ("" if k.get("index_width", 32) == 32 else f" i{k['index_width']}"))
        elif k["kind"] == "general":
            parts.append(f"general {k['threads']}" + ("" if k.get("index_width", 32) == 32 else f" i{k['index_width']}"))
        else:
            parts.append(f"map {k['threads']} v{k['vector']}")
        if show and i < len(show):
            parts[-1] += "".join(f" {n}={_value(k.get(n))}" for n in sorted(show[i]) if n in k)
    rewrites = plan.get("rewrites") or []
    # no square brackets: the table is rich text, where "[factor:Y]" would be read as markup
    return (", ".join(rewrites) + " → " if rewrites else "") + "; ".join(parts)


def _value(v: object) -> str:
    return {True: "1", False: "0", None: "-"}.get(v, str(v)) if isinstance(v, bool | None) else str(v)


def top_table(records: list[Record], roofline_us: float | None, baseline_us: float | None = None) -> Table:
    table = Table(title="best plans")
    show = distinguishing_fields([r.plan for r in records])
    for col in ("#", "plan", "status", "median µs", "p20–p80 µs", "predicted µs", "% of roofline", "× baseline", "key"):
        table.add_column(col)
    for r in records:
        from habu.plan.plan import Plan

        pct = f"{100 * roofline_us / r.median_us:.0f}%" if roofline_us and r.median_us else "—"
        table.add_row(str(r.rank + 1), plan_summary(r.plan, show), r.status,
                      f"{r.median_us:.1f}" if r.median_us else "—",
                      f"{r.p20_us:.1f}–{r.p80_us:.1f}" if r.p20_us and r.p80_us else "—",
                      f"{r.predicted_us:.1f}" if r.predicted_us else "—", pct,
                      f"{baseline_us / r.median_us:.2f}×" if baseline_us and r.median_us else "—",
                      Plan.from_json(r.plan).key)
    return table


def roofline_plot(result: SearchResult, path: Path, peak_flops: float, bandwidth: float) -> Path | None:
    """Every timed candidate on the roofline (achieved FLOP/s against arithmetic intensity)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = [(t["flops"] / max(1.0, t["bytes"]), t["flops"] / (t["median_us"] * 1e-6)) for t in result.timeline
           if t.get("median_us")]
    fig, ax = plt.subplots(figsize=(7, 5))
    if pts:
        xs = [p[0] for p in pts]
        lo, hi = min(xs) / 4, max(xs) * 4
    else:
        lo, hi = 0.1, 1e4
    import numpy as np

    x = np.logspace(np.log10(max(lo, 1e-3)), np.log10(hi), 200)
    ax.loglog(x, np.minimum(peak_flops, x * bandwidth), "k-", label="roofline")
    if pts:
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o", alpha=0.6, label="timed candidates")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{result.key.model} on {result.key.target.gpu}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def time_account(stats) -> str:
    """One line on where the search's time went: each proof step summed over the workers, the GPU's
    time per plan, and how long the driver waited for each side (the side it waits for is the
    bottleneck)."""
    spent = stats.spent
    parts = []
    steps = [(k.removeprefix("proof "), v) for k, v in spent.items() if k.startswith("proof ")]
    if steps:
        field_note = (f" ({stats.field_checks} checks, {stats.field_shared} plans sharing one)"
                      if stats.field_shared else "")
        parts.append("proofs " + ", ".join(f"{name} {v:.1f} s" + (field_note if name == "field" else "")
                                           for name, v in steps) + " in all")
    gpu = [(k.removeprefix("gpu "), v) for k, v in spent.items() if k.startswith("gpu ") and k != "gpu actor"]
    if gpu and stats.compiled:
        per = sum(v for _, v in gpu) / stats.compiled
        parts.append(f"GPU {per * 1e3:.0f} ms a plan (" + ", ".join(f"{n} {v:.1f} s" for n, v in gpu) + ")")
    waits = [(k.removeprefix("driver waits for "), v) for k, v in spent.items() if k.startswith("driver waits")]
    if waits:
        parts.append("the driver waited " + ", ".join(f"{v:.1f} s for {n}" for n, v in waits))
    return "; ".join(parts) if parts else "nothing recorded"


CANDIDATE_COLUMNS = ("seconds_in", "region", "plan_key", "plan", "predicted_us", "median_us", "p20_us", "p80_us",
                     "gflop", "mbytes")


def write_candidates(result: SearchResult, path: Path) -> Path:
    """Every candidate the search timed, in the order it was timed: when, which region it tuned, the
    plan, the cost model's prediction and the measurement (a spreadsheet's or pandas' input)."""
    import csv

    from habu.plan.plan import Plan

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CANDIDATE_COLUMNS)
        for t in result.timeline:
            if t.get("median_us") is None or "plan" not in t:
                continue
            out.writerow([f"{t['t']:.3f}", t["region"], Plan.from_json(t["plan"]).key, plan_summary(t["plan"]),
                          f"{t['predicted_us']:.1f}", f"{t['median_us']:.2f}", f"{t['p20_us']:.2f}",
                          f"{t['p80_us']:.2f}", f"{t['flops'] / 1e9:.3f}", f"{t['bytes'] / 1e6:.3f}"])
    return path

