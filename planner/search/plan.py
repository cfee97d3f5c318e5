"""plan(model, cluster, job) -> the top-K parallel plans, best first, best under the model.

Exact up to two documented approximations: an uneven layer split is not sought when it could
gain less than SPLIT_MIN_GAIN (0.2%), and the split program uses two-point affine fits of
each stage's quantities (collective times are affine in bytes for a fixed algorithm).

1. Enumerate the candidate space (:mod:`planner.search.space`), as plain tuples.
2. Prune what cannot fit: model states alone (a lower bound of memory) over capacity.
3. Order by a lower bound on step time valid for every layer split
   (:func:`planner.search.bounds.step_lower_bound`: per-layer compute and exposed
   tensor/context/expert traffic, pipeline send/recv, the slowest stage at least the mean and
   at least ceil(L / (v pp)) chunks of v layers; no data-parallel traffic) and evaluate the
   exact cost model in that order; stop once the bound exceeds the K-th best exact time
   (branch and bound: nothing after that point can enter the top K).
4. For pipelined candidates the layer split is decided by the integer program of
   :mod:`planner.search.split` under each stage's memory limit, solved by HiGHS to a zero
   optimality gap (as arrays, :mod:`planner.search.split_highs`; the PuLP formulation, on
   HiGHS or CBC, where highspy is missing); an even split is kept when it is as good.
5. Rank by predicted step time; ties break on the configuration tuple (deterministic).
   With ``objective="goodput"`` the rank key is the goodput-adjusted time
   step_time / goodput_fraction (:mod:`planner.studies.goodput`: Young/Daly checkpointing for the
   plan's GPU count and model size), the expected wall-clock time per step with failures.
   Every candidate of one search uses the cluster's GPU count, so the factor is common and
   the order is that of step time; it matters when plans on different GPU counts are
   compared (``planner sweep``).
"""

from __future__ import annotations

import heapq
import math
import time
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.estimate import Estimate, price
from planner.cost.rules import check_precision
from planner.engines import AUTO, AUTO_ENGINES, a2a_overlap_why, default_etp, default_split, engine_flags, fp8_casts, fp8_gathers, get_engine, resolve_job
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.search.bounds import (SPLIT_MIN_GAIN, memory_bound_fn, only_split, p2p_per_stage, peak_grows_with_micro_batch, per_layer_time,  # noqa: F401
                                   split_gain, split_may_help, states_bound_fn, step_lower_bound)
from planner.search.milp import SolveStats
from planner.search.rules import check_fixed, explain_no_candidates
from planner.cost.step import pipeline_form
from planner.search.space import SearchOptions, candidate_tuples, to_parallel
from planner.search.split import optimal_split, split_unit, stage_affine
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, is_flash

__all__ = ["Plan", "PlanResult", "plan", "SPLIT_MIN_GAIN", "DEFAULT_TIME_LIMIT_S", "TIME_LIMIT_S", "MAX_CANDIDATES", "OBJECTIVES"]

# Wall-clock limit of one whole search (enumeration, bounds, exact estimates, layer-split
# programs). When it hits, plan() raises SolverFailure carrying the best plans found so far
# (CLI exit 3). The CLI sets TIME_LIMIT_S from --time-limit; plan(time_limit_s=...) overrides.
DEFAULT_TIME_LIMIT_S = 30.0
# Candidates enumerated before the search gives up with InputError (bounds memory: ~150 bytes each).
MAX_CANDIDATES = 500_000
TIME_LIMIT_S: ContextVar[float] = ContextVar("planner_time_limit_s", default=DEFAULT_TIME_LIMIT_S)
# The nearest-miss hints search a larger cluster for a plan that fits; each such search is
# bounded, and none of them looks for hints of its own. The bound is a count of exact
# evaluations, so that a hint is the same on a fast machine and a loaded one (past it the best
# plan found so far is the example); the time limit is only a safety net.
HINT_EVALUATIONS = 400
HINT_TIME_LIMIT_S = 15.0
_HINTING: ContextVar[bool] = ContextVar("planner_hinting", default=False)


OBJECTIVES = ("time", "goodput")


