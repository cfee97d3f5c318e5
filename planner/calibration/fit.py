"""Fit cost-model constants to measured step times, and save/load a cluster profile.

Independent of the cost model: the caller passes ``predict(params, run) -> step_time_s``.
The fit minimises the sum of squared log-ratios ``log(predicted / measured)`` (relative
error, so a 10 s step and a 0.1 s step weigh the same) with
:func:`scipy.optimize.least_squares` (trust-region reflective, bounded).

Standard uncertainties come from the linearised model at the optimum (Gauss-Newton
covariance, the inverse of the curvature matrix alpha = J^T J of Press et al., Numerical
Recipes 3rd ed. sec. 15.5, scaled by the residual variance estimated from the fit, which
is what ``scipy.optimize.curve_fit`` returns as ``pcov`` for ``absolute_sigma=False``)::

    s^2 = sum(r_i^2) / (n - p),   cov = s^2 (J^T J)^-1,   u_k = sqrt(cov_kk)

with J the Jacobian of the log-residuals with respect to the parameters (so u_k is in the
parameter's own unit). Parameters the data cannot determine (a rank-deficient J) get an
infinite uncertainty; a parameter sitting on a bound is flagged, as its linearised
uncertainty is then not meaningful.

A *cluster profile* is a YAML file mapping constant name -> value, uncertainty, number of
runs and date; :func:`save_profile` writes it atomically and refuses to overwrite unless
``force=True``. See ``docs/goodput.md``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from planner.errors import InputError

__all__ = [
    "CalibrationResult",
    "ProfileEntry",
    "PROFILE_FORMAT",
    "fit_constants",
    "mape_pct",
    "profile_from_result",
    "save_profile",
    "load_profile",
]

PROFILE_FORMAT = "planner-cluster-profile/1"
_TINY_S = 1e-300  # floor for a non-positive prediction inside the optimiser's search


@dataclass(frozen=True)
class CalibrationResult:
    """Fitted constants with standard uncertainties and the fit quality before/after."""

    values: dict[str, float]
    uncertainties: dict[str, float]  # standard (1-sigma), same unit as the value
    covariance: np.ndarray = field(repr=False)  # in the order of ``names``
    names: tuple[str, ...]
    at_bound: dict[str, bool]
    n_runs: int
    mape_before_pct: float  # mean |pred - meas| / meas * 100 at the initial values
    mape_after_pct: float  # same at the fitted values
    rms_log_residual: float  # s, the residual standard deviation of log(pred/meas)
    predicted_s: np.ndarray = field(repr=False)
    success: bool
    message: str


def mape_pct(predicted_s: Sequence[float], measured_s: Sequence[float]) -> float:
    """Mean absolute percentage error, 100 * mean(|pred - meas| / meas)."""
    p = np.asarray(predicted_s, dtype=float)
    m = np.asarray(measured_s, dtype=float)
    return float(100.0 * np.mean(np.abs(p - m) / m))


def _check_params(params: Mapping[str, tuple[float, float, float]]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(params, Mapping) or not params:
        raise InputError("params", params, "a non-empty dict name -> (init, lo, hi)")
    names, x0, lo, hi = [], [], [], []
    for name, spec in params.items():
        if not isinstance(name, str) or not name:
            raise InputError("params", name, "parameter names as non-empty strings")
        try:
            init, low, high = (float(v) for v in spec)
        except (TypeError, ValueError) as exc:
            raise InputError(f"params[{name}]", spec, "a tuple (init, lo, hi) of numbers") from exc
        if not (math.isfinite(init) and low < high and low <= init <= high) or math.isnan(low) or math.isnan(high):
            raise InputError(f"params[{name}]", spec, "finite init with lo <= init <= hi and lo < hi")
        names.append(name)
        x0.append(init)
        lo.append(low)
        hi.append(high)
    return names, np.array(x0), np.array(lo), np.array(hi)


def _covariance(jac: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """s^2 (J^T J)^-1 via the SVD of J; directions J cannot see get infinite variance."""
    n, p = jac.shape
    s2 = float(residuals @ residuals) / (n - p)
    _, sv, vt = np.linalg.svd(jac, full_matrices=False)
    tol = np.finfo(float).eps * max(jac.shape) * (sv[0] if sv.size else 0.0)
    ok = sv > tol
    cov = (vt[ok].T / sv[ok] ** 2) @ vt[ok] * s2
    if not np.all(ok):
        blind = np.any(np.abs(vt[~ok]) > 1e-8, axis=0)  # parameters in the null space
        cov[blind, :] = np.inf
        cov[:, blind] = np.inf
    return cov


def fit_constants(
    predict: Callable[[dict[str, float], Any], float],
    runs: Sequence[Any],
    measured_s: Sequence[float],
    params: Mapping[str, tuple[float, float, float]],
) -> CalibrationResult:
    """Fit ``params`` (name -> (init, lo, hi)) so that ``predict(values, run)`` matches
    ``measured_s`` in log space; return values, standard uncertainties and MAPE.

    Needs more runs than parameters (the residual variance has n - p degrees of freedom).
    """
    from scipy.optimize import least_squares  # noqa: PLC0415  (scipy costs ~1 s to import: only when fitting)

    if not callable(predict):
        raise InputError("predict", predict, "a callable predict(params, run) -> step_time_s")
    names, x0, lo, hi = _check_params(params)
    runs = list(runs)
    meas = np.asarray(measured_s, dtype=float)
    if meas.ndim != 1 or meas.size != len(runs):
        raise InputError("measured_s", measured_s, f"one measured step time per run ({len(runs)})")
    if not np.all(np.isfinite(meas) & (meas > 0)):
        raise InputError("measured_s", measured_s, "finite step times > 0")
    if len(runs) <= len(names):
        raise InputError("runs", len(runs), f"more runs than fitted parameters ({len(names)})")
    log_meas = np.log(meas)

    def predict_all(x: np.ndarray) -> np.ndarray:
        values = dict(zip(names, (float(v) for v in x)))
        return np.array([float(predict(values, run)) for run in runs])

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict_all(x)
        pred = np.where(np.isfinite(pred) & (pred > 0), pred, _TINY_S)
        return np.log(pred) - log_meas

    pred0 = predict_all(x0)
    if not np.all(np.isfinite(pred0) & (pred0 > 0)):
        raise InputError("params", dict(zip(names, x0)), "initial values for which predict() is finite and > 0")

    sol = least_squares(residuals, x0, bounds=(lo, hi), jac="3-point", x_scale="jac", method="trf",
                        xtol=1e-12, ftol=1e-12, gtol=1e-12)
    x = sol.x
    cov = _covariance(np.asarray(sol.jac, dtype=float), np.asarray(sol.fun, dtype=float))
    unc = np.sqrt(np.diag(cov))
    pred = predict_all(x)
    n, p = len(runs), len(names)
    return CalibrationResult(
        values={k: float(v) for k, v in zip(names, x)},
        uncertainties={k: float(u) for k, u in zip(names, unc)},
        covariance=cov,
        names=tuple(names),
        at_bound={k: bool(a != 0) for k, a in zip(names, sol.active_mask)},
        n_runs=n,
        mape_before_pct=mape_pct(pred0, meas),
        mape_after_pct=mape_pct(pred, meas),
        rms_log_residual=float(math.sqrt(float(sol.fun @ sol.fun) / (n - p))),
        predicted_s=pred,
        success=bool(sol.success),
        message=str(sol.message),
    )


# --- Cluster profile ----------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileEntry:
    """One calibrated constant in a cluster profile."""

    value: float
    uncertainty: float
    n_runs: int
    date: str  # ISO 8601 date of the calibration, e.g. "2025-01-31"


def profile_from_result(result: CalibrationResult, date: str | None = None) -> dict[str, ProfileEntry]:
    """Profile entries for every fitted constant; ``date`` defaults to today (ISO 8601)."""
    day = date if date is not None else _dt.date.today().isoformat()
    return {k: ProfileEntry(result.values[k], result.uncertainties[k], result.n_runs, day) for k in result.names}


def _entry(name: str, raw: object) -> ProfileEntry:
    field_ = f"constants.{name}"
    if not isinstance(raw, Mapping):
        raise InputError(field_, raw, "a mapping with value, uncertainty, n_runs, date")
    try:
        value, unc = float(raw["value"]), float(raw["uncertainty"])
        n_runs, date = raw["n_runs"], raw["date"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(field_, raw, "numeric value and uncertainty, n_runs and date") from exc
    if not math.isfinite(value) or not (unc >= 0):
        raise InputError(field_, raw, "a finite value and an uncertainty >= 0")
    if isinstance(n_runs, bool) or not isinstance(n_runs, int) or n_runs < 1:
        raise InputError(f"{field_}.n_runs", n_runs, "an integer >= 1")
    if isinstance(date, _dt.date):  # YAML reads an unquoted 2025-01-31 as a date
        date = date.isoformat()
    if not isinstance(date, str):
        raise InputError(f"{field_}.date", date, "an ISO 8601 date string")
    return ProfileEntry(value, unc, n_runs, date)


def save_profile(path: str | os.PathLike[str], profile: Mapping[str, ProfileEntry] | CalibrationResult,
                 *, force: bool = False) -> Path:
    """Write a cluster profile YAML atomically (temp file in the same folder, then rename).

    Refuses (InputError) to replace an existing file unless ``force=True``; without force
    the final step is a hard link, which fails if the path appeared meanwhile.
    """
    entries = profile_from_result(profile) if isinstance(profile, CalibrationResult) else dict(profile)
    doc = {"format": PROFILE_FORMAT, "constants": {}}
    for name, e in entries.items():
        e = e if isinstance(e, ProfileEntry) else _entry(name, e)
        _entry(name, vars(e))  # validate
        doc["constants"][str(name)] = {"value": float(e.value), "uncertainty": float(e.uncertainty),
                                       "n_runs": int(e.n_runs), "date": str(e.date)}
    target = Path(path)
    if not force and target.exists():
        raise InputError("path", str(target), "a path that does not exist yet (or force=True)")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump(doc, fh, sort_keys=False)
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # atomic and never overwrites
            except FileExistsError as exc:
                raise InputError("path", str(target), "a path that does not exist yet (or force=True)") from exc
            except OSError:  # filesystem without hard links: best effort
                if target.exists():
                    raise InputError("path", str(target), "a path that does not exist yet (or force=True)")
                os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_profile(path: str | os.PathLike[str]) -> dict[str, ProfileEntry]:
    """Read a cluster profile written by :func:`save_profile`."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise InputError("path", str(path), "a readable cluster profile YAML file") from exc
    except yaml.YAMLError as exc:
        raise InputError("path", str(path), f"valid YAML ({exc})") from exc
    if not isinstance(doc, Mapping) or doc.get("format") != PROFILE_FORMAT:
        raise InputError("format", None if not isinstance(doc, Mapping) else doc.get("format"), PROFILE_FORMAT)
    constants = doc.get("constants")
    if not isinstance(constants, Mapping):
        raise InputError("constants", constants, "a mapping name -> {value, uncertainty, n_runs, date}")
    return {str(k): _entry(str(k), v) for k, v in constants.items()}
