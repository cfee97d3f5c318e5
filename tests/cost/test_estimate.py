"""The assembled estimate: communication terms against hand-computed alpha-beta values, the
pipeline bubble, the seed chapter's GPipe example, and the utilisation definitions.

Alpha-beta costs (Hockney; Thakur, Rabenseifner & Gropp 2005 Table 1), f = (p - 1)/p:
ring allreduce 2(p-1) a + 2 f n/B, double tree 2 log2(p) a + 2 n/B; send/recv a + n/B; every
call also pays the cluster's fixed collective latency c (NCCL's launch and set-up,
ClusterSpec.collective_latency_s). Megatron's tensor parallelism all-reduces the
b s h activation twice forward and twice backward per layer (Narayanan 2021 sec. 3.2), the
backward pair half hidden behind the weight-gradient GEMM (constants.TP_BWD_OVERLAP_FRACTION).
"""

from __future__ import annotations

import math

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost import memory as M
from planner.cost.estimate import estimate
from planner.cost.flops import step_model_flops
from planner.io.loaders import make_cluster
from planner.report.schedule import makespan_and_bubble, simulate_schedule
from planner.specs import Job, ModelSpec, ParallelConfig


def gpt(layers=16, hidden=2048, heads=16, vocab=51200):
    return ModelSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, mlp="gelu", tied_embeddings=True, bias=True, norm="layernorm")


def intra(cluster):
    return cluster.intra.latency_s, cluster.intra.bandwidth_bytes_per_s * cluster.intra.efficiency


def call(cluster):
    return cluster.collective_latency_s


def _tp_comm_of(est):
    return next(c for c in est.comm if c["kind"] == "tp")


# --- tensor parallelism -----------------------------------------------------------------------

@pytest.mark.parametrize("sp", [False, True])
def test_tp2_allreduce_by_hand(sp):
    model = gpt(16, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 8)
    job = Job(seq_len=2048, global_batch_size=32, precision="bf16")
    par = ParallelConfig(tp=2, pp=1, dp=4, micro_batch_size=2, sequence_parallel=sp, tp_comm_overlap=False)
    est = estimate(model, cluster, job, par)
    a, B = intra(cluster)
    assert (a, B) == (pytest.approx(2.5e-6), 300e9 * 0.77)
    n = 2 * 2048 * 2048 * 2  # b s h in 16-bit
    # p = 2: ring 2a + n/B < tree 2a + 2n/B. With SP: reduce-scatter + all-gather, each
    # a + n/(2B): the same total, but two calls.
    t = 2 * a + n / B + (2 if sp else 1) * call(cluster)
    m = est.num_microbatches
    assert m == 32 // (2 * 4)
    per_layer_exposed = 2 * t + 2 * t * (1 - C.TP_BWD_OVERLAP_FRACTION)
    # The output layer: with SP its input all-gather (a + n/2B) and, half overlapped, the
    # gradient's reduce-scatter; without SP the backward all-reduce, half overlapped.
    half = a + n / (2 * B) + call(cluster)
    head = half + half * (1 - C.TP_BWD_OVERLAP_FRACTION) if sp else t * (1 - C.TP_BWD_OVERLAP_FRACTION)
    emb = t  # the input embedding: all-reduce, or with SP reduce-scatter forward and all-gather backward
    assert est.time_breakdown_s["tp_comm_exposed_s"] == pytest.approx(m * (16 * per_layer_exposed + head + emb), rel=1e-12)
    tp = _tp_comm_of(est)
    assert tp["link"] == "nvswitch"
    assert tp["time_s"] == pytest.approx(m * (16 * 4 + 2) * t, rel=1e-12)
    assert tp["exposed_s"] == est.time_breakdown_s["tp_comm_exposed_s"]


def test_tp_full_recompute_adds_forward_allreduces():
    model = gpt(16, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 8)
    job = Job(seq_len=2048, global_batch_size=32, precision="bf16")
    base = estimate(model, cluster, job, ParallelConfig(tp=4, dp=2, micro_batch_size=1, sequence_parallel=False))
    full = estimate(model, cluster, job, ParallelConfig(tp=4, dp=2, micro_batch_size=1, recompute="full", sequence_parallel=False))
    a, B = intra(cluster)
    n = 1 * 2048 * 2048 * 2
    # p = 4: ring 6a + 1.5 n/B beats the tree 4a + 2 n/B at 8 MiB (NCCL has no halving-doubling).
    t = 6 * a + 1.5 * n / B + call(cluster)
    m = base.num_microbatches
    head = t * (1 - C.TP_BWD_OVERLAP_FRACTION) + t  # the output layer's backward all-reduce (half overlapped), the embedding's
    assert base.time_breakdown_s["tp_comm_exposed_s"] == pytest.approx(m * (16 * 3 * t + head), rel=1e-12)
    assert full.time_breakdown_s["tp_comm_exposed_s"] == pytest.approx(m * (16 * 5 * t + head), rel=1e-12)
    assert _tp_comm_of(full)["time_s"] == pytest.approx(m * (16 * 6 + 2) * t, rel=1e-12)