@dataclass(frozen=True)
class Plan:
    """One ranked plan: its resolved configuration and the estimate of it.

    ``plan.estimate`` equals ``planner.estimate(model, cluster, job, plan.parallel, engine)``
    for the same inputs (the search prices through the same function).

    >>> import planner
    >>> m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 64)
    >>> p = planner.plan(m, c, j, top_k=1).plans[0]
    >>> planner.estimate(m, c, j, p.parallel, p.estimate.engine).step_time_s == p.estimate.step_time_s
    True
    """

    rank: int
    parallel: ParallelConfig
    estimate: Estimate

    def __repr__(self) -> str:
        e = self.estimate
        return f"Plan(#{self.rank} {self.parallel.short()}: {e.step_time_s:.4g} s/step, MFU {100 * e.mfu:.1f}%, {e.memory_peak_bytes / 2**30:.1f} GiB, {e.engine})"

    def as_dict(self) -> dict:
        par = self.parallel.as_dict()
        par["num_microbatches"] = self.estimate.num_microbatches
        par["layers_per_stage"] = list(self.estimate.layers_per_stage)
        pred = self.estimate.as_dict()
        return {"rank": self.rank, "engine": self.estimate.engine, "parallel": par, "predicted": pred}


@dataclass
class PlanResult:
    """The ranked plans of one search and how the search went (``stats``: the integer programs
    it solved).

    >>> import planner
    >>> r = planner.plan(planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8),
    ...                  planner.Job(8192, 64), top_k=2)
    >>> len(r.plans), r.plans[0].estimate.step_time_s <= r.plans[1].estimate.step_time_s
    (2, True)
    """

    plans: list[Plan]
    solver: str
    candidates: int
    evaluated: int
    seconds: float
    engine: str
    notes: list[str] = field(default_factory=list)
    objective: str = "time"
    goodput: object = None  # planner.studies.goodput.GoodputResult when objective == "goodput"
    stats: SolveStats = field(default_factory=SolveStats)

    def __repr__(self) -> str:
        best = f"best {self.plans[0].parallel.short()} {self.plans[0].estimate.step_time_s:.4g} s" if self.plans else "no plan"
        return (f"PlanResult({len(self.plans)} plans, {best}; {self.candidates} candidates, {self.evaluated} evaluated, "
                f"{self.stats.programs} split programs, {self.seconds:.2f} s, {self.engine})")

    def __rich__(self):
        from rich.console import Group  # noqa: PLC0415  (rich only when rendering)
        from rich.text import Text  # noqa: PLC0415

        lines = [Text(f"{p.rank}. {p.parallel.short()}: {p.estimate.step_time_s:.4g} s/step, {p.estimate.tokens_per_s:,.0f} tok/s, "
                      f"MFU {100 * p.estimate.mfu:.1f}%, {p.estimate.memory_peak_bytes / 2**30:.1f} GiB") for p in self.plans]
        lines.append(Text(f"{self.candidates} candidates, {self.evaluated} evaluated, {self.stats.programs} split programs "
                          f"({self.solver}), {self.seconds:.2f} s, engine {self.engine}", style="dim"))
        return Group(*lines)

    def objective_time_s(self, p: Plan) -> float:
        """The rank key: step time, or step time / goodput fraction."""
        g = self.goodput.goodput_fraction if self.goodput is not None else 1.0
        return p.estimate.step_time_s / g if g > 0 else math.inf

    def search_dict(self) -> dict:
        d = {
            "solver": self.solver,
            "candidates": self.candidates,
            "evaluated": self.evaluated,
            "split_programs_solved": self.stats.programs,
            "split_programs_ruled_out": self.stats.ruled_out,
            "memory_pruned": self.stats.memory_pruned,
            "time_pruned": self.stats.time_pruned,
            "seconds": self.seconds,
            "engine": self.engine,
            "notes": list(self.notes),
            "objective": self.objective,
        }
        if self.goodput is not None:
            d["goodput_fraction"] = self.goodput.goodput_fraction
        return d


_REC = {"none": 0, "selective": 1, "full": 2}


