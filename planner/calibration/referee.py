"""The step-time referees scored the same way everywhere (issue 16's table): for one shipped
runs file, runs scored and refused, mean absolute error with the fastest and with the median
fill of unknown fields, the largest miss, and the pair order (among measured alternatives of one
job, measured more than 5% apart, the share the model orders as the hardware did). vTrain multi
also gets, per model, the measured time of the predicted-fastest configuration against the
measured best. ``benchmarks/referees.py`` prints the table (in parallel); the README's table
is pinned by ``tests/validation/test_referee_table.py``.

>>> from planner.calibration.referee import score_run, summarise
>>> from planner.calibration.datasets import dataset_path
>>> from planner.io.loaders import load_runs
>>> run = load_runs(dataset_path("public"))[0]
>>> row = score_run("public", run)
>>> summarise("public", [row])["scored"]
1
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

from planner.calibration.validate import validate_runs
from planner.io.loaders import Run

__all__ = ["SETS", "score_run", "pair_order", "summarise", "markdown"]

SETS = ("public", "vtrain-multi", "vtrain-single", "modern")
MEDIAN_FILL_SETS = ("public", "vtrain-multi", "vtrain-single", "modern")  # every file leaves some field unknown (vTrain: recompute, ZeRO)


def score_run(name: str, run: Run) -> dict:
    """One run's row: error with each fill, predicted and measured step, the job it belongs to."""
    results, refused = validate_runs([run], median=name in MEDIAN_FILL_SETS)
    if refused:
        return {"id": run.id, "refused": refused[0].reason}
    r = results[0]
    m = run.model
    return {"id": r.id, "err": r.error_pct, "median_err": r.median_error_pct, "pred": r.estimate.step_time_s,
            "meas": r.measured_step_time_s, "job": [m.layers, m.hidden, run.cluster.num_gpus, run.job.global_batch_size, run.job.seq_len],
            "parallel": r.parallel.short()}


def pair_order(rows: list[dict], gap: float = 0.05) -> tuple[int, int]:
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
    """The set's line of the referee table from its rows (:func:`score_run`)."""
    ok = [r for r in rows if r.get("err") is not None]
    errs = [abs(r["err"]) for r in ok]
    med = [abs(r["median_err"]) for r in ok if r["median_err"] is not None]
    worst = max(ok, key=lambda r: abs(r["err"])) if ok else None
    good, total = pair_order(ok)
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


def markdown(table: list[dict]) -> str:
    """The referee table as README markdown (``benchmarks/referees.py --markdown``)."""
    pct = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    lines = ["| set | scored | refused | MAPE (fastest fill) | MAPE (median fill) | largest miss | pair order (pairs) | largest miss on |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in table:
        po = "-" if s["pair_order"] is None else f"{100 * s['pair_order']:.1f}% ({s['pairs']})"
        lines.append(f"| {s['set']} | {s['scored']} | {s['refused']} | {pct(s['mape_pct'])} | {pct(s['median_fill_mape_pct'])} | "
                     f"{pct(s['max_abs_pct'])} | {po} | {s['worst']} |")
    picked = [s for s in table if "picked_vs_best_pct" in s]
    for s in picked:
        lines.append("")
        lines.append(f"{s['set']}: measured time of the predicted-fastest configuration against the measured best, per model: "
                     + ", ".join(f"{k} {v:+.1f}%" for k, v in s["picked_vs_best_pct"].items()) + ".")
    return "\n".join(lines)
