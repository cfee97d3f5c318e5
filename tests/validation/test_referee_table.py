"""README's referee table (all four step-time files, one constants set) is what the referees
give today: the block between its markers equals planner.calibration.referee.markdown."""

import re
from pathlib import Path

from planner.calibration.referee import SETS, markdown, score_run, summarise
from planner.io.loaders import load_runs

from conftest import dataset_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_readme_referee_table_is_measured():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- referee-table[^>]*-->\n(.*?)\n<!-- /referee-table -->", text, re.S)
    assert m, "README has the referee table between its markers"
    table = [summarise(name, [score_run(name, r) for r in load_runs(dataset_path(name))]) for name in SETS]
    assert m.group(1).strip() == markdown(table).strip()