# Misses ruled out by a memory bound that _no_fit prices to name the nearest one.
NEAREST_PRICED = 24


# Skip the members of a candidate group whose least-memory member cannot fit (the ranking loop);
# tests/search/test_dominance.py turns it off to check that the plans do not change.
GROUP_PRUNE = True


# Times the layer-split program is solved again when its proposal misses the exact memory
# limit (each with the overflowing stages' limits lowered by their memory lines' error).
_SPLIT_REPAIRS = 2


def _tuple_key(t: tuple) -> tuple:
    tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
    return (cp, ep, v, tp, pp, dp, mb, _REC[rec], z, sched, ())


def _key(par: ParallelConfig) -> tuple:
    """Deterministic tie-break among equal predictions: fewer exotic dimensions first
    (no context or expert parallelism, no interleaving), then smaller degrees."""
    return (par.cp, par.ep, par.vpp, par.tp, par.pp, par.dp, par.micro_batch_size, _REC[par.recompute],
            par.zero, par.schedule or "", par.layers_per_stage or ())


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    top_k: int = 10,
    options: SearchOptions | None = None,
    time_limit_s: float | None = None,
    objective: str = "time",
    goodput: object = None,
    constants: Constants | None = None,
    engine: str | None = None,
) -> PlanResult:
    """The ``top_k`` fastest plans that fit, best first, on the engine ``options.engine``
    (``engine=``, as planner.estimate takes it, sets ``options.engine``).

    Raises NoFeasiblePlan (with the nearest miss and what would make it fit) when none does, and
    SolverFailure (with the best plans found so far) when the search runs past ``time_limit_s``
    (default :data:`TIME_LIMIT_S`). ``constants``: a calibration profile (default the published
    values). Every plan's estimate is what :func:`planner.estimate` gives for its configuration.

    >>> import planner
    >>> best = planner.plan(planner.load_model("llama3.1-70b"), planner.make_cluster("h100-sxm5-80gb", 64),
    ...                     planner.Job(8192, 256), top_k=1).plans[0]
    >>> best.estimate.fits
    True
    """
    if engine is not None:  # planner.estimate's spelling; it sets options.engine
        options = replace(options or SearchOptions(), engine=engine)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError("top_k", top_k, "a positive integer", flag="--top")
    if objective not in OBJECTIVES:
        raise InputError("objective", objective, "time or goodput", flag="--objective")
    if objective == "goodput" and (goodput is None or getattr(goodput, "n_gpus", None) != cluster.num_gpus):
        raise InputError("goodput", goodput, f"a planner.studies.goodput.GoodputResult for {cluster.num_gpus} GPUs with objective='goodput'")
    factor = 1.0 / goodput.goodput_fraction if objective == "goodput" and goodput.goodput_fraction > 0 else (math.inf if objective == "goodput" else 1.0)
    limit = TIME_LIMIT_S.get() if time_limit_s is None else time_limit_s
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (0 < limit < math.inf):
        raise InputError("time_limit_s", limit, "a positive finite number of seconds", flag="--time-limit")
    t0 = time.perf_counter()
    deadline = t0 + limit
    opts = options or SearchOptions()
    if isinstance(opts.engine, str) and opts.engine.lower() == AUTO:
        return _plan_auto(model, cluster, job, top_k, opts, limit, objective, goodput, constants)
    eng = get_engine(opts.engine)
    job = resolve_job(job, eng)  # the FP8 recipe the engine runs (checked)
    C = constants or DEFAULT_CONSTANTS
    if opts.memory_margin is not None:
        C = C.replace(MEMORY_MARGIN_FRACTION=opts.memory_margin)
    check_precision(cluster, job)
    check_fixed(model, cluster, job, opts)
    fixed = opts.fixed or {}
    cap = cluster.gpu.memory_bytes * (1.0 - C.MEMORY_MARGIN_FRACTION)  # usable: the margin is kept free
    stats = SolveStats()
    pool = []
    for t in candidate_tuples(model, cluster, job, opts):
        pool.append(t)
        if len(pool) % 1024 == 0:
            if len(pool) > MAX_CANDIDATES:
                raise InputError("parallel", f"more than {MAX_CANDIDATES:,} candidate configurations for {cluster.num_gpus:,} GPUs and {model.layers:,} layers",
                                 "a bounded search: fix some of --tp, --pp, --dp, --cp, --mb, --recompute, --zero")
            if time.perf_counter() > deadline:
                raise _timed_out(limit, [], len(pool), 0, t0, eng.name, stats, "enumerating candidates")
    if not pool:
        raise explain_no_candidates(model, cluster, job, opts)
    nearest: tuple | None = None  # the priced miss with the least memory: ((bytes, place in the order), estimate, parallel)
    unpriced: list = []  # (key, candidate) of the misses a memory bound ruled out unpriced (_no_fit prices the closest)
    states_of = states_bound_fn(model, job.precision, C, grad_reduce=job.grad_reduce, engine=eng,  # valid for any layer split
                                fp8_params=fp8_gathers(eng, job, 1))
    given = {k: fixed.get(k) for k in ("sequence_parallel", "attention", "tp_comm_overlap", "async_tp_allreduce",
                                         "overlap_grad_reduce", "overlap_param_gather")}
    disp = fixed.get("moe_dispatcher") or "alltoall"  # not searched: the fixed one, else the engine's all-to-all
    graph = fixed.get("cuda_graph") or "none"  # not searched: the fixed capture, else eager launches
    flag_cache: dict = {}
    per_layer_cache: dict = {}
    p2p_cache: dict = {}
    states_cache: dict = {}
    may_fit = memory_bound_fn(model, job, C, eng, cap)
    bounded = []
    for i, t in enumerate(pool):
        if i % 256 == 0 and time.perf_counter() > deadline:
            raise _timed_out(limit, [], len(pool), 0, t0, eng.name, stats, "bounding")
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        etp = fixed.get("etp") or default_etp(tp, dp, cp, ep)  # the expert tensor degree the candidate runs
        sk = (tp, pp, dp, cp, ep, z)
        states = states_cache.get(sk)
        if states is None:
            states = states_cache[sk] = states_of(*sk, etp)
        if states > cap:
            # unpriced misses rank by their model states, then the least activation memory
            # (full recompute, the smallest micro-batch): the one _no_fit prices
            unpriced.append(((states, -_REC[rec], mb, -tp * ep), t))
            continue
        fk = (tp, z, pp > 1)
        if fk not in flag_cache:
            flag_cache[fk] = engine_flags(eng, cluster.gpu, tp, z, given, pp, cluster.nvlink_domain)
        f = flag_cache[fk]
        a2a = fixed.get("moe_a2a_overlap")
        if a2a is None:
            a2a = a2a_overlap_why(eng, model, ep, rec, pp, v, sched, zero=z, graph=graph) is None
        lk = (tp, cp, ep, mb, rec, f["sequence_parallel"], f["tp_comm_overlap"], f["async_tp_allreduce"], f["attention"], etp, a2a, disp, graph)
        if lk not in per_layer_cache:
            per_layer_cache[lk] = per_layer_time(model, cluster, job, lk, C, sac=eng.memory.selective, fp8=fp8_casts(eng, job, 3))
        m = job.global_batch_size // (mb * dp)
        pk = (tp, cp, dp, pp, mb, v)
        if pk not in p2p_cache:
            p2p_cache[pk] = p2p_per_stage(model, cluster, job, pk, C, eng.overlap_p2p_comm) if pp > 1 else 0.0
        lb = step_lower_bound(model.layers, pp, v, m, per_layer_cache[lk], p2p_cache[pk], C.STEP_OVERHEAD_S, split_unit(v, eng),
                              pipeline_form(sched, m, v, pp))
        bounded.append((lb, _tuple_key(t), t, a2a, etp))
    bounded.sort(key=lambda x: (x[0], x[1]))
    kth: list[float] = []  # max-heap (negated) of the K best exact times so far
    found: list = []
    evaluated = 0
    lps_fixed = tuple(fixed["layers_per_stage"]) if fixed.get("layers_per_stage") else None

    def configure(t: tuple, a2a: bool, etp: int) -> tuple[ParallelConfig, tuple, bool]:
        """The candidate as priced: its flags, its default (or fixed) layer split, whether an
        uneven split may be searched."""
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        par = to_parallel(t, fixed).replace(**flag_cache[(tp, z, pp > 1)], etp=etp)
        if par.moe_a2a_overlap is None:
            par = par.replace(moe_a2a_overlap=a2a)  # the bound's (the engine's default, or the fixed value)
        if par.moe_dispatcher is None:
            par = par.replace(moe_dispatcher=disp)
        if par.cuda_graph is None:
            par = par.replace(cuda_graph=graph)
        lps = lps_fixed or default_split(model, pp, v, eng)
        return par, lps, par.pp > 1 and opts.uneven_split and eng.custom_split and lps_fixed is None

    def exact(par: ParallelConfig, lps: tuple, may_split: bool, kth_now: list) -> Estimate:
        """The estimate on the default split, or on an uneven split that makes it fit or faster."""
        est = price(model, cluster, job, par, lps, eng, C)
        v = par.vpp
        if may_split and split_may_help(est, par, job, cap, kth_now, top_k, split_unit(v, eng)):
            room, aff = [cap] * par.pp, stage_affine(model, cluster, job, par, C, eng)  # one fit for the program and its repairs
            for _ in range(_SPLIT_REPAIRS + 1):
                split = optimal_split(model, cluster, job, par, room, C, eng, aff=aff, time_limit_s=max(0.01, deadline - time.perf_counter()), stats=stats)
                if split is None or split == est.layers_per_stage:
                    break
                est2 = price(model, cluster, job, par, split, eng, C)
                if est2.fits:
                    if not est.fits or est2.step_time_s < est.step_time_s:
                        est = est2
                    break
                # The program's memory rows are two-point lines in a stage's layer count; how the
                # engine spreads a rank's layers over its virtual stages bends them (an extra
                # layer in the chunk with the most micro-batches in flight costs more). Solve
                # again with each overflowing stage's limit lowered by its line's error there.
                for i, (st, (a, b), n) in enumerate(zip(est2.stages, aff.mem, split)):
                    if st.total_bytes > est2.memory_usable_bytes:
                        room[i] = min(room[i], cap - max(0.0, st.total_bytes - (a * n + b)))
        return est

    # Candidates that differ only in micro-batch and recompute form a group; within one, memory
    # grows with the micro-batch and with less recompute where bounds.peak_grows_with_micro_batch
    # says so (tests/search/test_dominance.py samples it on the memory model). When a candidate
    # misses memory, the group's least-memory member (the smallest micro-batch, then the most
    # recompute) is priced once on its default split; if no split can make it fit (it has no
    # other, or every stage is over), every member it dominates is skipped unpriced. Nothing that
    # fits is skipped, so the plans are the same; a job that fits nowhere is told so sooner.
    least: dict = {}  # group -> (its least-memory member, that member's place in the order)
    for i, (_, _, t, a2a, _) in enumerate(bounded):
        g = (*t[:6], t[8], t[9], a2a)
        if g not in least or (t[6], -_REC[t[7]]) < (least[g][0][6], -_REC[least[g][0][7]]):
            least[g] = (t, i)
    dead: set = set()
    alive: set = set()
    hinting = _HINTING.get()  # a nearest-miss hint's search: bounded by HINT_EVALUATIONS as well
    for i, (lb, _, t, a2a, etp) in enumerate(bounded):
        if len(kth) >= top_k and lb > -kth[0]:
            break
        if time.perf_counter() > deadline or (hinting and evaluated >= HINT_EVALUATIONS):
            raise _timed_out(limit, found, len(pool), evaluated, t0, eng.name, stats, "ranking", top_k)
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        f = flag_cache[(tp, z, pp > 1)]
        if not may_fit(tp, pp, dp, cp, ep, v, mb, rec, z, sched, f["sequence_parallel"], is_flash(f["attention"]), split_unit(v, eng), etp):
            stats.memory_pruned += 1  # no layer split fits (model states and in-flight activations alone)
            unpriced.append(((states_cache[(tp, pp, dp, cp, ep, z)], -_REC[rec], mb, -tp * ep), t))
            continue
        g = (*t[:6], z, sched, a2a)
        if g in dead and least[g][0][6] <= mb and _REC[least[g][0][7]] >= _REC[rec]:
            stats.memory_pruned += 1  # its group's least-memory member misses under every split tried
            continue
        par, lps, may_split = configure(t, a2a, etp)
        evaluated += 1
        if len(kth) >= top_k:
            # With K plans found, a candidate slower than the K-th under every split cannot
            # enter, whatever its memory: its time alone decides (the memory model is the costly part).
            quick = price(model, cluster, job, par, lps, eng, C, memory=False)
            gain = split_gain(quick, par, split_unit(v, eng), r=0.0) if may_split and not only_split(quick, par) else 0.0
            if quick.step_time_s - gain > -kth[0]:
                stats.time_pruned += 1
                continue
        est = exact(par, lps, may_split, kth)
        if (not est.fits and GROUP_PRUNE and g not in alive and g not in dead
                and peak_grows_with_micro_batch(eng, z)):
            xt, xi = least[g]
            if not may_fit(*xt, f["sequence_parallel"], is_flash(f["attention"]), split_unit(v, eng), etp):
                dead.add(g)  # even its memory bound misses
            else:
                xpar, xlps, xsplit = configure(xt, a2a, etp)  # same tp, dp, cp, ep: same etp
                x = est if xt == t and est.layers_per_stage == tuple(xlps) else price(model, cluster, job, xpar, xlps, eng, C)
                # no split fits it: it has one, or every stage is over (split_may_help's rule)
                if not x.fits and (not xsplit or all(st.total_bytes > cap for st in x.stages)):
                    dead.add(g)
                    if nearest is None or (x.memory_peak_bytes, xi) < nearest[0]:
                        nearest = ((x.memory_peak_bytes, xi), x, x.parallel)  # as if priced in its turn (the rule above skips it)
                else:
                    alive.add(g)
        par = est.parallel
        if not est.fits:
            if nearest is None or (est.memory_peak_bytes, i) < nearest[0]:
                nearest = ((est.memory_peak_bytes, i), est, par)  # ties go to the earlier in the order
            continue
        # The goodput factor is common to every candidate (one GPU count): bounds and the
        # K-th best stay in step time; the rank key carries the factor.
        found.append((est.step_time_s * factor, _key(par), est, par))
        heapq.heappush(kth, -est.step_time_s)
        if len(kth) > top_k:
            heapq.heappop(kth)
    if not found:
        raise _no_fit(model, cluster, job, nearest, eng, C, fixed, unpriced)
    ranked = sorted(found, key=lambda x: (x[0], x[1]))[:top_k]
    plans = [Plan(i + 1, par, est) for i, (_, _, est, par) in enumerate(ranked)]
    solver = stats.solver if stats.programs else "none"
    result = PlanResult(plans, solver, len(pool), evaluated, time.perf_counter() - t0, eng.name,
                        objective=objective, goodput=goodput if objective == "goodput" else None, stats=stats)
    if stats.programs or stats.ruled_out:
        result.notes.append(f"{stats.programs} layer-split integer programs solved"
                            f" ({stats.ruled_out} more ruled out by their memory rows alone)")
    return result


