"""Mixed GPU clusters: pipeline stages placed on GPU groups, layers split by each group's speed.

A heterogeneous cluster is a list of GPU groups (e.g. 64 A100-80GB and 32 H100), each a set
of whole nodes of one GPU type, joined by one scale-out network. A plan keeps the homogeneous
plan's structure (every pipeline stage is ``tp * dp`` GPUs of one type, data parallelism
replicates the pipeline, Megatron-LM's layout) and decides, per stage, which group hosts it
and how many layers it holds. Mixing types *inside* a stage would make its tensor-parallel
ranks wait for the slowest GPU, so stages are never split across groups (the placement of
HetPipe, Park et al., USENIX ATC 2020, and Metis, Um et al., USENIX ATC 2024: stages on
homogeneous GPU groups, layers balanced by group speed).

Per-stage quantities come from the homogeneous cost model evaluated with a ClusterSpec of
that group's GPU (:func:`planner.search.split.stage_affine`: time per micro-batch, gradient
sync, optimizer step and memory, each affine in the stage's layer count). The step time is
assembled as :func:`planner.cost.estimate.estimate` does for one cluster:

    T_step = m T + (sum_i t_i - T) + max_i dp_i + max_i opt_i + emb_sync + overhead,  T = max_i t_i

The placement and split are one mixed-integer program (HiGHS via PuLP), with x_ig = 1 when
stage i runs on group g:

    min  (m - 1) T + sum_i t_i + D + O
    s.t. sum_g x_ig = 1,  sum_i x_ig <= floor(count_g / (tp dp)),  sum_i n_i = L,  n_i >= 1,
         t_i >= a_ig n_i + b_ig - M_t (1 - x_ig)            (stage time on group g)
         D   >= dp_ig(n_i) - M_t (1 - x_ig),  O >= opt_ig(n_i) - M_t (1 - x_ig),
         mem_ig(n_i) <= cap_g + M_m (1 - x_ig)              (the group's GPU memory)

with big-M constants M_t, M_m the largest value any stage could take (all L layers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from planner.cost import constants as C
from planner.cost import memory as M
from planner.cost.comm import group_links
from planner.cost.compute import supports_flash
from planner.engines import default_generation, features, resolve_flash
from planner.cost.estimate import check_parallel, even_split, layer_costs, stage_memory, stage_sync, stage_time_parts
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.io.loaders import make_cluster, read_mapping
from planner.search.split import _quiet, _solver, dp_rows, stage_affine
from planner.specs import ClusterSpec, GpuSpec, Job, ModelSpec, ParallelConfig

__all__ = ["GpuGroup", "HeteroCluster", "HeteroPlan", "load_hetero", "hetero_evaluate", "hetero_place", "hetero_plan"]


@dataclass(frozen=True)
class GpuGroup:
    gpu: GpuSpec
    count: int
    gpus_per_node: int
    inter_node: dict | None


@dataclass(frozen=True)
class HeteroCluster:
    name: str
    groups: tuple[GpuGroup, ...]

    @property
    def num_gpus(self) -> int:
        return sum(g.count for g in self.groups)

    def group_cluster(self, g: int, world: int) -> ClusterSpec:
        """A homogeneous ClusterSpec of group g's GPU for a job of ``world`` GPUs (its links)."""
        grp = self.groups[g]
        return make_cluster(grp.gpu, world, grp.gpus_per_node, grp.inter_node, name=f"{self.name}/{grp.gpu.id}")


def load_hetero(path: str | Path) -> HeteroCluster:
    """Read ``{name, groups: [{gpu, count[, gpus_per_node]}], network: {kind, gbps_per_nic, nics_per_node}}``."""
    from planner.io.loaders import load_gpu  # noqa: PLC0415

    d = read_mapping(path)
    groups = d.get("groups")
    if not isinstance(groups, list) or not groups:
        raise InputError(f"{path}.groups", groups, "a non-empty list of {gpu, count}")
    net = d.get("network")
    if net is not None and not isinstance(net, dict):
        raise InputError(f"{path}.network", net, "a mapping {kind, gbps_per_nic, nics_per_node}")
    out = []
    for i, g in enumerate(groups):
        w = f"{path}.groups[{i}]"
        if not isinstance(g, dict) or "gpu" not in g:
            raise InputError(w, g, "a mapping with gpu and count")
        gpu = load_gpu(str(g["gpu"]))
        count = g.get("count")
        gpn = g.get("gpus_per_node", gpu.gpus_per_node)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"{w}.count", count, "a positive integer")
        if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1 or (count > gpn and count % gpn):
            raise InputError(f"{w}.gpus_per_node", gpn, f"a positive integer dividing count ({count})")
        out.append(GpuGroup(gpu, count, gpn, g.get("inter_node", net)))
    return HeteroCluster(str(d.get("name", Path(path).stem)), tuple(out))


