"""The search's bounds are bounds: on random small models (dense and MoE with dense first
layers), for random candidates and every (or a sample of) layer split, the step-time lower
bound of the branch and bound never exceeds the cost model's step time; and the split
program's HiGHS array form handles memory rows that bound, do not bound, or rule out a stage."""

from __future__ import annotations

import dataclasses
import random

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.engines import a2a_overlap_why, default_etp, engine_flags, get_engine
from planner.io.loaders import make_cluster
from planner.search.bounds import p2p_per_stage, per_layer_time, step_lower_bound
from planner.search.milp import INF, Program, highs_available
from planner.cost.step import pipeline_form
from planner.search.space import SearchOptions, candidate_tuples, to_parallel
from planner.search.split import StageAffine, chunk_bounds, split_unit
from planner.specs import Job, ModelSpec, MoESpec, is_flash

from split_enumeration import unit_splits  # noqa: E402


def _splits(layers: int, pp: int, v: int, unit: int):
    """Splits of at least v layers a stage, in units of ``unit`` layers."""
    return (parts for parts in unit_splits(layers, pp, unit) if min(parts) >= v)


def _model(rng: random.Random) -> ModelSpec:
    layers, hidden = rng.randint(4, 12), rng.choice([512, 1024])
    moe = None
    if rng.random() < 0.5:
        moe = MoESpec(experts=rng.choice([4, 8]), top_k=rng.choice([1, 2]), expert_ffn_hidden=rng.choice([256, 2048]),
                      dense_layers=rng.choice([0, 1, 2]), shared_experts=rng.choice([0, 1]))
    return ModelSpec(name="m", layers=layers, hidden=hidden, heads=8, kv_heads=8, ffn_hidden=4 * hidden,
                     vocab=rng.choice([1024, 32000]), moe=moe)


@pytest.mark.parametrize("engine", [None, "megatron-zb", "torchtitan"])
@pytest.mark.parametrize("seed", range(6))
def test_step_lower_bound_never_exceeds_the_estimate(seed, engine):
    """For every schedule the engine runs (zero-bubble ones and DualPipeV included), and with
    each CUDA-graph capture on Megatron-core (the host term the bound counts)."""
    rng = random.Random(1000 + seed)
    model = _model(rng)
    cluster = make_cluster(rng.choice(["a100-sxm4-80gb", "h100-sxm5-80gb"]), rng.choice([8, 16]))
    eng = get_engine(engine)
    job = Job(seq_len=rng.choice([512, 2048]), global_batch_size=rng.choice([16, 32]),
              precision=rng.choice([p for p in ("bf16", "fp16") if p in eng.precisions]))  # torchtitan: no fp16
    tuples = list(candidate_tuples(model, cluster, job, SearchOptions(max_micro_batch=2, max_cp=2, max_vpp=16, engine=engine)))
    rng.shuffle(tuples)
    checked = 0
    for t in tuples[:25]:
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        graph = ("none", "layer", "full_iteration")[seed % 3] if engine is None else "none"
        par = to_parallel(t, {"cuda_graph": graph})
        f = engine_flags(eng, cluster.gpu, tp, z, None, pp, cluster.nvlink_domain)
        p2p = p2p_per_stage(model, cluster, job, (tp, cp, dp, pp, mb, v), C, eng.overlap_p2p_comm) if pp > 1 else 0.0
        lk = (tp, cp, ep, mb, rec, f["sequence_parallel"], f["tp_comm_overlap"], f["async_tp_allreduce"], f["attention"],
              default_etp(tp, dp, cp, ep), a2a_overlap_why(eng, model, ep, rec, pp, v, sched) is None, "alltoall", graph)
        per_layer = per_layer_time(model, cluster, job, lk, C, sac=eng.memory.selective)
        m = par.num_microbatches(job.global_batch_size)
        lb = step_lower_bound(model.layers, pp, v, m, per_layer, p2p, C.STEP_OVERHEAD_S, split_unit(v, eng), pipeline_form(sched, m, v, pp))
        splits = [None] if pp == 1 else list(_splits(model.layers, pp, v, split_unit(v, eng)))
        for s in rng.sample(splits, min(len(splits), 20)):
            p2 = par if s is None else dataclasses.replace(par, layers_per_stage=s)
            step = estimate(model, cluster, job, p2, eng, validate=False).step_time_s
            assert lb <= step * (1 + 1e-12), (model, par, s, lb, step)
            checked += 1
    assert checked >= 20


def _aff(mem: list[tuple[float, float]]) -> StageAffine:
    pp = len(mem)
    return StageAffine(time=((1e-3, 0.0),) * pp, sync=(((0.0, 0.0, 0.0, 0.0),),) * pp, opt=((0.0, 0.0),) * pp, mem=tuple(mem))


