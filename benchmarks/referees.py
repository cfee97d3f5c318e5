"""The step-time referees, all at once, with one constants set (issue 16's table).

For each shipped step-time file (public, vtrain-multi, vtrain-single, modern): runs scored and
refused, mean absolute error with the fastest fill and with the median fill, the largest miss,
and the pair order: among measured alternatives of one job (same model, GPUs, batch and
sequence; configurations measured more than 5% apart), the fraction the model orders as the
hardware did. vTrain multi also gets, per model, the measured time of the predicted-fastest
configuration against the measured best.

    python benchmarks/referees.py [--sets public,vtrain-multi,vtrain-single,modern] [-j 2] [--json out.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from multiprocessing import Pool
from pathlib import Path

import yaml

from planner.calibration.datasets import dataset_path
from planner.calibration.referee import SETS, markdown, score_run, summarise
from planner.io.loaders import load_runs

_RUNS: dict = {}
SUSPECT = Path(__file__).resolve().parent / "suspect_rows.yaml"  # rows believed inconsistent, with why


def _one(args):
    name, i = args
    return score_run(name, _RUNS[name][i])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--markdown", action="store_true", help="print the README's table instead")
    a = ap.parse_args()
    names = a.sets.split(",")
    for n in names:
        _RUNS[n] = load_runs(dataset_path(n))
    t0 = time.time()
    jobs = [(n, i) for n in names for i in range(len(_RUNS[n]))]
    with Pool(a.j, initializer=_RUNS.update, initargs=(_RUNS,)) as p:
        rows = p.map(_one, jobs, chunksize=16)
    by = defaultdict(list)
    for (n, _), r in zip(jobs, rows):
        by[n].append(r)
    table = [summarise(n, by[n]) for n in names]
    if a.markdown:
        print(markdown(table))
        return
    print(f"{'set':<14} {'scored':>6} {'refused':>7} {'MAPE':>7} {'median fill':>11} {'max':>7} {'pair order':>10}  worst")
    for s in table:
        fmt = lambda v, u="%": "-" if v is None else f"{v:.1f}{u}"  # noqa: E731
        po = "-" if s["pair_order"] is None else f"{100 * s['pair_order']:.1f}% ({s['pairs']})"
        print(f"{s['set']:<14} {s['scored']:>6} {s['refused']:>7} {fmt(s['mape_pct']):>7} {fmt(s['median_fill_mape_pct']):>11} "
              f"{fmt(s['max_abs_pct']):>7} {po:>10}  {s['worst']}")
        if "picked_vs_best_pct" in s:
            print("    predicted-fastest vs measured best: " + ", ".join(f"{k} {v:+.1f}%" for k, v in s["picked_vs_best_pct"].items()))
    suspects = yaml.safe_load(SUSPECT.read_text()) or {}
    without = []
    for n in names:
        ids = {e["id"] for e in suspects.get(n, [])}
        if not ids:
            continue
        kept = [r for r in by[n] if r["id"] not in ids]
        s = summarise(n, kept)
        s["left_out"] = sorted(ids)
        without.append(s)
        print(f"{n} without the {len(by[n]) - len(kept)} rows believed inconsistent (benchmarks/suspect_rows.yaml; still in the "
              f"table above): MAPE {s['mape_pct']:.1f}%, median fill {s['median_fill_mape_pct']:.1f}%, largest miss {s['max_abs_pct']:.1f}%")
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"summary": table, "rows": dict(by), "without_suspect_rows": without}, fh, indent=1)


if __name__ == "__main__":
    main()
