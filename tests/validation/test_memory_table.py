"""README's memory table (error by source and engine on memory_runs.json) is what
benchmarks/memory_by_source.py prints today."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_memory_table_is_measured():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_by_source.py")], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    table = [ln for ln in out.splitlines() if ln.startswith("| ") and "source" not in ln]
    assert len(table) >= 4
    readme = (ROOT / "README.md").read_text().splitlines()
    for line in table:
        assert line in readme, line
