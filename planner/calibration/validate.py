"""Predict published runs and score the cost model against them (``planner validate``).

For each run, the engine it was measured on is named (:func:`planner.calibration.datasets.run_engine`),
the non-null fields of its ``parallel`` block are fixed, the engine resolves the fields it
decides (sequence parallelism, overlaps, kernels) as for any estimate, and every unknown
searched field (vpp, micro-batch, recompute, ZeRO, ...) is filled two ways:

* ``fastest``: the planner's own best choice over the unknowns (the fastest configuration that
  fits in memory) -- this biases predictions fast;
* ``median``: the median, by predicted step time, of every configuration over the unknowns that
  fits (the lower median; the engine's default layer split).

A run the planner cannot express (its engine refuses the layout, a field out of range) is
listed with its one-line reason and counted; the others are still scored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.calibration.datasets import run_engine, run_job_fields, run_model_fields, run_recipe
from planner.cost.constants import DEFAULT_CONSTANTS
from planner.cost.estimate import Estimate, estimate
from planner.errors import InputError, NoFeasiblePlan
from planner.io.loaders import Run
from planner.search.plan import plan
from planner.search.space import SearchOptions, candidates
from planner.specs import ParallelConfig

__all__ = ["RunResult", "Refused", "fill_and_predict", "validate_runs", "summary", "fixed_fields", "SEARCHED"]

# The fields a published run may leave unknown and the fill searches (the engine resolves the rest).
SEARCHED = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero")
FILLS = ("fastest", "median")


@dataclass(frozen=True)
class RunResult:
    """One scored run: the fastest fill (``parallel``, ``estimate``) and, when fields were
    unknown, the median fill (``median``); ``filled`` names the unknown fields."""

    id: str
    engine: str
    parallel: ParallelConfig
    filled: tuple[str, ...]
    estimate: Estimate
    measured: dict
    median: Estimate | None = None
    candidates: int = 1
    from_recipe: dict = dataclasses.field(default_factory=dict)  # fields read from the run's recipe (run_recipes.yaml)

    @property
    def measured_step_time_s(self) -> float | None:
        return self.measured.get("step_time_s")

    @staticmethod
    def _err(pred: float, meas: float | None) -> float | None:
        return 100.0 * (pred - meas) / meas if meas else None

    @property
    def error_pct(self) -> float | None:
        return self._err(self.estimate.step_time_s, self.measured_step_time_s)

    @property
    def median_error_pct(self) -> float | None:
        e = self.median or self.estimate
        return self._err(e.step_time_s, self.measured_step_time_s)

    @property
    def memory_metric(self) -> str | None:
        return self.measured.get("memory_metric") if self.measured.get("memory_peak_bytes") else None

    def predicted_memory_bytes(self, est: Estimate | None = None) -> float:
        """The predicted peak in the counter the run measured: ``max_allocated`` is what tensors
        hold, ``max_reserved`` and ``unknown`` the caching allocator's reserved peak (device memory
        outside the allocator is in neither torch counter)."""
        e = est or self.estimate
        return e.memory_allocated_peak_bytes if self.memory_metric == "max_allocated" else e.memory_reserved_peak_bytes

    @property
    def memory_error_pct(self) -> float | None:
        meas = self.measured.get("memory_peak_bytes")
        return self._err(self.predicted_memory_bytes(), meas) if meas else None

    def as_dict(self) -> dict:
        par = self.parallel.as_dict()
        par["num_microbatches"] = self.estimate.num_microbatches

        def pred(e: Estimate) -> dict:
            return {"step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "tflops_per_gpu": e.tflops_per_gpu,
                    "memory_peak_bytes": e.memory_peak_bytes, "memory_allocated_peak_bytes": e.memory_allocated_peak_bytes,
                    "bound": e.bound, "parallel": e.parallel.as_dict()}

        return {
            "id": self.id,
            "engine": self.engine,
            "parallel": par,
            "filled": list(self.filled),
            "from_recipe": dict(self.from_recipe),
            "candidates": self.candidates,
            "predicted": pred(self.estimate),
            "predicted_median_fill": pred(self.median) if self.median is not None else None,
            "measured": dict(self.measured),
            "error_pct": self.error_pct,
            "median_fill_error_pct": self.median_error_pct,
            "memory_error_pct": self.memory_error_pct,
        }


@dataclass(frozen=True)
class Refused:
    """A run the planner cannot express, with the one-line reason."""

    id: str
    engine: str
    reason: str

    def as_dict(self) -> dict:
        return {"id": self.id, "engine": self.engine, "reason": self.reason}


# A runs file's ``schedule: zb`` is the Zero Bubble fork's automatic schedule; its memory limit
# (--zero-bubble-max-pending-backward, p or 2p micro-batches, 2p by default in the fork's
# examples/pretrain_zero_bubble.sh) is the run's ``parallel.zb_variant`` note. ZB-1p runs at
# ZB-H1's activation memory, ZB-2p at ZB-H2's (Qi et al. 2024 sec. 3-4): the planner's schedules.
ZB_VARIANTS = {"zb-1p": "zb-h1", "zb-2p": "zb-h2"}

# A run that does not name its schedule ran its engine's default one (1F1B, or interleaved 1F1B
# with virtual stages): the fill does not pick a zero-bubble or V-shaped schedule for it.
DEFAULT_SCHEDULES = ("1f1b", "interleaved")

# A published run ran: when its unknown fields are filled, a configuration counts as fitting when
# the memory model's prediction is within the model's own error band of the capacity. The model's
# reserved-peak predictions fall within -5%..+15% of the measured peaks (benchmarks/
# memory_by_source.py), so a prediction up to 15% over the capacity can be a job that ran. (plan
# and estimate instead keep Constants.MEMORY_MARGIN_FRACTION free.)
FILL_MEMORY_MARGIN = -0.15


def fixed_fields(parallel: dict, notes: dict | None = None) -> dict:
    """The known fields of a runs file's ``parallel`` block, as search constraints (``notes``:
    the run's notes, which name the Zero Bubble variant of a ``zb`` schedule)."""
    fixed = {k: v for k, v in parallel.items() if k in SEARCHED and v is not None}
    sched = parallel.get("schedule")
    if sched == "zb":
        sched = ZB_VARIANTS.get(str((notes or {}).get("parallel.zb_variant", "zb-2p")).lower(), "zb-h2")
    if sched is not None:
        fixed["schedule"] = sched
        if sched in ("1f1b", "gpipe", "zb-h1", "zb-h2") and "vpp" not in fixed:
            fixed["vpp"] = 1
    for k in ("layers_per_stage", "zero_shard_degree", "etp", "moe_a2a_overlap", "moe_dispatcher", "cuda_graph", "tp_comm_overlap", "attention"):
        if parallel.get(k) is not None:
            fixed[k] = tuple(parallel[k]) if k == "layers_per_stage" else parallel[k]
    return fixed


