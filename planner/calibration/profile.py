"""The bridge between the cost model's physical constants and :func:`planner.calibration.fit.fit_constants`.

Constants are values (:class:`planner.cost.constants.Constants`); nothing here edits module
state. A set of fitted values becomes a :class:`Calibration`: the ``Constants`` it implies and
the scale-out link efficiency, which belongs to the cluster (:func:`Calibration.cluster`).

* :func:`fit_runs` fits 2-4 constants to the measured step times of the user's own runs
  (schema ``planner-runs/1``) and returns a :class:`planner.calibration.fit.CalibrationResult`;
  :func:`identifiable` picks the constants the data can determine.
* :func:`calibration_from_profile` turns a saved cluster profile into a :class:`Calibration`,
  which ``plan --profile``, ``sweep`` and ``goodput`` pass down to the search.

The fittable constants (:data:`FITTABLE`), each a dimensionless efficiency:

``TRAINING_KERNEL_EFFICIENCY``       sustained / short-burst GEMM throughput (constants.py)
``HBM_STREAM_EFFICIENCY``            achieved / spec HBM bandwidth of streaming kernels
``COMM_COMPUTE_OVERLAP_EFFICIENCY``  hidden fraction of overlapped communication
``INTER_NODE_EFFICIENCY``            usable / line rate of the scale-out network
                                     (``InterNodeNetwork.efficiency`` of the cluster)

A step-time measurement says nothing about a constant whose term is absent from the run
(e.g. the inter-node efficiency of single-node runs); :func:`identifiable` measures that
with the log-sensitivities d log t / d log c of the runs and drops the blind ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.calibration.fit import CalibrationResult, ProfileEntry, fit_constants
from planner.cost.constants import DEFAULT_CONSTANTS, FITTABLE, Constants
from planner.calibration.values import Calibration, check_values as _check
from planner.errors import InputError
from planner.specs import ClusterSpec, ParallelConfig

__all__ = [
    "FITTABLE",
    "DEFAULT_FIT",
    "MIN_SENSITIVITY",
    "NOISE_REL",
    "MAX_REL_SIGMA",
    "Calibration",
    "CalibrationRun",
    "current_values",
    "apply_to_cluster",
    "predict_step_time",
    "prepare_runs",
    "start_values",
    "sensitivities",
    "identifiable",
    "fit_runs",
    "calibration_from_profile",
]

DEFAULT_FIT = FITTABLE
# Bounds of the fit: every constant is a fraction of a peak. The lower bound 0.05 keeps the
# model finite; nothing measured in constants.py comes near it.
_BOUNDS = (0.05, 1.0)
# A constant is identifiable when the runs would pin it down to within MAX_REL_SIGMA (10 %)
# at the ~2 % run-to-run noise of measured step times (NOISE_REL): with S the matrix of
# log-sensitivities d log t / d log c of the chosen constants, the linearised relative
# standard uncertainties are NOISE_REL * sqrt(diag((S^T S)^-1)) (the Gauss-Newton covariance
# of fit.fit_constants, in log units). A constant no run moves by MIN_SENSITIVITY per
# unit log-change is dropped first.
NOISE_REL = 0.02
MAX_REL_SIGMA = 0.10
MIN_SENSITIVITY = 0.02


def current_values(constants: Constants = DEFAULT_CONSTANTS, inter_node_efficiency: float | None = None) -> dict[str, float]:
    """The values of every name in :data:`FITTABLE` (the inter-node efficiency: the given one,
    else the InfiniBand default of planner.cost.constants.LINK_DEFAULTS)."""
    from planner.cost.constants import LINK_DEFAULTS  # noqa: PLC0415

    vals = {k: float(getattr(constants, k)) for k in FITTABLE if k != "INTER_NODE_EFFICIENCY"}
    vals["INTER_NODE_EFFICIENCY"] = float(LINK_DEFAULTS["infiniband"][1] if inter_node_efficiency is None else inter_node_efficiency)
    return vals


def apply_to_cluster(cluster: ClusterSpec, values: Mapping[str, float]) -> ClusterSpec:
    """The cluster with ``INTER_NODE_EFFICIENCY`` (if given) as its network efficiency."""
    return Calibration.from_values({k: v for k, v in values.items() if k == "INTER_NODE_EFFICIENCY"}).cluster(cluster)


@dataclass(frozen=True)
class CalibrationRun:
    """A measured run with its parallel configuration fully known (filled once, then fixed)."""

    id: str
    model: object
    cluster: ClusterSpec
    job: object
    parallel: ParallelConfig
    measured_s: float
    filled: tuple[str, ...] = ()
    engine: str | None = None  # None: the default engine


def predict_step_time(values: Mapping[str, float], run: CalibrationRun) -> float:
    """Predicted step time of ``run`` with the constants in ``values`` (the others at their defaults)."""
    from planner.cost.estimate import estimate  # noqa: PLC0415

    cal = Calibration.from_values(values)
    return estimate(run.model, cal.cluster(run.cluster), run.job, run.parallel, run.engine, cal.constants, validate=False).step_time_s


def prepare_runs(runs: Sequence[object], engine: str | None = None) -> list[CalibrationRun]:
    """Runs with a measured step time, their unknown parallel fields filled by the planner's
    own search at the default constants (:func:`planner.calibration.validate.fill_and_predict`),
    then held fixed during the fit (the fit moves constants, not configurations). ``engine``:
    the engine the runs were measured on (None: each run's by :func:`planner.calibration.datasets.run_engine`)."""
    from planner.calibration.datasets import run_engine  # noqa: PLC0415
    from planner.calibration.validate import fill_and_predict  # noqa: PLC0415
    from planner.io.loaders import parallel_from_dict  # noqa: PLC0415
    from planner.search.space import SearchOptions  # noqa: PLC0415

    out = []
    for r in runs:
        meas = (r.measured or {}).get("step_time_s")
        if meas is None:
            continue
        if isinstance(meas, bool) or not isinstance(meas, (int, float)) or not math.isfinite(meas) or meas <= 0:
            raise InputError(f"runs[{r.id}].measured.step_time_s", meas, "a positive number of seconds")
        eng = engine or run_engine(r.id)[0]
        par_raw = r.parallel or {}
        known = {k for k, v in par_raw.items() if v is not None}
        needed = {"tp", "pp", "dp", "micro_batch_size", "recompute", "zero"}
        if needed <= known:
            par = parallel_from_dict({k: v for k, v in par_raw.items() if k != "num_microbatches"})
            filled: tuple[str, ...] = ()
        else:
            res = fill_and_predict(r, SearchOptions(engine=eng), median=False)
            par, filled = res.parallel, tuple(res.filled)
        out.append(CalibrationRun(r.id, r.model, r.cluster, r.job, par, float(meas), filled, eng))
    return out


def start_values(runs: Sequence[CalibrationRun], base: Mapping[str, float] | None) -> dict[str, float]:
    """Starting values: the current constants, the runs' own network efficiency (median), then ``base``."""
    vals = current_values()
    if runs:
        vals["INTER_NODE_EFFICIENCY"] = float(np.median([r.cluster.inter.efficiency for r in runs]))
    vals.update(base or {})
    return vals


def sensitivities(runs: Sequence[CalibrationRun], names: Sequence[str], base: Mapping[str, float], rel_step: float = 0.01) -> np.ndarray:
    """d log t / d log c for every run (rows) and constant (columns), central differences
    around ``base``; each constant is moved alone, the others stay as the runs have them."""
    sens = np.zeros((len(runs), len(names)))
    for j, k in enumerate(names):
        up, dn = min(1.0, base[k] * (1 + rel_step)), base[k] * (1 - rel_step)
        t_up = np.array([predict_step_time({k: up}, r) for r in runs])
        t_dn = np.array([predict_step_time({k: dn}, r) for r in runs])
        sens[:, j] = (np.log(t_up) - np.log(t_dn)) / (math.log(up) - math.log(dn))
    return sens


def identifiable(runs: Sequence[CalibrationRun], names: Sequence[str] = DEFAULT_FIT,
                 base: Mapping[str, float] | None = None) -> tuple[list[str], dict[str, float]]:
    """The constants the runs can determine, strongest signal first, and every constant's
    largest |d log t / d log c| over the runs.

    Greedy: take constants by decreasing column norm of the sensitivity matrix; keep one if
    some run moves by >= MIN_SENSITIVITY per unit log-change and, with it, every kept
    constant's predicted relative uncertainty NOISE_REL sqrt(diag((S^T S)^-1)) stays
    <= MAX_REL_SIGMA (a constant the others can trade against fails this too).
    """
    base = start_values(runs, base)
    names = list(names)
    S = sensitivities(runs, names, base)
    strength = {k: float(np.max(np.abs(S[:, j]))) for j, k in enumerate(names)}
    order = sorted(range(len(names)), key=lambda j: -float(np.linalg.norm(S[:, j])))
    kept: list[int] = []
    for j in order:
        if strength[names[j]] < MIN_SENSITIVITY or len(kept) + 2 > len(runs):  # keep more runs than parameters
            continue
        sub = S[:, kept + [j]]
        try:
            rel = NOISE_REL * np.sqrt(np.diag(np.linalg.inv(sub.T @ sub)))
        except np.linalg.LinAlgError:
            continue
        if np.all(np.isfinite(rel)) and np.all(rel <= MAX_REL_SIGMA):
            kept.append(j)
    return [names[j] for j in kept], strength


def fit_runs(runs: Sequence[CalibrationRun], names: Sequence[str], init: Mapping[str, float] | None = None) -> CalibrationResult:
    """Fit ``names`` (starting from ``init`` or the current values) to the measured times."""
    if not names:
        raise InputError("constants", list(names), "at least one constant the runs can identify")
    start = start_values(runs, init)
    _check({k: start[k] for k in names})
    params = {k: (min(max(start[k], _BOUNDS[0]), _BOUNDS[1]), *_BOUNDS) for k in names}
    # Constants not fitted stay as the runs and planner.cost.constants have them.
    return fit_constants(predict_step_time, list(runs), [r.measured_s for r in runs], params)


def calibration_from_profile(entries: Mapping[str, ProfileEntry]) -> Calibration:
    """The :class:`Calibration` of a loaded cluster profile (:func:`planner.calibration.fit.load_profile`)."""
    return Calibration.from_values({k: e.value for k, e in entries.items()})
