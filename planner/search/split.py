"""The split of layers over pipeline stages, decided by a mixed-integer program.

For a fixed resolved configuration (tp, pp, dp, cp, vpp, micro-batch, recompute, ...), every
per-stage quantity of the cost model is affine in the stage's layer count n_i (time per
micro-batch, the (comm, window) parts of its once-per-step synchronisation, optimizer step,
memory), with an intercept that differs on the first stage (embedding) and the last (output
layer, loss). The step time of :func:`planner.cost.step.assemble` is then

    m T + B + D + O + const,   T >= t_i,  D >= sync_i,  O >= opt_i,
    B >= 0,  B >= a (sum_i t_i - T) + b (sum_i w_i - W) + c (sum_i f_i - F),  W >= w_i,  F >= f_i

with (a, b, c) the schedule's :func:`planner.cost.step.pipeline_form` (b = c = 0 but for the
zero-bubble schedules and DualPipe, where b, c <= 0 make W, F the maxima of the weight-gradient
and forward parts w_i, f_i at the optimum; m >= a makes T the maximum of t_i), and sync_i =
sum_j exposed(s_ij, w_ij) over the parts of stage i, a sum of maxima (the overlap rule of
:func:`planner.cost.stages.overlap_exposed`), i.e. the maximum over one linear branch per part
(:func:`planner.cost.step.sync_branches`). The split that minimises the step time under the
per-stage memory limit is the integer program

    min  m T + B + D + O
    s.t. t_i = a_i n_i + e_i (w_i, f_i likewise),  n_i = u k_i,  n_i >= v,  k_i integer,  sum_i n_i = L,
         T >= t_i,  D >= every branch sum of stage i,  O >= opt_i(n_i),  mem_i(n_i) <= capacity,

with u = v where the engine needs every virtual stage of a rank to hold the same number of
layers, and u = 1 where it takes an uneven layout (Megatron-core's
``--pipeline-model-parallel-layout``): a rank's n_i layers are then spread over its v chunks
as evenly as possible. Each memory row is a bound on k_i (:func:`chunk_bounds`). It is built once
(:class:`planner.search.milp.Program`) and solved by HiGHS (or CBC via PuLP).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import memory as M
from planner.cost.constants import Constants
from planner.cost.stages import dense_in, engine_layer_costs, overlap_exposed, stage_fw, stage_memory, stage_sync, stage_time_parts
from planner.cost.step import pipeline_form, pipeline_time, sync_branches
from planner.engines import Engine, least_layers
from planner.search.milp import INF, Program, SolveStats
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["StageAffine", "stage_affine", "optimal_split", "split_objective", "chunk_bounds", "split_may_fit", "split_fits",
           "sync_rows", "split_unit"]


@dataclass(frozen=True)
class StageAffine:
    """value(n) = slope * n + intercept, per stage, for each quantity."""

    time: tuple[tuple[float, float], ...]
    sync: tuple[tuple[tuple[float, float, float, float], ...], ...]  # per stage, per part: (s slope, s intercept, w slope, w intercept)
    opt: tuple[tuple[float, float], ...]
    mem: tuple[tuple[float, float], ...]
    fwd: tuple[tuple[float, float], ...] = ()  # the forward part f_i (zero-bubble schedules, DualPipe)
    wgrad: tuple[tuple[float, float], ...] = ()  # the weight-gradient part w_i


def stage_affine(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, C: Constants, engine: Engine) -> StageAffine:
    """Affine coefficients of each stage's quantities in its layer count (two-point fit) for the
    resolved configuration ``par``."""
    pp, v = par.pp, par.vpp
    m = par.num_microbatches(job.global_batch_size)
    costs = engine_layer_costs(model, cluster, job, par, C, engine)
    bwd, fwd = costs[4]["bwd_dense_s"], costs[4]["fwd_dense_s"]
    times, syncs, opts, mems, fwds, wgrads = [], [], [], [], [], []
    dense = model.dense_layers if model.moe is not None else 0
    memo: dict = {}
    for i in range(pp):
        pts = []
        # Stage 0 holds the dense first layers (DeepSeek-V3): fit it past them, where each
        # further layer is an MoE layer; a later stage starts past them (all its layers of one kind).
        n1 = max(v, -(-dense // v) * v) if (i == 0 and 0 < dense < model.layers) else v
        for n in (n1, n1 + v):
            nd = dense_in(model, 0 if i == 0 else model.dense_layers, n)
            # Time, parameters and synchronisation depend on the stage's role (first, middle,
            # last), not its index; only memory (in-flight micro-batches) does.
            role = (0 if i == 0 else (2 if i == pp - 1 else 1), n, nd)
            if role not in memo:
                t = sum(stage_time_parts(costs, n, nd, i == pp - 1, i == 0).values())
                params = M.stage_params(model, n, i, pp, par.tp, par.ep, n_dense=nd, etp=par.etp)
                memo[role] = (t, params, stage_sync(cluster, job, par, params, n, t, m, bwd, fwd, C, engine))
            t, params, sync = memo[role]
            mem = stage_memory(model, job, par, i, n, params, m, C, engine).total_bytes
            pts.append((t, sync["parts"], sync["optimizer_s"], mem, stage_fw(costs, n, nd, i == pp - 1)))
        (t1, d1, o1, m1, fw1), (t2, d2, o2, m2, fw2) = pts
        slope = lambda a, b: (b - a) / v  # noqa: E731  (the two points are v layers apart)
        line = lambda a, b: (slope(a, b), a - slope(a, b) * n1)  # noqa: E731
        times.append(line(t1, t2))
        syncs.append(tuple(line(s1, s2) + line(w1, w2) for (s1, w1), (s2, w2) in zip(d1, d2)))
        opts.append(line(o1, o2))
        mems.append(line(m1, m2))
        fwds.append(line(fw1[0], fw2[0]))
        wgrads.append(line(fw1[1], fw2[1]))
    return StageAffine(tuple(times), tuple(syncs), tuple(opts), tuple(mems), tuple(fwds), tuple(wgrads))


def split_objective(aff: StageAffine, split: tuple[int, ...], m: int, v: int, schedule: str, C: Constants) -> float:
    """The program's objective for one split (the split-dependent part of the step time),
    evaluated with the cost model's own overlap rule."""
    line = lambda lines: [a * n + b for (a, b), n in zip(lines, split)]  # noqa: E731
    t, f, w = line(aff.time), line(aff.fwd), line(aff.wgrad)
    sync = [sum(overlap_exposed(sa * n + sb, wa * n + wb, C) for sa, sb, wa, wb in parts) for parts, n in zip(aff.sync, split)]
    pipe = pipeline_time(t, w, f, m, pipeline_form(schedule, m, v, len(split)))
    return pipe + max(sync) + max(line(aff.opt))