def _median(run: Run, fixed: dict, engine: str) -> tuple[Estimate | None, int]:
    """The median-time fitting configuration over the unknowns, and how many fit."""
    opts = SearchOptions(fixed=fixed, allow_tp_across_nodes=True, engine=engine, schedules=DEFAULT_SCHEDULES)
    C = DEFAULT_CONSTANTS.replace(MEMORY_MARGIN_FRACTION=FILL_MEMORY_MARGIN)
    ests = []
    for par in candidates(run.model, run.cluster, run.job, opts):
        e = estimate(run.model, run.cluster, run.job, par, engine, C, validate=False)
        if e.fits:
            ests.append(e)
    if not ests:
        return None, 0
    ests.sort(key=lambda e: (e.step_time_s, e.parallel.short()))
    return ests[(len(ests) - 1) // 2], len(ests)


def with_sidecars(run: Run) -> tuple[Run, dict]:
    """The run as the planner reads it: the model fields its source states beside the row
    (``run_engines.yaml``) and the parallel fields its recipe states where the row leaves them
    null (``run_recipes.yaml``); and those recipe fields. ``validate`` and ``--scenario`` read a
    run the same way."""
    over = run_model_fields(run.id)
    job_over = {k: v for k, v in run_job_fields(run.id).items() if run.job.precision == "fp8" or not k.startswith("fp8_")}
    recipe, _ = run_recipe(run.id)
    recipe = {k: v for k, v in recipe.items() if run.parallel.get(k) is None}  # only what the row leaves out
    if over.get("moe") is not None and run.model.moe is not None:
        over = {**over, "moe": dataclasses.replace(run.model.moe, **over["moe"])}
    elif "moe" in over:
        over = {k: v for k, v in over.items() if k != "moe"}
    if over or recipe or job_over:
        run = Run(run.id, dataclasses.replace(run.model, **over), dataclasses.replace(run.job, **job_over), run.cluster,
                  {**run.parallel, **recipe}, run.measured, run.raw)
    return run, recipe


def fill_and_predict(run: Run, opts: SearchOptions | None = None, median: bool = True) -> RunResult:
    """Fill the run's unknown fields (fastest, and median when ``median``) and predict it.

    The fastest fill is the planner's own search (:func:`planner.search.plan.plan`) with the
    run's known fields fixed; when nothing fits, the nearest miss is reported. Raises
    InputError when the run's engine does not run its configuration.
    """
    engine = (opts.engine if opts is not None and opts.engine is not None else run_engine(run.id)[0])
    run, recipe = with_sidecars(run)
    fixed = fixed_fields(run.parallel, (run.raw or {}).get("notes"))
    base = opts or SearchOptions()
    margin = base.memory_margin if base.memory_margin is not None else FILL_MEMORY_MARGIN
    sopts = SearchOptions(fixed=fixed, allow_tp_across_nodes=True, max_micro_batch=base.max_micro_batch, engine=engine,
                          uneven_split=base.uneven_split and "layers_per_stage" not in fixed, memory_margin=margin,
                          schedules=DEFAULT_SCHEDULES)
    try:
        best = plan(run.model, run.cluster, run.job, top_k=1, options=sopts).plans[0]
        est = best.estimate
    except NoFeasiblePlan as exc:
        if exc.nearest is None:
            raise
        est = estimate(run.model, run.cluster, run.job, exc.nearest, engine)
    filled = tuple(f for f in SEARCHED if f not in fixed)
    med, n = (None, 1)
    if median and any(f in filled for f in SEARCHED if f != "sequence_parallel"):
        med, n = _median(run, fixed, engine)
    return RunResult(run.id, engine, est.parallel, filled, est, dict(run.measured or {}), med, n, recipe)


def validate_runs(runs: list[Run], opts: SearchOptions | None = None, median: bool = True) -> tuple[list[RunResult], list[Refused]]:
    """Score every run that can be expressed; the others are returned as :class:`Refused`.

    >>> import planner
    >>> from planner.calibration.datasets import dataset_path
    >>> results, refused = planner.validate_runs(planner.load_runs(dataset_path("public"))[:2], median=False)
    >>> [r.engine for r in results], refused
    (['megatron-legacy', 'megatron-legacy'], [])
    """
    results, refused = [], []
    for r in runs:
        try:
            results.append(fill_and_predict(r, opts, median))
        except (InputError, NoFeasiblePlan) as exc:
            refused.append(Refused(r.id, run_engine(r.id)[0], str(exc)))
    return results, refused


def _stats(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"n": len(a), "mape_pct": sum(a) / len(a) if a else None, "max_abs_error_pct": max(a) if a else None}


def summary(results: list[RunResult], refused: list[Refused] | None = None) -> dict:
    """Step-time error (fastest and median fill) and memory error over the scored runs."""
    step = [r.error_pct for r in results if r.error_pct is not None]
    med = [r.median_error_pct for r in results if r.median_error_pct is not None]
    mem = [r.memory_error_pct for r in results if r.memory_error_pct is not None]
    out = _stats(step)
    out["median_fill"] = _stats(med)
    out["memory"] = {**_stats(mem), "within_-5_+15_pct": sum(1 for e in mem if -5 <= e <= 15),
                     "under_by_more_than_5_pct": sum(1 for e in mem if e < -5)}
    out["refused"] = len(refused or [])
    return out
