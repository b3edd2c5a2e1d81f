"""The Python API without a GPU: build proves and emits, and the kernels compile."""

from __future__ import annotations

import habu
from tests.conftest import ROOT


def test_build_compiles_every_member_for_the_target():
    model = habu.build(ROOT / "examples" / "ggemm.habu", target="sm_90a", trials=1, K=511, M=512, N=512)
    cubins = model.compile("sm_90a")
    assert len(cubins) == 1 and len(cubins[0]) == 3  # two staging passes and the contraction


def test_build_with_a_runtime_extent_gives_a_checked_set(tmp_path):
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    path = tmp_path / "runtime_k.habu"
    path.write_text(src)
    model = habu.build(path, target="sm_90a", trials=1, pins={"B": "tma"})
    members = model.kernel_set.members
    assert len(members) == 2 and members[0][0] and not members[1][0]
    assert model.kernel_set.index({"K": 512, "M": 4096, "N": 4096}) == 0
    assert model.kernel_set.index({"K": 511, "M": 4096, "N": 4096}) == 1
