"""The search's group prune (planner.search.plan.GROUP_PRUNE): candidates that differ only in
micro-batch and recompute form a group, and when the group's least-memory member cannot fit,
the members it dominates are skipped unpriced. That is sound only if the memory model's peak
grows with the micro-batch and with less recompute; these tests check that property on the
memory model where the search relies on it (bounds.peak_grows_with_micro_batch), and that the
prune changes no plan and no nearest miss."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

import planner.search.plan as plan_mod
from planner import Job, ParallelConfig, estimate, load_model, make_cluster, plan
from planner.cost.estimate import estimate as exact_estimate
from planner.engines import get_engine
from planner.errors import InputError, NoFeasiblePlan
from planner.search.bounds import peak_grows_with_micro_batch
from planner.search.space import SearchOptions, candidate_tuples, to_parallel

RANK = {"full": 0, "selective": 1, "none": 2}  # more recompute holds less


@pytest.mark.parametrize("name,gpus,seq,batch", [
    ("gpt3-2.7b", 32, 2048, 16), ("llama3.1-8b", 16, 8192, 32), ("mixtral-8x7b", 32, 4096, 64), ("qwen3-30b-a3b", 16, 4096, 64),
])
@pytest.mark.parametrize("engine", ["megatron-core", "torchtitan", "deepspeed", "megatron-deepspeed", "megatron-zb"])
def test_peak_memory_grows_with_micro_batch_and_less_recompute(name, gpus, seq, batch, engine):
    """Within a group (every degree, ZeRO stage and schedule fixed) the default split's peak grows
    with the micro-batch and with less recompute wherever peak_grows_with_micro_batch says so: a
    sample of the search's own candidate groups on each engine (on an A100 40GB, pipelined and not)."""
    model, cluster, job, eng = load_model(name), make_cluster("a100-sxm4-40gb", gpus), Job(seq, batch), get_engine(engine)
    try:
        tuples = list(candidate_tuples(model, cluster, job, SearchOptions(max_micro_batch=8, max_cp=2, max_vpp=2, engine=engine)))
    except InputError:
        pytest.skip(f"{engine} does not run {name}")
    groups = defaultdict(list)
    for t in tuples:
        groups[(*t[:6], t[8], t[9])].append(t)
    keys = sorted(groups)
    random.Random(7).shuffle(keys)
    checked = 0
    for g in keys[:12]:
        if not peak_grows_with_micro_batch(eng, g[6]):
            continue
        peaks = {}
        for t in groups[g]:
            try:
                peaks[(t[6], RANK[t[7]])] = exact_estimate(model, cluster, job, to_parallel(t), eng, validate=False).memory_peak_bytes
            except InputError:
                continue
        for (mb, r), m in peaks.items():
            for (mb2, r2), m2 in peaks.items():
                if mb2 >= mb and r2 >= r:  # (mb2, r2) holds at least as much
                    assert m2 >= m * (1 - 1e-9), (g, (mb2, r2), m2 / 2**30, (mb, r), m / 2**30)
        checked += len(peaks) > 1
    if engine == "torchtitan":
        assert not peak_grows_with_micro_batch(eng, 2) and not peak_grows_with_micro_batch(eng, 3)
    assert checked or all(not peak_grows_with_micro_batch(eng, g[6]) for g in keys[:12])


def test_fsdp2_pipelines_are_left_out_of_the_prune():
    """Why torchtitan's FSDP (ZeRO >= 2) is left out: under pipelining its peak falls as the
    micro-batch grows (fewer micro-batches, less unsharded gradient held)."""
    model, cluster, job = load_model("gpt3-2.7b"), make_cluster("a100-sxm4-40gb", 32), Job(2048, 16)
    peak = {mb: estimate(model, cluster, job, ParallelConfig(tp=2, pp=2, zero=2, micro_batch_size=mb, recompute="full"),
                         engine="torchtitan").memory_peak_bytes for mb in (1, 2)}
    assert peak[2] < peak[1]


def _outcome(model, cluster, job, **kw):
    try:
        r = plan(model, cluster, job, **kw)
        return [(p.parallel, p.estimate.step_time_s, p.estimate.memory_peak_bytes) for p in r.plans], r.evaluated
    except NoFeasiblePlan as exc:
        return str(exc), 0


@pytest.mark.parametrize("name,gpus,gpu,seq,batch,engine,extra", [
    ("llama3.1-70b", 32, "h100-sxm5-80gb", 8192, 128, "megatron-core", {}),
    ("llama3.1-8b", 8, "a100-sxm4-40gb", 8192, 64, "torchtitan", {}),
    ("mixtral-8x7b", 16, "h100-sxm5-80gb", 4096, 256, "megatron-core", {}),
    ("llama3.1-405b", 16, "h100-sxm5-80gb", 8192, 64, "megatron-core", {}),  # fits nowhere: the nearest miss
    # a review's counter-examples: torchtitan's FSDP peaks lower at a larger micro-batch under
    # pipelining (the best plan was lost with the splits off), and a nearest miss that ties
    ("gpt3-2.7b", 32, "a100-sxm4-40gb", 2048, 16, "torchtitan",
     dict(fixed={"tp": 2, "pp": 2, "zero": 2}, memory_margin=0.76, uneven_split=False)),
    ("mixtral-8x7b", 32, "a100-sxm4-40gb", 4096, 32, "torchtitan", dict(fixed={"pp": 4, "zero": 2})),
    ("gpt3-13b", 16, "a100-sxm4-40gb", 2048, 64, "megatron-core", dict(uneven_split=False, memory_margin=0.5)),
])
def test_group_prune_changes_no_plan(monkeypatch, name, gpus, gpu, seq, batch, engine, extra):
    model, cluster, job = load_model(name), make_cluster(gpu, gpus), Job(seq, batch)
    kw = dict(top_k=5, options=SearchOptions(engine=engine, **extra), time_limit_s=120)
    with_prune, n_with = _outcome(model, cluster, job, **kw)
    monkeypatch.setattr(plan_mod, "GROUP_PRUNE", False)
    without, n_without = _outcome(model, cluster, job, **kw)
    assert with_prune == without
    assert n_with <= n_without
    if (name, engine) == ("mixtral-8x7b", "megatron-core"):  # memory binds on many of its candidates: the prune skips some
        assert n_with < n_without
