"""Does the planner rank configurations the way the hardware does? vTrain's multi-node
Megatron-DeepSpeed runs (shared/validation/vtrain_multi_runs.json, VTRAIN.md): four models,
each measured in many (tp, pp, dp, micro-batch) configurations on the same A100 cluster.

Per model: the configuration predicted fastest is within 5% of the measured fastest, and
the Spearman rank correlation of predicted and measured step times is >= 0.8.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import dataset_path  # noqa: E402

RUNS = dataset_path("vtrain-multi")

# Measured 2026-11-30 (Spearman, best-pick gap), after legacy engines stopped overlapping the
# gradient all-reduce with the backward.
XFAIL = {
    "18.4B": "Spearman 0.786 < 0.8 (best-pick gap 4.5%): tp4-pp2 rows predicted 10-14% fast "
             "(predicted fastest, measured 3rd), tp16 (across nodes) 15% fast",
    "39.1B": "Spearman 0.637 < 0.8: tp2 with pp8/pp16 measured 20-35% slower than predicted "
             "(e.g. tp2-pp16-dp16-mb2 23.75 s measured vs 15.6 s), tp4-pp8 mb2-4 9-15% fast",
}
GROUPS = ["3.6B", "18.4B", "39.1B", "175B"]


def _spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr  # noqa: PLC0415

    return float(spearmanr(x, y).correlation)


@pytest.fixture(scope="module")
def groups() -> dict:
    from planner.io.loaders import load_runs  # noqa: PLC0415
    from planner.calibration.validate import validate_runs  # noqa: PLC0415

    out = defaultdict(list)
    results, refused = validate_runs(load_runs(RUNS), median=False)
    assert not refused
    for r in results:
        size = re.search(r"-(\d+(?:\.\d+)?B)-", r.id).group(1)
        out[size].append(r)
    return out


def test_groups_present(groups):
    assert sorted(groups) == sorted(GROUPS)
    assert {k: len(v) for k, v in groups.items()} == {"3.6B": 26, "18.4B": 15, "39.1B": 47, "175B": 21}


@pytest.mark.parametrize("size", [
    pytest.param(g, marks=pytest.mark.xfail(reason=XFAIL[g], strict=True)) if g in XFAIL else g for g in GROUPS
])
def test_ranking(groups, size):
    rs = groups[size]
    pred = [r.estimate.step_time_s for r in rs]
    meas = [r.measured_step_time_s for r in rs]
    # The fixed fields of each row are what was run: tp, pp, dp, micro-batch, full recompute, no vpp.
    for r in rs:
        assert r.parallel.recompute == "full" and r.parallel.vpp == 1
    picked = min(rs, key=lambda r: (r.estimate.step_time_s, r.id))
    gap = picked.measured_step_time_s / min(meas) - 1
    rho = _spearman(pred, meas)
    assert gap <= 0.05, f"{size}: predicted-best {picked.id} is {100 * gap:.1f}% slower than the measured best"
    assert rho >= 0.8, f"{size}: Spearman {rho:.3f}"
