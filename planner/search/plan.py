"""plan(model, cluster, job) -> the top-K parallel plans, best first, proven best under the model.

1. Enumerate the candidate space (:mod:`planner.search.space`), as plain tuples.
2. Prune what cannot fit: model states alone (a lower bound of memory) over capacity.
3. Order by a lower bound on step time (compute and unavoidable tensor-parallel traffic of
   the bottleneck stage, m * L/pp layers; no bubble, no data-parallel traffic) and evaluate
   the exact cost model in that order; stop once the bound exceeds the K-th best exact time
   (branch and bound: nothing after that point can enter the top K).
4. For pipelined candidates the layer split is decided by the integer program of
   :mod:`planner.search.split` (HiGHS via PuLP) under each stage's memory limit; an even
   split is kept when it is as good.
5. Rank by predicted step time; ties break on the configuration tuple (deterministic).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace

from planner.cost.estimate import Estimate, default_flash, estimate, layer_costs, stage_time_parts
from planner.cost.flops import embedding_params, layer_params
from planner.cost.memory import bytes_per_param
from planner.errors import InputError, NoFeasiblePlan
from planner.search.space import SearchOptions, candidate_tuples, to_parallel
from planner.search.split import optimal_split, solver_name
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["Plan", "PlanResult", "plan", "SPLIT_MIN_GAIN"]

# An uneven split is sought only when it could shorten the step by more than this fraction
# (or when the even split does not fit): smaller gains are below the model's resolution.
SPLIT_MIN_GAIN = 0.002


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

    def search_dict(self) -> dict:
        return {
            "solver": self.solver,
            "candidates": self.candidates,
            "evaluated": self.evaluated,
            "seconds": self.seconds,
            "flash_attention": self.flash_attention,
            "notes": list(self.notes),
        }


def _states_lower_bound(model: ModelSpec, par: ParallelConfig, precision: str) -> float:
    """Model-state bytes per GPU on the most loaded stage, ignoring activations (a lower bound)."""
    per_layer = layer_params(model, moe_layer=model.moe is not None)
    dense = (per_layer["attention"] + per_layer["mlp"]) / par.tp + per_layer["norms"]
    experts = per_layer["experts"] / (par.tp * par.ep)
    emb = embedding_params(model)["embedding"] / par.tp
    layers = math.ceil(model.layers / par.pp)
    shard = par.dp * par.cp
    bpp = sum(bytes_per_param(precision, par.zero, shard).values())
    bpp_e = sum(bytes_per_param(precision, par.zero, max(1, shard // par.ep)).values())
    first = layers * dense + (emb if par.pp > 1 else emb * (1 if model.tied_embeddings else 2))
    return first * bpp + layers * experts * bpp_e


def _time_lower_bound(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, flash: bool) -> float:
    costs = layer_costs(model, cluster, job, par, flash)
    m = par.num_microbatches(job.global_batch_size)
    per_layer = sum(stage_time_parts(costs, 1, 1 if model.moe is None else 0, False).values()) - costs[3]
    # Every split has (m - 1/v) T + sum(t)/v >= sum(t) ((m - 1/v)/pp + 1/v), T >= mean stage.
    v = par.vpp
    return per_layer * model.layers * ((m - 1.0 / v) / par.pp + 1.0 / v)


_REC = {"none": 0, "selective": 1, "full": 2}


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
) -> PlanResult:
    """The ``top_k`` fastest plans that fit, best first. Raises NoFeasiblePlan (with the nearest
    miss and what would make it fit) when none does."""
    if top_k < 1:
        raise InputError("--top", top_k, "a positive integer")
    t0 = time.perf_counter()
    opts = options or SearchOptions()
    flash = default_flash(job) if opts.flash_attention is None else opts.flash_attention
    cap = cluster.gpu.memory_bytes
    pool = list(candidate_tuples(model, cluster, job, opts))
    if not pool:
        raise InputError("parallel", opts.fixed or "(none fixed)", f"a configuration the engines accept for {cluster.num_gpus} GPUs (degrees multiplying to the GPU count, heads divisible by tp, batch divisible by micro-batch x dp)")
    nearest: tuple | None = None  # (bytes, estimate or None, parallel)
    lb_cache: dict = {}
    bounded = []
    for t in pool:
        par = to_parallel(t)
        states = _states_lower_bound(model, par, job.precision)
        if states > cap:
            if nearest is None or states < nearest[0]:
                nearest = (states, None, par)
            continue
        lk = t[:9]
        if lk not in lb_cache:
            lb_cache[lk] = _time_lower_bound(model, cluster, job, par, flash)
        bounded.append((lb_cache[lk], t, par))
    bounded.sort(key=lambda x: (x[0], _key(x[2])))
    kth: list[float] = []  # max-heap (negated) of the K best exact times so far
    found: list = []
    evaluated = 0
    mip_solves = 0
    for lb, _, par in bounded:
        if len(kth) >= top_k and lb > -kth[0]:
            break
        evaluated += 1
        est = estimate(model, cluster, job, par, flash_attention=flash, validate=False)
        if par.pp > 1 and opts.uneven_split and _split_may_help(est, par, job, cap, kth, top_k):
            mip_solves += 1
            split = optimal_split(model, cluster, job, par, flash, cap)
            if split is not None and split != est.layers_per_stage:
                par2 = replace(par, layers_per_stage=split)
                est2 = estimate(model, cluster, job, par2, flash_attention=flash, validate=False)
                if est2.fits and (not est.fits or est2.step_time_s < est.step_time_s):
                    par, est = par2, est2
        if not est.fits:
            if nearest is None or nearest[1] is None or est.memory_peak_bytes < nearest[1].memory_peak_bytes:
                nearest = (est.memory_peak_bytes, est, par)
            continue
        found.append((est.step_time_s, _key(par), est, par))
        heapq.heappush(kth, -est.step_time_s)
        if len(kth) > top_k:
            heapq.heappop(kth)
    if not found:
        raise _no_fit(model, cluster, job, nearest, cap)
    ranked = sorted(found, key=lambda x: (x[0], x[1]))[:top_k]
    plans = [Plan(i + 1, par, est) for i, (_, _, est, par) in enumerate(ranked)]
    result = PlanResult(plans, solver_name() if mip_solves else "none (no pipeline split to decide)", len(pool), evaluated, time.perf_counter() - t0, flash)
    result.notes.append(f"{mip_solves} layer-split integer programs solved")
    return result


def _split_may_help(est: Estimate, par: ParallelConfig, job: Job, cap: float, kth: list, top_k: int) -> bool:
    """Whether an uneven layer split could make this candidate fit or enter the top K.

    The sum of stage times is the same for every split, so no split's step time is below
    (m - 1/v) * mean(t_i) + sum(t_i)/v + the split-independent terms: the even-split time
    minus (m - 1/v)(t_max - t_mean).
    """
    if not est.fits and est.memory_peak_bytes > 1.5 * cap:
        return False
    if par.vpp * par.pp == sum(est.layers_per_stage) or len(set(est.layers_per_stage)) == 1 and est.layers_per_stage[0] == par.vpp:
        return False  # one layer chunk per virtual stage: no other split exists
    t = est.stage_times_s
    m, v = est.num_microbatches, par.vpp
    lps = est.layers_per_stage
    # Any other split moves at least one chunk of v layers onto some stage, which then runs at
    # least t_light + v * a (a: time per layer), unless the bottleneck keeps all its layers.
    light = min(range(len(t)), key=t.__getitem__)
    pp_comm = est.time_breakdown_s["pp_comm_exposed_s"] / max(1, m)
    a = max(0.0, t[light] - pp_comm) / max(1, lps[light])
    t_lb = max(sum(t) / len(t), min(max(t), t[light] + v * a))
    # The data-parallel and optimizer terms also depend on the split, but by at most the
    # parameters of the layers moved off the largest stage; they are left out of the bound.
    gain = (m - 1.0 / v) * (max(t) - t_lb)
    if est.fits and gain <= SPLIT_MIN_GAIN * est.step_time_s:
        return False
    return len(kth) < top_k or est.step_time_s - gain < -kth[0]


def _no_fit(model, cluster, job, nearest, cap) -> NoFeasiblePlan:
    gib = 2**30
    if nearest is None:
        return NoFeasiblePlan(f"no configuration of {model.name} fits on {cluster.num_gpus} x {cluster.gpu.id}")
    need, est, par = nearest
    hints = []
    if par.recompute != "full":
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
