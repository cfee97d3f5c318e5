"""What part of a pipeline schedule a picture draws, and where its time axis goes.

With a hundred micro-batches a to-scale timeline is a barcode: every bar is a pixel or two
wide. The steady state of 1F1B and interleaved 1F1B is periodic (one forward and one
backward per micro-batch and chunk on every rank, Narayanan et al. 2021 sec. 2.2), so a
picture loses nothing by drawing the warm-up, a few periods of the steady state, a marked
cut, and the last periods with the cool-down. :func:`timeline_view` finds that cut:

* warm-up ends when the first rank starts its first backward on every rank
  (``max_r`` of each rank's first ``bwd`` start: rank 0 is the last to get one);
* cool-down starts when the first rank has run its last forward (``min_r`` of each rank's
  last ``fwd`` end);
* the steady state between them is cut after ``KEEP_PERIODS`` periods and resumes
  ``KEEP_PERIODS`` periods before the cool-down; the cut spans a whole number of periods
  (one period = the busiest rank's pipeline time / micro-batches), so the pattern after the
  cut continues in phase with the one before it.

Schedules with at most ``SUMMARY_MIN_MICROBATCHES`` micro-batches, or whose steady state is
too short to cut, are drawn whole. :class:`View` maps seconds to pixels on either side of
the cut and gives the tick positions (the same tick step on both sides, real times as labels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SUMMARY_MIN_MICROBATCHES", "KEEP_PERIODS", "View", "timeline_view", "nice_ticks"]

SUMMARY_MIN_MICROBATCHES = 24
KEEP_PERIODS = 3
_PIPE = ("fwd", "bwd", "wgrad", "recompute", "p2p")


def nice_ticks(span_s: float, target_count: int = 8) -> list[float]:
    """Tick positions 0, step, 2*step, ... <= span_s with step in {1, 2, 5} x 10^k."""
    if not (span_s > 0 and math.isfinite(span_s)):
        return [0.0]
    step = tick_step(span_s, target_count)
    count = int(math.floor(span_s / step * (1 + 1e-12))) + 1
    return [round(i * step, 12) for i in range(count)]


def tick_step(span_s: float, target_count: int = 8) -> float:
    raw = span_s / max(1, target_count)
    base = 10.0 ** math.floor(math.log10(raw))
    return next(base * k for k in (1, 2, 5, 10) if base * k >= raw)


@dataclass(frozen=True)
class View:
    """Seconds to pixels: ``[0, cut_start_s]`` and ``[cut_end_s, makespan_s]`` share one scale,
    ``gap_px`` apart (no cut: ``cut_start_s == cut_end_s == makespan_s``)."""

    makespan_s: float
    cut_start_s: float
    cut_end_s: float
    period_s: float
    omitted_microbatches: int
    left_px: float
    width_px: float
    gap_px: float = 0.0

    @property
    def cut(self) -> bool:
        return self.cut_end_s > self.cut_start_s

    @property
    def shown_s(self) -> float:
        return self.makespan_s - (self.cut_end_s - self.cut_start_s)

    @property
    def scale(self) -> float:
        """Pixels per second."""
        return (self.width_px - self.gap_px) / self.shown_s if self.shown_s > 0 else 0.0

    def x(self, t: float) -> float:
        """Pixel of time ``t`` (a time inside the cut maps to the cut's left edge)."""
        if t <= self.cut_start_s or not self.cut:
            return self.left_px + t * self.scale
        if t < self.cut_end_s:
            return self.left_px + self.cut_start_s * self.scale
        return self.left_px + (t - (self.cut_end_s - self.cut_start_s)) * self.scale + self.gap_px

    def visible(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        """The parts of ``[start_s, end_s]`` that are drawn (none, one, or two around the cut)."""
        if not self.cut:
            return [(start_s, end_s)]
        parts = []
        if start_s < self.cut_start_s:
            parts.append((start_s, min(end_s, self.cut_start_s)))
        if end_s > self.cut_end_s:
            parts.append((max(start_s, self.cut_end_s), end_s))
        return parts

    def ticks(self, target_count: int = 8) -> list[float]:
        """Tick times: one step for the whole picture, left of the cut and right of it."""
        if not self.cut:
            return nice_ticks(self.makespan_s, target_count)
        step = tick_step(self.shown_s, target_count)
        left = [round(i * step, 12) for i in range(int(self.cut_start_s / step * (1 + 1e-12)) + 1)]
        first = math.ceil((self.cut_end_s + 0.5 * step) / step)  # half a step clear of the cut marker
        right = [round(i * step, 12) for i in range(first, int(self.makespan_s / step * (1 + 1e-12)) + 1)]
        return left + right


def _period(schedule) -> float:
    busy = max((sum(e.dur_s for e in stage if e.kind in _PIPE) for stage in schedule.stages), default=0.0)
    return busy / schedule.num_microbatches if schedule.num_microbatches else 0.0


def timeline_view(schedule, left_px: float, width_px: float, summarise: bool | None = None, gap_px: float = 28.0) -> View:
    """The view of ``schedule`` drawn ``width_px`` wide from ``left_px``: cut or whole.

    ``summarise``: None cuts when there are more than :data:`SUMMARY_MIN_MICROBATCHES`
    micro-batches and the steady state holds more than ``2 KEEP_PERIODS + 2`` periods; True
    cuts whenever it can; False never."""
    span = schedule.makespan_s
    whole = View(span, span, span, _period(schedule), 0, left_px, width_px)
    if summarise is False or (summarise is None and schedule.num_microbatches <= SUMMARY_MIN_MICROBATCHES):
        return whole
    period = whole.period_s
    firsts = [next((e.start_s for e in stage if e.kind == "bwd"), None) for stage in schedule.stages]
    lasts = [max((e.end_s for e in stage if e.kind == "fwd"), default=None) for stage in schedule.stages]
    if period <= 0 or None in firsts or None in lasts:
        return whole
    warm_end, cool_start = max(firsts), min(lasts)
    t1 = warm_end + KEEP_PERIODS * period
    n = math.floor((cool_start - KEEP_PERIODS * period - t1) / period)
    if n < 2:
        return whole
    return View(span, t1, t1 + n * period, period, n, left_px, width_px, gap_px)
