"""The search's group prune (planner.search.plan.GROUP_PRUNE): candidates that differ only in
micro-batch and recompute form a group, and when the group's least-memory member cannot fit,
the members it dominates are skipped unpriced. That is sound only if the memory model's peak
grows with the micro-batch and with less recompute; these tests check that property on the
memory model, and that the prune changes no plan and no nearest miss."""

from __future__ import annotations

import itertools

import pytest

import planner.search.plan as plan_mod
from planner import Job, ParallelConfig, estimate, load_model, make_cluster, plan
from planner.errors import InputError, NoFeasiblePlan
from planner.search.space import SearchOptions

REC = ("full", "selective", "none")  # least memory first


def _peaks(model, cluster, job, engine, base: dict) -> dict:
    out = {}
    for mb, rec in itertools.product((1, 2, 4), REC):
        try:
            e = estimate(model, cluster, job, ParallelConfig(micro_batch_size=mb, recompute=rec, **base), engine=engine)
        except InputError:
            continue
        out[(mb, rec)] = e.memory_peak_bytes
    return out


CASES = [  # (model, gpus, engine, seq, batch, fixed degrees)
    ("llama3.1-8b", 8, "megatron-core", 8192, 64, dict(tp=2, pp=1, zero=1)),
    ("llama3.1-8b", 8, "megatron-core", 8192, 64, dict(tp=1, pp=4, zero=1, vpp=2)),
    ("llama3.1-70b", 64, "megatron-core", 4096, 256, dict(tp=8, pp=4, zero=1)),
    ("llama3.1-70b", 64, "torchtitan", 8192, 128, dict(tp=8, pp=1, zero=3)),
    ("llama3.1-8b", 16, "torchtitan", 8192, 64, dict(tp=2, pp=2, zero=2, schedule="interleaved", vpp=2)),
    ("gpt3-13b", 16, "megatron-deepspeed", 2048, 128, dict(tp=2, pp=4, zero=1)),
    ("gpt3-2.7b", 8, "deepspeed", 2048, 64, dict(zero=2)),
    ("mixtral-8x7b", 32, "megatron-core", 4096, 256, dict(tp=2, pp=2, ep=8, zero=1)),
    ("qwen3-30b-a3b", 16, "megatron-core", 4096, 512, dict(pp=2, ep=8, zero=1, vpp=2)),
]


@pytest.mark.parametrize("name,gpus,engine,seq,batch,base", CASES)
def test_peak_memory_grows_with_micro_batch_and_less_recompute(name, gpus, engine, seq, batch, base):
    model, cluster, job = load_model(name), make_cluster("h100-sxm5-80gb", gpus), Job(seq, batch)
    peaks = _peaks(model, cluster, job, engine, base)
    assert len(peaks) >= 4, "too few valid configurations to test"
    for (mb, rec), m in peaks.items():
        for (mb2, rec2), m2 in peaks.items():
            if mb2 >= mb and REC.index(rec2) >= REC.index(rec):  # (mb2, rec2) holds at least as much
                assert m2 >= m * (1 - 1e-9), f"{(mb2, rec2)} {m2 / 2**30:.2f} GiB < {(mb, rec)} {m / 2**30:.2f} GiB"


def _outcome(model, cluster, job, **kw):
    try:
        r = plan(model, cluster, job, **kw)
        return [(p.parallel, p.estimate.step_time_s, p.estimate.memory_peak_bytes) for p in r.plans], r.evaluated
    except NoFeasiblePlan as exc:
        return str(exc), 0


@pytest.mark.parametrize("name,gpus,gpu,seq,batch,engine", [
    ("llama3.1-70b", 32, "h100-sxm5-80gb", 8192, 128, "megatron-core"),
    ("llama3.1-8b", 8, "a100-sxm4-40gb", 8192, 64, "torchtitan"),
    ("mixtral-8x7b", 16, "h100-sxm5-80gb", 4096, 256, "megatron-core"),
    ("llama3.1-405b", 16, "h100-sxm5-80gb", 8192, 64, "megatron-core"),  # fits nowhere: the nearest miss
])
def test_group_prune_changes_no_plan(monkeypatch, name, gpus, gpu, seq, batch, engine):
    model, cluster, job = load_model(name), make_cluster(gpu, gpus), Job(seq, batch)
    kw = dict(top_k=5, options=SearchOptions(engine=engine), time_limit_s=120)
    with_prune, n_with = _outcome(model, cluster, job, **kw)
    monkeypatch.setattr(plan_mod, "GROUP_PRUNE", False)
    without, n_without = _outcome(model, cluster, job, **kw)
    assert with_prune == without
    assert n_with <= n_without
    if name == "mixtral-8x7b":  # memory binds on many of its candidates: the prune skips some
        assert n_with < n_without
