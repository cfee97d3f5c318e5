"""Pipeline schedule simulation: per-stage event lists for GPipe, 1F1B and interleaved 1F1B.

Each pipeline rank executes a fixed operation order (its "program") one operation after the
other; an operation starts at ``max(rank free, dependencies ready)`` (deterministic list
scheduling). Gaps are filled with ``idle`` events so that every rank's events tile
``[0, makespan_s]`` exactly (consecutive events share the same float endpoint).

Operation orders
----------------
* ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe").
* ``1f1b``: PipeDream-Flush (Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", sec. 2.2.1): rank r runs ``min(p - r - 1, m)``
  warm-up forwards, then alternates one forward / one backward, then drains the backwards.
* ``interleaved``: Megatron-LM's interleaved 1F1B (same paper, sec. 2.2.2; Megatron-LM
  ``megatron/core/pipeline_parallel/schedules.py``, ``forward_backward_pipelining_with_interleaving``):
  each rank holds ``v`` model chunks, chunk c of rank r is virtual stage ``c * p + r``;
  warm-up = ``min((p - r - 1) * 2 + (v - 1) * p, m * v)``; the k-th forward of a rank runs
  chunk ``(k // p) % v`` on micro-batch ``(k // (p * v)) * p + k % p``, the k-th backward the
  chunk ``v - 1 - (k // p) % v`` of the same micro-batch formula. Requires ``m % p == 0``.

Dependencies: forward of micro-batch i on (virtual) stage s+1 starts after the forward of i
on stage s plus ``p2p_s``; backward of i on stage s starts after the backward of i on stage
s+1 plus ``p2p_s`` and after the stage's own forward of i. A send is modelled as blocking the
sender for ``p2p_s`` right after the op that produced the tensor (a ``p2p`` event; Megatron's
non-overlapped send/recv); the receiver's recv is pre-posted and costs nothing.
Recomputation (``recompute_s``) runs immediately before each backward, once the output
gradient has arrived (as in Megatron, where it happens inside the backward step).
After its last pipeline op each rank appends its exposed data-parallel gradient
communication (``dp_comm``) and then its ``optimizer`` step.

Closed forms (equal stage times f, b, no p2p): 1F1B and GPipe take ``(m + p - 1)(f + b)``,
bubble fraction ``(p - 1) / m``; interleaved takes ``(m + (p - 1) / v)(f + b)``, bubble
``(p - 1) / (v * m)`` (Narayanan et al. 2021 sec. 2.2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InputError

__all__ = [
    "EVENT_KINDS",
    "SCHEDULE_KINDS",
    "Event",
    "Schedule",
    "simulate_schedule",
    "makespan_and_bubble",
    "per_stage_view",
]

EVENT_KINDS: tuple[str, ...] = ("fwd", "bwd", "wgrad", "recompute", "p2p", "idle", "optimizer", "dp_comm")
SCHEDULE_KINDS: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2")
_PIPELINE_KINDS = frozenset({"fwd", "bwd", "wgrad", "recompute", "p2p"})


@dataclass(frozen=True)
class Event:
    """One interval on one pipeline rank; ``microbatch``/``chunk`` are None for idle, optimizer, dp_comm."""

    kind: str
    start_s: float
    end_s: float
    microbatch: int | None = None
    chunk: int | None = None

    @property
    def dur_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Schedule:
    """Simulated schedule: ``stages[r]`` is rank r's event list, tiling ``[0, makespan_s]``."""

    kind: str
    pp: int
    vpp: int
    num_microbatches: int
    stages: tuple[tuple[Event, ...], ...]
    makespan_s: float