# --- pipeline send/recv, data parallelism -----------------------------------------------------

def test_pp_p2p_and_dp_allreduce_by_hand():
    model = gpt(16, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 8)
    job = Job(seq_len=2048, global_batch_size=32, precision="fp16")
    par = ParallelConfig(tp=2, pp=2, dp=2, micro_batch_size=1, overlap_grad_reduce=False, zero=0)
    est = estimate(model, cluster, job, par)
    a, B = intra(cluster)
    m = est.num_microbatches
    # pp group {r, r+4} inside one 8-GPU node: one send per direction per micro-batch of b s h / t.
    t_p2p = a + (1 * 2048 * 2048 * 2 / 2) / B + call(cluster)
    assert est.time_breakdown_s["pp_comm_exposed_s"] == pytest.approx(m * 2 * t_p2p, rel=1e-12)
    # dp group of 2 (stride tp = 2): ring allreduce 2a + n/B of each stage's fp16 gradients;
    # the larger stage (the last: same layers + the tied output copy) sets the time.
    params = [M.stage_params(model, 8, i, 2, 2, 1, n_dense=8) for i in range(2)]
    grad = max(p["layers"] + p["embedding"] + p["output"] for p in params) * 2
    t_dp = 2 * a + grad / B + call(cluster)
    dp = next(c for c in est.comm if c["kind"] == "dp")
    assert dp["time_s"] == pytest.approx(t_dp, rel=1e-12)
    assert est.time_breakdown_s["dp_comm_exposed_s"] == pytest.approx(t_dp, rel=1e-12)  # no overlap asked


def test_dp_across_nodes_by_hand():
    # 16 A100s, tp = 8 per node, dp = 2 across nodes: one rank per node in the dp group, so a
    # flat two-rank allreduce over the network at that rank's NIC share: 2 a_net + n / B_net.
    model = gpt(16, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 16)  # 8 x 200 Gb/s HDR InfiniBand per node (DGX A100, the preset's scale_out)
    job = Job(seq_len=2048, global_batch_size=32, precision="bf16")
    par = ParallelConfig(tp=8, pp=1, dp=2, micro_batch_size=1, overlap_grad_reduce=False, zero=0)
    est = estimate(model, cluster, job, par)
    a_net = cluster.inter.latency_s
    b_net = 200e9 / 8 * 8 * cluster.inter.efficiency / 8  # per GPU
    p = M.stage_params(model, 16, 0, 1, 8, 1, n_dense=16)
    grad = (p["layers"] + p["embedding"] + p["output"]) * 4  # fp32 main gradients (bf16)
    dp = next(c for c in est.comm if c["kind"] == "dp")
    assert dp["link"] == "infiniband"
    assert dp["time_s"] == pytest.approx(2 * a_net + grad / b_net + call(cluster), rel=1e-12)


# --- pipeline bubble -----------------------------------------------------------------------------

