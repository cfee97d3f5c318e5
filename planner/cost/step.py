"""The one step-time assembly: from per-stage quantities to the step time.

    T_step = T_pipeline + max_i sync_i + max_i opt_i + embedding sync + fixed overhead
    T_pipeline = c_max * max_i t_i + c_sum * sum_i t_i

with t_i stage i's time per micro-batch, ``(c_max, c_sum)`` the schedule's coefficients
(:func:`pipeline_coefficients`; 1F1B and interleaved 1F1B: ``(m - 1/v, 1/v)``, i.e.
``m t_max + (sum_i t_i - t_max) / v``, which with equal stages is ``(m + (p - 1)/v) t``: the
bubble fraction (p - 1)/(v m) of Narayanan et al. 2021 eq. 1 and sec. 2.2.2), sync_i the
exposed part of stage i's once-per-step communication (each (comm, window) part exposed by
:func:`planner.cost.stages.overlap_exposed`, plus what cannot hide) and opt_i its optimizer step.

:func:`planner.cost.estimate.estimate` evaluates it; the layer-split program
(:mod:`planner.search.split`) and the mixed-cluster program (:mod:`planner.search.hetero`)
minimise it, reading the coefficients from :func:`pipeline_coefficients` and the overlap rule's
linear pieces from :func:`sync_branches`, so the three cannot drift apart.

>>> pipeline_coefficients(8, 1, "1f1b")
(7.0, 1.0)
>>> round(assemble([1.0, 1.0], [0.0, 0.0], [0.1, 0.1], m=8, v=1, schedule="1f1b", extra_s=0.02).step_s, 9)
9.12
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["pipeline_coefficients", "sync_branches", "StepParts", "assemble"]


def pipeline_coefficients(m: int, v: int, schedule: str) -> tuple[float, float]:
    """(c_max, c_sum) with T_pipeline = c_max max_i t_i + c_sum sum_i t_i for ``m`` micro-batches
    and ``v`` virtual stages per rank. GPipe has 1F1B's bubble (it differs in memory)."""
    return m - 1.0 / v, 1.0 / v


def sync_branches(parts, eta: float) -> list[tuple[float, float, float, float]]:
    """The linear pieces of sum_j exposed(s_j, w_j) over one stage's (comm, window) parts:
    exposed(s, w) = s - eta min(s, w) = max((1 - eta) s, s - eta w), so the sum of maxima is the
    maximum, over one branch per part, of sum_j (alpha_j s_j - beta_j w_j). Returns, for every
    choice of branches, the coefficient pairs as ``[(alpha_j, beta_j) for j]`` flattened per
    part: a list of tuples ``((alpha_0, beta_0), (alpha_1, beta_1), ...)``."""
    per_part = [((1.0 - eta, 0.0), (1.0, eta)) for _ in parts]
    return [tuple(c) for c in itertools.product(*per_part)]


@dataclass(frozen=True)
class StepParts:
    """The step time and its assembly terms (seconds)."""

    pipeline_s: float
    bubble_s: float
    sync_s: float
    optimizer_s: float
    extra_s: float
    critical_stage: int

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.sync_s + self.optimizer_s + self.extra_s


def assemble(stage_t: list[float], sync_exposed: list[float], optimizer: list[float], *, m: int, v: int, schedule: str,
             extra_s: float) -> StepParts:
    """The step time from per-stage time per micro-batch, exposed sync and optimizer time;
    ``extra_s``: split-independent terms (embedding sync, fixed overhead)."""
    c_max, c_sum = pipeline_coefficients(m, v, schedule)
    t_max = max(stage_t)
    pipe = c_max * t_max + c_sum * sum(stage_t)
    return StepParts(pipeline_s=pipe, bubble_s=pipe - m * t_max, sync_s=max(sync_exposed), optimizer_s=max(optimizer),
                     extra_s=extra_s, critical_stage=stage_t.index(t_max))
