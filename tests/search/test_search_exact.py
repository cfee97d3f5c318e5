"""The search is exact under the cost model: on random small scenarios the best plan of
:func:`planner.search.plan.plan` equals exhaustive enumeration of every candidate
(:func:`planner.search.space.candidates`, same SearchOptions) times every layer split (all
compositions of the layers into pp positive parts, multiples of vpp), each evaluated by
:func:`planner.cost.estimate.estimate`, keeping those that fit (search_design.md sec. 4).

The layer-split program alone (:func:`planner.search.split.optimal_split`) is checked
against enumerating its own objective over every feasible split, and that objective against
the estimate (the two differ by a split-independent constant).

GPUs get a small memory (``dataclasses.replace(memory_bytes=...)``) so that memory binds in
part of the scenarios. Seeded; the scenario sizes are capped so the module runs in well
under a minute.
"""

from __future__ import annotations

import dataclasses
import math
import random
from functools import lru_cache

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.engines import default_split, get_engine
from planner.errors import NoFeasiblePlan
from planner.io.loaders import load_gpu, make_cluster
from planner.search.plan import SPLIT_MIN_GAIN, plan
from planner.search.space import SearchOptions, candidates
from planner.search.split import optimal_split, split_fits, split_objective, stage_affine
from planner.specs import Job, ModelSpec, ParallelConfig

from split_enumeration import engine_splits  # noqa: E402

GIB = 2**30
SEED = 20261130
N_SCENARIOS = 32
MAX_EVALS = 1600  # estimate() calls per scenario's enumeration (keeps the module fast)
OPTS = SearchOptions(max_micro_batch=4, max_cp=2, max_vpp=2)
REL = 1e-9


ENGINE = get_engine(OPTS.engine)


def compositions(layers: int, pp: int, v: int):
    """Every split of ``layers`` into ``pp`` parts the engine accepts with ``v`` chunks a stage."""
    return engine_splits(layers, pp, v, ENGINE)


def _n_splits(layers: int, pp: int, v: int) -> int:
    if pp == 1:
        return 1
    return sum(1 for _ in compositions(layers, pp, v))


def _draw(rng: random.Random):
    layers = rng.randint(4, 12)
    heads = rng.choice([4, 8, 16])
    hidden = rng.choice([h for h in (256, 512, 768, 1024) if h % heads == 0])
    vocab = rng.choice([1024, 8192, 32000, 51200])
    gpu_id = rng.choice(["a100-sxm4-80gb", "h100-sxm5-80gb"])
    gpn = rng.choice([4, 8])
    n = rng.choice([4, 8, 16, 32])
    seq = rng.choice([512, 1024, 2048])
    gbs = rng.choice([4, 8, 16])
    prec = rng.choice(["bf16", "bf16", "fp16"])
    # Just above the fixed framework buffers: model states + activations of a few hundred MB
    # decide what fits.
    free = rng.choice([0.05, 0.1, 0.2, 0.4, 0.8, 2.0])
    model = ModelSpec(name=f"gpt-l{layers}-h{hidden}", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                      ffn_hidden=4 * hidden, vocab=vocab)
    gpu = dataclasses.replace(load_gpu(gpu_id), memory_bytes=C.FRAMEWORK_BUFFER_BYTES + free * GIB)
    cluster = make_cluster(gpu, n, gpn)
    job = Job(seq_len=seq, global_batch_size=gbs, precision=prec)
    return model, cluster, job


def _size(model, cluster, job, opts) -> int:
    return sum(_n_splits(model.layers, p.pp, p.vpp) for p in candidates(model, cluster, job, opts))


@lru_cache(maxsize=1)
def scenarios() -> list:
    """(model, cluster, job, options). Every other scenario pins pp > 1 (small models rarely
    want a pipeline on their own), so that the split search is exercised end to end."""
    rng = random.Random(SEED)
    out = []
    while len(out) < N_SCENARIOS:
        model, cluster, job = _draw(rng)
        opts = OPTS
        if len(out) % 2:
            pps = [p for p in (2, 3, 4, 6, 8) if cluster.num_gpus % p == 0 and p <= model.layers]
            opts = dataclasses.replace(OPTS, fixed={"pp": rng.choice(pps)})
        if 0 < _size(model, cluster, job, opts) <= MAX_EVALS:
            out.append((model, cluster, job, opts))
    return out


def _desc(model, cluster, job, opts=OPTS) -> str:
    free = (cluster.gpu.memory_bytes - C.FRAMEWORK_BUFFER_BYTES) / GIB
    return (f"L{model.layers} h{model.hidden} a{model.heads} V{model.vocab} {cluster.num_gpus}x{cluster.gpu.id}"
            f"/{cluster.gpus_per_node} s{job.seq_len} B{job.global_batch_size} {job.precision} free{free:.2f}GiB"
            f" fixed={opts.fixed}")


