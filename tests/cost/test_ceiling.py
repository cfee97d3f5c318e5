"""An upper bound a reader can check: no prediction runs the model's FLOPs faster than the GPU's
measured achievable matmul allows (planner.report.explain.mfu_ceiling). With attention counted
as executed (the causal half under flash attention, the full square unfused: explain's
mfu_executed), MFU stays at or below the ceiling on random configurations of every GPU and
precision, including the small-GEMM regime where shapes cost efficiency and long sequences where
the full-square MFU does not."""

from __future__ import annotations

import random

import pytest

import planner
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.flops import step_model_flops
from planner.report.explain import mfu_ceiling, mfu_executed
from planner.search.space import SearchOptions, candidates

GPUS = ["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200"]


@pytest.mark.parametrize("seed", range(6))
def test_causal_mfu_never_exceeds_the_matmul_ceiling(seed):
    rng = random.Random(300 + seed)
    model = planner.load_model(rng.choice(["llama3.1-8b", "llama3.1-70b", "gpt3-1.3b", "mixtral-8x7b", "qwen3-30b-a3b"]))
    gpu = rng.choice(GPUS)
    prec = rng.choice(["bf16", "fp8"] if not gpu.startswith("a100") else ["bf16", "fp16"])
    cluster = planner.make_cluster(gpu, rng.choice([8, 16, 64]))
    job = planner.Job(seq_len=rng.choice([1024, 4096, 8192, 32768]), global_batch_size=rng.choice([64, 128]), precision=prec)
    pars = list(candidates(model, cluster, job, SearchOptions(max_micro_batch=4, max_cp=2, max_vpp=2)))
    assert pars
    ceiling = mfu_ceiling(cluster.gpu, prec, C)
    for par in rng.sample(pars, min(15, len(pars))):
        e = planner.estimate(model, cluster, job, par)
        mfu = mfu_executed(model, cluster, job, e)
        assert mfu <= ceiling * (1 + 1e-9), (par.short(), mfu, ceiling)
        causal = step_model_flops(model, job.global_batch_size, job.seq_len, causal=True)
        assert mfu >= causal / (e.step_time_s * cluster.num_gpus * cluster.gpu.peak("bf16")) * (1 - 1e-9)


def test_unfused_attention_executes_the_full_square():
    """Without a flash kernel the whole s x s square runs: the executed MFU is the headline one
    (and still under the ceiling)."""
    model, cluster = planner.load_model("gpt3-1.3b"), planner.make_cluster("a100-sxm4-80gb", 8)
    job = planner.Job(seq_len=2048, global_batch_size=64)
    e = planner.estimate(model, cluster, job, planner.ParallelConfig(attention="unfused", micro_batch_size=4))
    assert e.parallel.attention == "unfused"
    assert mfu_executed(model, cluster, job, e) == e.mfu <= mfu_ceiling(cluster.gpu, "bf16", C)
    f = planner.estimate(model, cluster, job, planner.ParallelConfig(micro_batch_size=4))
    assert f.parallel.attention == "flash" and mfu_executed(model, cluster, job, f) < f.mfu


def test_explain_shows_the_executed_mfu_where_the_full_square_one_passes_the_ceiling():
    """At 128K the full-square MFU (72.7%) is above the ceiling; explain prints the executed
    (causal) MFU beside it and that one is below."""
    from planner.report.explain import explain  # noqa: PLC0415

    model, cluster = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 64)
    job = planner.Job(seq_len=131072, global_batch_size=64)
    par = planner.plan(model, cluster, job, top_k=1).plans[0].parallel
    x = explain(model, cluster, job, par)
    assert x.estimate.mfu > x.mfu_ceiling > x.mfu_executed
    assert x.as_dict()["mfu_executed"] == x.mfu_executed
