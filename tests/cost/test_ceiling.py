"""An upper bound a reader can check: no prediction runs the model's FLOPs faster than the GPU's
measured achievable matmul allows (planner.report.explain.mfu_ceiling). With attention counted
as executed (causal), MFU stays at or below the ceiling on random configurations of every GPU
and precision, including the small-GEMM regime where shapes cost efficiency."""

from __future__ import annotations

import random

import pytest

import planner
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.flops import step_model_flops
from planner.report.explain import mfu_ceiling
from planner.search.space import SearchOptions, candidates

GPUS = ["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200"]


@pytest.mark.parametrize("seed", range(6))
def test_causal_mfu_never_exceeds_the_matmul_ceiling(seed):
    rng = random.Random(300 + seed)
    model = planner.load_model(rng.choice(["llama3.1-8b", "llama3.1-70b", "gpt3-1.3b", "mixtral-8x7b", "qwen3-30b-a3b"]))
    gpu = rng.choice(GPUS)
    prec = rng.choice(["bf16", "fp8"] if not gpu.startswith("a100") else ["bf16", "fp16"])
    cluster = planner.make_cluster(gpu, rng.choice([8, 16, 64]))
    job = planner.Job(seq_len=rng.choice([1024, 4096, 8192]), global_batch_size=rng.choice([64, 128]), precision=prec)
    pars = list(candidates(model, cluster, job, SearchOptions(max_micro_batch=4, max_cp=2, max_vpp=2)))
    assert pars
    ceiling = mfu_ceiling(cluster.gpu, prec, C)
    for par in rng.sample(pars, min(15, len(pars))):
        e = planner.estimate(model, cluster, job, par)
        causal = step_model_flops(model, job.global_batch_size, job.seq_len, causal=True)
        mfu = causal / (e.step_time_s * cluster.num_gpus * cluster.gpu.peak("bf16"))
        assert mfu <= ceiling * (1 + 1e-9), (par.short(), mfu, ceiling)