@dataclass(frozen=True)
class HeteroPlan:
    parallel: ParallelConfig
    placement: tuple[int, ...]  # group index of each stage
    layers_per_stage: tuple[int, ...]
    stage_times_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    stage_capacity_bytes: tuple[float, ...]
    step_time_s: float
    tokens_per_s: float
    gpus_used: int

    @property
    def fits(self) -> bool:
        return all(m <= c for m, c in zip(self.stage_memory_bytes, self.stage_capacity_bytes))


def _check(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig) -> list[ClusterSpec]:
    if par.cp != 1 or par.vpp != 1 or par.ep != 1:
        raise InputError("parallel", f"cp={par.cp} vpp={par.vpp} ep={par.ep}", "cp = vpp = ep = 1 on a mixed cluster")
    if par.pp < 2:
        raise InputError("parallel.pp", par.pp, "at least 2 stages (one stage cannot be split over GPU types)")
    clusters = [hc.group_cluster(g, par.world) for g in range(len(hc.groups))]
    for c in clusters:
        check_parallel(model, c, job, par)
    return clusters


def hetero_evaluate(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, placement: tuple[int, ...],
                    layers: tuple[int, ...], flash: bool | None = None) -> HeteroPlan:
    """Step time and memory of one placement and split (the formula in the module docstring)."""
    clusters = _check(model, hc, job, par)
    pp, m = par.pp, par.num_microbatches(job.global_batch_size)
    if len(placement) != pp or len(layers) != pp or sum(layers) != model.layers or min(layers) < 1:
        raise InputError("layers_per_stage", list(layers), f"{pp} positive counts summing to {model.layers}")
    flash = resolve_flash(job, None, flash)
    dense = model.layers - model.moe_layers
    t, mem, cap, syncs, first = [], [], [], [], 0
    for i, (g, n) in enumerate(zip(placement, layers)):
        c = clusters[g]
        fl = flash and supports_flash(c.gpu)
        costs = layer_costs(model, c, job, par, fl)
        nd = max(0, min(n, dense - first))
        first += n
        t_i = sum(stage_time_parts(costs, n, nd, i == pp - 1).values())
        params = M.stage_params(model, n, i, pp, par.tp, par.ep, n_dense=nd)
        syncs.append(stage_sync(c, job, par, params, n, t_i, m, costs[4]["bwd_dense_s"], costs[4]["fwd_dense_s"]))
        mem.append(stage_memory(model, job, par, fl, i, n, params, m).total_bytes)
        cap.append(c.gpu.memory_bytes)
        t.append(t_i)
    T = max(t)
    emb = 0.0
    if model.tied_embeddings:  # as in estimate(): first and last stage all-reduce the tied embedding's gradient
        links = group_links(clusters[placement[0]], par)["pp"]
        lvl = links.inter if links.m > 1 or placement[0] != placement[-1] else links.intra
        emb = links.intra.latency_s + model.vocab * model.hidden / par.tp * M.grad_bytes(job.precision, job.grad_reduce) / lvl.bandwidth_bytes_per_s
    step = (m * T + (sum(t) - T) + max(s["dp_exposed_s"] for s in syncs) + max(s["zero3_exposed_s"] for s in syncs)
            + max(s["optimizer_s"] for s in syncs) + emb + C.STEP_OVERHEAD_S)
    return HeteroPlan(par, tuple(placement), tuple(layers), tuple(t), tuple(mem), tuple(cap), step,
                      job.tokens_per_step / step, par.world)


