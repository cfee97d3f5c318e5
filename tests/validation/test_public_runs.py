"""``planner validate --set public`` on the published runs (validation/public_runs.json), through the
CLI: mean absolute step-time error <= 10%, worst run <= 25%, and the JSON shape
{runs: [{id, parallel, predicted: {step_time_s}, measured: {step_time_s}, error_pct}],
summary: {mape_pct, max_abs_error_pct, n}}."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import dataset_path  # noqa: E402

RUNS = dataset_path("public")
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def report() -> dict:
    proc = subprocess.run([sys.executable, "-m", "planner", "validate", "--set", "public", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_json_shape(report):
    src = json.loads(RUNS.read_text())
    assert isinstance(report["runs"], list) and len(report["runs"]) == len(src["runs"])
    assert [r["id"] for r in report["runs"]] == [r["id"] for r in src["runs"]]
    for r in report["runs"]:
        assert isinstance(r["id"], str)
        assert isinstance(r["parallel"], dict)
        for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "recompute", "zero"):
            assert k in r["parallel"], (r["id"], k)
        pred, meas = r["predicted"]["step_time_s"], r["measured"]["step_time_s"]
        assert pred > 0 and meas > 0 and math.isfinite(pred)
        assert r["error_pct"] == pytest.approx(100 * (pred - meas) / meas, rel=1e-9)
    s = report["summary"]
    assert set(s) >= {"mape_pct", "max_abs_error_pct", "n"}
    errs = [abs(r["error_pct"]) for r in report["runs"]]
    assert s["n"] == len(errs)
    assert s["mape_pct"] == pytest.approx(sum(errs) / len(errs), rel=1e-9)
    assert s["max_abs_error_pct"] == pytest.approx(max(errs), rel=1e-9)


def test_known_fields_are_kept(report):
    src = {r["id"]: r for r in json.loads(RUNS.read_text())["runs"]}
    for r in report["runs"]:
        for k, v in src[r["id"]]["parallel"].items():
            if v is not None and k in ("tp", "pp", "dp", "cp", "micro_batch_size", "recompute", "zero"):
                assert r["parallel"][k] == v, (r["id"], k)


def test_accuracy(report):
    s = report["summary"]
    worst = sorted(report["runs"], key=lambda r: -abs(r["error_pct"]))[:3]
    detail = ", ".join(f"{r['id']} {r['error_pct']:+.1f}%" for r in worst)
    assert s["mape_pct"] <= 10.0, f"MAPE {s['mape_pct']:.2f}% (worst: {detail})"
    assert s["max_abs_error_pct"] <= 25.0, f"max {s['max_abs_error_pct']:.2f}% (worst: {detail})"