def _check_int(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(field, value, f"an integer >= {minimum}")
    return value


def _per_stage(field: str, value: object, pp: int, *, positive: bool) -> tuple[float, ...]:
    """Broadcast a scalar or check a length-pp sequence of finite durations in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values = (float(value),) * pp
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != pp:
            raise InputError(field, value, f"a number or a sequence of {pp} numbers (one per stage)")
        values = tuple(value)
    else:
        raise InputError(field, value, f"a number or a sequence of {pp} numbers (one per stage)")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(field, value, "finite durations in seconds")
        if v < 0 or (positive and v == 0):
            raise InputError(field, value, "durations > 0 s" if positive else "durations >= 0 s")
        out.append(float(v))
    return tuple(out)


def _program(kind: str, pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """Operation order of one rank as (op in {"F", "B", "W"}, micro-batch, chunk); "B" is the
    whole backward but where a "W" of the same micro-batch follows it (then B is the
    input-gradient part only and W the weight gradients)."""
    if kind == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if kind == "1f1b":
        warmup = min(pp - rank - 1, m)
        ops = [("F", i, 0) for i in range(warmup)]
        for k in range(m - warmup):
            ops += [("F", warmup + k, 0), ("B", k, 0)]
        return ops + [("B", k, 0) for k in range(m - warmup, m)]
    if kind in ("zb-h1", "zb-h2"):
        return _zb_program(kind, pp, m, rank)
    # Megatron interleaved 1F1B.
    total = m * vpp

    def micro(k: int) -> int:
        return (k // (pp * vpp)) * pp + k % pp

    def fchunk(k: int) -> int:
        return (k // pp) % vpp

    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    ops = [("F", micro(k), fchunk(k)) for k in range(warmup)]
    for k in range(total - warmup):
        kf = k + warmup
        ops += [("F", micro(kf), fchunk(kf)), ("B", micro(k), vpp - 1 - fchunk(k))]
    return ops + [("B", micro(k), vpp - 1 - fchunk(k)) for k in range(total - warmup, total)]


def _zb_program(kind: str, pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The forwards and backwards of the zero-bubble schedules in 1F1B's order with more
    warm-up forwards (the weight-gradient passes are placed as the simulation runs,
    :func:`simulate_schedule`): ``pp - rank`` for ZB-H1, ``2 (pp - rank) - 1`` for ZB-H2, the
    forwards that fit before the first gradient comes back (Qi et al. 2024, "Zero Bubble
    Pipeline Parallelism", sec. 3.1, Figs. 3-4)."""
    warmup = min(pp - rank if kind == "zb-h1" else 2 * (pp - rank) - 1, m)
    ops = [("F", i, 0) for i in range(warmup)]
    for k in range(m):
        ops.append(("B", k, 0))
        if warmup + k < m:
            ops.append(("F", warmup + k, 0))
    return ops


def _zb_in_flight(kind: str, pp: int) -> int:
    """Micro-batches a rank may hold (forward run, weight gradients not yet): 1F1B's first-stage
    peak ``pp`` for ZB-H1, ``2 pp - 1`` for ZB-H2 (Qi et al. 2024, Table 1: peak memory
    p M_B and (2p - 1) M_B)."""
    return pp if kind == "zb-h1" else 2 * pp - 1


def simulate_schedule(
    pp: int,
    vpp: int,
    num_microbatches: int,
    kind: str,
    fwd_s: float | Sequence[float],
    bwd_s: float | Sequence[float],
    recompute_s: float | Sequence[float] = 0.0,
    p2p_s: float = 0.0,
    optimizer_s: float | Sequence[float] = 0.0,
    dp_exposed_s: float | Sequence[float] = 0.0,
    wgrad_s: float | Sequence[float] = 0.0,
) -> Schedule:
    """Simulate one training step's pipeline schedule.

    ``fwd_s``/``bwd_s``/``recompute_s``/``optimizer_s``/``dp_exposed_s`` are per *stage* (rank)
    per micro-batch (a scalar is broadcast); ``bwd_s`` includes the weight-gradient pass. For
    ``interleaved`` each of a rank's ``vpp`` chunks takes the rank's durations / ``vpp``;
    ``p2p_s`` is paid per send between adjacent (virtual) stages. ``wgrad_s`` is the part of
    ``bwd_s`` the zero-bubble schedules run as a separate weight-gradient pass ("wgrad" events).
    """
    pp = _check_int("pp", pp, 1)
    vpp = _check_int("vpp", vpp, 1)
    m = _check_int("num_microbatches", num_microbatches, 1)
    if kind not in SCHEDULE_KINDS:
        raise InputError("kind", kind, f"one of {', '.join(SCHEDULE_KINDS)}")
    if kind == "interleaved":
        if vpp < 2:
            raise InputError("vpp", vpp, "an integer >= 2 for the interleaved schedule")
        if m % pp != 0:
            raise InputError("num_microbatches", m, f"a multiple of pp={pp} for the interleaved schedule")
    elif vpp != 1:
        raise InputError("vpp", vpp, f"1 for the {kind} schedule (use kind='interleaved' for vpp > 1)")
    fwd = _per_stage("fwd_s", fwd_s, pp, positive=True)
    bwd = _per_stage("bwd_s", bwd_s, pp, positive=True)
    rec = _per_stage("recompute_s", recompute_s, pp, positive=False)
    opt = _per_stage("optimizer_s", optimizer_s, pp, positive=False)
    dpc = _per_stage("dp_exposed_s", dp_exposed_s, pp, positive=False)
    wgr = _per_stage("wgrad_s", wgrad_s, pp, positive=False) if kind.startswith("zb") else (0.0,) * pp
    if any(w >= b for w, b in zip(wgr, bwd)):
        raise InputError("wgrad_s", wgrad_s, "durations below bwd_s (the weight gradients are part of the backward)")
    p2p = _per_stage("p2p_s", p2p_s, 1, positive=False)[0]

    n_virtual = pp * vpp
    programs = [_program(kind, pp, vpp, m, r) for r in range(pp)]
    pos = [0] * pp
    free_s = [0.0] * pp
    events: list[list[Event]] = [[] for _ in range(pp)]
    fwd_done: dict[tuple[int, int], float] = {}   # (micro-batch, virtual stage) -> fwd end
    fwd_ready: dict[tuple[int, int], float] = {}  # input activation arrived
    bwd_ready: dict[tuple[int, int], float] = {}  # output gradient arrived

    def emit(rank: int, ev_kind: str, start: float, dur: float, mb: int | None, ch: int | None) -> float:
        if start > free_s[rank]:
            events[rank].append(Event("idle", free_s[rank], start))
        end = start + dur
        if dur > 0:
            events[rank].append(Event(ev_kind, start, end, mb, ch))
        free_s[rank] = end
        return end

    def ready(rank: int) -> float | None:
        op, mb, ch = programs[rank][pos[rank]]
        vs = ch * pp + rank
        if op == "F":
            return 0.0 if vs == 0 else fwd_ready.get((mb, vs))
        own = fwd_done.get((mb, vs))
        if own is None:
            return None
        if vs == n_virtual - 1:
            return own
        grad = bwd_ready.get((mb, vs))
        return None if grad is None else max(own, grad)

    zb = kind.startswith("zb")
    pending: list[list[int]] = [[] for _ in range(pp)]  # micro-batches whose W has not run
    in_flight = [0] * pp
    limit = _zb_in_flight(kind, pp) if zb else 0

    def run_w(r: int) -> None:
        emit(r, "wgrad", free_s[r], wgr[r], pending[r].pop(0), 0)
        in_flight[r] -= 1

    def step(r: int) -> bool:
        """Run rank r's next operation if its inputs are known; False when it must wait. On the
        zero-bubble schedules a pending weight-gradient pass W (oldest first) runs before it
        where it fits whole in the wait for the operation's input, where a forward would exceed
        the in-flight limit, and at the end (the rules of Qi et al. 2024 sec. 3.1; a rank that
        waits is idle, so a W placed into its wait once the input time is known is exact)."""
        if pos[r] == len(programs[r]):
            if not pending[r]:
                return False
            run_w(r)
            return True
        dep = ready(r)
        if dep is None:
            return False
        op, mb, ch = programs[r][pos[r]]
        while pending[r] and (free_s[r] + wgr[r] <= dep + 1e-12 * max(1.0, dep) or (op == "F" and in_flight[r] >= limit)):
            run_w(r)
        vs = ch * pp + r
        start = max(free_s[r], dep)
        if op == "F":
            end = emit(r, "fwd", start, fwd[r] / vpp, mb, ch)
            fwd_done[(mb, vs)] = end
            in_flight[r] += zb
            if vs < n_virtual - 1:
                fwd_ready[(mb, vs + 1)] = emit(r, "p2p", end, p2p, mb, ch)
        else:
            end = emit(r, "recompute", start, rec[r] / vpp, mb, ch)
            end = emit(r, "bwd", end, (bwd[r] - wgr[r]) / vpp, mb, ch)
            if zb:
                pending[r].append(mb)
            if vs > 0:
                bwd_ready[(mb, vs - 1)] = emit(r, "p2p", end, p2p, mb, ch)
        pos[r] += 1
        return True

    while any(pos[r] < len(programs[r]) or pending[r] for r in range(pp)):
        progressed = False
        for r in range(pp):
            while step(r):
                progressed = True
        if not progressed:  # cannot happen for the orders above; guards future edits
            raise RuntimeError(f"pipeline schedule {kind} deadlocked at positions {pos}")

    for r in range(pp):
        emit(r, "dp_comm", free_s[r], dpc[r], None, None)
        emit(r, "optimizer", free_s[r], opt[r], None, None)
    makespan = max(free_s)
    for r in range(pp):
        if free_s[r] < makespan:
            events[r].append(Event("idle", free_s[r], makespan))
    return Schedule(kind, pp, vpp, m, tuple(tuple(e) for e in events), makespan)


def per_stage_view(schedule: Schedule) -> Schedule:
    """The schedule with every rank's events shifted to start at its first operation: how a
    rank's step looks when steps run back to back and each rank starts its next step as soon as
    its own work is done (ZB-H2 with the Zero Bubble fork's optimizer post-validation, Qi et al.
    2024 sec. 4: the warm-up staircase overlaps the previous step). Rows are padded with idle to
    the longest one."""
    rows = []
    for stage in schedule.stages:
        busy = [e for e in stage if e.kind != "idle"]
        off = busy[0].start_s if busy else 0.0
        rows.append([Event(e.kind, e.start_s - off, e.end_s - off, e.microbatch, e.chunk) for e in stage if e.end_s > off])
    span = max((r[-1].end_s for r in rows if r), default=0.0)
    for r in rows:
        end = r[-1].end_s if r else 0.0
        if end < span:
            r.append(Event("idle", end, span))
    return Schedule(schedule.kind, schedule.pp, schedule.vpp, schedule.num_microbatches, tuple(tuple(r) for r in rows), span)


def makespan_and_bubble(schedule: Schedule) -> tuple[float, float]:
    """Return ``(makespan_s, bubble_fraction)``.

    ``bubble_fraction = (pipeline_span_s - ideal_s) / ideal_s`` (Narayanan et al. 2021 sec. 2.2.1,
    t_pb / t_id), where ``pipeline_span_s`` is the end of the last fwd/bwd/recompute/p2p event
    (the optimizer and exposed DP tail are excluded) and ``ideal_s`` is the busiest rank's total
    fwd+bwd+recompute+p2p time, i.e. the step time of a bubble-free pipeline. With equal stage
    times this is (p-1)/m for 1F1B and GPipe and (p-1)/(v*m) for interleaved 1F1B.
    """
    span_s = 0.0
    ideal_s = 0.0
    for stage in schedule.stages:
        busy = [e for e in stage if e.kind in _PIPELINE_KINDS]
        if busy:
            span_s = max(span_s, max(e.end_s for e in busy))
            ideal_s = max(ideal_s, math.fsum(e.dur_s for e in busy))
    bubble = (span_s - ideal_s) / ideal_s if ideal_s > 0 else 0.0
    return schedule.makespan_s, bubble