@lru_cache(maxsize=None)
def exhaustive(i: int):
    """(best fitting (time, parallel) or None, best ignoring memory (time, parallel, fits))."""
    model, cluster, job, opts = scenarios()[i]
    best = None
    best_any = None
    for par in candidates(model, cluster, job, opts):
        splits = [None] if par.pp == 1 else list(compositions(model.layers, par.pp, par.vpp))
        for sp in splits:
            p2 = par if sp is None else dataclasses.replace(par, layers_per_stage=sp)
            e = estimate(model, cluster, job, p2, opts.engine, validate=False)
            if best_any is None or e.step_time_s < best_any[0]:
                best_any = (e.step_time_s, p2, e.fits)
            if e.fits and (best is None or e.step_time_s < best[0]):
                best = (e.step_time_s, p2)
    return best, best_any


@lru_cache(maxsize=None)
def planned(i: int):
    model, cluster, job, opts = scenarios()[i]
    try:
        p = plan(model, cluster, job, top_k=1, options=opts).plans[0]
    except NoFeasiblePlan:
        return None
    return p.estimate.step_time_s, p.parallel, p.estimate.layers_per_stage


# Where the plan is slower than the enumeration it must be because the even split was kept:
# the bound on what an uneven split could gain was below SPLIT_MIN_GAIN (0.2%) of the step
# (planner.search.bounds.split_may_help), so the split MIP was not run. With this seed that
# happened in scenarios 11 (pp=2: even (4, 5) kept, (5, 4) is 0.00005% faster) and 13 (pp=4:
# even (1, 1, 2, 2) kept, (1, 2, 2, 1) is 0.024% faster) when written, and in 30 (even
# (3, 4) kept, (4, 3) 0.00007% faster) after the engine-generation change.


@pytest.mark.parametrize("i", range(N_SCENARIOS))
def test_plan_equals_exhaustive_enumeration(i):
    model, cluster, job, opts = scenarios()[i]
    best, _ = exhaustive(i)
    got = planned(i)
    desc = _desc(model, cluster, job, opts)
    if best is None:
        assert got is None, f"{desc}: the plan {got} fits but enumeration found nothing that fits"
        return
    assert got is not None, f"{desc}: enumeration finds {best[1]} ({best[0]:.6g} s) that fits; plan() found none"
    t_plan, t_best = got[0], best[0]
    assert t_plan >= t_best * (1 - REL), f"{desc}: plan beats enumeration ({got} < {best})"
    msg = (f"{desc}: plan {got[1]} split {got[2]} {t_plan:.9g} s vs enumeration {best[1]} {t_best:.9g} s "
           f"({100 * (t_plan / t_best - 1):+.5f}%)")
    if t_plan > t_best * (1 + REL):
        # Allowed only as the documented split pruning: even split kept, loss < SPLIT_MIN_GAIN.
        assert got[1].pp > 1 and got[2] == default_split(model, got[1].pp, got[1].vpp, ENGINE), msg
        assert t_plan <= t_best * (1 + SPLIT_MIN_GAIN), msg


