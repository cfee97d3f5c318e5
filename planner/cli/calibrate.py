"""``planner calibrate RUNS.json --out PROFILE.yaml``: fit the cluster's efficiency constants.

Reads measured step times of the user's own jobs (schema ``planner-runs/1``), picks the
constants the runs can identify (:func:`planner.calibration.profile.identifiable`), fits them
(:func:`planner.calibration.fit.fit_constants`: log-residual least squares, Gauss-Newton
uncertainties) and saves a cluster profile that ``planner plan --profile`` uses.
"""

from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.app import app
from planner.errors import InputError

__all__ = ["calibrate_cmd"]


@app.command("calibrate")
def calibrate_cmd(
    runs_file: Annotated[str, typer.Argument(help="Runs file (planner-runs/1) with measured.step_time_s.")],
    out: Annotated[str, typer.Option("--out", "-o", help="Cluster profile YAML to write.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    fit: Annotated[Optional[str], typer.Option("--fit", help="Comma-separated constants to try (default: all four; those the runs cannot identify are dropped).")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", "-e", help="The engine the runs were measured on (default: megatron-core, or each published run's).")] = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable JSON.")] = False,
) -> None:
    """Fit 2-4 efficiency constants to your measured step times and save a cluster profile.

    Examples:
      planner calibrate my_runs.json --out my-cluster.yaml
      planner plan --model llama3.1-70b --gpus 256 --profile my-cluster.yaml
    """
    from planner.calibration.fit import profile_from_result, save_profile  # noqa: PLC0415
    from planner.calibration.profile import FITTABLE, fit_runs, identifiable, prepare_runs, start_values  # noqa: PLC0415
    from planner.io.loaders import load_runs  # noqa: PLC0415

    if Path(out).exists() and not force:
        raise InputError("--out", out, "a path that does not exist yet (or --force)")
    if not Path(out).resolve().parent.is_dir():
        raise InputError("--out", out, "a file path inside an existing directory")
    names = list(FITTABLE) if fit is None else [n.strip() for n in fit.split(",") if n.strip()]
    for n in names:
        if n not in FITTABLE:
            raise InputError("--fit", n, "one of " + ", ".join(FITTABLE))
    runs = prepare_runs(load_runs(runs_file), engine)
    if len(runs) < 3:
        raise InputError(runs_file, f"{len(runs)} runs with measured.step_time_s", "at least 3 measured runs")
    chosen, strength = identifiable(runs, names)
    if not chosen:
        raise InputError(runs_file, "no constant moves the predicted step times by 2 %", "runs whose step times depend on the constants")
    base = start_values(runs, None)
    res = fit_runs(runs, chosen)
    # a constant the fit drives to its bound is not a measurement of the cluster: the runs are
    # further from the cost model than the constants can absorb (wrong units, wrong hardware or
    # layout fields); no profile is written from it
    stuck = [k for k in chosen if res.at_bound[k]]
    if not stuck:
        save_profile(out, profile_from_result(res), force=force)
    dropped = [n for n in names if n not in chosen]
    if json:
        typer.echo(_json.dumps({
            "schema": "planner-calibration/1", "profile": None if stuck else out, "runs": len(runs), "at_bound": stuck,
            "constants": {k: {"default": base[k], "value": res.values[k], "uncertainty": res.uncertainties[k],
                              "at_bound": res.at_bound[k], "max_sensitivity": strength[k]} for k in chosen},
            "dropped": {k: strength[k] for k in dropped},
            "mape_before_pct": res.mape_before_pct, "mape_after_pct": res.mape_after_pct,
            "rms_log_residual": res.rms_log_residual}, indent=2))
        if stuck:
            raise typer.Exit(1)
        return
    typer.echo(f"{len(runs)} measured runs from {runs_file}")
    typer.echo(f"{'constant':<34} {'default':>8} {'fitted':>8} {'+/- 1 sigma':>12}  max |dlog t/dlog c|")
    for k in chosen:
        flag = "  (at bound)" if res.at_bound[k] else ""
        typer.echo(f"{k:<34} {base[k]:>8.4f} {res.values[k]:>8.4f} {res.uncertainties[k]:>12.4f}  {strength[k]:.3f}{flag}")
    for k in dropped:
        typer.echo(f"{k:<34} {base[k]:>8.4f} {'-':>8} {'-':>12}  {strength[k]:.3f} (not identifiable from these runs)")
    typer.echo(f"MAPE before {res.mape_before_pct:.2f} %, after {res.mape_after_pct:.2f} %, rms log residual {res.rms_log_residual:.4f}")
    if stuck:
        typer.echo(f"no profile written: {', '.join(stuck)} ended at the bound of the fit (MAPE {res.mape_after_pct:.1f} % after): "
                   "the runs are further from the cost model than these constants can absorb; check measured.step_time_s "
                   "(seconds per optimizer step) and the runs' hardware and parallel fields", err=True)
        raise typer.Exit(1)
    typer.echo(f"profile written to {out} (use: planner plan --profile {out})")
