"""The layer contract: spec -> plan -> lower -> prove -> emit_cuda -> paths -> timing -> search -> cluster
-> compile/api/cli, nothing importing upward (pyproject's [tool.importlinter], checked by import-linter,
which sees imports inside functions too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_module_imports_a_layer_above_its_own():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("lint-imports is not installed (pip install -e '.[dev]')")
    done = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout
