"""For each published run: the published configuration (known fields fixed, unknowns searched)
against the planner's own best plan for the same model, cluster and job.

    python benchmarks/published_vs_best.py [RUNS.json]

Prints one row per run (ratio = published / best predicted step time) and how many runs are
within 10%.
"""

from __future__ import annotations

import sys
from pathlib import Path

from planner.loaders import load_runs
from planner.search.plan import plan
from planner.search.space import SearchOptions
from planner.validate import fill_and_predict

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "public_runs.json"


def main(path: str) -> None:
    runs = load_runs(path)
    within = 0
    print("| run | published (s) | planner best (s) | ratio | planner's best plan |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in runs:
        pub = fill_and_predict(r).estimate.step_time_s
        best = plan(r.model, r.cluster, r.job, top_k=1, options=SearchOptions()).plans[0]
        b = best.parallel
        ratio = pub / best.estimate.step_time_s
        within += ratio <= 1.10
        print(f"| {r.id} | {pub:.2f} | {best.estimate.step_time_s:.2f} | {ratio:.2f} | tp{b.tp} pp{b.pp} dp{b.dp} cp{b.cp} "
              f"mb{b.micro_batch_size} vpp{b.vpp} {b.recompute} zero{b.zero} |")
    print(f"\n{within} of {len(runs)} runs within 10% of the planner's best ({100 * within / len(runs):.0f}%)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT))