@pytest.mark.parametrize("pp,vpp,gbs", [(2, 1, 32), (4, 1, 32), (4, 2, 32), (8, 2, 64), (4, 4, 16)])
def test_bubble_is_sum_minus_max_over_v_and_breakdown_sums_to_step(pp, vpp, gbs):
    model = gpt(32, 1024, 16, vocab=64)  # tiny vocab: the last stage's extra work is negligible
    cluster = make_cluster("a100-sxm4-80gb", 8 * (pp // 4 if pp >= 4 else 1))
    dp = cluster.num_gpus // pp
    job = Job(seq_len=1024, global_batch_size=gbs, precision="bf16")
    est = estimate(model, cluster, job, ParallelConfig(pp=pp, dp=dp, vpp=vpp, micro_batch_size=1))
    t = est.stage_times_s
    m = est.num_microbatches
    assert len(t) == pp
    # Stages with the same layers (all but the last, which adds the output layer and the loss,
    # with their host-side launch floor, Constants.HOST_LOGITS_KERNELS) take equal time.
    assert all(x == t[0] for x in t[:-1])
    bd = est.time_breakdown_s
    assert bd["bubble_s"] == pytest.approx((sum(t) - max(t)) / vpp, rel=1e-12)
    assert sum(bd.values()) == pytest.approx(est.step_time_s, rel=1e-12)
    t_pipe = est.step_time_s - bd["dp_comm_exposed_s"] - bd["optimizer_s"] - bd["embedding_sync_s"] - bd["overhead_s"]
    assert t_pipe == pytest.approx(m * max(t) + bd["bubble_s"], rel=1e-12)
    # The p - 1 equal stages make the bubble exactly (p - 1) t_stage / v (Narayanan 2021 sec. 2.2);
    # with the last stage's output layer a few % heavier, t_pipe is (m + (p - 1)/v) t_stage
    # within that difference.
    assert max(t) == t[-1]
    assert bd["bubble_s"] == pytest.approx((pp - 1) * t[0] / vpp, rel=1e-12)
    assert t_pipe == pytest.approx((m + (pp - 1) / vpp) * t[0], rel=(t[-1] - t[0]) / t[0] + 1e-12)
    assert bd["bubble_s"] / (m * t[0]) == pytest.approx((pp - 1) / (vpp * m), rel=1e-12)


def test_bubble_exact_for_equal_stages_with_schedule_simulation():
    # The estimate's pipeline time equals the simulated 1F1B / interleaved schedule when the
    # stage times are equal (f = t/3, b = 2t/3 per stage, p2p folded into the stage time).
    for p, v, m in [(4, 1, 8), (4, 2, 8), (8, 1, 3), (8, 4, 16)]:
        t = 0.3
        kind = "1f1b" if v == 1 else "interleaved"
        s = simulate_schedule(p, v, m, kind, t / 3, 2 * t / 3)
        assert s.makespan_s == pytest.approx((m + (p - 1) / v) * t, rel=1e-12)
        assert s.makespan_s == pytest.approx(m * t + (p * t - t) / v, rel=1e-12)


def test_seed_chapter_gpipe_4_stages_2_microbatches():
    # seed_chapter.md sec. 3 example 5: F = B = 1 slot, p = 4, m = 2.
    s = simulate_schedule(4, 1, 2, "gpipe", 1.0, 1.0)
    assert s.makespan_s == 10.0  # (m + p - 1)(t_F + t_B)
    for k, events in enumerate(s.stages):
        busy = sum(e.dur_s for e in events if e.kind in ("fwd", "bwd"))
        idle = sum(e.dur_s for e in events if e.kind == "idle")
        assert busy == 4.0 and idle == 6.0
        assert idle / s.makespan_s == pytest.approx(3 / 5)  # (p-1)/(m+p-1)
        fwd = [e for e in events if e.kind == "fwd"]
        assert [(e.microbatch, e.start_s) for e in fwd] == [(0, float(k)), (1, float(k + 1))]
    last_b0 = next(e for e in s.stages[3] if e.kind == "bwd" and e.microbatch == 0)
    assert last_b0.start_s == 5.0
    first_b1 = next(e for e in s.stages[0] if e.kind == "bwd" and e.microbatch == 1)
    assert first_b1.end_s == 10.0
    _, bubble = makespan_and_bubble(s)
    assert bubble == pytest.approx((4 - 1) / 2)  # t_pb / t_id = (p-1)/m, Narayanan's convention


# --- utilisation definitions ---------------------------------------------------------------------

@pytest.mark.parametrize("gpu,rec", [("a100-sxm4-80gb", "none"), ("h100-sxm5-80gb", "full"), ("h100-sxm5-80gb", "selective")])
def test_mfu_and_throughput_definitions(gpu, rec):
    model = gpt(16, 2048, 16)
    cluster = make_cluster(gpu, 16)
    job = Job(seq_len=2048, global_batch_size=64, precision="bf16")
    est = estimate(model, cluster, job, ParallelConfig(tp=2, pp=2, dp=4, micro_batch_size=2, recompute=rec))
    n = 16
    peak = cluster.gpu.peak("bf16")
    assert est.model_flops == step_model_flops(model, 64, 2048)
    assert est.mfu == pytest.approx(est.model_flops / (est.step_time_s * n * peak), rel=1e-12)
    assert est.hfu == pytest.approx(est.executed_flops / (est.step_time_s * n * peak), rel=1e-12)
    assert est.tokens_per_s == pytest.approx(64 * 2048 / est.step_time_s, rel=1e-12)
    assert est.tflops_per_gpu == pytest.approx(est.model_flops / est.step_time_s / n / 1e12, rel=1e-12)
    assert 0 < est.mfu < 1
    if rec == "full":
        assert est.executed_flops > est.model_flops  # the recomputed forward is executed work
    d = est.as_dict()
    assert d["mfu"] == est.mfu and d["step_time_s"] == est.step_time_s and math.isfinite(d["hfu"])