def _timed_out(limit: float, found: list, candidates: int, evaluated: int, t0: float, engine: str, stats: SolveStats,
               phase: str, top_k: int = 1) -> SolverFailure:
    """SolverFailure carrying a PlanResult of the plans found so far (possibly none)."""
    ranked = sorted(found, key=lambda x: (x[0], x[1]))[:top_k]
    plans = [Plan(i + 1, par, est) for i, (_, _, est, par) in enumerate(ranked)]
    best = PlanResult(plans, stats.solver, candidates, evaluated, time.perf_counter() - t0, engine,
                      [f"time limit of {limit:g} s hit while {phase}; not proven best"], stats=stats)
    what = (f"best so far: step {plans[0].estimate.step_time_s:.3g} s with tp={plans[0].parallel.tp} pp={plans[0].parallel.pp} "
            f"dp={plans[0].parallel.dp} cp={plans[0].parallel.cp}") if plans else "no plan that fits found yet"
    # while enumerating, the pool is not complete: its size is a count so far, not a total
    count = (f"while enumerating candidates ({candidates} so far, none evaluated)" if phase == "enumerating candidates"
             else f"after {evaluated} of {candidates} candidates evaluated")
    return SolverFailure(f"time limit of {limit:g} s hit {count} ({what}); raise --time-limit or fix more fields", best=best)


