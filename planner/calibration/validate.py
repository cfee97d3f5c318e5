"""Predict published runs and score the cost model against them (``planner validate``).

For each run, the non-null fields of its ``parallel`` block are fixed; every unknown field
is filled with the planner's own best choice over the unknowns only (the fastest
configuration that fits in memory), and the output says what was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.estimate import Estimate, estimate
from planner.errors import NoFeasiblePlan
from planner.io.loaders import Run
from planner.search.plan import plan
from planner.search.space import SearchOptions
from planner.specs import ParallelConfig

__all__ = ["RunResult", "fill_and_predict", "validate_runs", "summary", "fixed_fields"]

_MAP = {"tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero"}


@dataclass(frozen=True)
class RunResult:
    id: str
    parallel: ParallelConfig
    filled: tuple[str, ...]
    estimate: Estimate
    measured_step_time_s: float | None

    @property
    def error_pct(self) -> float | None:
        if not self.measured_step_time_s:
            return None
        return 100.0 * (self.estimate.step_time_s - self.measured_step_time_s) / self.measured_step_time_s

    def as_dict(self) -> dict:
        par = self.parallel.as_dict()
        par["num_microbatches"] = self.estimate.num_microbatches
        return {
            "id": self.id,
            "parallel": par,
            "filled": list(self.filled),
            "predicted": {
                "step_time_s": self.estimate.step_time_s,
                "tokens_per_s": self.estimate.tokens_per_s,
                "mfu": self.estimate.mfu,
                "tflops_per_gpu": self.estimate.tflops_per_gpu,
                "memory_peak_bytes": self.estimate.memory_peak_bytes,
                "bound": self.estimate.bound,
            },
            "measured": {"step_time_s": self.measured_step_time_s},
            "error_pct": self.error_pct,
        }


def fixed_fields(parallel: dict) -> dict:
    fixed = {k: v for k, v in parallel.items() if k in _MAP and v is not None}
    if parallel.get("schedule") in ("1f1b", "gpipe") and "vpp" not in fixed:
        fixed["vpp"] = 1
    return fixed


def fill_and_predict(run: Run, opts: SearchOptions | None = None) -> RunResult:
    """Fill the run's unknown parallel fields with the best feasible choice and predict it.

    The fill is the planner's own search (:func:`planner.search.plan.plan`) with the run's
    known fields fixed; when nothing fits, the nearest miss is reported.
    """
    fixed = fixed_fields(run.parallel)
    base = opts or SearchOptions()
    opts = SearchOptions(fixed=fixed, allow_tp_across_nodes=True, max_micro_batch=base.max_micro_batch,
                         flash_attention=base.flash_attention, generation=base.generation, uneven_split=base.uneven_split and not run.parallel.get("layers_per_stage"))
    from planner.engines import resolve_flash  # noqa: PLC0415

    flash = resolve_flash(run.job, opts.generation, opts.flash_attention)
    try:
        best = plan(run.model, run.cluster, run.job, top_k=1, options=opts).plans[0]
        par, est = best.parallel, best.estimate
    except NoFeasiblePlan as exc:
        if exc.nearest is None:
            raise
        par = exc.nearest
        est = estimate(run.model, run.cluster, run.job, par, flash_attention=flash)
    if run.parallel.get("layers_per_stage"):
        par = ParallelConfig(**{**par.__dict__, "layers_per_stage": tuple(run.parallel["layers_per_stage"])})
        est = estimate(run.model, run.cluster, run.job, par, flash_attention=flash)
    filled = tuple(sorted(f for f in _MAP if f not in fixed))
    meas = (run.measured or {}).get("step_time_s")
    return RunResult(run.id, par, filled, est, meas)


def validate_runs(runs: list[Run], opts: SearchOptions | None = None) -> list[RunResult]:
    return [fill_and_predict(r, opts) for r in runs]


def summary(results: list[RunResult]) -> dict:
    errs = [abs(r.error_pct) for r in results if r.error_pct is not None]
    return {
        "n": len(errs),
        "mape_pct": sum(errs) / len(errs) if errs else None,
        "max_abs_error_pct": max(errs) if errs else None,
    }
