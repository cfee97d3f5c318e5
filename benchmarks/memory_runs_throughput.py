"""Step time against the throughput the memory referee's sources report beside their memory.

``validation/memory_runs.json`` is the memory referee; some of its rows (torchtitan's Dec-2024
H100 benchmark, 18 rows) also carry the tokens/s per GPU their source reported
(``notes["measured.other_reported"]["tokens_per_s_per_gpu"]``). They are not one of issue 16's
four step-time files; this script scores them as a further check of the step-time model, the
same way: unknown fields filled by the planner's fastest fill, each row on the engine it ran.

    python benchmarks/memory_runs_throughput.py
"""

from __future__ import annotations

import json
import statistics

from planner.calibration.datasets import dataset_path
from planner.calibration.validate import fill_and_predict
from planner.io.loaders import load_runs


def main() -> None:
    path = dataset_path("memory")
    raw = {r["id"]: r for r in json.loads(path.read_text())["runs"]}
    errs = []
    print(f"{'run':44s} {'engine':11s} {'filled configuration':42s} {'meas':>7s} {'pred':>7s} {'step err':>8s}")
    for run in load_runs(path):
        reported = ((raw[run.id].get("notes") or {}).get("measured.other_reported") or {}).get("tokens_per_s_per_gpu")
        if not reported:
            continue
        res = fill_and_predict(run, median=False)
        pred = res.estimate.tokens_per_s / run.cluster.num_gpus
        err = 100 * (reported / pred - 1)  # step time: predicted / measured - 1
        errs.append(err)
        print(f"{run.id:44s} {res.engine:11s} {res.parallel.short():42s} {reported:7.0f} {pred:7.0f} {err:+7.1f}%")
    print(f"\nn = {len(errs)}, step-time MAPE {statistics.mean(abs(e) for e in errs):.1f}%, "
          f"mean signed {statistics.mean(errs):+.1f}%, largest miss {max(abs(e) for e in errs):.1f}%")


if __name__ == "__main__":
    main()
