"""The search's closing lines: where the time went."""

from __future__ import annotations

from habu.search.loop import Stats
from habu.search.report import time_account


def test_time_account_names_each_step_and_the_driver_waits():
    st = Stats(verified=10, compiled=4)
    for what, s in [("proof rules", 0.5), ("proof field", 1.25), ("proof compile", 6.0), ("gpu load", 0.04),
                    ("gpu check", 0.06), ("gpu time", 0.3), ("gpu actor", 0.5),
                    ("driver waits for proofs", 2.0), ("driver waits for GPUs", 0.3)]:
        st.add(what, s)
    st.add("proof field", 0.25)  # summed
    line = time_account(st)
    assert "proofs rules 0.5 s, field 1.5 s, compile 6.0 s in all" in line
    assert "GPU 100 ms a plan (load 0.0 s, check 0.1 s, time 0.3 s)" in line
    assert "the driver waited 2.0 s for proofs, 0.3 s for GPUs" in line


def test_time_account_without_records_says_so():
    assert time_account(Stats()) == "nothing recorded"
    st = Stats()
    st.add("gpu time", None)  # a step that did not happen adds nothing
    assert st.spent == {}



def test_time_account_says_how_many_plans_shared_a_field_check():
    st = Stats(verified=8, field_checks=3, field_shared=5)
    st.add("proof field", 1.0)
    assert "field 1.0 s (3 checks, 5 plans sharing one) in all" in time_account(st)


def test_the_plan_summary_names_a_cluster_and_leaves_out_the_defaults():
    from habu.search.report import plan_summary
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    one = default_plan(m, TARGETS["sm_90a"], None, {"store": "direct"})
    two = default_plan(m, TARGETS["sm_90a"], None, {"cluster": "2", "persistent": "true"})
    assert "cluster" not in plan_summary(one.to_json()) and "store" not in plan_summary(one.to_json())
    assert plan_summary(two.to_json()).endswith("store:tma cluster:2")


def test_the_plan_summary_names_a_row_cluster_and_a_prefetch():
    from habu.search.report import plan_summary
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    plain = plan_summary(default_plan(m.with_sizes({"C": 16384}), TARGETS["sm_90a"], {"C": 16384}).to_json())
    long = plan_summary(default_plan(m.with_sizes({"C": 131072}), TARGETS["sm_90a"], {"C": 131072}).to_json())
    ahead = plan_summary(default_plan(m.with_sizes({"C": 32768}), TARGETS["sm_90a"], {"C": 32768}).to_json())
    assert plain == "rows 512x1 v8 cached" and long.endswith("cluster:4") and ahead.endswith("prefetch")


def test_regression_a_general_kernel_crashed_the_search_report():
    """`habu search` on a model with a general kernel (bmm, a scatter) raised KeyError: 'vector' while
    printing its table: the summary read a map kernel's fields."""
    from habu.search.report import plan_summary
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    model = load_program(ROOT / "examples" / "scatter_add.habu").models["UNPERMUTE"]
    plan = default_plan(model, TARGETS["sm_90a"], {}, {})
    assert plan_summary(plan.to_json()) == f"general {plan.kernels[0].threads}"


def test_regression_the_best_plans_table_printed_three_different_plans_alike():
    """`habu search examples/ggemm.habu --shape M=64` printed ranks 1, 2 and 5 as the same line ("wgmma
    128x64x64 s6 A:cp.async B:tma g8 store:tma"): they differed in b_ahead and warps, which the summary never
    names. A table now prints every other field that tells its rows apart, as name=value."""
    from rich.console import Console

    from habu.db import Record
    from habu.search.report import plan_summary, top_table
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    sizes = {"M": 64, "N": 4096, "K": 4096}
    base = default_plan(model.with_sizes(sizes), TARGETS["sm_90a"], sizes, {"mma": "wgmma"}).to_json()
    plans = []
    for change in ({"b_ahead": False, "warps": 12}, {"b_ahead": True, "warps": 12}, {"b_ahead": False, "warps": 8}):
        p = {**base, "kernels": [{**base["kernels"][0], **change}]}
        plans.append(p)
    assert len({plan_summary(p) for p in plans}) == 1  # the summary alone reads alike
    records = [Record(plan=p, status="unmeasured", rank=i) for i, p in enumerate(plans)]
    console = Console(width=400, record=True)
    console.print(top_table(records, None))
    text = console.export_text()
    assert "b_ahead=0 warps=12" in text and "b_ahead=1 warps=12" in text and "b_ahead=0 warps=8" in text
