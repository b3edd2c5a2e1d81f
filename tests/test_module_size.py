"""Small modules with one job: no module of the habu package is over 600 lines (issue 18, "no module
over ~600 lines"); a module that grows past it is split by what its parts do."""

from __future__ import annotations

from pathlib import Path

MAX_LINES = 600
PACKAGE = Path(__file__).resolve().parent.parent / "habu"


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_under_habu_is_over_600_lines():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the package itself, not an empty folder
    over = {str(p.relative_to(PACKAGE.parent)): n for p in modules if (n := lines_of(p)) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
