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

from planner.cost.estimate import Estimate, check_precision, estimate
from planner.cost.compute import supports_flash
from planner.engines import resolve_flash
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.cost.constants import STEP_OVERHEAD_S
from planner.search.bounds import SPLIT_MIN_GAIN, p2p_per_stage, per_layer_time, split_may_help, states_bound_fn, step_lower_bound  # noqa: F401
from planner.search import split as _split
from planner.search.space import SearchOptions, candidate_tuples, to_parallel
from planner.search.split import optimal_split, solver_name
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["Plan", "PlanResult", "plan", "SPLIT_MIN_GAIN", "DEFAULT_TIME_LIMIT_S", "TIME_LIMIT_S", "MAX_CANDIDATES", "OBJECTIVES"]

# Wall-clock limit of one whole search (enumeration, bounds, exact estimates, layer-split
# programs). When it hits, plan() raises SolverFailure carrying the best plans found so far
# (CLI exit 3). The CLI sets TIME_LIMIT_S from --time-limit; plan(time_limit_s=...) overrides.
DEFAULT_TIME_LIMIT_S = 30.0
# Candidates enumerated before the search gives up with InputError (bounds memory: ~150 bytes each).
MAX_CANDIDATES = 500_000
TIME_LIMIT_S: ContextVar[float] = ContextVar("planner_time_limit_s", default=DEFAULT_TIME_LIMIT_S)


OBJECTIVES = ("time", "goodput")


@dataclass(frozen=True)
class Plan:
    rank: int
    parallel: ParallelConfig
    estimate: Estimate

    def as_dict(self) -> dict:
        par = self.parallel.as_dict()
        par["num_microbatches"] = self.estimate.num_microbatches
        par["layers_per_stage"] = list(self.estimate.layers_per_stage)
        pred = self.estimate.as_dict()
        return {"rank": self.rank, "parallel": par, "predicted": pred}


@dataclass
class PlanResult:
    plans: list[Plan]
    solver: str
    candidates: int
    evaluated: int
    seconds: float
    flash_attention: bool
    notes: list[str] = field(default_factory=list)
    objective: str = "time"
    goodput: object = None  # planner.studies.goodput.GoodputResult when objective == "goodput"

    def objective_time_s(self, p: Plan) -> float:
        """The rank key: step time, or step time / goodput fraction."""
        g = self.goodput.goodput_fraction if self.goodput is not None else 1.0
        return p.estimate.step_time_s / g if g > 0 else math.inf

    def search_dict(self) -> dict:
        d = {
            "solver": self.solver,
            "candidates": self.candidates,
            "evaluated": self.evaluated,
            "seconds": self.seconds,
            "flash_attention": self.flash_attention,
            "notes": list(self.notes),
            "objective": self.objective,
        }
        if self.goodput is not None:
            d["goodput_fraction"] = self.goodput.goodput_fraction
        return d


_REC = {"none": 0, "selective": 1, "full": 2}


def _tuple_key(t: tuple) -> tuple:
    tp, pp, dp, cp, ep, v, mb, rec, sp, z, tpo, asy, opg, ogr = t
    return (cp, ep, v, tp, pp, dp, mb, _REC[rec], not sp, z, ())


