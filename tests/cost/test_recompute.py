"""torchtitan's per-op selective checkpointing re-runs every second mm of a block, its
elementwise kernels and the sequence-parallel all-gathers (planner.cost.recompute), not the
attention core that Megatron's selective recompute re-runs."""

from __future__ import annotations

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.recompute import op_sac_recomputed_gemm_share
from planner.cost.stages import layer_costs
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig

LLAMA = load_model("llama3.1-8b")


def test_recomputed_share_is_wk_wo_and_w3_of_a_llama_block():
    h, f, kv = 4096, 14336, 1024  # Llama 3.1 8B: 8 KV heads of 128
    every = h * h + 2 * kv * h + h * h + 3 * h * f
    assert op_sac_recomputed_gemm_share(LLAMA, False, 1, C) == pytest.approx((kv * h + h * h + h * f) / every)


def test_routed_experts_are_recomputed_whole():
    moe = load_model("mixtral-8x7b")
    share = op_sac_recomputed_gemm_share(moe, True, 8, C)
    assert share > op_sac_recomputed_gemm_share(moe, False, 8, C)  # the same block with a dense MLP: one matrix of three
    assert 0.75 < share < 1.0  # the experts dominate a Mixtral layer's GEMMs


def test_op_policy_prices_gemms_elementwise_and_the_gathers():
    cluster = make_cluster("h100-sxm5-80gb", 8)
    job = Job(8192, 8, "bf16")
    par = ParallelConfig(tp=8, dp=1, micro_batch_size=1, recompute="selective", sequence_parallel=True)
    meg = layer_costs(LLAMA, cluster, job, par, C)[0]
    op = layer_costs(LLAMA, cluster, job, par, C, sac="op")[0]
    assert op["compute"] == meg["compute"]
    assert op["tp_comm"] > meg["tp_comm"]  # the two forward all-gathers run again
    assert op["recompute"] != meg["recompute"]
    # without selective recompute the policy changes nothing
    none = par.replace(recompute="none")
    assert layer_costs(LLAMA, cluster, job, none, C, sac="op") == layer_costs(LLAMA, cluster, job, none, C)


def test_torchtitan_estimate_uses_the_op_policy():
    cluster = make_cluster("h100-sxm5-80gb", 64)
    job = Job(8192, 64, "bf16")
    par = ParallelConfig(tp=8, dp=8, micro_batch_size=1, recompute="selective", zero=3)
    tt = estimate(LLAMA, cluster, job, par, "torchtitan")
    costs = layer_costs(LLAMA, cluster, job, tt.parallel, C, sac="op")[0]
    per_layer = tt.time_breakdown_s["recompute_s"] / LLAMA.layers / tt.num_microbatches
    assert per_layer == pytest.approx(costs["recompute"], rel=1e-6)


def test_op_recompute_is_the_share_of_gemms_every_cast_and_the_elementwise_kernels():
    from planner.cost.compute import layer_times

    cluster = make_cluster("h100-sxm5-80gb", 8)
    job = Job(8192, 8, "fp8")
    par = ParallelConfig(tp=8, dp=1, micro_batch_size=1, recompute="selective", sequence_parallel=True)
    lt = layer_times(LLAMA, cluster.gpu, "fp8", 1, 8192, 8, 1, True, True, False, 1, C=C)
    op = layer_costs(LLAMA, cluster, job, par, C, sac="op")[0]
    share = op_sac_recomputed_gemm_share(LLAMA, False, 1, C)
    assert lt.fwd_quant_s > 0
    assert op["recompute"] == pytest.approx(share * lt.fwd_gemm_s + lt.fwd_quant_s + lt.fwd_elementwise_s)


def test_the_search_bound_takes_the_policy():
    """At 32K tokens Megatron's selective recompute (the attention core) costs more than the
    per-op policy, so a bound priced with the wrong policy would exceed the exact time."""
    from planner.search.bounds import per_layer_time

    cluster = make_cluster("h100-sxm5-80gb", 8)
    job = Job(32768, 8, "bf16")
    lk = (1, 1, 1, 1, "selective", False, False, False, "flash", 1, False, "alltoall", "none")
    op = per_layer_time(LLAMA, cluster, job, lk, C, sac="op")[0]
    assert per_layer_time(LLAMA, cluster, job, lk, C)[0] > op
    est = estimate(LLAMA, cluster, job, ParallelConfig(tp=1, dp=8, micro_batch_size=1, recompute="selective", zero=3), "torchtitan")
    assert op * LLAMA.layers * est.num_microbatches <= est.step_time_s
