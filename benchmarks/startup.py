"""CLI start-up cost: median CPU time (user + system, less sensitive to other load than wall
time) of ``python -m planner --version`` over N fresh processes, for this tree and, optionally,
another checkout to compare with (``--against DIR``).

    python benchmarks/startup.py [--n 15] [--against /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_s(tree: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "planner", "--version"], cwd=tree, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(tree)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--against", type=Path)
    a = ap.parse_args()
    trees = [ROOT] + ([a.against] if a.against else [])
    samples = {t: [] for t in trees}
    for _ in range(a.n):  # interleaved, so that load from other jobs hits both alike
        for t in trees:
            samples[t].append(cpu_s(t))
    for t in trees:
        s = samples[t]
        print(f"{t}: median {statistics.median(s):.3f} s CPU, min {min(s):.3f} s (n={len(s)})")
    if a.against:
        r = statistics.median(samples[ROOT]) / statistics.median(samples[a.against])
        print(f"ratio this/against: {r:.3f}")


if __name__ == "__main__":
    main()
