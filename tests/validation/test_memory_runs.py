"""The memory referee (validation/memory_runs.json: torchtitan's Dec-2024 benchmark, the Zero
Bubble paper, Megatron's get_training_info): every run priced on its engine, none refused, at
least 90% of them within -5%..+15% of the measured peak in the counter the run measured, none
more than 5% under. benchmarks/memory_by_source.py prints the same by source."""

from __future__ import annotations

from planner.calibration.datasets import dataset_path
from planner.calibration.validate import summary, validate_runs
from planner.io.loaders import load_runs


def test_memory_runs_within_the_band():
    runs = load_runs(str(dataset_path("memory")))
    results, refused = validate_runs(runs, median=False)
    assert not refused, [(r.id, r.reason) for r in refused]
    s = summary(results, refused)["memory"]
    assert s["n"] == len(runs) == 64
    assert s["within_-5_+15_pct"] >= 0.9 * s["n"], s
    assert s["under_by_more_than_5_pct"] == 0, [(r.id, r.memory_error_pct) for r in results if r.memory_error_pct < -5]


def test_counters_are_compared_like_for_like():
    runs = {r.id: r for r in load_runs(str(dataset_path("memory")))}
    results, _ = validate_runs([runs["mtool-llama2-7b-tp8"], runs["tt24-8b-8gpu-fsdp"]], median=False)
    mtool, tt = results
    assert mtool.memory_metric == "max_allocated"
    assert mtool.predicted_memory_bytes() == mtool.estimate.memory_allocated_peak_bytes
    assert tt.predicted_memory_bytes() == tt.estimate.memory_reserved_peak_bytes  # 'unknown' -> reserved
    e = tt.estimate
    assert e.memory_allocated_peak_bytes < e.memory_reserved_peak_bytes < e.memory_peak_bytes
