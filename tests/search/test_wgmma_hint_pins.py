"""A wgmma loop's choice (the L2 hints, the consumer lag, the early epilogue loads, the next kernel's warm-up)
pinned where no contraction runs that loop is refused with the target, not recorded in a plan that ignores it."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.search.space import WGMMA_HINTS, default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

GEMM = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"].with_sizes({"M": 512, "N": 512, "K": 512})


@pytest.mark.parametrize("key", WGMMA_HINTS)
def test_regression_a_wgmma_choice_pinned_on_sm80_is_refused_naming_the_loop(key):
    """`--pin stream_b=true` (and `keep_operands`) on sm_80 compiled an mma.sync plan that recorded the choice and
    printed no hint (found in session 60, refused in session 61)."""
    value = "1" if key in ("consumer_lag", "lag", "warm_next") else "true"
    with pytest.raises(UsageError, match=rf"--pin {key}={value}: a choice of the wgmma loop.*on sm_80: mma\.sync"):
        default_plan(GEMM, TARGETS["sm_80"], {}, {key: value})


def test_the_same_choice_off_is_harmless_and_on_sm90a_it_is_taken():
    assert default_plan(GEMM, TARGETS["sm_80"], {}, {"stream_b": "false"}).kernels[0].mma == "mma.sync"
    with pytest.raises(UsageError, match=r"on sm_90a: mma\.sync"):
        default_plan(GEMM, TARGETS["sm_90a"], {}, {"mma": "mma.sync", "keep_operands": "true"})
    assert default_plan(GEMM, TARGETS["sm_90a"], {}, {"stream_b": "true"}).kernels[0].stream_b