@pytest.mark.parametrize("backend", ["highs", "pulp"])
def test_memory_rows_become_bounds(backend):
    if backend == "highs" and not highs_available():
        pytest.skip("highspy not installed")
    # capacity 10: a stage of slope 2 per layer (v = 1) holds at most 5 layers; slope 0 with an
    # intercept under the capacity holds any number; a negative slope needs at least 2 layers.
    k = chunk_bounds(_aff([(2.0, 0.0), (0.0, 3.0), (-1.0, 12.0)]), 1, 8, 10.0)
    assert k == [(1, 5), (1, 8), (2, 8)]
    assert chunk_bounds(_aff([(0.0, 11.0), (1.0, 0.0)]), 1, 8, 10.0) is None  # a stage over capacity at any size
    assert chunk_bounds(_aff([(20.0, 0.0), (1.0, 0.0)]), 1, 8, 10.0) is None  # not even one layer fits
    # A program under those bounds: 10 layers over 3 stages with equal times, minimising the
    # slowest stage: the first capped at 5, the last at least 2, the best spread 4/3/3 or 3/3/4.
    prog = Program()
    xs = [prog.var(lo, hi, integer=True) for lo, hi in k]
    T = prog.var(cost=1.0)
    prog.row(10, 10, [(x, 1.0) for x in xs])
    for x in xs:
        prog.row(0.0, INF, [(T, 1.0), (x, -1.0)])
    sol = prog.solve(backend=backend)
    ks = [round(sol.x[x]) for x in xs]
    assert sol.ok and sum(ks) == 10 and ks[0] <= 5 and ks[2] >= 2 and max(ks) == 4


