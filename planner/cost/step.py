"""The one step-time assembly: from per-stage quantities to the step time.

    T_step = T_pipeline + max_i sync_i + max_i opt_i + embedding sync + fixed overhead
    T_pipeline = m T + max(0, a (sum_i t_i - T) + b (sum_i w_i - W) + c (sum_i f_i - F))

with t_i stage i's time per micro-batch, w_i its weight-gradient part, f_i its forward part,
T, W, F their maxima over the stages, and (a, b, c) the schedule's :func:`pipeline_form`:

==============  ======================  ==================================================
schedule        (a, b, c)               equal stages: bubble
==============  ======================  ==================================================
1F1B, GPipe     (1, 0, 0)               (p - 1) t            Narayanan et al. 2021 eq. 1
interleaved     (1/v, 0, 0)             (p - 1) t / v        Narayanan et al. 2021 sec. 2.2.2
ZB-H1           (1, -2, 0)              (p - 1)(F + B - W)   Qi et al. 2024 (Zero Bubble), Table 1
ZB-H2           (1, -3, 0)              (p - 1)(F + B - 2W)  same
ZB-V            (1/2, -3/2, 0)          (p - 1)(F + B - 2W)/2, chunks of half a stage (same paper, ZB-V)
DualPipeV       (1, -3/2, -1/2)         (p - 1)(F + 2B - W)/2, chunks of half a stage (below)
==============  ======================  ==================================================

with t = F + B + W per rank and micro-batch (B: the input-gradient part of the backward; W: the
weight gradients that zero-bubble schedules defer into the bubble).

The ZB forms hold where a W fits whole in the wait it fills (W <= F: :func:`planner.cost.stages.
stage_fw` caps W at F; the schedule simulator, :mod:`planner.report.schedule`, reproduces ZB-H1
and ZB-H2 exactly there) and, for ZB-H2, where its 2p - 1 warm-up forwards exist (m >= 2p - 1;
with fewer it keeps ZB-H1's order and form). ZB-H2's figure is each stage's span from its first
forward to its last W: the fork's optimizer post-validation (``--enable-optimizer-post-validation``,
Qi et al. sec. 4) lets a stage start its next step without waiting for the others, so the
warm-up staircase overlaps the previous step.

``dualpipe`` is DualPipeV, the cut-in-half DualPipe of DeepSeek-V3 that torchtitan runs
(``DualPipeV``): p ranks, two chunks of half a stage each, one copy of the weights. The
deepseek-ai/DualPipe README gives its bubble as (PP/2 - 1)(F&B + B' - 3W) on PP/2 devices, in
chunk times, with B' the whole backward and F&B the overlapped forward-and-backward chunk (arXiv
2412.19437 sec. 3.2.1, Table 2). Taking F&B = F + B' (the overlap hides the expert all-to-all,
not compute) and rank times (twice the chunk's), that is (p - 1)(F + 2B - W)/2.
The bubble never goes below zero.
sync_i is the exposed part of stage i's once-per-step communication (each (comm, window) part
exposed by :func:`planner.cost.stages.overlap_exposed`) and opt_i its optimizer step.

:func:`planner.cost.estimate.estimate` evaluates it; the layer-split program
(:mod:`planner.search.split`) and the mixed-cluster program (:mod:`planner.search.hetero`)
minimise it, reading the same :func:`pipeline_form` and the overlap rule's linear pieces from
:func:`sync_branches`, so the three cannot drift apart.

>>> pipeline_form("1f1b", 8, 1, 4)
(1.0, 0.0, 0.0)
>>> round(assemble([1.0, 1.0], [0.0, 0.0], [0.1, 0.1], m=8, v=1, schedule="1f1b", extra_s=0.02).step_s, 9)
9.12
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["pipeline_form", "pipeline_time", "sync_branches", "StepParts", "assemble", "SCHEDULE_FORMS"]

SCHEDULE_FORMS = ("1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe")


def pipeline_form(schedule: str, m: int, v: int, pp: int) -> tuple[float, float, float]:
    """(a, b, c) of the bubble a (sum t - T) + b (sum w - W) + c (sum f - F) (module table)."""
    if schedule in ("1f1b", "gpipe"):
        return 1.0, 0.0, 0.0
    if schedule == "interleaved":
        return 1.0 / v, 0.0, 0.0
    if schedule == "zb-h1":
        return 1.0, -2.0, 0.0
    if schedule == "zb-h2":
        return (1.0, -3.0, 0.0) if m >= 2 * pp - 1 else (1.0, -2.0, 0.0)
    if schedule == "zb-v":
        return 0.5, -1.5, 0.0
    if schedule == "dualpipe":
        return 1.0, -1.5, -0.5
    raise ValueError(f"schedule {schedule!r}: expected one of {SCHEDULE_FORMS}")


def pipeline_time(stage_t: list[float], stage_w: list[float], stage_f: list[float], m: int, form: tuple[float, float, float]) -> float:
    """m T + max(0, bubble) for the schedule ``form`` (:func:`pipeline_form`)."""
    a, b, c = form
    T = max(stage_t)
    bubble = a * (sum(stage_t) - T)
    if b:
        bubble += b * (sum(stage_w) - max(stage_w))
    if c:
        bubble += c * (sum(stage_f) - max(stage_f))
    return m * T + max(0.0, bubble)


def sync_branches(parts, eta: float) -> list[tuple[float, float, float, float]]:
    """The linear pieces of sum_j exposed(s_j, w_j) over one stage's (comm, window) parts:
    exposed(s, w) = s - eta min(s, w) = max((1 - eta) s, s - eta w), so the sum of maxima is the
    maximum, over one branch per part, of sum_j (alpha_j s_j - beta_j w_j). Returns, for every
    choice of branches, the coefficient pairs ``((alpha_0, beta_0), (alpha_1, beta_1), ...)``."""
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
             extra_s: float, stage_w: list[float] | None = None, stage_f: list[float] | None = None) -> StepParts:
    """The step time from per-stage time per micro-batch (and, for the zero-bubble schedules
    and DualPipe, its weight-gradient and forward parts), exposed sync and optimizer time;
    ``extra_s``: split-independent terms (embedding sync, fixed overhead)."""
    zeros = [0.0] * len(stage_t)
    form = pipeline_form(schedule, m, v, len(stage_t))
    pipe = pipeline_time(stage_t, stage_w or zeros, stage_f or zeros, m, form)
    t_max = max(stage_t)
    return StepParts(pipeline_s=pipe, bubble_s=pipe - m * t_max, sync_s=max(sync_exposed), optimizer_s=max(optimizer),
                     extra_s=extra_s, critical_stage=stage_t.index(t_max))

