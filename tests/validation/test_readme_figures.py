"""The README's headline accuracy figures are the ones `planner validate` gives today."""

import re
from pathlib import Path

import pytest

from planner.io.loaders import load_runs
from planner.calibration.validate import summary, validate_runs

from conftest import dataset_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUNS = dataset_path("public")


def test_readme_headline_matches_validate():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"\*\*Mean absolute error ([0-9.]+)%, largest miss ([0-9.]+)%", text)
    assert m, "README states the mean absolute error and the largest miss"
    results, _ = validate_runs(load_runs(RUNS), median=False)
    s = summary(results)
    assert float(m.group(1)) == pytest.approx(round(s["mape_pct"], 1), abs=0.051)
    assert float(m.group(2)) == pytest.approx(round(s["max_abs_error_pct"], 1), abs=0.051)
    rows = re.findall(r"^\| (\S+) \| \d+/\d+/\d+ \|.*\| ([+-][0-9.]+)% \|$", text, re.M)
    assert len(rows) == s["n"], "one README table row per public run"
    by_id = {r.id: r.error_pct for r in results}
    for rid, err in rows:
        assert float(err) == pytest.approx(by_id[rid], abs=0.051), rid
