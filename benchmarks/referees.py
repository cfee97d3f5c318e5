"""The step-time referees, all at once, with one constants set (issue 16's table).

For each shipped step-time file (public, vtrain-multi, vtrain-single, modern): runs scored and
refused, mean absolute error with the fastest fill and with the median fill, the largest miss,
and the pair order: among measured alternatives of one job (same model, GPUs, batch and
sequence; configurations measured more than 5% apart), the fraction the model orders as the
hardware did. vTrain multi also gets, per model, the measured time of the predicted-fastest
configuration against the measured best.

    python benchmarks/referees.py [--sets public,vtrain-multi,vtrain-single,modern] [-j 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from multiprocessing import Pool

from planner.calibration.datasets import dataset_path
from planner.calibration.validate import validate_runs
from planner.io.loaders import load_runs

SETS = ("public", "vtrain-multi", "vtrain-single", "modern")
_RUNS: dict = {}


def _one(args):
    name, i = args
    run = _RUNS[name][i]
    # the median fill only where a run leaves searched fields unknown (vtrain files fix them all)
    results, refused = validate_runs([run], median=name in ("public", "modern"))
    if refused:
        return {"id": run.id, "refused": refused[0].reason}
    r = results[0]
    m = run.model
    return {"id": r.id, "err": r.error_pct, "median_err": r.median_error_pct, "pred": r.estimate.step_time_s,
            "meas": r.measured_step_time_s, "job": [m.layers, m.hidden, run.cluster.num_gpus, run.job.global_batch_size, run.job.seq_len],
            "parallel": r.parallel.short()}


def _pairs(rows: list[dict], gap: float = 0.05) -> tuple[int, int]:
    """(ordered as measured, pairs) over configurations of one job measured more than ``gap`` apart."""
    groups = defaultdict(list)
    for r in rows:
        groups[tuple(r["job"])].append(r)
    good = total = 0
    for g in groups.values():
        for a, b in itertools.combinations(g, 2):
            if max(a["meas"], b["meas"]) / min(a["meas"], b["meas"]) - 1 <= gap:
                continue
            total += 1
            good += (a["pred"] < b["pred"]) == (a["meas"] < b["meas"])
    return good, total


def summarise(name: str, rows: list[dict]) -> dict:
    ok = [r for r in rows if "err" in r and r["err"] is not None]
    errs = [abs(r["err"]) for r in ok]
    med = [abs(r["median_err"]) for r in ok if r["median_err"] is not None]
    worst = max(ok, key=lambda r: abs(r["err"])) if ok else None
    good, total = _pairs(ok)
    out = {"set": name, "scored": len(ok), "refused": len(rows) - len(ok), "mape_pct": statistics.mean(errs) if errs else None,
           "median_fill_mape_pct": statistics.mean(med) if med else None, "max_abs_pct": max(errs) if errs else None,
           "worst": worst["id"] if worst else None, "pair_order": good / total if total else None, "pairs": total}
    if name == "vtrain-multi":
        best = {}
        for size in sorted({r["id"].split("-")[3] for r in ok}):
            grp = [r for r in ok if r["id"].split("-")[3] == size]
            picked = min(grp, key=lambda r: (r["pred"], r["id"]))
            best[size] = 100 * (picked["meas"] / min(r["meas"] for r in grp) - 1)
        out["picked_vs_best_pct"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--json")
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
    print(f"{'set':<14} {'scored':>6} {'refused':>7} {'MAPE':>7} {'median fill':>11} {'max':>7} {'pair order':>10}  worst")
    for s in table:
        fmt = lambda v, u="%": "-" if v is None else f"{v:.1f}{u}"  # noqa: E731
        po = "-" if s["pair_order"] is None else f"{100 * s['pair_order']:.1f}% ({s['pairs']})"
        print(f"{s['set']:<14} {s['scored']:>6} {s['refused']:>7} {fmt(s['mape_pct']):>7} {fmt(s['median_fill_mape_pct']):>11} "
              f"{fmt(s['max_abs_pct']):>7} {po:>10}  {s['worst']}")
        if "picked_vs_best_pct" in s:
            print("    predicted-fastest vs measured best: " + ", ".join(f"{k} {v:+.1f}%" for k, v in s["picked_vs_best_pct"].items()))
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"summary": table, "rows": dict(by)}, fh, indent=1)


if __name__ == "__main__":
    main()
