"""FP8, context parallelism, mixture-of-experts and long-context terms, each against a closed
form computed by hand (docs/cost_model_modern.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost import memory as M
from planner.cost.comm import cp_hiding_local_len, cp_ring_exposed, cp_ring_time, group_links, moe_dispatch_bytes
from planner.cost.compute import attention_efficiency, fp8_quant_time, layer_times, moe_load_factor
from planner.cost.estimate import estimate
from planner.cost.flops import attn_core_head_dims, kv_exchange_width, layer_flops, step_model_flops
from planner.errors import InputError
from planner.io.loaders import load_gpu, load_model, make_cluster
from planner.search.space import SearchOptions, candidate_tuples
from planner.specs import Job, MoESpec, ParallelConfig

IB = {"kind": "infiniband", "gbps_per_nic": 400, "nics_per_node": 8}
H100 = load_gpu("h100-sxm5-80gb")
HBM = H100.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY


# --- long context / attention -----------------------------------------------------------------
def test_attention_efficiency_closed_form():
    base = C.FLASH_ATTENTION_EFFICIENCY["hopper"]
    assert attention_efficiency(H100, 8192, C=C) == pytest.approx(base)
    # s / (s + 220) / (8192 / 8412): 1024 -> 0.8231 / 0.97385 = 0.8452
    assert attention_efficiency(H100, 1024, C=C) == pytest.approx(base * (1024 / 1244) / (8192 / 8412))
    assert attention_efficiency(H100, 1024, C=C) / base == pytest.approx(0.8452, abs=1e-3)
    assert attention_efficiency(H100, 131072, C=C) > base  # saturates slightly above the 8K figure


def test_attention_efficiency_by_head_dim_closed_form():
    """d / (d + d_half) relative to d = 128, d_half = 114 / 16.9 x TFLOP/s per SM: on the GB200
    it was read from (FA4 head-dim sweep) hdim 64 runs at 0.68 of hdim 128; on the H100
    d_half = 6.75 x 989 / 132 = 50.6."""
    gb200 = load_gpu("gb200")
    r = attention_efficiency(gb200, 8192, C, 64) / attention_efficiency(gb200, 8192, C)
    assert r == pytest.approx(0.68, abs=0.005)
    dh = C.FLASH_ATTENTION_HEAD_HALF_DIM_PER_TFLOPS_PER_SM * H100.peak("bf16") / 1e12 / H100.sm_count
    assert dh == pytest.approx(50.6, abs=0.1)
    base = attention_efficiency(H100, 4096, C)
    assert attention_efficiency(H100, 4096, C, 128) == pytest.approx(base)
    assert attention_efficiency(H100, 4096, C, 64) == pytest.approx(base * (64 / (64 + dh)) / (128 / (128 + dh)))
    assert attention_efficiency(H100, 4096, C, 64) < base < attention_efficiency(H100, 4096, C, 192)


def test_narrow_heads_run_slower_attention_in_a_layer():
    """GPT-OSS-style heads of 64: the same attention FLOPs at d = 64 take longer than at 128."""
    wide = load_model("llama3.1-8b")
    narrow = replace(wide, heads=64, kv_heads=16, head_dim=64)  # the same q width, heads of 64
    t_w = layer_times(wide, H100, "bf16", 1, 8192, 1, 1, False, True, C=C)
    t_n = layer_times(narrow, H100, "bf16", 1, 8192, 1, 1, False, True, C=C)
    assert t_n.fwd_attn_s / t_w.fwd_attn_s == pytest.approx(
        attention_efficiency(H100, 8192, C) / attention_efficiency(H100, 8192, C, 64), rel=1e-3)


def test_causal_model_flops_halve_the_core():
    m = load_model("llama3.1-405b")
    b, s = 1, 131072
    lf = layer_flops(m, b, s)
    full = step_model_flops(m, b, s)
    causal = step_model_flops(m, b, s, causal=True)
    assert full - causal == pytest.approx(3 * m.layers * lf.attn_core / 2)
    # core per layer, full square: 4 b s^2 a d = 4 * 131072^2 * 128 * 128
    assert lf.attn_core == pytest.approx(4 * s**2 * 128 * 128)
    # at 128K the attention share is s/(6h) ~ 1.33 of the dense part: causal ~30% below full
    assert 0.25 < 1 - causal / full < 0.35


def test_flash_attention_time_is_causal_half_at_long_context():
    m = load_model("llama3.1-405b")
    s, tp = 131072, 8
    lt = layer_times(m, H100, "bf16", 1, s, tp, 1, True, True, C=C)
    core = 2.0 * s * s * (128 / tp) * 256 / 2  # causal half, a/t heads, d_qk + d_v = 256
    t = core / (H100.peak("bf16") * attention_efficiency(H100, s, C=C))
    assert lt.fwd_attn_s == pytest.approx(t + C.GEMM_KERNEL_OVERHEAD_S)
    assert lt.bwd_attn_s == pytest.approx(2.5 * t + 2 * C.GEMM_KERNEL_OVERHEAD_S)



def test_fa2_kernels_run_attention_at_their_measured_share_of_the_generations_flash():
    """attention="fa2" (FlashAttention-2's kernels, e.g. SDPA's flash backend on Hopper before
    cuDNN came first): the attention core at FA2_ATTENTION_RATIO of the generation's flash
    efficiency, 0.52 on H100 (pytorch/pytorch#142132: 329.5 against 631.3 TFLOP/s); the same
    kernel as "flash" on A100; the GEMMs and elementwise work unchanged."""
    m = load_model("llama3.1-8b")
    assert attention_efficiency(H100, 8192, C, 128, "fa2") == pytest.approx(0.52 * attention_efficiency(H100, 8192, C, 128))
    fa3 = layer_times(m, H100, "bf16", 1, 8192, 1, 1, False, True, C=C)
    fa2 = layer_times(m, H100, "bf16", 1, 8192, 1, 1, False, True, C=C, flash_kernel="fa2")
    ov = C.GEMM_KERNEL_OVERHEAD_S
    assert (fa2.fwd_attn_s - ov) == pytest.approx((fa3.fwd_attn_s - ov) / 0.52)
    assert (fa2.bwd_attn_s - 2 * ov) == pytest.approx((fa3.bwd_attn_s - 2 * ov) / 0.52)
    assert (fa2.fwd_gemm_s, fa2.fwd_elementwise_s) == (fa3.fwd_gemm_s, fa3.fwd_elementwise_s)
    a100 = load_gpu("a100-sxm4-80gb")
    assert layer_times(m, a100, "bf16", 1, 8192, 1, 1, False, True, C=C, flash_kernel="fa2") == \
        layer_times(m, a100, "bf16", 1, 8192, 1, 1, False, True, C=C)
    # through estimate: the same plan on H100 is slower with fa2, by the attention's share only
    cl, job = make_cluster("h100-sxm5-80gb", 8), Job(8192, 16)
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1, recompute="none", zero=1)
    e3, e2 = estimate(m, cl, job, par), estimate(m, cl, job, par.replace(attention="fa2"))
    assert e2.parallel.attention == "fa2" and 1.05 < e2.step_time_s / e3.step_time_s < 1.3
    assert e2.memory_peak_bytes == pytest.approx(e3.memory_peak_bytes)  # flash-style memory either way


# --- FP8 ---------------------------------------------------------------------------------------
def test_fp8_quant_kernels_closed_form():
    # one GEMM m=4096 tokens, n=8192 out, k=2048 in: fwd reads/writes 4 B x m k, bwd 4 B x m n
    f, b = fp8_quant_time([(4096, 8192, 2048)], H100, C=C)
    assert f == pytest.approx(4 * 4096 * 2048 / HBM + C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    assert b == pytest.approx(4 * 4096 * 8192 / HBM + C.ELEMENTWISE_KERNEL_OVERHEAD_S)


def test_fp8_faster_gemms_but_not_2x_and_attention_unchanged():
    m = load_model("llama3.1-70b")
    bf = layer_times(m, H100, "bf16", 1, 8192, 8, 1, True, C=C)
    f8 = layer_times(m, H100, "fp8", 1, 8192, 8, 1, True, C=C)
    assert f8.fwd_attn_s == bf.fwd_attn_s and f8.bwd_attn_s == bf.bwd_attn_s  # attention in BF16
    assert bf.fwd_quant_s == 0.0 and f8.fwd_quant_s > 0.0
    ratio = (bf.fwd_gemm_s + bf.bwd_gemm_s) / (f8.fwd_gemm_s + f8.bwd_gemm_s)
    # ceiling 0.709 x 1979 vs 0.803 x 989 = 1.77x at infinite size; the FP8 shape penalty
    # (d_half twice BF16's) lowers it; kernel_throughput.md sec. 5.4: 1.25-1.75x.
    assert 1.25 < ratio < 1.77
    layer_ratio = (bf.fwd_s + bf.bwd_s) / (f8.fwd_s + f8.bwd_s)
    assert 1.1 < layer_ratio < ratio


def test_fp8_weight_and_activation_bytes():
    assert M.bytes_per_param("fp8", 1, 8, "auto", C)["weights"] == pytest.approx(2 + C.FP8_WEIGHT_COPY_BYTES_PER_PARAM)
    assert M.bytes_per_param("fp8", 3, 8, "auto", C)["weights"] == pytest.approx(2 / 8)  # copies only while gathered
    m = load_model("llama3.1-70b")  # no dropout, SwiGLU, GQA
    s, b, h, f, t = 8192, 1, 8192, 28672, 8
    a16 = M.activation_bytes_per_layer(m, b, s, t, 1, True, "none", True, C=C)
    a8 = M.activation_bytes_per_layer(m, b, s, t, 1, True, "none", True, precision="fp8", C=C)
    qw = 8192
    # linear inputs go 2 B -> 1 B: QKV input s b h / t, fc1 input s b h / t, fc2 input s b f / t;
    # the out-projection keeps its bf16 copy for flash backward and adds a 1 B FP8 copy.
    saved = s * b * h / t + s * b * h / t + s * b * f / t - s * b * qw / t
    assert a16 - a8 == pytest.approx(saved)


# --- context parallelism -----------------------------------------------------------------------
def test_kv_exchange_width():
    llama = load_model("llama3.1-405b")
    assert kv_exchange_width(llama, 8) == 1 * 256  # 8 KV heads over tp 8, d 128 for K and V
    assert kv_exchange_width(llama, 16) == 256  # replicated KV head: still one per rank
    assert kv_exchange_width(llama, 1) == 8 * 256
    ds = load_model("deepseek-v3")
    assert attn_core_head_dims(ds) == (192, 128)
    assert kv_exchange_width(ds, 1) == 128 * (192 + 128)


def test_cp_ring_closed_form_and_overlap():
    c = make_cluster("h100-sxm5-80gb", 128, 8, IB)
    par = ParallelConfig(tp=8, cp=16, dp=1)
    links = group_links(c, par)["cp"]
    assert links.size == 16 and links.m == 16  # stride tp = 8: every CP rank on another node
    kv = 2 * 8192 * 256  # bytes of one K+V block: 8192 local tokens x 256 elements x 2 B
    lvl = links.inter
    t = 15 * (lvl.latency_s + kv / lvl.bandwidth_bytes_per_s + c.collective_latency_s)  # each step a send/recv call
    assert cp_ring_time(links, kv) == pytest.approx(t)
    # long attention: every transfer hides behind the (cp-1)/cp of attention it overlaps
    assert cp_ring_exposed(links, kv, 10 * t, 30 * t) == (0.0, 0.0)
    # short attention (small local length): exposed = t - 15/16 attn, backward 2 t - 15/16 attn
    f, b = cp_ring_exposed(links, kv, 0.32 * t, 0.8 * t)
    assert f == pytest.approx(t - 15 / 16 * 0.32 * t) and b == pytest.approx(2 * t - 15 / 16 * 0.8 * t)


def test_cp_hiding_length_matches_the_cost_model():
    m = load_model("llama3.1-405b")
    c = make_cluster("h100-sxm5-80gb", 128, 8, IB)
    links = group_links(c, ParallelConfig(tp=8, cp=16, dp=1))["cp"]
    bw = links.inter.bandwidth_bytes_per_s
    rate = H100.peak("bf16") * attention_efficiency(H100, 16384, C=C)
    L = cp_hiding_local_len(256, 16, 256, rate, bw)
    assert L == pytest.approx(2 * 256 * rate / (bw * 16 * 256))
    assert 900 < L < 1500  # ~1.2K tokens: 8K over cp 8 (1K local) cannot hide, 128K over cp 16 can

    def exposed(local):
        s = local * 16
        lt = layer_times(m, H100, "bf16", 1, s, 8, 16, True, C=C)
        return cp_ring_exposed(links, 2 * local * 256, lt.fwd_attn_s, lt.bwd_attn_s)[0]

    assert exposed(4 * L) == 0.0 and exposed(L / 4) > 0.0


def test_cp_divides_activations_and_must_divide_half_the_sequence():
    m = load_model("llama3.1-405b")
    a1 = M.activation_bytes_per_layer(m, 1, 131072, 8, 1, True, "none", True, C=C)
    a16 = M.activation_bytes_per_layer(m, 1, 131072, 8, 16, True, "none", True, C=C)
    assert a1 / a16 == pytest.approx(16)
    c = make_cluster("h100-sxm5-80gb", 48, 8, IB)
    estimate(m, c, Job(6144, 6), ParallelConfig(tp=8, cp=6, dp=1))  # 6144 / (2*6) = 512: accepted
    with pytest.raises(InputError, match="parallel.cp"):
        estimate(m, make_cluster("h100-sxm5-80gb", 24, 8, IB), Job(6148, 3), ParallelConfig(tp=8, cp=3, dp=1))


def test_cp_exposed_at_short_local_length_hidden_at_long():
    m = load_model("llama3.1-8b")
    c = make_cluster("h100-sxm5-80gb", 64, 8, IB)
    short = estimate(m, c, Job(8192, 8), ParallelConfig(tp=8, cp=8, dp=1), validate=False)
    long = estimate(m, c, Job(131072, 8), ParallelConfig(tp=8, cp=8, dp=1), validate=False)
    assert short.time_breakdown_s["cp_comm_exposed_s"] > 0.05 * short.step_time_s
    assert long.time_breakdown_s["cp_comm_exposed_s"] == 0.0


def test_search_offers_cp_and_respects_seq_limit():
    m = load_model("llama3.1-8b")
    c = make_cluster("h100-sxm5-80gb", 64, 8, IB)
    cps = {t[3] for t in candidate_tuples(m, c, Job(131072, 8), SearchOptions())}
    assert {1, 2, 4, 8, 16, 32, 64} <= cps
    cps = {t[3] for t in candidate_tuples(m, c, Job(96, 8), SearchOptions())}
    assert 32 not in cps and 16 in cps  # 96 % 64 != 0, 96 % 32 == 0


# --- mixture of experts ------------------------------------------------------------------------
def test_moe_load_factor():
    mix = load_model("mixtral-8x7b")
    assert moe_load_factor(mix, 1, C=C) == 1.0
    assert moe_load_factor(mix, 8, C=C) == C.MOE_DROPLESS_IMBALANCE
    capped = replace(mix, moe=replace(mix.moe, capacity_factor=1.25))
    assert moe_load_factor(capped, 8, C=C) == 1.25 and moe_load_factor(capped, 1, C=C) == 1.25
    assert moe_load_factor(load_model("llama3.1-8b"), 4, C=C) == 1.0


def test_moe_dispatch_bytes_and_alltoall_links():
    # 4096 tokens, top-2, h 4096, 16-bit: 4096 * 2 * 4096 * 2 B = 64 MiB per rank
    assert moe_dispatch_bytes(4096, 4096, 2, 1.0) == 4096 * 2 * 4096 * 2
    assert moe_dispatch_bytes(4096, 4096, 2, 1.25) == pytest.approx(1.25 * 4096 * 2 * 4096 * 2)
    c = make_cluster("h800-sxm5-80gb", 2048, 8, IB)
    links = group_links(c, ParallelConfig(tp=1, pp=16, dp=128, ep=64))
    ep = links["ep"]
    assert ep.size == 64 and ep.k == 8 and ep.m == 8 and ep.link == "infiniband"
    n = 1e8
    # pairwise: 56/64 of the buffer leaves the node through this rank's NIC share
    t_out = 7 * ep.inter.latency_s + n * 56 / 64 / ep.inter.bandwidth_bytes_per_s + c.collective_latency_s
    assert ep.time("alltoall", n) == pytest.approx(t_out)
    intra = group_links(c, ParallelConfig(tp=1, pp=16, dp=128, ep=8))["ep"]
    assert intra.link == "nvswitch"


def test_moe_expert_gemm_tokens_and_four_alltoall_per_layer():
    mix = load_model("mixtral-8x7b")
    c = make_cluster("h100-sxm5-80gb", 64, 8, IB)
    job = Job(4096, 64)
    par = ParallelConfig(tp=1, pp=1, dp=64, ep=8, zero=1)
    e = estimate(mix, c, job, par)
    # per rank 4096 tokens, top-2, h 4096, 16-bit, x1.1 dropless imbalance; 4 a2a per MoE layer
    a2a = group_links(c, par)["ep"].time("alltoall", 4096 * 2 * 4096 * 2 * C.MOE_DROPLESS_IMBALANCE)
    assert e.time_breakdown_s["ep_comm_exposed_s"] == pytest.approx(1 * 32 * 4 * a2a)
    # expert FLOPs: each GPU holds 1 expert and runs tokens * k * ep / E * load = 4096*2*1.1 rows
    lt1 = layer_times(mix, H100, "bf16", 1, 4096, 1, 1, False, True, True, 8, C=C)
    capped = replace(mix, moe=replace(mix.moe, capacity_factor=2.2))
    lt2 = layer_times(capped, H100, "bf16", 1, 4096, 1, 1, False, True, True, 8, C=C)
    assert lt2.fwd_gemm_s > lt1.fwd_gemm_s  # 2.2 vs 1.1 x the routed rows


def test_moe_memory_experts_sharded_by_ep():
    ds = load_model("deepseek-v3")
    p = M.stage_params(ds, 4, 1, 16, 1, 64, n_dense=0)
    per_layer_experts = 256 * 3 * 7168 * 2048
    assert p["experts"] == pytest.approx(4 * per_layer_experts / 64)
    p0 = M.stage_params(ds, 4, 0, 16, 1, 64, n_dense=3)  # first stage: 3 dense layers + 1 MoE layer
    assert p0["experts"] == pytest.approx(per_layer_experts / 64)


def test_mla_projection_gemms_match_layer_flops():
    ds = load_model("deepseek-v3")
    tokens = 4096
    lf = layer_flops(ds, 1, tokens)
    # hand count of the MLA projections (DeepSeek-V3 eqs. 1-11), per token, 2 FLOP per MAC:
    h, a, qr, kvr = 7168, 128, 1536, 512
    macs = h * qr + qr * a * 192 + h * (kvr + 64) + kvr * a * (128 + 128) + a * 128 * h
    assert lf.qkv + lf.out_proj == pytest.approx(2 * tokens * macs)
    # and the compute model prices those GEMMs, not the parameter-equivalent dense widths
    t_mla = layer_times(ds, H100, "bf16", 1, tokens, 1, 1, False, True, False, C=C)
    dense_eq = replace(ds, q_lora_rank=0, kv_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0, moe=None)
    t_dense = layer_times(dense_eq, H100, "bf16", 1, tokens, 1, 1, False, True, False, C=C)
    assert t_mla.fwd_gemm_s < t_dense.fwd_gemm_s


def test_search_covers_ep_for_moe():
    ds = load_model("qwen3-30b-a3b")
    c = make_cluster("h100-sxm5-80gb", 16, 8, IB)
    eps = {t[4] for t in candidate_tuples(ds, c, Job(4096, 64), SearchOptions())}
    assert {1, 2, 4, 8, 16} <= eps


def test_moe_spec_capacity_validation():
    with pytest.raises(InputError):
        MoESpec(experts=8, top_k=2, expert_ffn_hidden=10, capacity_factor=0.0)