def _key(par: ParallelConfig) -> tuple:
    """Deterministic tie-break among equal predictions: fewer exotic dimensions first
    (no context or expert parallelism, no interleaving), then smaller degrees."""
    return (par.cp, par.ep, par.vpp, par.tp, par.pp, par.dp, par.micro_batch_size, _REC[par.recompute],
            not par.sequence_parallel, par.zero, par.layers_per_stage or ())


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    top_k: int = 10,
    options: SearchOptions | None = None,
    time_limit_s: float | None = None,
    objective: str = "time",
    goodput: object = None,
) -> PlanResult:
    """The ``top_k`` fastest plans that fit, best first. Raises NoFeasiblePlan (with the nearest
    miss and what would make it fit) when none does, and SolverFailure (with the best plans found
    so far) when the search runs past ``time_limit_s`` (default :data:`TIME_LIMIT_S`)."""
    from planner.io.schema import check_fixed, explain_no_candidates  # noqa: PLC0415

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError("--top", top_k, "a positive integer")
    if objective not in OBJECTIVES:
        raise InputError("--objective", objective, "time or goodput")
    if objective == "goodput" and (goodput is None or getattr(goodput, "n_gpus", None) != cluster.num_gpus):
        raise InputError("goodput", goodput, f"a planner.studies.goodput.GoodputResult for {cluster.num_gpus} GPUs with objective='goodput'")
    factor = 1.0 / goodput.goodput_fraction if objective == "goodput" and goodput.goodput_fraction > 0 else (math.inf if objective == "goodput" else 1.0)
    limit = TIME_LIMIT_S.get() if time_limit_s is None else time_limit_s
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (0 < limit < math.inf):
        raise InputError("--time-limit", limit, "a positive finite number of seconds")
    t0 = time.perf_counter()
    deadline = t0 + limit
    opts = options or SearchOptions()
    check_precision(cluster, job)
    check_fixed(model, cluster, job, opts)
    flash = resolve_flash(job, opts.generation, opts.flash_attention) and supports_flash(cluster.gpu)
    cap = cluster.gpu.memory_bytes
    pool = []
    for t in candidate_tuples(model, cluster, job, opts):
        pool.append(t)
        if len(pool) % 1024 == 0:
            if len(pool) > MAX_CANDIDATES:
                raise InputError("parallel", f"more than {MAX_CANDIDATES:,} candidate configurations for {cluster.num_gpus:,} GPUs and {model.layers:,} layers",
                                 "a bounded search: fix some of --tp, --pp, --dp, --cp, --mb, --recompute, --zero")
            if time.perf_counter() > deadline:
                raise _timed_out(limit, [], len(pool), 0, t0, flash, "enumerating candidates")
    if not pool:
        raise explain_no_candidates(model, cluster, job, opts)
    nearest: tuple | None = None  # (bytes, estimate or None, parallel)
    states_of = states_bound_fn(model, job.precision, grad_reduce=job.grad_reduce)  # valid for any layer split
    per_layer_cache: dict = {}
    p2p_cache: dict = {}
    states_cache: dict = {}
    bounded = []
    for i, t in enumerate(pool):
        if i % 256 == 0 and time.perf_counter() > deadline:
            raise _timed_out(limit, [], len(pool), 0, t0, flash, "bounding")
        tp, pp, dp, cp, ep, v, mb, rec, sp, z, tpo, asy, opg, ogr = t
        sk = (tp, pp, dp, cp, ep, z)
        states = states_cache.get(sk)
        if states is None:
            states = states_cache[sk] = states_of(*sk)
        if states > cap:
            if nearest is None or states < nearest[0]:
                nearest = (states, None, to_parallel(t))
            continue
        lk = (tp, cp, ep, mb, rec, sp, tpo, asy)  # what the per-layer time depends on
        if lk not in per_layer_cache:
            per_layer_cache[lk] = per_layer_time(model, cluster, job, lk, flash)
        m = job.global_batch_size // (mb * dp)
        pk = (tp, cp, dp, pp, mb, v)
        if pk not in p2p_cache:
            p2p_cache[pk] = p2p_per_stage(model, cluster, job, pk) if pp > 1 else 0.0
        lb = step_lower_bound(model.layers, pp, v, m, per_layer_cache[lk], p2p_cache[pk], STEP_OVERHEAD_S)
        bounded.append((lb, _tuple_key(t), t))
    bounded.sort(key=lambda x: (x[0], x[1]))
    kth: list[float] = []  # max-heap (negated) of the K best exact times so far
    found: list = []
    evaluated = 0
    mip_solves = 0
    solved_before = _split.SOLVES[0]
    for lb, _, t in bounded:
        if len(kth) >= top_k and lb > -kth[0]:
            break
        par = to_parallel(t)
        if time.perf_counter() > deadline:
            raise _timed_out(limit, found, len(pool), evaluated, t0, flash, "ranking", top_k)
        evaluated += 1
        est = estimate(model, cluster, job, par, flash_attention=flash, validate=False)
        if par.pp > 1 and opts.uneven_split and split_may_help(est, par, job, cap, kth, top_k):
            mip_solves += 1
            split = optimal_split(model, cluster, job, par, flash, cap, time_limit_s=max(0.01, deadline - time.perf_counter()))
            if split is not None and split != est.layers_per_stage:
                par2 = replace(par, layers_per_stage=split)
                est2 = estimate(model, cluster, job, par2, flash_attention=flash, validate=False)
                if est2.fits and (not est.fits or est2.step_time_s < est.step_time_s):
                    par, est = par2, est2
        if not est.fits:
            if nearest is None or nearest[1] is None or est.memory_peak_bytes < nearest[1].memory_peak_bytes:
                nearest = (est.memory_peak_bytes, est, par)
            continue
        # The goodput factor is common to every candidate (one GPU count): bounds and the
        # K-th best stay in step time; the rank key carries the factor.
        found.append((est.step_time_s * factor, _key(par), est, par))
        heapq.heappush(kth, -est.step_time_s)
        if len(kth) > top_k:
            heapq.heappop(kth)
    if not found:
        raise _no_fit(model, cluster, job, nearest, cap)
    ranked = sorted(found, key=lambda x: (x[0], x[1]))[:top_k]
    plans = [Plan(i + 1, par, est) for i, (_, _, est, par) in enumerate(ranked)]
    solver = solver_name() if _split.SOLVES[0] > solved_before else (
        "none (every split program was ruled out by its memory rows)" if mip_solves else "none (no pipeline split to decide)")
    result = PlanResult(plans, solver, len(pool), evaluated, time.perf_counter() - t0, flash,
                        objective=objective, goodput=goodput if objective == "goodput" else None)
    result.notes.append(f"{_split.SOLVES[0] - solved_before} layer-split integer programs solved "
                        f"({mip_solves - (_split.SOLVES[0] - solved_before)} more ruled out by their memory rows alone)")
    return result