def sync_rows(parts, eta: float) -> list[tuple[float, float]]:
    """(slope, intercept) in the stage's layer count of every branch sum of its sync parts
    (:func:`planner.cost.step.sync_branches`): sync_i(n) = max over these of slope n + intercept."""
    out = []
    for coeffs in sync_branches(parts, eta):
        a = sum(al * sa - be * wa for (al, be), (sa, sb, wa, wb) in zip(coeffs, parts))
        b = sum(al * sb - be * wb for (al, be), (sa, sb, wa, wb) in zip(coeffs, parts))
        out.append((a, b))
    return out


def split_unit(v: int, engine: Engine) -> int:
    """Layers per unit of the split: v (whole chunks) unless the engine takes uneven chunks."""
    return 1 if engine.uneven_interleaving else v


def chunk_bounds(aff: StageAffine, v: int, top: int, capacity: float | Sequence[float], least: int | list[int] = 1) -> list[tuple[int, int]] | None:
    """Per stage, the fewest and most units of v layers (at least ``least``, one value or one per
    stage, at most ``top``) its memory row ``a v k + b <= capacity`` (one value or one per stage)
    allows; None when some stage allows none."""
    bounds = []
    leasts = least if isinstance(least, list) else [least] * len(aff.mem)
    for (a, b), lo, capacity in zip(aff.mem, leasts, _per_stage(capacity, len(aff.mem))):
        hi = top
        room = capacity - b  # a * v * k <= room
        if a > 0:
            hi = min(hi, math.floor(room / (a * v) * (1 + 1e-12)))
        elif a < 0:
            lo = max(lo, math.ceil(room / (a * v) * (1 - 1e-12)))
        elif room < 0:
            return None
        if hi < lo:
            return None
        bounds.append((lo, hi))
    return bounds


def _per_stage(capacity: float | Sequence[float], pp: int) -> list[float]:
    return [float(capacity)] * pp if isinstance(capacity, (int, float)) else [float(c) for c in capacity]


def _admits(kb: list[tuple[int, int]] | None, chunks: int) -> bool:
    """Whether per-stage chunk bounds admit ``chunks`` chunks in all."""
    return kb is not None and sum(lo for lo, _ in kb) <= chunks <= sum(hi for _, hi in kb)