def _plan_auto(model, cluster, job, top_k, opts, limit, objective, goodput, constants) -> PlanResult:
    """``engine="auto"``: the search on each of :data:`planner.engines.AUTO_ENGINES` (an engine
    that cannot run the fixed fields is skipped and said so), the plans of all ranked together
    by the same key; each plan names its engine. No engine fitting raises the nearest miss of
    the engine that came closest."""
    t0 = time.perf_counter()
    found, misses, notes, results = [], [], [], []
    for name in AUTO_ENGINES:
        left = limit - (time.perf_counter() - t0)
        try:
            r = plan(model, cluster, job, top_k, replace(opts, engine=name), max(0.5, left), objective, goodput, constants)
        except NoFeasiblePlan as exc:
            misses.append((name, exc))
            continue
        except InputError as exc:
            notes.append(f"{name}: not searched ({exc})")
            continue
        results.append(r)
        found += r.plans
    if not found:
        if misses:
            raise misses[0][1]
        raise InputError("engine", AUTO, "an engine that can run the fixed fields (" + "; ".join(notes) + ")", flag="--engine")
    factor = 1.0
    if objective == "goodput" and goodput is not None and goodput.goodput_fraction > 0:
        factor = 1.0 / goodput.goodput_fraction
    ranked = sorted(found, key=lambda p: (p.estimate.step_time_s * factor, _key(p.parallel), p.estimate.engine))[:top_k]
    plans = [Plan(i + 1, p.parallel, p.estimate) for i, p in enumerate(ranked)]
    stats = SolveStats()
    for r in results:
        for f in ("programs", "ruled_out", "memory_pruned", "time_pruned"):
            setattr(stats, f, getattr(stats, f) + getattr(r.stats, f))
        stats.solver = r.stats.solver if r.stats.programs else stats.solver
    best = {r.engine: r.plans[0].estimate.step_time_s for r in results}
    notes.insert(0, "engines searched: " + ", ".join(f"{e} (best {t:.4g} s)" for e, t in best.items())
                 + "".join(f", {n} (nothing fits)" for n, _ in misses))
    return PlanResult(plans, stats.solver if stats.programs else "none", sum(r.candidates for r in results),
                      sum(r.evaluated for r in results), time.perf_counter() - t0, AUTO, notes=notes, objective=objective,
                      goodput=goodput if objective == "goodput" else None, stats=stats)


