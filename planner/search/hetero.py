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
assembled by :func:`planner.cost.step.assemble`, the step assembly of ``estimate``:

    T_step = (m - a) T + a sum_i t_i + max_i sync_i + max_i opt_i + emb_sync + overhead,  T = max_i t_i

with a = 1 for 1F1B and GPipe, the schedules of a mixed cluster (:func:`planner.cost.step.pipeline_form`).
The placement and split are one mixed-integer program (:class:`planner.search.milp.Program`,
HiGHS or CBC), with x_ig = 1 when stage i runs on group g:

    min  (m - a) T + a sum_i t_i + D + O
    s.t. sum_g x_ig = 1,  sum_i x_ig <= floor(count_g / (tp dp)),  sum_i n_i = L,  n_i >= 1,
         t_i >= a_ig n_i + b_ig - M_t (1 - x_ig)            (stage time on group g)
         D   >= branch_ig(n_i) - M_t (1 - x_ig)  (every sync branch, planner.cost.step.sync_branches),  O >= opt_ig(n_i) - M_t (1 - x_ig),
         mem_ig(n_i) <= cap_g + M_m (1 - x_ig)              (the group's GPU memory)

with big-M constants M_t, M_m the largest value any stage could take (all L layers).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from planner.cost import memory as M
from planner.cost.comm import group_links
from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.rules import check_parallel, tp_ok
from planner.cost.stages import dense_counts, embedding_sync_time, engine_layer_costs, stage_memory, stage_sync, stage_time_parts
from planner.cost.step import assemble, pipeline_form
from planner.engines import Engine, default_split, fp8_gathers, get_engine, resolve, resolve_job, supports_flash
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.search.bounds import states_bound_fn
from planner.search.milp import INF, Program, SolveStats
from planner.search.split import stage_affine, sync_rows
from planner.specs import ClusterSpec, GpuSpec, Job, ModelSpec, ParallelConfig

__all__ = ["GpuGroup", "HeteroCluster", "HeteroPlan", "hetero_evaluate", "hetero_place", "hetero_plan"]


@dataclass(frozen=True)
class GpuGroup:
    """Whole nodes of one GPU type: ``cluster`` is that group as a homogeneous cluster (its GPU,
    nodes and links; :func:`planner.io.loaders.load_hetero` builds it)."""

    cluster: ClusterSpec
    count: int

    @property
    def gpu(self) -> GpuSpec:
        return self.cluster.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node


@dataclass(frozen=True)
class HeteroCluster:
    name: str
    groups: tuple[GpuGroup, ...]

    @property
    def num_gpus(self) -> int:
        return sum(g.count for g in self.groups)

    def group_cluster(self, g: int, world: int) -> ClusterSpec:
        """A homogeneous ClusterSpec of group g's GPU for a job of ``world`` GPUs (its links)."""
        return replace(self.groups[g].cluster, num_gpus=world, name=f"{self.name}/{self.groups[g].gpu.id}")


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


def _setup(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, engine: Engine) -> tuple[ParallelConfig, list[ClusterSpec]]:
    """The resolved configuration (resolved on the first group; every group runs the same engine
    settings) and the per-group clusters, after the rules of each."""
    if par.pp < 2:
        raise InputError("parallel.pp", par.pp, "at least 2 stages (one stage cannot be split over GPU types)")
    if par.dp is None:
        raise InputError("parallel.dp", None, "a data-parallel degree on a mixed cluster")
    world = par.tp * par.pp * par.dp * par.cp
    clusters = [hc.group_cluster(g, world) for g in range(len(hc.groups))]
    res, _ = resolve(par, model, clusters[0], job, engine)
    if res.cp != 1 or res.vpp != 1 or res.ep != 1:
        raise InputError("parallel", f"cp={res.cp} vpp={res.vpp} ep={res.ep}", "cp = vpp = ep = 1 on a mixed cluster")
    # Each group's own attention kernel (flash only where its GPU has it).
    for c in clusters:
        check_parallel(model, c, job, res, engine, default_split(model, res.pp, 1, engine))
    return res, clusters


def _on(par: ParallelConfig, cluster: ClusterSpec, model: ModelSpec, job: Job, engine: Engine) -> ParallelConfig:
    """``par`` with the attention kernel resolved for this group's GPU: unfused stays; a flash kernel
    is the group's (a GPU without flash attention runs unfused), FlashAttention-2 (or 1) kept where it runs."""
    if par.attention == "unfused":
        return par
    res = resolve(par.replace(attention=None), model, cluster, job, engine)[0]
    return res.replace(attention=par.attention) if par.attention in ("fa2", "fa1") and supports_flash(cluster.gpu) else res


def hetero_evaluate(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, placement: tuple[int, ...],
                    layers: tuple[int, ...], engine: "str | Engine | None" = None, constants: Constants | None = None) -> HeteroPlan:
    """Step time and memory of one placement and split (the formula in the module docstring)."""
    eng, C = get_engine(engine), constants or DEFAULT_CONSTANTS
    par, clusters = _setup(model, hc, job, par, eng)
    pp, m = par.pp, par.num_microbatches(job.global_batch_size)
    if len(placement) != pp or len(layers) != pp or sum(layers) != model.layers or min(layers) < 1:
        raise InputError("layers_per_stage", list(layers), f"{pp} positive counts summing to {model.layers}")
    dcounts = dense_counts(model, tuple(layers))
    t, mem, cap, syncs = [], [], [], []
    for i, (g, n) in enumerate(zip(placement, layers)):
        c = clusters[g]
        pg = _on(par, c, model, job, eng)
        costs = engine_layer_costs(model, c, job, pg, C, eng)
        t_i = sum(stage_time_parts(costs, n, dcounts[i], i == pp - 1, i == 0).values())
        params = M.stage_params(model, n, i, pp, par.tp, par.ep, n_dense=dcounts[i], etp=par.etp)
        syncs.append(stage_sync(c, job, pg, params, n, t_i, m, costs[4]["bwd_dense_s"], costs[4]["fwd_dense_s"], C, eng))
        mem.append(stage_memory(model, job, pg, i, n, params, m, C, eng).total_bytes)
        cap.append(c.gpu.memory_bytes * (1 - C.MEMORY_MARGIN_FRACTION))  # usable, as planner.estimate's fit
        t.append(t_i)
    pp_links = group_links(clusters[placement[0]], par)["pp"]
    emb = embedding_sync_time(model, par, M.grad_bytes(job.precision, job.grad_reduce), pp_links,
                              crosses_network=pp_links.m > 1 or placement[0] != placement[-1])
    step = assemble(t, [s["exposed_s"] for s in syncs], [s["optimizer_s"] for s in syncs], m=m, v=1, schedule=par.schedule,
                    extra_s=emb + C.STEP_OVERHEAD_S).step_s
    return HeteroPlan(par, tuple(placement), tuple(layers), tuple(t), tuple(mem), tuple(cap), step,
                      job.tokens_per_step / step, par.world)


def hetero_place(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, engine: "str | Engine | None" = None,
                 constants: Constants | None = None, time_limit_s: float | None = None, stats: SolveStats | None = None,
                 backend: str | None = None) -> HeteroPlan | None:
    """The placement and split minimising the step time (the program in the module docstring);
    None when no placement fits in the groups' GPU counts and memories. A program stopped by
    ``time_limit_s`` returns its best integer solution (re-evaluated exactly)."""
    eng, C = get_engine(engine), constants or DEFAULT_CONSTANTS
    par, clusters = _setup(model, hc, job, par, eng)
    pp, L, G = par.pp, model.layers, len(hc.groups)
    width = par.tp * par.dp
    slots = [g.count // width for g in hc.groups]
    if sum(slots) < pp or L < pp:
        return None
    m = par.num_microbatches(job.global_batch_size)
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    a_form, b_form, c_form = pipeline_form(par.schedule, m, 1, pp)
    if b_form or c_form:
        raise InputError("parallel.schedule", par.schedule, "1f1b or gpipe on a mixed cluster")
    c_max, c_sum = m - a_form, a_form
    aff = [stage_affine(model, c, job, _on(par, c, model, job, eng), C, eng) for c in clusters]
    ts, ms = 1e3, 1.0 / 2**30  # milliseconds and GiB: coefficients near 1
    big_t = ts * max(max(a * L + b for a, b in af.time) + max(sum(abs(sa) * L + abs(sb) for sa, sb, _, _ in parts) for parts in af.sync)
                     + max(a * L + b for a, b in af.opt) for af in aff)
    big_m = ms * max(max(a * L + b for a, b in af.mem) for af in aff)
    prog = Program()
    n = [prog.var(1, L - pp + 1, integer=True) for _ in range(pp)]
    x = [[prog.var(0, 1, integer=True) for _ in range(G)] for _ in range(pp)]
    t = [prog.var(lo=0.0, cost=c_sum) for _ in range(pp)]
    T, D, O = prog.var(lo=0.0, cost=c_max), prog.var(lo=0.0, cost=1.0), prog.var(lo=0.0, cost=1.0)  # noqa: E741
    prog.row(L, L, [(v, 1.0) for v in n])
    for g in range(G):
        prog.row(-INF, slots[g], [(x[i][g], 1.0) for i in range(pp)])
    for i in range(pp):
        prog.row(1, 1, [(x[i][g], 1.0) for g in range(G)])
        prog.row(0, INF, [(T, 1.0), (t[i], -1.0)])
        for g in range(G):
            af = aff[g]
            a, b = af.time[i]
            # t_i >= ts (a n_i + b) - big_t (1 - x_ig)
            prog.row(ts * b - big_t, INF, [(t[i], 1.0), (n[i], -ts * a), (x[i][g], -big_t)])
            for sa, sb in sync_rows(af.sync[i], eta):
                prog.row(ts * sb - big_t, INF, [(D, 1.0), (n[i], -ts * sa), (x[i][g], -big_t)])
            oa, ob = af.opt[i]
            prog.row(ts * ob - big_t, INF, [(O, 1.0), (n[i], -ts * oa), (x[i][g], -big_t)])
            ma, mb = af.mem[i]
            prog.row(-INF, ms * clusters[g].gpu.memory_bytes * (1 - C.MEMORY_MARGIN_FRACTION) + big_m - ms * mb,
                     [(n[i], ms * ma), (x[i][g], big_m)])
    # Symmetry breaking: middle stages (1 .. pp-2) have the same costs in every position, so
    # any placement can be reordered to put their group index non-decreasing and, within one
    # group, their layer counts non-increasing, without changing the objective.
    for i in range(1, pp - 2):
        gi = [(x[i][g], float(g)) for g in range(G)]
        gj = [(x[i + 1][g], -float(g)) for g in range(G)]
        prog.row(-INF, 0.0, gi + gj)  # gidx_i <= gidx_{i+1}
        # n_i >= n_{i+1} - L (gidx_{i+1} - gidx_i)
        prog.row(0.0, INF, [(n[i], 1.0), (n[i + 1], -1.0)] + [(x[i + 1][g], L * float(g)) for g in range(G)]
                 + [(x[i][g], -L * float(g)) for g in range(G)])
    sol = prog.solve(time_limit_s, backend)
    if stats is not None:
        stats.add(sol)
    if not sol.ok:
        return None  # infeasible, or stopped by the time limit before an integer solution
    placement = tuple(max(range(G), key=lambda g, i=i: sol.x[x[i][g]]) for i in range(pp))
    layers = tuple(int(round(sol.x[v])) for v in n)
    if sum(layers) != L or min(layers) < 1 or any(placement.count(g) > slots[g] for g in range(G)):
        return None
    return hetero_evaluate(model, hc, job, par, placement, layers, eng, C)


def _candidates(model: ModelSpec, hc: HeteroCluster, job: Job, fixed: dict, engine: Engine):
    """Megatron-style configurations whose stages are whole nodes of one type: tp and dp
    powers of two, any pp from 2 up to the stage slots, and for each (tp, pp) the largest
    dp the groups can host (idle GPUs cost the same and add nothing). The engine's defaults
    (sequence parallelism, overlaps, ZeRO) are resolved by :func:`planner.engines.resolve`."""
    gpn = min(g.gpus_per_node for g in hc.groups)
    pows = [2**k for k in range(0, 15)]
    slots_of = lambda w: sum(g.count // w for g in hc.groups)  # noqa: E731
    recs = [r for r in ("none", "selective", "full") if r in engine.recompute]
    for tp in [fixed["tp"]] if "tp" in fixed else [p for p in pows if p <= gpn and (p == 1 or engine.tensor_parallel)]:
        if not tp_ok(model, tp):
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
                    for rec in [fixed["recompute"]] if "recompute" in fixed else recs:
                        yield ParallelConfig(tp=tp, pp=pp, dp=dp, vpp=1, micro_batch_size=mb, recompute=rec, zero=fixed.get("zero"))


def _lower_bound(model: ModelSpec, hc: HeteroCluster, job: Job, par: ParallelConfig, engine: Engine, C: Constants) -> float:
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
        pc = _on(par, c, model, job, engine)
        costs = engine_layer_costs(model, c, job, pc, C, engine)
        one = stage_time_parts(costs, 1, 1 if model.moe is None else 0, False)
        a = sum(one.values()) - one["pp_comm"]
        speeds.append((1.0 / a, grp.count // width))
        p2p, last = min(p2p, (1 - costs[4]["p2p_overlap_eta"]) * costs[3]), min(last, sum(costs[2].values()))
    speeds.sort(reverse=True)
    left, rate = par.pp, 0.0
    for v, slots in speeds:
        take = min(left, slots)
        rate, left = rate + take * v, left - take
    fixed = par.pp * p2p + last
    t_lb = (model.layers + fixed * speeds[-1][0]) / rate
    return (m - 1) * t_lb + max(t_lb, model.layers / speeds[0][0] + fixed) + C.STEP_OVERHEAD_S


def hetero_plan(model: ModelSpec, hc: HeteroCluster, job: Job, fixed: dict | None = None, top_k: int = 5,
                engine: "str | Engine | None" = None, constants: Constants | None = None,
                time_limit_s: float = 60.0) -> tuple[list[tuple[HeteroPlan, HeteroPlan]], int, SolveStats, bool]:
    """The ``top_k`` fastest (placement program, even split on the same placement) pairs,
    fastest first, with the number of candidates, the programs' statistics, and whether the
    search ran to its end (True) or stopped at ``time_limit_s`` (False: best found so far).
    Candidates are taken in order of :func:`_lower_bound` and the search stops once the bound
    exceeds the K-th best time (branch and bound). Raises NoFeasiblePlan when nothing fits,
    SolverFailure when the time ran out before any plan was found."""
    deadline = time.perf_counter() + time_limit_s
    eng, C = get_engine(engine), constants or DEFAULT_CONSTANTS
    job = resolve_job(job, eng)  # the FP8 recipe the engine runs (checked)
    states_of = states_bound_fn(model, job.precision, C, grad_reduce=job.grad_reduce, fp8_params=fp8_gathers(eng, job, 1))
    cap = max(g.gpu.memory_bytes for g in hc.groups) * (1 - C.MEMORY_MARGIN_FRACTION)  # usable, as planner.estimate's fit
    gpn = min(g.gpus_per_node for g in hc.groups)
    if (fixed or {}).get("tp") is not None and gpn % fixed["tp"]:
        raise InputError("parallel.tp", fixed["tp"], f"a divisor of the GPUs per node ({gpn}): each stage is whole nodes of one type")
    if (fixed or {}).get("pp") == 1:
        raise InputError("parallel.pp", 1, "at least 2 pipeline stages (one stage runs on one GPU type: `planner plan` prices it)")
    pool = []
    for par in _candidates(model, hc, job, dict(fixed or {}), eng):
        try:
            res, clusters = _setup(model, hc, job, par, eng)
        except InputError:
            continue
        if states_of(res.tp, res.pp, res.dp, res.cp, res.ep, res.zero) > cap:
            continue
        pool.append((_lower_bound(model, hc, job, res, eng, C), res))
    pool.sort(key=lambda r: (r[0], r[1].tp, r[1].pp, r[1].dp, r[1].micro_batch_size, r[1].recompute))
    found: list = []
    stats, proven = SolveStats(), True
    for lb, par in pool:
        if len(found) >= top_k and lb > found[top_k - 1][0]:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            proven = False
            break
        best = hetero_place(model, hc, job, par, eng, C, time_limit_s=max(0.1, left), stats=stats)
        if best is None or not best.fits:
            continue
        even = hetero_evaluate(model, hc, job, par, best.placement, default_split(model, par.pp, 1, eng), eng, C)
        found.append((best.step_time_s, par.tp, par.pp, par.dp, par.micro_batch_size, par.recompute, best, even))
        found.sort(key=lambda r: r[:6])
    if not found and not proven:
        raise SolverFailure(f"time limit of {time_limit_s:g} s hit after {stats.programs} of {len(pool)} placement programs, none fitting yet")
    if not found:
        why = "" if pool else (" (no candidate: hetero places at least 2 pipeline stages of whole nodes; with fewer stage slots "
                               "the job runs on one GPU type, which `planner plan` prices)")
        raise NoFeasiblePlan(f"no placement of {model.name} fits on {hc.name} ({hc.num_gpus} GPU{'s' if hc.num_gpus != 1 else ''}){why}")
    return [(r[6], r[7]) for r in found[:top_k]], len(pool), stats, proven