@pytest.mark.parametrize("engine", [None, "megatron-zb", "torchtitan", "deepspeed"])
@pytest.mark.parametrize("seed", range(5))
def test_memory_bound_never_prunes_a_split_that_fits(seed, engine):
    """With the GPU memory set at the median peak of the sampled candidates (so memory binds for
    about half), a candidate the memory bound rules out has no layer split whose estimate fits;
    and the bound does rule some out (it is not vacuous)."""
    from planner.engines import least_layers
    from planner.search.bounds import memory_bound_fn

    rng = random.Random(2000 + seed)
    model = _model(rng)
    eng = get_engine(engine)
    n = rng.choice([8, 16])
    job = Job(seq_len=rng.choice([1024, 4096]), global_batch_size=rng.choice([16, 32]), precision=rng.choice(["bf16", "fp8"]))
    big = make_cluster("h100-sxm5-80gb", n)
    tuples = list(candidate_tuples(model, big, job, SearchOptions(max_micro_batch=4, max_cp=2, max_vpp=2, engine=engine)))
    rng.shuffle(tuples)
    tuples = tuples[:40]
    peaks = sorted(estimate(model, big, job, to_parallel(t), eng, validate=False).memory_peak_bytes for t in tuples)
    cap = peaks[len(peaks) // 2]
    gpu = dataclasses.replace(big.gpu, memory_bytes=cap / (1 - C.MEMORY_MARGIN_FRACTION))
    cluster = make_cluster(gpu, n)
    may_fit = memory_bound_fn(model, job, C, eng, cap)
    pruned = fitting = 0
    for t in tuples:
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        graph = ("none", "layer", "full_iteration")[seed % 3] if engine is None else "none"
        par = to_parallel(t, {"cuda_graph": graph})
        f = engine_flags(eng, cluster.gpu, tp, z, None, pp, cluster.nvlink_domain)
        ok = may_fit(tp, pp, dp, cp, ep, v, mb, rec, z, sched, f["sequence_parallel"], is_flash(f["attention"]), split_unit(v, eng),
                     default_etp(tp, dp, cp, ep))
        splits = [None] if pp == 1 else [s for s in _splits(model.layers, pp, 1, split_unit(v, eng))
                                         if all(n_ >= least_layers(i, pp, v, eng) for i, n_ in enumerate(s))]
        fits = False
        for s in splits:
            p2 = par if s is None else dataclasses.replace(par, layers_per_stage=s)
            if estimate(model, cluster, job, p2, eng, validate=False).memory_peak_bytes <= cap:
                fits = True
                break
        assert ok or not fits, (model, par, "pruned but a split fits")
        pruned += not ok
        fitting += fits
    assert fitting >= 1, (pruned, fitting)


@pytest.mark.parametrize("engine", [None, "torchtitan", "deepspeed"])
@pytest.mark.parametrize("seed", range(6))
def test_states_bound_is_below_every_split(seed, engine):
    """The whole-step model-state bound the search prunes with first (states_bound_fn, with the
    candidate's expert tensor degree and, for MoE models with dense first layers, what the layer
    counts force on the fullest stage) never exceeds the exact peak under any layer split."""
    from planner.engines import fp8_gathers, least_layers
    from planner.search.bounds import states_bound_fn

    rng = random.Random(3000 + seed)
    model = _model(rng)
    while model.moe is None:
        model = _model(rng)
    eng = get_engine(engine)
    n = rng.choice([8, 16])
    job = Job(seq_len=rng.choice([1024, 4096]), global_batch_size=rng.choice([16, 32]), precision=rng.choice(["bf16", "fp8"]))
    cluster = make_cluster("h100-sxm5-80gb", n)
    states_of = states_bound_fn(model, job.precision, C, grad_reduce=job.grad_reduce, engine=eng, fp8_params=fp8_gathers(eng, job, 1))
    tuples = list(candidate_tuples(model, cluster, job, SearchOptions(max_micro_batch=2, max_cp=2, max_vpp=2, engine=engine)))
    rng.shuffle(tuples)
    checked = 0
    for t in tuples[:30]:
        tp, pp, dp, cp, ep, v, mb, rec, z, sched = t
        etp = default_etp(tp, dp, cp, ep)
        bound = states_of(tp, pp, dp, cp, ep, z, etp)
        par = dataclasses.replace(to_parallel(t), etp=etp)
        splits = [None] if pp == 1 else [s for s in _splits(model.layers, pp, 1, split_unit(v, eng))
                                         if all(n_ >= least_layers(i, pp, v, eng) for i, n_ in enumerate(s))]
        for s in splits:
            p2 = par if s is None else dataclasses.replace(par, layers_per_stage=s)
            est = estimate(model, cluster, job, p2, eng, validate=False)
            assert bound <= est.memory_peak_bytes * (1 + 1e-9), (model, p2, bound / 2**30, est.memory_peak_bytes / 2**30)
            if engine is None:  # Megatron's states are all held all step: the bound is of them alone
                held = max(sum(v_ for k, v_ in st.parts if k in ("weights", "gradients", "optimizer")) for st in est.stages)
                assert bound <= held * (1 + 1e-9), (model, p2, bound / 2**30, held / 2**30)
                if pp == 1:  # one stage holds every layer: nothing is left to chance, the bound is tight
                    assert bound >= 0.98 * held, (model, p2, bound / 2**30, held / 2**30)
            checked += 1
    assert checked >= 10


def test_memory_bound_prunes_on_the_default_job():
    """The bound is not vacuous: on the default job (Llama 3.1 70B, 64 H100, 8K x 256) it rules
    out more candidates than the search prices."""
    import planner

    r = planner.plan(planner.load_model("llama3.1-70b"), make_cluster("h100-sxm5-80gb", 64), Job(8192, 256), top_k=3)
    assert r.stats.memory_pruned > r.evaluated


@pytest.mark.parametrize("engine", [None, "torchtitan", "deepspeed"])
@pytest.mark.parametrize("seed", range(4))
def test_every_stage_over_capacity_means_no_split_fits(seed, engine):
    """split_may_help skips the split program when every stage is over the capacity under the
    candidate's split: no other split fits (checked by trying them all), and the rule fires."""
    from planner.engines import least_layers  # noqa: PLC0415
    from planner.search.bounds import split_may_help  # noqa: PLC0415

    rng = random.Random(3000 + seed)
    model = _model(rng)
    eng = get_engine(engine)
    n = rng.choice([8, 16])
    job = Job(seq_len=rng.choice([1024, 4096]), global_batch_size=rng.choice([16, 32]), precision="bf16")
    big = make_cluster("h100-sxm5-80gb", n)
    tuples = [t for t in candidate_tuples(model, big, job, SearchOptions(max_micro_batch=4, max_cp=2, max_vpp=2, engine=engine)) if t[1] > 1]
    rng.shuffle(tuples)
    tuples = tuples[:30]
    ests = [estimate(model, big, job, to_parallel(t), eng, validate=False) for t in tuples]
    lows = sorted(min(s.total_bytes for s in e.stages) for e in ests)
    cap = lows[len(lows) // 2]  # about half the candidates have every stage over it
    fired = 0
    for t, e in zip(tuples, ests):
        e = dataclasses.replace(e, memory_capacity_bytes=cap / (1 - e.memory_margin))
        if split_may_help(e, e.parallel, job, cap, [], 10, split_unit(e.parallel.vpp, eng)):
            continue
        if e.fits:
            continue  # skipped for its gain, not its memory
        fired += 1
        par = e.parallel
        for s in _splits(model.layers, par.pp, 1, split_unit(par.vpp, eng)):
            if any(n_ < least_layers(i, par.pp, par.vpp, eng) for i, n_ in enumerate(s)):
                continue
            alt = estimate(model, big, job, dataclasses.replace(par, layers_per_stage=s), eng, validate=False)
            assert alt.memory_peak_bytes > cap, (par, s, "a split fits")
    assert fired >= 1
