"""README's per-run table of public_runs.json: each run with the configuration the fastest fill
chose, predicted and measured step time, and the error with the median fill and the fastest
fill (tests/validation/test_readme_figures.py checks every row against `planner validate`).

    python benchmarks/public_table.py
"""

from __future__ import annotations

from planner.calibration.datasets import dataset_path
from planner.calibration.validate import summary, validate_runs
from planner.io.loaders import load_runs
from planner.units import fmt_time


def main() -> None:
    results, refused = validate_runs(load_runs(dataset_path("public")), median=True)
    print("| run | tp/pp/dp | mb | vpp | recompute | predicted | measured | error (median fill) | error |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        p = r.parallel
        med = "-" if r.median_error_pct is None else f"{r.median_error_pct:+.1f}%"
        print(f"| {r.id} | {p.tp}/{p.pp}/{p.dp} | {p.micro_batch_size} | {p.vpp} | {p.recompute} | "
              f"{fmt_time(r.estimate.step_time_s)} | {fmt_time(r.measured_step_time_s)} | {med} | {r.error_pct:+.1f}% |")
    s = summary(results)
    worst = max(results, key=lambda r: abs(r.error_pct))
    print(f"\n**Mean absolute error {s['mape_pct']:.1f}%, largest miss {s['max_abs_error_pct']:.1f}% ({worst.id}), n = {s['n']}.** "
          f"With the median fill: {s['median_fill']['mape_pct']:.1f}%, largest miss {s['median_fill']['max_abs_error_pct']:.1f}%; refused {len(refused)}.")


if __name__ == "__main__":
    main()
