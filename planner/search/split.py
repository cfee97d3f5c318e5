"""The split of layers over pipeline stages, decided by a mixed-integer program.

For a fixed (tp, pp, dp, cp, vpp, micro-batch, recompute, ...), every per-stage quantity of
the cost model is affine in the stage's layer count n_i (time per micro-batch, gradient
synchronisation, optimizer step, memory), with an intercept that differs on the first
stage (embedding) and the last (output layer, loss). The step time of
:func:`planner.cost.estimate.estimate` is then

    m T + (sum_i t_i - T) / v + D + O + const,   T >= t_i,  D >= dp_i,  O >= opt_i

with dp_i = sum_j max((1 - eta) s_ij, s_ij - eta w_ij) over the parts j of the stage's
gradient synchronisation (the overlap rule of stage_sync: the reduction beside the last
backward, and with ``overlap_param_gather`` the weight gather beside the first forward). A sum
of maxima is the maximum over the choices of one branch per part, so the split that minimises
the step time under the per-stage memory limit is the integer program

    min  (m - 1/v) T + (1/v) sum_i t_i + D + O
    s.t. t_i = a_i n_i + e_i,  n_i = v k_i,  k_i >= 1 integer,  sum_i n_i = L,
         T >= t_i,  D >= sum_j branch_j(s_ij, w_ij) for every choice of branches,
         O >= opt_i(n_i),  mem_i(n_i) <= capacity.

It is solved with HiGHS through PuLP (CBC when HiGHS is unavailable).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from planner.cost import constants as C
from planner.cost import memory as M
from planner.cost.estimate import layer_costs, stage_memory, stage_sync, stage_time_parts
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["StageAffine", "stage_affine", "optimal_split", "split_objective", "solver_name"]


@dataclass(frozen=True)
class StageAffine:
    """value(n) = slope * n + intercept, per stage, for each quantity."""

    time: tuple[tuple[float, float], ...]
    dp: tuple[tuple[tuple[float, float, float, float], ...], ...]  # per stage, per part: (s slope, s intercept, w slope, w intercept)
    opt: tuple[tuple[float, float], ...]
    mem: tuple[tuple[float, float], ...]


def _n_dense(model: ModelSpec, stage: int, n: int) -> int:
    dense = model.layers - model.moe_layers
    if model.moe is None:
        return n
    return min(n, dense) if stage == 0 else 0


def stage_affine(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, flash: bool) -> StageAffine:
    """Affine coefficients of each stage's quantities in its layer count (two-point fit)."""
    pp, v = par.pp, par.vpp
    m = par.num_microbatches(job.global_batch_size)
    costs = layer_costs(model, cluster, job, par, flash)
    bwd, fwd = costs[4]["bwd_dense_s"], costs[4]["fwd_dense_s"]
    times, dps, opts, mems = [], [], [], []
    dense = model.layers - model.moe_layers if model.moe is not None else 0
    memo: dict = {}
    for i in range(pp):
        pts = []
        # Stage 0 holds the dense first layers (DeepSeek-V3): fit it past them, where each
        # further layer is an MoE layer; elsewhere every layer is of one kind.
        n1 = max(v, -(-dense // v) * v) if (i == 0 and 0 < dense < model.layers) else v
        for n in (n1, n1 + v):
            nd = _n_dense(model, i, n)
            # Time, parameters and synchronisation depend on the stage's role (first, middle,
            # last), not its index; only memory (in-flight micro-batches) does.
            role = (0 if i == 0 else (2 if i == pp - 1 else 1), n, nd)
            if role not in memo:
                t = sum(stage_time_parts(costs, n, nd, i == pp - 1).values())
                params = M.stage_params(model, n, i, pp, par.tp, par.ep, n_dense=nd)
                memo[role] = (t, params, stage_sync(cluster, job, par, params, n, t, m, bwd, fwd))
            t, params, sync = memo[role]
            mem = stage_memory(model, job, par, flash, i, n, params, m).total_bytes
            pts.append((t, sync["dp_parts"], sync["optimizer_s"], mem))
        (t1, d1, o1, m1), (t2, d2, o2, m2) = pts
        slope = lambda a, b: (b - a) / v  # noqa: E731  (the two points are v layers apart)
        line = lambda a, b: (slope(a, b), a - slope(a, b) * n1)  # noqa: E731
        times.append(line(t1, t2))
        dps.append(tuple(line(s1, s2) + line(w1, w2) for (s1, w1), (s2, w2) in zip(d1, d2)))
        opts.append(line(o1, o2))
        mems.append(line(m1, m2))
    return StageAffine(tuple(times), tuple(dps), tuple(opts), tuple(mems))


def split_objective(aff: StageAffine, split: tuple[int, ...], m: int, v: int, overlap: bool = True) -> float:
    """The program's objective for one split (the split-dependent part of the step time)."""
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    t = [a * n + b for (a, b), n in zip(aff.time, split)]
    dp = []
    for parts, n in zip(aff.dp, split):
        d = 0.0
        for sa, sb, wa, wb in parts:
            s_ = sa * n + sb
            w_ = wa * n + wb
            d += max((1 - eta) * s_, s_ - eta * w_) if overlap else s_
        dp.append(d)
    opt = [a * n + b for (a, b), n in zip(aff.opt, split)]
    return m * max(t) + (sum(t) - max(t)) / v + max(dp) + max(opt)


def dp_branches(parts, ts: float, eta: float, overlap: bool) -> list[tuple[float, float]]:
    """(slope, intercept) in the stage's layer count n of every r with D >= r for one stage's
    synchronisation parts, in units of ``ts``: the sum over parts of one overlap branch each
    ((1 - eta) s, or s - eta w), for every choice of branches (a sum of maxima is the maximum
    of these sums)."""
    terms = []
    for sa, sb, wa, wb in parts:
        s_ = (ts * sa, ts * sb)
        terms.append([((1 - eta) * s_[0], (1 - eta) * s_[1]), (s_[0] - eta * ts * wa, s_[1] - eta * ts * wb)] if overlap else [s_])
    return [(sum(c[0] for c in combo), sum(c[1] for c in combo)) for combo in itertools.product(*terms)]


def dp_rows(parts, n, ts: float, eta: float, overlap: bool) -> list:
    """The right-hand sides of :func:`dp_branches` at ``n`` (a number or a solver expression)."""
    return [a * n + b for a, b in dp_branches(parts, ts, eta, overlap)]


__all__.append("dp_branches")
__all__.append("dp_rows")


def chunk_bounds(aff: StageAffine, v: int, top: int, capacity: float) -> list[tuple[int, int]] | None:
    """Per stage, the fewest and most chunks of v layers (at least 1, at most ``top``) its memory
    row ``a v k + b <= capacity`` allows; None when some stage allows none."""
    bounds = []
    for a, b in aff.mem:
        lo, hi = 1, top
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


def split_may_fit(aff: StageAffine, layers: int, v: int, capacity: float) -> bool:
    """Whether some split meets the memory limit of every stage (the program's memory rows alone):
    the stages' chunk bounds (:func:`chunk_bounds`) must admit L / v chunks in all."""
    return _admits(chunk_bounds(aff, v, layers // v, capacity), layers // v)


def _admits(kb: list[tuple[int, int]] | None, chunks: int) -> bool:
    """Whether per-stage chunk bounds admit ``chunks`` chunks in all."""
    return kb is not None and sum(lo for lo, _ in kb) <= chunks <= sum(hi for _, hi in kb)


def split_fits(aff: StageAffine, split: tuple[int, ...], capacity: float) -> bool:
    return all(a * n + b <= capacity for (a, b), n in zip(aff.mem, split))


__all__.append("split_fits")
__all__.append("split_may_fit")
__all__.append("chunk_bounds")

_SOLVER: list = []
USED = ["none"]  # the solver of the last program handed to one ("highs", "highs via PuLP", "cbc via PuLP")
SOLVES = [0]  # integer programs handed to the solver (the rest were answered by split_may_fit)


@contextmanager
def _quiet():
    """Silence the solver's banner (highspy prints it on stdout at construction)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def solver_name() -> str:
    """The solver that took the last layer-split program."""
    return USED[0]


def _solver():
    if not _SOLVER:
        import pulp  # noqa: PLC0415  (lazy: pulp costs ~0.2 s to import)

        try:
            # tiny programs: one thread avoids contention on small machines; a zero relative
            # gap makes the optimum exact (HiGHS' default 1e-4 stops at a near-optimal split)
            s = pulp.HiGHS(msg=False, threads=1, gapRel=0.0)
            if not s.available():
                raise RuntimeError
            _SOLVER.append((s, "highs"))
        except Exception:  # noqa: BLE001 - any failure to load HiGHS falls back to CBC
            _SOLVER.append((pulp.PULP_CBC_CMD(msg=False, gapRel=0.0), "cbc"))
    return _SOLVER[0]


def optimal_split(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    par: ParallelConfig,
    flash: bool,
    capacity_bytes: float,
    aff: StageAffine | None = None,
    time_limit_s: float | None = None,
    backend: str | None = None,
) -> tuple[int, ...] | None:
    """The layer split minimising the step time under memory, or None if no split fits.

    ``time_limit_s`` is passed to the solver; a program stopped by it returns its best integer
    split so far (callers re-check fit and time), or None. ``backend``: "highspy" (the
    program as arrays, :mod:`planner.search.split_highs`), "pulp" (the same program in PuLP,
    on HiGHS or else CBC), or None: highspy when installed, else PuLP."""
    pp, v, L = par.pp, par.vpp, model.layers
    if pp == 1:
        return (L,)
    if L % v or L < pp * v:
        return None
    aff = aff or stage_affine(model, cluster, job, par, flash)
    kb = chunk_bounds(aff, v, L // v, capacity_bytes)
    if not _admits(kb, L // v):
        return None  # no split meets every stage's memory limit (split_may_fit): skip the solver
    m = par.num_microbatches(job.global_batch_size)
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    # Symmetry breaking: the middle stages have the same time and synchronisation terms, and a
    # later stage holds no more in-flight micro-batches (so no more memory per layer); any
    # optimum can therefore be reordered so that middle stages hold non-decreasing layer counts.
    symmetric = [i for i in range(1, pp - 2)
                 if aff.time[i] == aff.time[i + 1] and aff.dp[i] == aff.dp[i + 1] and aff.opt[i] == aff.opt[i + 1]
                 and aff.mem[i + 1][0] <= aff.mem[i][0] and aff.mem[i + 1][1] <= aff.mem[i][1]]
    from planner.search import split_highs  # noqa: PLC0415  (imports this module)

    if backend in (None, "highspy") and split_highs.available():
        SOLVES[0] += 1
        USED[0] = "highs"
        ks = split_highs.solve_split(aff, kb, v, L, m, eta, par.overlap_grad_reduce, symmetric, time_limit_s)
        if ks is None:
            return None
        split = tuple(x * v for x in ks)
        return split if sum(split) == L and min(split) >= v else None
    import pulp  # noqa: PLC0415  (lazy: ~0.2 s to import, and only the CBC path needs it)

    # Scale to milliseconds and GiB so that the solver sees coefficients near 1.
    ts, ms = 1e3, 1.0 / 2**30
    prob = pulp.LpProblem("layer_split", pulp.LpMinimize)
    new_var = getattr(prob, "add_variable", None)  # PuLP >= 3.3 attaches variables to the model
    var = (lambda name, **kw: new_var(name, **kw)) if new_var else (lambda name, **kw: pulp.LpVariable(name, **kw))  # noqa: E731
    k = [var(f"k{i}", lowBound=1, upBound=L // v, cat="Integer") for i in range(pp)]
    T = var("T")
    D = var("D", lowBound=0)
    O = var("O", lowBound=0)  # noqa: E741
    t = [ts * (aff.time[i][0] * v * k[i] + aff.time[i][1]) for i in range(pp)]
    prob += (m - 1.0 / v) * T + (1.0 / v) * pulp.lpSum(t) + D + O
    prob += pulp.lpSum(k) * v == L
    for i in symmetric:
        prob += k[i] <= k[i + 1]
    for i in range(pp):
        prob += T >= t[i]
        for rhs in dp_rows(aff.dp[i], v * k[i], ts, eta, par.overlap_grad_reduce):
            prob += D >= rhs
        prob += O >= ts * (aff.opt[i][0] * v * k[i] + aff.opt[i][1])
        prob += ms * (aff.mem[i][0] * v * k[i] + aff.mem[i][1]) <= ms * capacity_bytes
    solver, name = _solver()
    USED[0] = f"{name} via PuLP"
    solver.timeLimit = time_limit_s
    SOLVES[0] += 1
    with _quiet():
        status = prob.solve(solver)
    if pulp.LpStatus[status] != "Optimal" or any(x.value() is None for x in k):
        return None
    split = tuple(int(round(x.value())) * v for x in k)
    return split if sum(split) == L and min(split) >= v else None
