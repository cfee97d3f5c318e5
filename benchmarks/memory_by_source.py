"""Peak-memory error by source and engine on validation/memory_runs.json (issue 15's table).

Each run is priced on the engine it was measured on (planner/calibration/run_engines.yaml) and
compared in the counter it measured (max_allocated, else the reserved peak). Per group: runs,
runs within -5%..+15% of the measured peak, runs under by more than 5%, mean absolute error,
the range; then the README table (markdown) and, with --rows, every run with its peak stage,
the moment of the peak and its terms.

    python benchmarks/memory_by_source.py [--rows] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from planner.calibration.datasets import dataset_path
from planner.calibration.validate import validate_runs
from planner.io.loaders import load_runs

GIB = 2**30
SOURCES = (  # id prefix, source, what it measured
    ("tt24-", "torchtitan Dec-2024 benchmark (H100 96 GB; FSDP/TP/PP/CP, Float8, compile)", "Memory(GiB), reserved"),
    ("zb24-", "Zero Bubble paper, Qi et al. 2024 (A100; 1F1B, interleaved, ZB-1p/2p)", "Memory (GB), counter unknown"),
    ("mtool-", "Megatron-LM get_training_info (H800; dp/tp/pp)", "max_memory_allocated"),
)


def _group(rid: str) -> str:
    return next((name for pre, name, _ in SOURCES if rid.startswith(pre)), "other")


def _stats(errs: list[float]) -> dict:
    return {"n": len(errs), "within": sum(-5 <= e <= 15 for e in errs), "under5": sum(e < -5 for e in errs),
            "mape": sum(abs(e) for e in errs) / len(errs) if errs else 0.0,
            "min": min(errs) if errs else 0.0, "max": max(errs) if errs else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="every run with its peak stage, moment and terms")
    ap.add_argument("--json", help="write the per-run results here")
    a = ap.parse_args(argv)
    runs = load_runs(str(dataset_path("memory")))
    results, refused = validate_runs(runs, median=False)
    groups: dict = defaultdict(list)
    rows = []
    for r in results:
        e = r.memory_error_pct
        groups[(_group(r.id), r.engine)].append(e)
        est = r.estimate
        st = est.stages[est.memory_peak_stage]
        rows.append({"id": r.id, "engine": r.engine, "metric": r.memory_metric,
                     "measured_gib": r.measured["memory_peak_bytes"] / GIB, "predicted_gib": r.predicted_memory_bytes() / GIB,
                     "error_pct": e, "peak_stage": est.memory_peak_stage, "moment": st.moment,
                     "terms_gib": {k: v / GIB for k, v in st.parts}})
    allerr = [x["error_pct"] for x in rows]
    print(f"memory_runs.json: {len(runs)} runs, {len(results)} priced, {len(refused)} refused")
    for x in refused:
        print(f"  refused {x.id}: {x.reason}")
    print()
    head = "| source | engine | runs | within -5..+15% | under by >5% | mean abs. error | range |"
    lines = [head, "|---|---|---:|---:|---:|---:|---|"]
    for (src, eng), errs in sorted(groups.items()):
        s = _stats(errs)
        lines.append(f"| {src} | {eng} | {s['n']} | {s['within']} | {s['under5']} | {s['mape']:.1f}% | {s['min']:+.1f}% .. {s['max']:+.1f}% |")
    s = _stats(allerr)
    lines.append(f"| **all** | | **{s['n']}** | **{s['within']}** | **{s['under5']}** | **{s['mape']:.1f}%** | {s['min']:+.1f}% .. {s['max']:+.1f}% |")
    print("\n".join(lines))
    print("\n(planner validate --set memory; each run on its engine, in the counter it measured)")
    if a.rows:
        print()
        for x in rows:
            terms = ", ".join(f"{k} {v:.1f}" for k, v in x["terms_gib"].items())
            print(f"{x['id']:44s} {x['engine']:14s} {x['measured_gib']:6.1f} {x['predicted_gib']:6.1f} {x['error_pct']:+6.1f}%  "
                  f"stage {x['peak_stage']}: {x['moment']} | {terms}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "refused": [x.as_dict() for x in refused], "table": lines}, fh, indent=1)
    return 0 if not refused else 1


if __name__ == "__main__":
    sys.exit(main())