def hetero_place(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig,
                 flash: bool | None = None, time_limit_s: float | None = None) -> HeteroPlan | None:
    """The placement and split minimising the step time (the program in the module docstring);
    None when no placement fits in the groups' GPU counts and memories. A program stopped by
    ``time_limit_s`` returns its best integer solution (re-evaluated exactly)."""
    import pulp  # noqa: PLC0415

    clusters = _check(model, hc, job, par)
    flash = resolve_flash(job, None, flash)
    pp, L, G = par.pp, model.layers, len(hc.groups)
    width = par.tp * par.dp
    slots = [g.count // width for g in hc.groups]
    if sum(slots) < pp or L < pp:
        return None
    m = par.num_microbatches(job.global_batch_size)
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    aff = [stage_affine(model, c, job, par, flash and supports_flash(c.gpu)) for c in clusters]
    ts, ms = 1e3, 1.0 / 2**30  # milliseconds and GiB: coefficients near 1 for HiGHS
    big_t = ts * max(max(a * L + b for a, b in af.time) + max(sum(sa * L + sb for sa, sb, _, _ in parts) for parts in af.dp)
                     + max(a * L + b for a, b in af.opt) for af in aff)
    big_m = ms * max(max(a * L + b for a, b in af.mem) for af in aff)
    prob = pulp.LpProblem("hetero_placement", pulp.LpMinimize)
    new_var = getattr(prob, "add_variable", None)  # PuLP >= 3.3 attaches variables to the model (as in split.py)
    var = new_var if new_var else pulp.LpVariable
    n = [var(f"n{i}", lowBound=1, upBound=L - pp + 1, cat="Integer") for i in range(pp)]
    x = [[var(f"x{i}_{g}", cat="Binary") for g in range(G)] for i in range(pp)]
    t = [var(f"t{i}", lowBound=0) for i in range(pp)]
    T, D, O = var("T", lowBound=0), var("D", lowBound=0), var("O", lowBound=0)  # noqa: E741
    prob += (m - 1) * T + pulp.lpSum(t) + D + O
    prob += pulp.lpSum(n) == L
    for g in range(G):
        prob += pulp.lpSum(x[i][g] for i in range(pp)) <= slots[g]
    for i in range(pp):
        prob += pulp.lpSum(x[i]) == 1
        prob += T >= t[i]
        for g in range(G):
            af, off = aff[g], 1 - x[i][g]
            a, b = af.time[i]
            prob += t[i] >= ts * (a * n[i] + b) - big_t * off
            for rhs in dp_rows(af.dp[i], n[i], ts, eta, par.overlap_grad_reduce):
                prob += D >= rhs - big_t * off
            prob += O >= ts * (af.opt[i][0] * n[i] + af.opt[i][1]) - big_t * off
            ma, mb = af.mem[i]
            prob += ms * (ma * n[i] + mb) <= ms * clusters[g].gpu.memory_bytes + big_m * off
    # Symmetry breaking: middle stages (1 .. pp-2) have the same costs in every position, so
    # any placement can be reordered to put their group index non-decreasing and, within one
    # group, their layer counts non-increasing, without changing the objective.
    gidx = [pulp.lpSum(g * x[i][g] for g in range(G)) for i in range(pp)]
    for i in range(1, pp - 2):
        prob += gidx[i] <= gidx[i + 1]
        prob += n[i] >= n[i + 1] - L * (gidx[i + 1] - gidx[i])
    solver = _solver()[0]
    solver.timeLimit = time_limit_s  # shared instance: optimal_split sets its own each call
    with _quiet():
        prob.solve(solver)
    if any(v.value() is None for v in n) or any(v.value() is None for row in x for v in row):
        return None  # infeasible, or stopped by the time limit before an integer solution
    placement = tuple(max(range(G), key=lambda g, i=i: x[i][g].value()) for i in range(pp))
    layers = tuple(int(round(v.value())) for v in n)
    if sum(layers) != L or min(layers) < 1 or any(placement.count(g) > slots[g] for g in range(G)):
        return None
    return hetero_evaluate(model, hc, job, par, placement, layers, flash)


def _candidates(model: ModelSpec, hc: HeteroCluster, job: Job, fixed: dict):
    """Megatron-style configurations whose stages are whole nodes of one type: tp and dp
    powers of two, any pp from 2 up to the stage slots, and for each (tp, pp) the largest
    dp the groups can host (idle GPUs cost the same and add nothing)."""
    gpn = min(g.gpus_per_node for g in hc.groups)
    feats = features(default_generation(job))  # the engine features of the job's generation
    pows = [2**k for k in range(0, 15)]
    slots_of = lambda w: sum(g.count // w for g in hc.groups)  # noqa: E731
    for tp in [fixed["tp"]] if "tp" in fixed else [p for p in pows if p <= gpn]:
        if model.heads % tp or (model.kv_heads % tp and tp % model.kv_heads):
            continue
        pps = [fixed["pp"]] if "pp" in fixed else range(2, min(slots_of(tp), model.layers, 64) + 1)
        for pp in pps:
            dps = [d for d in pows if slots_of(tp * d) >= pp and not (tp * d > gpn and (tp * d) % gpn)]
            dps = [fixed["dp"]] if "dp" in fixed else dps[-1:]
            for dp in dps:
                if slots_of(tp * dp) < pp:
                    continue
                for mb in [fixed["micro_batch_size"]] if "micro_batch_size" in fixed else (1, 2, 4):
                    if job.global_batch_size % (mb * dp):
                        continue
                    recs = ("none", "selective", "full") if feats["selective_recompute"] else ("none", "full")
                    for rec in [fixed["recompute"]] if "recompute" in fixed else recs:
                        sp = tp > 1 and feats["sequence_parallel"]
                        yield ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=mb, recompute=rec,
                                             sequence_parallel=sp, zero=fixed.get("zero", 1),
                                             tp_comm_overlap=sp and feats["tp_comm_overlap"],
                                             async_tp_allreduce=feats["async_tp_allreduce"],
                                             overlap_param_gather=feats["overlap_param_gather"] and fixed.get("zero", 1) in (1, 2),
                                             overlap_grad_reduce=feats["overlap_grad_reduce"])


def _lower_bound(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, flash: bool) -> float:
    """A bound no placement beats. Stage i on group g takes t_i >= a_g n_i + c_i, with a_g the
    per-layer time and c_i its pipeline send/recv (plus the output layer on the last stage),
    each taken at its smallest over the groups. With s_g of the pp stages on group g,
    sum_i (T - c_i) / a_g(i) >= L, so T >= (L + sum_i c_i / a_max) / max_s sum_g s_g / a_g
    (the fastest groups' slots filled first); and sum_i t_i >= max(T, a_min L + sum_i c_i).
    Then T_step >= (m - 1) T + sum_i t_i + the fixed per-step overhead."""
    m = par.num_microbatches(job.global_batch_size)
    width = par.tp * par.dp
    speeds, p2p, last = [], math.inf, math.inf
    for g, grp in enumerate(hc.groups):
        c = hc.group_cluster(g, par.world)
        costs = layer_costs(model, c, job, par, flash and supports_flash(c.gpu))
        a = sum(stage_time_parts(costs, 1, 1 if model.moe is None else 0, False).values()) - costs[3]
        speeds.append((1.0 / a, grp.count // width))
        p2p, last = min(p2p, costs[3]), min(last, costs[2])
    speeds.sort(reverse=True)
    left, rate = par.pp, 0.0
    for v, slots in speeds:
        take = min(left, slots)
        rate, left = rate + take * v, left - take
    fixed = par.pp * p2p + last
    t_lb = (model.layers + fixed * speeds[-1][0]) / rate
    return (m - 1) * t_lb + max(t_lb, model.layers / speeds[0][0] + fixed) + C.STEP_OVERHEAD_S


def hetero_plan(model: ModelSpec, hc: HeteroCluster, job: Job, fixed: dict | None = None, top_k: int = 5,
                flash: bool | None = None, time_limit_s: float = 60.0) -> tuple[list[tuple[HeteroPlan, HeteroPlan]], int, int, bool]:
    """The ``top_k`` fastest (placement program, even split on the same placement) pairs,
    fastest first, with the number of candidates and of programs solved. Candidates are
    taken in order of :func:`_lower_bound` and the search stops once the bound exceeds the
    K-th best time (branch and bound); the last value says whether it got there (True) or
    stopped at ``time_limit_s`` (False: best found so far). Raises NoFeasiblePlan when
    nothing fits, SolverFailure when the time ran out before any plan was found."""
    import time  # noqa: PLC0415

    deadline = time.perf_counter() + time_limit_s
    from planner.search.bounds import states_bound_fn  # noqa: PLC0415

    states_of = states_bound_fn(model, job.precision, grad_reduce=job.grad_reduce)
    flash = resolve_flash(job, None, flash)
    cap = max(g.gpu.memory_bytes for g in hc.groups)
    pool = []
    for par in _candidates(model, hc, job, dict(fixed or {})):
        if states_of(par.tp, par.pp, par.dp, par.cp, par.ep, par.zero) > cap:
            continue
        try:
            _check(model, hc, job, par)
        except InputError:
            continue
        pool.append((_lower_bound(model, hc, job, par, flash), par))
    pool.sort(key=lambda r: (r[0], r[1].tp, r[1].pp, r[1].dp, r[1].micro_batch_size, r[1].recompute))
    found: list = []
    solved, proven = 0, True
    for lb, par in pool:
        if len(found) >= top_k and lb > found[top_k - 1][0]:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            proven = False
            break
        solved += 1
        best = hetero_place(model, hc, job, par, flash, time_limit_s=max(0.1, left))
        if best is None or not best.fits:
            continue
        even = hetero_evaluate(model, hc, job, par, best.placement, even_split(model.layers, par.pp), flash)
        found.append((best.step_time_s, par.tp, par.pp, par.dp, par.micro_batch_size, par.recompute, best, even))
        found.sort(key=lambda r: r[:6])
    if not found and not proven:
        raise SolverFailure(f"time limit of {time_limit_s:g} s hit after {solved} of {len(pool)} placement programs, none fitting yet")
    if not found:
        raise NoFeasiblePlan(f"no placement of {model.name} fits on {hc.name} ({hc.num_gpus} GPUs)")
    return [(r[6], r[7]) for r in found[:top_k]], len(pool), solved, proven