def _timed_out(limit: float, found: list, candidates: int, evaluated: int, t0: float, flash: bool, phase: str, top_k: int = 1) -> SolverFailure:
    """SolverFailure carrying a PlanResult of the plans found so far (possibly none)."""
    ranked = sorted(found, key=lambda x: (x[0], x[1]))[:top_k]
    plans = [Plan(i + 1, par, est) for i, (_, _, est, par) in enumerate(ranked)]
    solver = _split.USED[0]  # the last solver used in this process, if any
    best = PlanResult(plans, solver, candidates, evaluated, time.perf_counter() - t0, flash,
                      [f"time limit of {limit:g} s hit while {phase}; not proven best"])
    what = (f"best so far: step {plans[0].estimate.step_time_s:.3g} s with tp={plans[0].parallel.tp} pp={plans[0].parallel.pp} "
            f"dp={plans[0].parallel.dp} cp={plans[0].parallel.cp}") if plans else "no plan that fits found yet"
    return SolverFailure(f"time limit of {limit:g} s hit after {evaluated} of {candidates} candidates evaluated ({what}); "
                         "raise --time-limit or fix more fields", best=best)


def _no_fit(model, cluster, job, nearest, cap) -> NoFeasiblePlan:
    gib = 2**30
    if nearest is None:
        return NoFeasiblePlan(f"no configuration of {model.name} fits on {cluster.num_gpus} x {cluster.gpu.id}")
    need, est, par = nearest
    hints = []
    short = need - cap
    acts = max((st.activations_bytes for st in est.stages), default=0.0) if est is not None else 0.0
    if par.recompute != "full" and acts > short:
        hints.append("full activation recompute (--recompute full)")
    if par.zero < 3 and par.pp == 1:
        hints.append("ZeRO-3 / FSDP sharding (--zero 3)")
    factor = need / cap
    more = 2 ** math.ceil(math.log2(max(factor, 1.0001)))
    hints.append(f"about {more}x more GPUs ({cluster.num_gpus * more}) or GPUs with {need / gib:.0f}+ GiB")
    if job.global_batch_size > 1 and par.micro_batch_size > 1:
        hints.append("a smaller micro-batch")
    msg = (
        f"needs {need / gib:.1f} GiB per GPU, {cap / gib:.1f} GiB available "
        f"(nearest miss: tp={par.tp} pp={par.pp} dp={par.dp} cp={par.cp} mb={par.micro_batch_size} "
        f"recompute={par.recompute} zero={par.zero}); feasible with " + " or ".join(hints[:2])
    )
    return NoFeasiblePlan(msg, nearest=par, hints=hints)
