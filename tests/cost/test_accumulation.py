"""planner.cost.accumulation: a step of several pipeline flushes (torchtitan's gradient
accumulation around the schedule)."""

from __future__ import annotations

import planner
from planner.cost.accumulation import ONCE_PER_STEP, repeat_flushes


def _one(gbs: int):
    m, c = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 16)
    return planner.estimate(m, c, planner.Job(8192, gbs), planner.ParallelConfig(tp=2, pp=4), engine="torchtitan")


def test_flushes_repeat_all_but_the_once_per_step_parts():
    one = _one(4)  # dp 2, mb 1: 2 micro-batches per flush
    rep = repeat_flushes(one, 8)
    once = sum(one.time_breakdown_s[k] for k in ONCE_PER_STEP)
    assert rep.step_time_s == 8 * (one.step_time_s - once) + once
    assert rep.time_breakdown_s["bubble_s"] == 8 * one.time_breakdown_s["bubble_s"]
    assert rep.time_breakdown_s["optimizer_s"] == one.time_breakdown_s["optimizer_s"]
    assert abs(sum(rep.time_breakdown_s.values()) - rep.step_time_s) < 1e-9 * rep.step_time_s
    assert rep.num_microbatches == 8 * one.num_microbatches and rep.memory_peak_bytes == one.memory_peak_bytes
    # 8 flushes of 2 micro-batches: the same tokens as one pipeline of 16, and slower (8 bubbles)
    whole = _one(32)
    assert abs(rep.tokens_per_s * rep.step_time_s - whole.tokens_per_s * whole.step_time_s) < 1e-6 * whole.tokens_per_s
    assert rep.step_time_s > 1.5 * whole.step_time_s and rep.mfu < whole.mfu  # (2 + 3) x 8 = 40 stage-slots against 16 + 3
    assert abs(rep.mfu / whole.mfu - whole.step_time_s / rep.step_time_s) < 1e-9
    assert repeat_flushes(one, 1) is one
