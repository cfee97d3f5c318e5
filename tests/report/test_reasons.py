"""The plan table says why: the bound column names the largest exposed term with its share,
and the top plan carries one line on what it trades against the runner-up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import planner
from planner.report.reasons import bound_label, knob_changes, recommendation, step_terms
from planner.specs import ParallelConfig

GIB = 2**30
ZERO = {k: 0.0 for k in ("compute_s", "recompute_s", "tp_comm_exposed_s", "cp_comm_exposed_s", "ep_comm_exposed_s",
                         "pp_comm_exposed_s", "bubble_s", "dp_comm_exposed_s", "optimizer_s", "embedding_sync_s", "overhead_s")}
COMM = [{"kind": "tp", "link": "nvswitch"}, {"kind": "pp", "link": "infiniband:network"},
        {"kind": "dp", "link": "infiniband:network"}, {"kind": "cp", "link": "nvswitch"}, {"kind": "ep", "link": "nvswitch"}]


def est(mem_gib: float = 60.0, fits: bool = True, **terms) -> SimpleNamespace:
    b = {**ZERO, **terms}
    return SimpleNamespace(time_breakdown_s=b, comm=COMM, step_time_s=sum(b.values()), fits=fits,
                           memory_peak_bytes=mem_gib * GIB, memory_capacity_bytes=80 * GIB)


def plan(rank, e, **par):
    return SimpleNamespace(rank=rank, estimate=e, parallel=ParallelConfig(**{"tp": 4, "pp": 4, "dp": 4, "vpp": 1,
                                                                              "recompute": "none", "zero": 1, **par}))


def test_bound_names_the_largest_term_with_its_share_and_the_network():
    assert bound_label(est(compute_s=7.1, bubble_s=1.8, dp_comm_exposed_s=0.9, overhead_s=0.2)) == "compute 71%"
    assert bound_label(est(compute_s=1.0, bubble_s=8.0, overhead_s=1.0)) == "bubble 80%"
    assert bound_label(est(compute_s=4.0, dp_comm_exposed_s=5.0, overhead_s=1.0)) == "dp ib 50%"
    # TP on the NVSwitch domain names only the kind; compute and recompute are one term
    assert bound_label(est(compute_s=2.0, tp_comm_exposed_s=5.0, recompute_s=1.0)) == "tp 62%"
    assert bound_label(est(compute_s=3.0, recompute_s=3.0, tp_comm_exposed_s=4.0)) == "compute 60%"
    assert bound_label(est(fits=False, compute_s=1.0)) == "memory!"


def test_step_terms_add_up_to_the_step():
    e = est(compute_s=3.0, recompute_s=1.0, tp_comm_exposed_s=0.5, bubble_s=0.25, overhead_s=0.02)
    assert sum(t for _, t, _ in step_terms(e)) == pytest.approx(e.step_time_s)
    assert step_terms(e)[0][0] == "compute"


def test_recommendation_says_what_the_top_plan_trades():
    p1 = plan(1, est(mem_gib=66.0, compute_s=10.0, tp_comm_exposed_s=0.2, bubble_s=0.3), tp=4, dp=8)
    p2 = plan(2, est(mem_gib=63.0, compute_s=10.0, tp_comm_exposed_s=0.5, bubble_s=0.15), tp=8, dp=4)
    line = recommendation([p1, p2])
    assert line.startswith("recommended: #1 is 1.4% faster than #2 (tp 4 vs 8, dp 8 vs 4)")
    assert "less exposed TP comm (-300 ms)" in line and "a larger pipeline bubble (+150 ms)" in line
    assert "3.0 GiB more memory" in line
    assert "within 1%" not in line


def test_recommendation_calls_a_tie_a_tie():
    p1 = plan(1, est(mem_gib=60.0, compute_s=10.0, bubble_s=0.100), vpp=3)
    p2 = plan(2, est(mem_gib=62.5, compute_s=10.0, bubble_s=0.105), vpp=2)
    line = recommendation([p1, p2])
    assert "ties with #2 (vpp 3 vs 2, 0.05% apart)" in line and "2.5 GiB less memory" in line
    assert "1 other plan within 1% of #1" in line  # #1 itself is not counted
    assert recommendation([p1]).startswith("recommended: #1, the only plan")


def test_knob_changes_fall_back_to_the_layer_split():
    a = ParallelConfig(tp=4, pp=2, dp=1, layers_per_stage=(15, 17))
    b = ParallelConfig(tp=4, pp=2, dp=1, layers_per_stage=(16, 16))
    assert knob_changes(a, b) == ["layer split 15/17 vs 16/16"]
    assert knob_changes(ParallelConfig(sequence_parallel=True), ParallelConfig(sequence_parallel=False)) == ["sp on vs off"]


def test_real_plans_get_a_reason_and_a_varied_bound():
    m = planner.load_model("llama3.1-8b")
    r = planner.plan(m, planner.make_cluster("h100-sxm5-80gb", 16), planner.Job(8192, 32), top_k=3)
    line = recommendation(r.plans)
    assert line.startswith("recommended: #1 ")
    for p in r.plans:
        name, share = bound_label(p.estimate).rsplit(" ", 1)
        assert share.endswith("%") and 0 < int(share[:-1]) <= 100


def test_a_term_the_cost_model_adds_later_still_counts():
    e = est(compute_s=1.0)
    e.time_breakdown_s["new_thing_exposed_s"] = 3.0
    e.step_time_s = 4.0
    assert bound_label(e) == "new thing 75%"
    assert sum(t for _, t, _ in step_terms(e)) == pytest.approx(4.0)
