"""Training cost arithmetic and the Pareto set over (wall time, cost, GPU count)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.studies.costing import PlanPoint, cost_plans, pareto_front, training_cost
from planner.errors import InputError


def test_training_cost_by_hand():
    # 1e12 tokens at 1e6 tokens/s = 1e6 s compute; goodput 0.8 -> 1.25e6 s wall
    # 1024 GPUs * 1.25e6 s / 3600 = 355,555.6 GPU-h; at 2.5 per GPU-hour = 888,888.9
    c = training_cost(1e12, 1e6, 1024, 2.5, goodput_fraction=0.8)
    assert c.compute_time_s == pytest.approx(1e6)
    assert c.wall_time_s == pytest.approx(1.25e6)
    assert c.gpu_hours == pytest.approx(355_555.5556, rel=1e-9)
    assert c.cost == pytest.approx(888_888.8889, rel=1e-9)


def test_training_cost_default_goodput_is_one():
    c = training_cost(3.6e9, 1e6, 8, 2.0)
    assert c.wall_time_s == pytest.approx(3600.0)
    assert c.gpu_hours == pytest.approx(8.0)
    assert c.cost == pytest.approx(16.0)


def test_pareto_hand_example():
    # 3.6e9 tokens at 2 per GPU-hour; every point runs 1e6 tokens per step.
    pts = [
        PlanPoint(8, 1.0, 1e6, label="A"),  # wall 1.0 h, 8 GPU-h, cost 16
        PlanPoint(16, 0.5, 1e6, label="B"),  # wall 0.5 h, 8 GPU-h, cost 16   (faster, more GPUs)
        PlanPoint(16, 0.6, 1e6, label="C"),  # wall 0.6 h, 9.6 GPU-h, cost 19.2 -> dominated by B
        PlanPoint(32, 0.3, 1e6, label="D"),  # wall 0.3 h, 9.6 GPU-h, cost 19.2 (fastest)
        PlanPoint(8, 1.0, 1e6, 0.5, "E"),  # wall 2.0 h, 16 GPU-h, cost 32   -> dominated by A
        PlanPoint(4, 2.5, 1e6, label="F"),  # wall 2.5 h, 10 GPU-h, cost 20   (fewest GPUs)
        PlanPoint(8, 1.0, 1e6, label="G"),  # identical to A: neither dominates, both kept
    ]
    front = pareto_front(pts, 3.6e9, 2.0)
    assert [c.point.label for c in front] == ["D", "B", "A", "G", "F"]
    by_label = {c.point.label: c for c in cost_plans(pts, 3.6e9, 2.0)}
    assert by_label["C"].cost.cost == pytest.approx(19.2)
    assert by_label["E"].cost.wall_time_s == pytest.approx(7200.0)
    assert by_label["F"].cost.gpu_hours == pytest.approx(10.0)


def test_pareto_accepts_tuples_and_mappings():
    pts = [(8, 1.0, 1e6), {"n_gpus": 16, "step_time_s": 0.6, "tokens_per_step": 1e6}, (16, 0.5, 1e6, 1.0, "B")]
    front = pareto_front(pts, 3.6e9, 2.0)
    assert [(c.point.n_gpus, c.point.step_time_s) for c in front] == [(16, 0.5), (8, 1.0)]


def test_pareto_matches_brute_force():
    rng = np.random.default_rng(0)
    pts = [PlanPoint(int(g), float(t), 4e6, float(gp)) for g, t, gp in
           zip(rng.choice([8, 16, 64, 256, 1024], 200), rng.uniform(0.5, 20.0, 200), rng.uniform(0.7, 1.0, 200))]
    costed = cost_plans(pts, 1e11, 3.0)
    obj = [(c.cost.wall_time_s, c.cost.cost, c.point.n_gpus) for c in costed]
    brute = {i for i, a in enumerate(obj)
             if not any(all(x <= y for x, y in zip(b, a)) and b != a for b in obj)}
    front = pareto_front(pts, 1e11, 3.0)
    assert {costed.index(c) for c in front} == brute
    assert pareto_front([], 1e11, 3.0) == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: training_cost(1e9, 0.0, 8, 1.0),
        lambda: training_cost(1e9, 1e5, 0, 1.0),
        lambda: training_cost(1e9, 1e5, 8, -1.0),
        lambda: training_cost(1e9, 1e5, 8, 1.0, goodput_fraction=1.2),
        lambda: training_cost(float("inf"), 1e5, 8, 1.0),
        lambda: pareto_front([(8, -1.0, 1e6)], 1e9, 1.0),
        lambda: pareto_front([(8, 1.0)], 1e9, 1.0),
        lambda: pareto_front([{"gpus": 8}], 1e9, 1.0),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(InputError):
        call()