def _no_fit(model, cluster, job, nearest, eng, C, fixed, unpriced=()) -> NoFeasiblePlan:
    """The nearest miss, priced by :func:`planner.estimate` (so the message and ``planner estimate``
    on that layout agree), and only changes that fit when estimated (each one is). ``nearest``:
    the priced miss with the least memory; when every candidate was ruled out unpriced, the
    :data:`NEAREST_PRICED` of ``unpriced`` with the least model states (then the most recompute,
    the smallest micro-batch, the most tensor x expert sharding) are priced and the least taken."""
    from dataclasses import replace as _replace  # noqa: PLC0415

    from planner.cost.estimate import estimate  # noqa: PLC0415

    gib = 2**30
    if nearest is None:  # every miss was ruled out by a bound: price the closest few
        for _, t in heapq.nsmallest(NEAREST_PRICED, unpriced, key=lambda x: (x[0], _tuple_key(x[1]))):
            try:
                e = estimate(model, cluster, job, to_parallel(t, fixed), eng, C, validate=False)
            except InputError:
                continue
            if nearest is None or e.memory_peak_bytes < nearest[0][0]:
                nearest = ((e.memory_peak_bytes, 0), e, e.parallel)
    if nearest is None:
        return NoFeasiblePlan(f"no configuration of {model.name} fits on {cluster.num_gpus} x {cluster.gpu.id}")
    _, est, par = nearest
    par = est.parallel
    need, usable = est.memory_peak_bytes, est.memory_usable_bytes

    def tried(p, cl=cluster):
        try:
            e = estimate(model, cl, job, p, eng, C)
        except InputError:
            return None
        return e if e.fits else None

    def degrees(p) -> str:  # the parallel degrees of a hint, the expert degree where the model has experts
        return f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp}" + (f" ep={p.ep}" if model.moe is not None and model.moe_layers else "")

    hints, fits_with = [], []
    free = lambda f: f not in fixed  # noqa: E731  (a change the user has not pinned)
    steps = []
    if par.recompute != "full" and "full" in eng.recompute and free("recompute"):
        steps.append(("full activation recompute (--recompute full)", {"recompute": "full"}))
    top_zero = max((z for z in eng.zero_stages if par.pp == 1 or eng.mode(z).with_pp), default=0)
    if (par.zero or 0) < top_zero and free("zero"):
        steps.append((f"ZeRO-{top_zero} sharding (--zero {top_zero})", {"zero": top_zero}))
    if par.micro_batch_size > 1 and free("micro_batch_size"):
        steps.append(("micro-batch 1 (--mb 1)", {"micro_batch_size": 1}))
    for label, ch in steps:
        e = tried(par.replace(**ch, layers_per_stage=None))
        if e is not None:
            hints.append(f"{label}: {e.memory_peak_bytes / gib:.1f} GiB")
            fits_with.append(e)
    if not hints and len(steps) > 1:
        allc = {k: v for _, ch in steps for k, v in ch.items()}
        e = tried(par.replace(**allc, layers_per_stage=None))
        if e is not None:
            hints.append(" and ".join(l.split(" (")[0] for l, _ in steps) + f" together: {e.memory_peak_bytes / gib:.1f} GiB")
    # More GPUs: the planner's own search on a cluster k times larger (the same nodes and links),
    # from k ~ the memory shortfall up; the first k with a plan that fits is the hint.
    if not _HINTING.get():
        token = _HINTING.set(True)
        try:
            k = 2 ** max(1, int(math.floor(math.log2(max(2.0, need / usable)))))
            for _ in range(3):
                try:
                    big = _replace(cluster, num_gpus=cluster.num_gpus * k, name=f"{cluster.name} x{k}")
                    best = plan(model, big, job, top_k=1, options=SearchOptions(fixed=dict(fixed), engine=eng,
                                                                                   memory_margin=est.memory_margin),
                                time_limit_s=HINT_TIME_LIMIT_S, constants=C).plans[0]
                except SolverFailure as exc:  # out of time: a plan found so far fits as well
                    found = getattr(exc, "best", None)
                    if not (found and found.plans):
                        k *= 2
                        continue
                    best = found.plans[0]
                except (NoFeasiblePlan, InputError):
                    k *= 2
                    continue
                p = best.parallel
                hints.append(f"{k}x more GPUs ({big.num_gpus}), e.g. {degrees(p)} "
                             f"recompute={p.recompute} zero={p.zero}: {best.estimate.memory_peak_bytes / gib:.1f} GiB")
                break
        finally:
            _HINTING.reset(token)
    # A GPU with enough memory fits it by construction (the same estimate, more capacity).
    hints.append(f"GPUs with {need / (1 - est.memory_margin) / gib:.0f}+ GiB")
    msg = (
        f"needs {need / gib:.1f} GiB per GPU, {usable / gib:.1f} GiB available of {est.memory_capacity_bytes / gib:.1f} "
        f"({100 * est.memory_margin:.0f}% margin kept free) (nearest miss: {degrees(par)} "
        f"mb={par.micro_batch_size} recompute={par.recompute} zero={par.zero}, peak at stage {est.memory_peak_stage}: "
        f"{est.memory_peak_moment}); feasible with " + " or ".join(hints[:2])
    )
    return NoFeasiblePlan(msg, nearest=par, hints=hints)
