"""GPU-hours and money to train a token budget, and the Pareto set of candidate plans.

Cost accounting (no model beyond arithmetic): a job of ``n_gpus`` GPUs that processes
``tokens_per_s`` tokens per second when nothing fails needs ``n_tokens / tokens_per_s``
seconds of compute; with goodput fraction g (:mod:`planner.studies.goodput`) its expected
wall-clock time is that divided by g, and every GPU is billed for the whole wall-clock
time (GPUs idle during checkpoint writes and restarts are still reserved):

    wall_time_s = n_tokens / tokens_per_s / g
    gpu_hours   = n_gpus * wall_time_s / 3600
    cost        = gpu_hours * price_per_gpu_hour

``cost`` is in the currency of ``price_per_gpu_hour``. See ``docs/goodput.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import InputError

__all__ = [
    "TrainingCost",
    "PlanPoint",
    "CostedPlan",
    "training_cost",
    "cost_plans",
    "pareto_front",
]

from planner.studies.goodput import SECONDS_PER_HOUR  # noqa: E402  (one definition)


def _number(name: str, value: object, *, positive: bool, upper: float | None = None) -> float:
    expected = "a finite number > 0" if positive else "a finite number >= 0"
    if upper is not None:
        expected += f" and <= {upper:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InputError(name, value, expected)
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0) or (upper is not None and x > upper):
        raise InputError(name, value, expected)
    return x


def _gpus(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(name, value, "an integer >= 1")
    return int(value)


@dataclass(frozen=True)
class TrainingCost:
    """Time and money to train a token budget on one configuration."""

    n_gpus: int
    tokens_per_s: float
    goodput_fraction: float
    compute_time_s: float  # failure-free
    wall_time_s: float  # expected, = compute_time_s / goodput_fraction
    gpu_hours: float
    cost: float  # in the currency of price_per_gpu_hour


def training_cost(
    n_tokens: float,
    tokens_per_s: float,
    n_gpus: int,
    price_per_gpu_hour: float,
    goodput_fraction: float = 1.0,
) -> TrainingCost:
    """GPU-hours and cost to train ``n_tokens`` (formulas in the module docstring)."""
    n = _number("n_tokens", n_tokens, positive=False)
    rate = _number("tokens_per_s", tokens_per_s, positive=True)
    gpus = _gpus("n_gpus", n_gpus)
    price = _number("price_per_gpu_hour", price_per_gpu_hour, positive=False)
    g = _number("goodput_fraction", goodput_fraction, positive=True, upper=1.0)
    compute_s = n / rate
    wall_s = compute_s / g
    gpu_h = gpus * wall_s / SECONDS_PER_HOUR
    return TrainingCost(gpus, rate, g, compute_s, wall_s, gpu_h, gpu_h * price)


@dataclass(frozen=True)
class PlanPoint:
    """One candidate: GPU count, failure-free step time and tokens per step (global batch)."""

    n_gpus: int
    step_time_s: float
    tokens_per_step: float
    goodput_fraction: float = 1.0
    label: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s


@dataclass(frozen=True)
class CostedPlan:
    """A :class:`PlanPoint` with its :class:`TrainingCost` for the token budget."""

    point: PlanPoint
    cost: TrainingCost


def _as_point(i: int, p: object) -> PlanPoint:
    """Accept a PlanPoint, a mapping with its field names, or a tuple in field order."""
    field = f"points[{i}]"
    if isinstance(p, PlanPoint):
        raw = p
    elif isinstance(p, Mapping):
        try:
            raw = PlanPoint(**p)
        except TypeError as exc:
            raise InputError(field, p, "keys n_gpus, step_time_s, tokens_per_step[, goodput_fraction, label]") from exc
    elif isinstance(p, Sequence) and not isinstance(p, str) and 3 <= len(p) <= 5:
        raw = PlanPoint(*p)
    else:
        raise InputError(field, p, "a PlanPoint, mapping or (n_gpus, step_time_s, tokens_per_step[, goodput, label])")
    return PlanPoint(
        n_gpus=_gpus(f"{field}.n_gpus", raw.n_gpus),
        step_time_s=_number(f"{field}.step_time_s", raw.step_time_s, positive=True),
        tokens_per_step=_number(f"{field}.tokens_per_step", raw.tokens_per_step, positive=True),
        goodput_fraction=_number(f"{field}.goodput_fraction", raw.goodput_fraction, positive=True, upper=1.0),
        label=str(raw.label),
    )


def cost_plans(points: Iterable[object], n_tokens: float, price_per_gpu_hour: float) -> list[CostedPlan]:
    """Cost every candidate for the same token budget and price, in input order."""
    out = []
    for i, p in enumerate(points):
        pt = _as_point(i, p)
        out.append(CostedPlan(pt, training_cost(n_tokens, pt.tokens_per_s, pt.n_gpus, price_per_gpu_hour,
                                                pt.goodput_fraction)))
    return out


def pareto_front(points: Iterable[object], n_tokens: float, price_per_gpu_hour: float) -> list[CostedPlan]:
    """Pareto-optimal candidates over (wall time, cost, GPU count), all minimised.

    A candidate is dropped if another is no worse in all three and strictly better in at
    least one (exact float comparison). Candidates with identical objectives are all kept.
    The result is sorted by wall time, then cost, then GPU count.
    """
    costed = cost_plans(points, n_tokens, price_per_gpu_hour)
    # Lexicographic sort: anything that dominates a candidate sorts strictly before it, and
    # a dominated dominator is itself dominated by an earlier kept one (transitivity), so
    # each candidate need only be checked against the front kept so far.
    order = sorted(costed, key=lambda c: (c.cost.wall_time_s, c.cost.cost, c.point.n_gpus))
    front: list[CostedPlan] = []
    front_obj = np.empty((0, 3))
    for c in order:
        o = np.array([c.cost.wall_time_s, c.cost.cost, float(c.point.n_gpus)])
        dominated = np.any(np.all(front_obj <= o, axis=1) & np.any(front_obj < o, axis=1))
        if not dominated:
            front.append(c)
            front_obj = np.vstack([front_obj, o])
    return front