def test_split_gaps_are_the_expected_ones():
    gaps = set()
    for i in range(N_SCENARIOS):
        best, _ = exhaustive(i)
        got = planned(i)
        if best and got and got[0] > best[0] * (1 + REL):
            gaps.add(i)
    # Each gap is the documented split pruning (checked above to lose < SPLIT_MIN_GAIN); they
    # must stay rare: at most 10% of the scenarios.
    assert len(gaps) <= max(1, N_SCENARIOS // 10), sorted(gaps)


def test_scenarios_exercise_memory_and_pipelines():
    binding = 0  # the fastest configuration ignoring memory does not fit
    infeasible = 0
    uneven = 0
    piped = 0
    for i in range(N_SCENARIOS):
        best, best_any = exhaustive(i)
        if best is None:
            infeasible += 1
            continue
        if not best_any[2]:
            binding += 1
        par = best[1]
        if par.pp > 1:
            piped += 1
            if len(set(par.layers_per_stage)) > 1:
                uneven += 1
    assert binding >= 5, binding
    assert piped >= N_SCENARIOS // 3, piped
    assert uneven >= 2, uneven
    assert infeasible <= 2 * N_SCENARIOS // 3, infeasible  # the memory model (margin included) leaves most feasible


# --- the layer-split program alone -------------------------------------------------------------

def _pipelined_candidates(limit_per_scenario: int = 3):
    rng = random.Random(SEED + 1)
    out = []
    for i, (model, cluster, job, opts) in enumerate(scenarios()):
        pars = [p for p in candidates(model, cluster, job, opts) if p.pp > 1 and _n_splits(model.layers, p.pp, p.vpp) > 1]
        rng.shuffle(pars)
        out += [(i, p) for p in pars[:limit_per_scenario]]
    return out


@pytest.mark.parametrize("backend", ["highs", "pulp"])
def test_split_mip_equals_enumeration_of_its_objective(backend):
    """The program reaches the enumerated optimum on both backends (HiGHS arrays, CBC via PuLP)."""
    cases = _pipelined_candidates()
    assert len(cases) >= 30
    feasible = infeasible = 0
    for i, par in cases:
        model, cluster, job, _ = scenarios()[i]
        cap = cluster.gpu.memory_bytes
        aff = stage_affine(model, cluster, job, par, C, ENGINE)
        m = par.num_microbatches(job.global_batch_size)
        objs = {sp: split_objective(aff, sp, m, par.vpp, par.schedule, C)
                for sp in compositions(model.layers, par.pp, par.vpp) if split_fits(aff, sp, cap)}
        got = optimal_split(model, cluster, job, par, cap, C, ENGINE, aff=aff, backend=backend)
        where = f"{_desc(model, cluster, job)} {par}"
        if not objs:
            assert got is None, where
            infeasible += 1
            continue
        feasible += 1
        assert got is not None and got in objs, f"{where}: MIP split {got} not a feasible split"
        best = min(objs.values())
        assert objs[got] == pytest.approx(best, rel=REL, abs=0), f"{where}: MIP {got} {objs[got]} vs enumeration {best}"
    assert feasible >= 20 and infeasible >= 1, (feasible, infeasible)


def test_split_objective_tracks_the_estimate():
    # The program is exact: estimate(split) - objective(split) is the same for every split.
    for i, par in _pipelined_candidates(1)[:12]:
        model, cluster, job, _ = scenarios()[i]
        aff = stage_affine(model, cluster, job, par, C, ENGINE)
        m = par.num_microbatches(job.global_batch_size)
        diffs, mems = [], []
        for sp in compositions(model.layers, par.pp, par.vpp):
            e = estimate(model, cluster, job, dataclasses.replace(par, layers_per_stage=sp), ENGINE)
            diffs.append(e.step_time_s - split_objective(aff, sp, m, par.vpp, par.schedule, C))
            mems.append((e.fits, split_fits(aff, sp, e.memory_usable_bytes)))
        assert max(diffs) - min(diffs) <= 1e-9 * max(abs(d) for d in diffs) + 1e-12, (par, min(diffs), max(diffs))
        assert all(a == b for a, b in mems), par


# --- feasible plans the search once missed (regressions) ----------------------------------------
# The memory bound once assumed the first stage holds ceil(L/pp) layers plus the embedding, and
# the split program was once skipped when the even split needed over 1.5x the capacity.

def test_states_bound_does_not_prune_a_fitting_uneven_split():
    model = ModelSpec(name="wide-vocab", layers=8, hidden=7168, heads=56, kv_heads=56, ffn_hidden=4 * 7168, vocab=174080)
    job = Job(seq_len=512, global_batch_size=4, precision="bf16")
    cluster = make_cluster(dataclasses.replace(load_gpu("h100-sxm5-80gb"), memory_bytes=43e9), 4)
    fixed = dict(tp=1, pp=4, dp=1, cp=1, micro_batch_size=1, recompute="full", zero=0, vpp=1)
    uneven = estimate(model, cluster, job, ParallelConfig(**fixed, layers_per_stage=(1, 3, 3, 1)))
    assert uneven.fits  # 40.3 GB peak on a 43 GB GPU
    result = plan(model, cluster, job, top_k=1, options=SearchOptions(fixed=fixed))
    assert result.plans[0].estimate.step_time_s <= uneven.step_time_s


def test_split_tried_when_even_split_is_far_over_capacity():
    model = ModelSpec(name="g", layers=16, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=1024)
    job = Job(seq_len=16384, global_batch_size=16, precision="bf16")
    fixed = dict(tp=1, pp=8, dp=1, cp=1, micro_batch_size=1, recompute="none", zero=0, vpp=1, sequence_parallel=False)
    gpu = load_gpu("h100-sxm5-80gb")
    even = estimate(model, make_cluster(gpu, 8), job, ParallelConfig(**fixed))
    cap = 0.6 * even.memory_peak_bytes  # usable memory: 60% of what the even split needs
    cluster = make_cluster(dataclasses.replace(gpu, memory_bytes=cap / (1 - C.MEMORY_MARGIN_FRACTION)), 8)
    par = estimate(model, cluster, job, ParallelConfig(**fixed)).parallel
    split = optimal_split(model, cluster, job, par, cap, C, ENGINE)
    assert split is not None
    assert estimate(model, cluster, job, ParallelConfig(**fixed, layers_per_stage=split)).fits
    best = plan(model, cluster, job, top_k=1, options=SearchOptions(fixed=fixed)).plans[0]
    assert best.estimate.fits and best.estimate.layers_per_stage != even.layers_per_stage