def split_may_fit(aff: StageAffine, layers: int, v: int, capacity: float, unit: int | None = None) -> bool:
    """Whether some split of at least v layers a stage meets the memory limit of every stage
    (the program's memory rows alone)."""
    u = v if unit is None else unit
    return _admits(chunk_bounds(aff, u, layers // u, capacity, -(-v // u)), layers // u)


def split_fits(aff: StageAffine, split: tuple[int, ...], capacity: float) -> bool:
    return all(a * n + b <= capacity for (a, b), n in zip(aff.mem, split))


def optimal_split(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    par: ParallelConfig,
    capacity_bytes: float | Sequence[float],
    C: Constants,
    engine: Engine,
    aff: StageAffine | None = None,
    time_limit_s: float | None = None,
    backend: str | None = None,
    stats: SolveStats | None = None,
) -> tuple[int, ...] | None:
    """The layer split (at least ``vpp`` layers a stage, in units of :func:`split_unit`) minimising
    the step time under memory (``capacity_bytes``: one limit, or one per stage), or None if no split fits. A program stopped by ``time_limit_s`` returns its best integer
    split so far (callers re-check fit and time), or None. ``backend``: "highs", "pulp" or None
    (:meth:`planner.search.milp.Program.solve`); ``stats`` counts the programs solved."""
    pp, v, L = par.pp, par.vpp, model.layers
    if pp == 1:
        return (L,)
    u = split_unit(v, engine)
    least = [-(-least_layers(i, pp, v, engine) // u) for i in range(pp)]
    if L % u or L < u * sum(least):
        return None
    aff = aff or stage_affine(model, cluster, job, par, C, engine)
    kb = chunk_bounds(aff, u, L // u, capacity_bytes, least)
    if not _admits(kb, L // u):
        if stats is not None:
            stats.ruled_out += 1
        return None  # no split meets every stage's memory limit: skip the solver
    m = par.num_microbatches(job.global_batch_size)
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    fa, fb, fc = pipeline_form(par.schedule, m, v, pp)
    ts = 1e3  # milliseconds: coefficients near 1
    prog = Program()
    k = [prog.var(lo, hi, integer=True) for lo, hi in kb]
    T = prog.var(cost=float(m))
    B = prog.var(lo=0.0, cost=1.0)  # the bubble, max(0, ...)
    D = prog.var(lo=0.0, cost=1.0)
    O = prog.var(lo=0.0, cost=1.0)  # noqa: E741
    prog.row(L / u, L / u, [(x, 1.0) for x in k])  # sum_i k_i = L / u
    # Symmetry breaking: the middle stages have the same time and synchronisation terms, and a
    # later stage holds no more in-flight micro-batches (so no more memory per layer); any
    # optimum can therefore be reordered so that middle stages hold non-decreasing layer counts.
    caps = _per_stage(capacity_bytes, pp)
    for i in range(1, pp - 2):
        if (aff.time[i] == aff.time[i + 1] and aff.sync[i] == aff.sync[i + 1] and aff.opt[i] == aff.opt[i + 1]
                and aff.mem[i + 1][0] <= aff.mem[i][0] and aff.mem[i + 1][1] <= aff.mem[i][1] and caps[i + 1] >= caps[i]):
            prog.row(-INF, 0.0, [(k[i], 1.0), (k[i + 1], -1.0)])
    # B + a T + b W + c F - sum_i (a t_i + b w_i + c f_i) >= 0, with t_i = slope u k_i + intercept
    bubble = [(B, 1.0), (T, fa)]
    rhs = 0.0
    for coef, lines in ((fa, aff.time), (fb, aff.wgrad), (fc, aff.fwd)):
        if not coef:
            continue
        if lines is not aff.time:
            top = prog.var(lo=0.0)  # W or F: the maximum of w_i or f_i
            bubble.append((top, coef))
            for i, (a, b) in enumerate(lines):
                prog.row(ts * b, INF, [(top, 1.0), (k[i], -ts * a * u)])
        rhs += coef * ts * sum(b for _, b in lines)
        bubble += [(k[i], -coef * ts * a * u) for i, (a, _) in enumerate(lines)]
    merged: dict[int, float] = {}
    for j, c in bubble:
        merged[j] = merged.get(j, 0.0) + c
    prog.row(rhs, INF, list(merged.items()))
    for i in range(pp):
        a, b = aff.time[i]
        prog.row(ts * b, INF, [(T, 1.0), (k[i], -ts * a * u)])  # T >= t_i
        for sa, sb in sync_rows(aff.sync[i], eta):
            prog.row(ts * sb, INF, [(D, 1.0), (k[i], -ts * sa * u)])  # D >= branch sum
        oa, ob = aff.opt[i]
        prog.row(ts * ob, INF, [(O, 1.0), (k[i], -ts * oa * u)])  # O >= opt_i
    sol = prog.solve(time_limit_s, backend)
    if stats is not None:
        stats.add(sol)
    if not sol.ok:
        return None
    split = tuple(int(round(sol.x[x])) * u for x in k)
    return split if sum(split) == L and all(n >= u * lo for n, lo in zip(split, least)) else None
