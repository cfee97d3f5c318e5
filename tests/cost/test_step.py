"""The step assembly's schedule forms (planner.cost.step): hand-computed bubbles for every
schedule, the estimate's bubble on a real configuration, and the forms' rules (ZB-H2's warm-up,
W capped at F)."""

from __future__ import annotations

import pytest

from planner import Job, ParallelConfig, estimate, load_model, make_cluster
from planner.cost.step import SCHEDULE_FORMS, assemble, pipeline_form, pipeline_time


@pytest.mark.parametrize("schedule,v,expect", [
    # p = 4 equal stages, per micro-batch F = 1, B = 1, W = 1 (t = 3), m = 8 micro-batches
    ("1f1b", 1, 3 * 3),              # (p-1)(F+B+W)
    ("gpipe", 1, 3 * 3),
    ("interleaved", 2, 3 * 3 / 2),   # (p-1) t / v
    ("zb-h1", 1, 3 * (1 + 1 - 1)),   # (p-1)(F+B-W)
    ("zb-h2", 1, 0.0),               # (p-1)(F+B-2W)
    ("zb-v", 2, 0.0),                # (p-1)(F+B-2W)/2
    ("dualpipe", 2, 3 * (1 + 2 - 1) / 2),  # (p-1)(F+2B-W)/2
])
def test_hand_computed_bubbles(schedule, v, expect):
    p, m = 4, 8
    got = pipeline_time([3.0] * p, [1.0] * p, [1.0] * p, m, pipeline_form(schedule, m, v, p)) - m * 3.0
    assert got == pytest.approx(expect)


def test_unequal_stages_and_clamp():
    # ZB-H1 with t = (3, 4), w = (1, 1.5): bubble = (7 - 4) - 2 (2.5 - 1.5) = 1
    assert pipeline_time([3.0, 4.0], [1.0, 1.5], [1.0, 1.2], 8, pipeline_form("zb-h1", 8, 1, 2)) == pytest.approx(32 + 1)
    # ZB-H2 would go negative with W > (F + B)/2: the bubble stops at zero
    assert pipeline_time([3.0, 3.0], [1.4, 1.4], [0.8, 0.8], 8, pipeline_form("zb-h2", 8, 1, 2)) == pytest.approx(24.0)


def test_zb_h2_needs_its_warm_up():
    assert pipeline_form("zb-h2", 7, 1, 4) == pipeline_form("zb-h2", 8, 1, 4) != pipeline_form("zb-h1", 8, 1, 4)
    assert pipeline_form("zb-h2", 6, 1, 4) == pipeline_form("zb-h1", 6, 1, 4)


def test_unknown_schedule():
    with pytest.raises(ValueError):
        pipeline_form("zb-h3", 8, 1, 4)
    assert set(SCHEDULE_FORMS) == {"1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe"}


def test_assemble_reports_the_bubble():
    parts = assemble([3.0, 3.0], [0.5, 0.2], [0.1, 0.3], m=8, v=1, schedule="zb-h1", extra_s=0.01,
                     stage_w=[1.0, 1.0], stage_f=[1.0, 1.0])
    assert parts.bubble_s == pytest.approx(3.0 - 2.0)
    assert parts.step_s == pytest.approx(24 + 1 + 0.5 + 0.3 + 0.01)


def test_estimate_orders_the_schedules():
    """On one pp = 8 configuration of the Zero Bubble fork, the schedules rank as the paper's
    Table 1 says: 1F1B > ZB-H1 > ZB-H2 bubble, ZB-V below ZB-H1."""
    model, job = load_model("llama2-7b"), Job(seq_len=4096, global_batch_size=128)  # m = 16 >= 2p - 1
    cluster = make_cluster("h100-sxm5-80gb", 64)
    base = dict(tp=1, pp=8, dp=8, micro_batch_size=1)
    bub = {}
    for schedule, v in (("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2)):
        e = estimate(model, cluster, job, ParallelConfig(**base, schedule=schedule, vpp=v), engine="megatron-zb")
        bub[schedule] = e.time_breakdown_s["bubble_s"]
    assert bub["1f1b"] > bub["zb-h1"] > bub["zb-h2"] >= 0
    assert bub["zb-v"] < bub["zb-h1"]
