"""Per-GPU compute time of one transformer layer: a roofline with shape-dependent efficiency.

Every kernel is priced as ``t0 + max(FLOP / (peak * ceiling * shape_eff), bytes / (HBM *
eta))`` (kernel_throughput.md sec. 5.1-5.5):

* ``ceiling`` is the GPU's best achievable matmul fraction of the dense peak (MAMF).
* ``shape_eff = d_min / (d_min + d_half)``: small GEMM dimensions leave the GPU partly idle
  (tile and wave quantisation, NVIDIA "Matrix Multiplication Background" guide). ``d_half``
  grows with throughput per SM (planner.cost.constants.GEMM_SHAPE_HALF_DIM_PER_TFLOPS_PER_SM).
* Memory-bound kernels (norms, activations, dropout, residual adds, softmax without flash
  attention, cross-entropy) move bytes at ``HBM_STREAM_EFFICIENCY`` of the HBM bandwidth.
* Flash attention runs at a per-generation efficiency measured inside training
  (``FLASH_ATTENTION_EFFICIENCY``) on the causal half of the square; the backward pass
  executes 2.5x the forward FLOPs (Dao 2023, FlashAttention-2 sec. 4.1 convention).

All functions take the per-GPU shard shapes: tensor parallel degree ``tp`` divides heads and
the MLP width; sequence parallelism divides the norm/dropout work by ``tp`` (Korthikanti et
al. 2022 sec. 4.2.2); context parallelism divides the tokens by ``cp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.cost.constants import Constants
from planner.cost.flops import attn_core_head_dims, attn_proj_dims, mlp_matrices
from planner.cost.fp8 import fp8_quant_time, torchao_gemm_factors
from planner.engines.policy import supports_flash
from planner.specs import GpuSpec, ModelSpec

__all__ = [
    "supports_flash",
    "LayerTimes", "MEGATRON_LOSS_BYTES", "gemm_time", "layer_times", "logits_times", "gpu_generation", "shape_half_dim",
    "attention_efficiency", "moe_load_factor", "fp8_quant_time", "layer_kernels", "stream_time",
]

ACT_BYTES = 2  # bf16/fp16 activations
DROPOUT_MASK_BYTES = 1  # torch dropout keeps a bool (1-byte) mask for the backward pass

# Backward elementwise traffic / forward, counted per kernel on the tensors each touches
# (2-byte elements, h the hidden and f the MLP width per token): a norm reads x and writes y
# (4h) forward, reads x and the incoming gradient and writes the input gradient (6h) backward
# (apex / TE fused layer norm); a fused residual add with dropout reads 2 and writes 1 tensor
# plus the mask (7h) forward, reads the gradient and the mask and writes one gradient (5h)
# backward, and the residual branches' gradients are summed (read 2, write 1: 6h each);
# the MLP activation reads 1-2 and writes 1 tensor forward, reads its inputs and the gradient
# and writes the input gradients backward (1.5-1.7x). Per layer that is 34h + 6f against
# 22h + 4f for a GPT layer with dropout (1.53 at f = 4h), 24h + 10f against 20h + 6f for a Llama
# layer (1.44 at f = 3.5h; 1.25 at tp 8 without sequence parallelism, where h is not split and f
# is); 1.5 is taken for all (rotary and bias-gradient terms ride on the same ratio).
BWD_ELEMENTWISE_TRAFFIC_RATIO = 1.5


def gpu_generation(gpu: GpuSpec) -> str:
    """Flash-attention efficiency class; "other" (no in-training measurement) for AMD and V100."""
    bf16 = gpu.peak("bf16") / 1e12
    if gpu.id.startswith("mi"):
        return "other"
    if bf16 < 200:
        return "other"  # V100 and older: no flash-attention-2 kernels
    if bf16 < 400:
        return "ampere"
    if bf16 < 1500:
        return "hopper"
    return "blackwell"


def shape_half_dim(gpu: GpuSpec, precision: str, C: Constants) -> float:
    tflops_per_sm = gpu.peak(precision) / 1e12 / gpu.sm_count
    return C.GEMM_SHAPE_HALF_DIM_PER_TFLOPS_PER_SM * tflops_per_sm


def gemm_time(m: float, n: float, k: float, gpu: GpuSpec, precision: str, C: Constants, batch: float = 1.0) -> float:
    """Seconds for ``batch`` GEMMs of (m x k) @ (k x n) on one GPU."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k * batch
    dmin = min(m, n, k)
    eff = gpu.ceiling(precision) * C.TRAINING_KERNEL_EFFICIENCY * dmin / (dmin + shape_half_dim(gpu, precision, C))
    t_flop = flops / (gpu.peak(precision) * eff)
    in_bytes = 1 if precision == "fp8" else ACT_BYTES
    t_mem = (in_bytes * (m * k + k * n) + ACT_BYTES * m * n) * batch / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    return C.GEMM_KERNEL_OVERHEAD_S + max(t_flop, t_mem)


def _gemm_fwd_bwd(m: float, n: float, k: float, gpu: GpuSpec, precision: str, C: Constants) -> tuple[float, float]:
    """Forward (m,k)@(k,n); backward = data gradient (m,n)@(n,k) + weight gradient (k,m)@(m,n)."""
    fwd = gemm_time(m, n, k, gpu, precision, C)
    bwd = gemm_time(m, k, n, gpu, precision, C) + gemm_time(k, n, m, gpu, precision, C)
    return fwd, bwd


def stream_time(nbytes: float, gpu: GpuSpec, kernels: int, C: Constants) -> float:
    return nbytes / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY) + kernels * C.ELEMENTWISE_KERNEL_OVERHEAD_S


@dataclass(frozen=True)
class LayerTimes:
    """Seconds for one layer and one micro-batch on one GPU, compute only (no communication).

    ``*_quant_s``: FP8 cast-transpose kernels (zero in 16-bit precision).
    """

    fwd_gemm_s: float
    bwd_gemm_s: float
    fwd_attn_s: float
    bwd_attn_s: float
    fwd_elementwise_s: float
    bwd_elementwise_s: float
    fwd_quant_s: float = 0.0
    bwd_quant_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return self.fwd_gemm_s + self.fwd_attn_s + self.fwd_elementwise_s + self.fwd_quant_s

    @property
    def bwd_s(self) -> float:
        return self.bwd_gemm_s + self.bwd_attn_s + self.bwd_elementwise_s + self.bwd_quant_s


def attention_efficiency(gpu: GpuSpec, kv_len: float, C: Constants, head_dim: float | None = None, kernel: str = "flash") -> float:
    """Flash-attention fwd+bwd achieved / dense 16-bit peak for kernel calls over ``kv_len``
    keys: the per-generation in-training figure at 8K and head dimension 128 scaled by
    s / (s + s_half) (constants.FLASH_ATTENTION_SEQ_HALF, fit to FA3's sequence sweep) and by
    d / (d + d_half) (constants.FLASH_ATTENTION_HEAD_HALF_DIM_PER_TFLOPS_PER_SM, FA4's head-dim
    sweep; d_half grows with the GPU's 16-bit throughput per SM). ``head_dim`` None: 128.
    ``kernel`` "fa2": FlashAttention-2's kernels on this generation (constants.FA2_ATTENTION_RATIO);
    "fa1": the first FlashAttention's, a fixed fraction of FA2's (constants.FA1_TO_FA2_RATIO)."""
    gen = gpu_generation(gpu)
    ratio = {"fa2": C.FA2_ATTENTION_RATIO[gen], "fa1": C.FA2_ATTENTION_RATIO[gen] * C.FA1_TO_FA2_RATIO}.get(kernel, 1.0)
    base = C.FLASH_ATTENTION_EFFICIENCY[gen] * ratio
    sh, ref = C.FLASH_ATTENTION_SEQ_HALF, C.FLASH_ATTENTION_REFERENCE_SEQ
    eff = base * (kv_len / (kv_len + sh)) / (ref / (ref + sh))
    if head_dim is None:
        return eff
    dh = C.FLASH_ATTENTION_HEAD_HALF_DIM_PER_TFLOPS_PER_SM * gpu.peak("bf16") / 1e12 / gpu.sm_count
    d0 = C.FLASH_ATTENTION_REFERENCE_HEAD_DIM
    return eff * (head_dim / (head_dim + dh)) / (d0 / (d0 + dh))


def moe_load_factor(model: ModelSpec, ep: int, C: Constants) -> float:
    """Tokens the busiest expert-parallel rank processes, relative to balanced routing.

    Capacity factor c (Fedus et al. 2021 sec. 2.2): buffers padded to c x tokens k / E.
    Dropless (capacity_factor None): constants.MOE_DROPLESS_IMBALANCE when experts are spread
    over ep > 1 ranks, 1 when every GPU holds every expert.
    """
    if model.moe is None:
        return 1.0
    if model.moe.capacity_factor is not None:
        return model.moe.capacity_factor
    return C.MOE_DROPLESS_IMBALANCE if ep > 1 else 1.0


def _attention_gemms(model: ModelSpec, tokens: float, tp: int) -> list:
    """(m, n, k) of the attention projections on one tensor-parallel rank.

    MLA (DeepSeek-V3 arXiv 2412.19437 eqs. 1-11): query down (h -> d_c'), query up
    (d_c' -> a (d_h + d_h^R)), joint KV down plus shared RoPE key (h -> d_c + d_h^R), KV up
    (d_c -> a (d_h + d_v)), output (a d_v -> h); the down projections are replicated over
    tensor parallelism (Megatron-core MLA), the up and output projections split by heads.
    """
    h = model.hidden
    if model.is_mla:
        d = model.head_dim or h // model.heads
        dqk, dv = d + model.qk_rope_head_dim, model.v_head_dim or d
        a = model.heads / tp
        out = []
        if model.q_lora_rank:
            out += [(tokens, model.q_lora_rank, h), (tokens, a * dqk, model.q_lora_rank)]
        else:
            out.append((tokens, a * dqk, h))
        out += [(tokens, model.kv_lora_rank + model.qk_rope_head_dim, h), (tokens, a * (d + dv), model.kv_lora_rank)]
        out.append((tokens, h, a * dv))
        return out
    qw, kvw = attn_proj_dims(model)
    return [(tokens, (qw + kvw) / tp, h), (tokens, h, qw / tp)]


@lru_cache(maxsize=65536)
def layer_times(
    model: ModelSpec,
    gpu: GpuSpec,
    precision: str,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    flash_attention: bool = True,
    moe_layer: bool = False,
    ep: int = 1,
    *,
    C: Constants,
    etp: int | None = None,
    fp8: str = "te",
    flash_kernel: str = "flash",
) -> LayerTimes:
    """Compute time of one dense (or MoE) layer for one micro-batch on one GPU.

    Precision ``fp8``: the linear layers (attention projections, MLP, experts) run FP8 GEMMs at
    the FP8 peak and ceiling, with the FP8 shape penalty (d_half scales with FP8 TFLOP/s per SM,
    twice BF16's on Hopper: kernel_throughput.md sec. 5.4) plus cast-transpose kernels; the
    attention core, router and output layer stay BF16 (Transformer Engine recipe).
    ``etp``: expert tensor parallelism (Megatron-core ``--expert-tensor-parallel-size``; None = tp,
    its default). With etp < tp the expert-parallel group spans the tensor-parallel ranks: each
    rank routes its own 1/tp of the sequence-parallel tokens and runs unsharded (or etp-sharded)
    experts (Megatron-core ``MoELayer`` with ``expert_tensor_parallel_size=1``).
    ``fp8``: how the FP8 casts and GEMMs run (:mod:`planner.cost.fp8`; engines.fp8_casts):
    Transformer Engine's, or a torchao recipe's, under which the routed experts stay 16-bit
    (torchtitan's Float8 converter swaps nn.Linear modules; grouped experts are not).
    ``flash_kernel``: which flash kernels run the attention core (``flash``, ``fa2`` or ``fa1``,
    ParallelConfig.attention).
    """
    h = model.hidden
    s_local = seq_len / cp
    tokens = micro_batch * s_local
    prec16 = "bf16" if precision == "fp8" else precision
    torchao = precision == "fp8" and fp8.startswith("torchao")
    exp_prec = prec16 if torchao else precision  # the routed experts' GEMMs
    gemms = _attention_gemms(model, tokens, tp)
    extra16 = []  # GEMMs that stay in 16-bit
    q_fwd = q_bwd = 0.0
    if model.moe is not None and moe_layer:
        moe = model.moe
        # Routed experts: each GPU runs experts/ep experts on tokens*top_k*ep/experts tokens
        # each after the all-to-all, times the busiest rank's load factor; shared experts run
        # on every token.
        et = tp if etp is None else etp
        local_experts = max(1, moe.experts // ep)
        fe = tokens * moe.top_k * ep / moe.experts * moe_load_factor(model, ep, C) * et / tp
        f_e = moe.expert_ffn_hidden
        up_n = f_e * (mlp_matrices(model) - 1) / et
        up = gemm_time(fe, up_n, h, gpu, exp_prec, C, local_experts)
        up_b = gemm_time(fe, h, up_n, gpu, exp_prec, C, local_experts) + gemm_time(h, up_n, fe, gpu, exp_prec, C, local_experts)
        down = gemm_time(fe, h, f_e / et, gpu, exp_prec, C, local_experts)
        down_b = gemm_time(fe, f_e / et, h, gpu, exp_prec, C, local_experts) + gemm_time(f_e / et, h, fe, gpu, exp_prec, C, local_experts)
        # TE GroupedLinear (Megatron-core TEGroupedMLP) issues one cuBLAS GEMM per local expert,
        # each paying the launch floor (gemm_time charged one per batched call).
        launches = (local_experts - 1) * C.GEMM_KERNEL_OVERHEAD_S
        # Token permutation into expert order and back (Megatron-core moe_utils permute /
        # unpermute): read T h and write T k h, and the reverse, in forward; twice in backward.
        routed = tokens * et / tp
        perm = 2 * ACT_BYTES * (routed * h + routed * moe.top_k * moe_load_factor(model, ep, C) * h)
        moe_f = up + down + 2 * launches + stream_time(perm, gpu, 4, C)
        moe_b = up_b + down_b + 4 * launches + stream_time(2 * perm, gpu, 4, C)
        if precision == "fp8" and not torchao:
            q_fwd, q_bwd = fp8_quant_time([(fe, up_n, h), (fe, h, f_e / et)], gpu, C, local_experts)
        if moe.shared_experts:
            gemms += [(tokens, f_e * moe.shared_experts * (mlp_matrices(model) - 1) / tp, h), (tokens, h, f_e * moe.shared_experts / tp)]
        extra16.append((tokens, moe.experts, h))  # router (kept in 16-bit/fp32)
        # routed activations per local token: k copies of f_e / etp on et / tp of the tokens
        ffn_local = f_e * (moe.top_k * moe_load_factor(model, ep, C) + moe.shared_experts) / tp
    else:
        f = model.ffn_hidden
        gemms += [(tokens, f * (mlp_matrices(model) - 1) / tp, h), (tokens, h, f / tp)]
        moe_f = moe_b = 0.0
        ffn_local = f / tp
    fwd_gemm = moe_f
    bwd_gemm = moe_b
    f_scale, gw16 = torchao_gemm_factors(fp8, C) if torchao else (1.0, False)
    for (m, n, k), prec in [(g, precision) for g in gemms] + [(g, prec16) for g in extra16]:
        f_, b_ = _gemm_fwd_bwd(m, n, k, gpu, prec, C)
        if prec == "fp8":
            f_ *= f_scale
            if gw16:  # the weight-gradient GEMM in 16-bit
                b_ += gemm_time(k, n, m, gpu, prec16, C) - gemm_time(k, n, m, gpu, prec, C)
        fwd_gemm += f_
        bwd_gemm += b_
    if precision == "fp8":
        qf, qb = fp8_quant_time(gemms, gpu, C, scheme=fp8)
        q_fwd, q_bwd = q_fwd + qf, q_bwd + qb

    heads_local = model.heads / tp
    dqk, dv = attn_core_head_dims(model)
    if flash_attention and supports_flash(gpu):
        # Causal: half the square is computed (what flash attention executes). With context
        # parallelism each rank holds s/cp queries (two load-balanced chunks) against, on
        # average, half of all s keys, in cp ring steps over key blocks of s/cp tokens
        # (Megatron-core / TE context parallelism); the kernel efficiency follows that block.
        eff = attention_efficiency(gpu, seq_len / cp, C, (dqk + dv) / 2, flash_kernel)
        core_fwd = 2.0 * micro_batch * s_local * seq_len * heads_local * (dqk + dv) / 2.0
        peak = gpu.peak(prec16)
        fwd_attn = core_fwd / (peak * eff) + cp * C.GEMM_KERNEL_OVERHEAD_S
        bwd_attn = 2.5 * core_fwd / (peak * eff) + 2 * cp * C.GEMM_KERNEL_OVERHEAD_S
    else:
        # Unfused attention (Megatron's fused scale-mask-softmax): two batched GEMMs over the
        # full square plus softmax, mask and dropout over b*a/t*s^2 elements.
        batch = micro_batch * heads_local
        sc_f, sc_b = _gemm_fwd_bwd(s_local, seq_len, dqk, gpu, prec16, C)
        cx_f, cx_b = _gemm_fwd_bwd(s_local, dv, seq_len, gpu, prec16, C)
        elems = batch * s_local * seq_len
        fwd_attn = batch * (sc_f + cx_f - 2 * C.GEMM_KERNEL_OVERHEAD_S) + 2 * C.GEMM_KERNEL_OVERHEAD_S + stream_time(elems * 9, gpu, 2, C)
        bwd_attn = batch * (sc_b + cx_b - 4 * C.GEMM_KERNEL_OVERHEAD_S) + 4 * C.GEMM_KERNEL_OVERHEAD_S + stream_time(elems * 13, gpu, 2, C)

    # Elementwise traffic per token (bytes): two norms (read+write h each), two residual adds
    # (read 2h, write h) with the dropout in the same kernel where the model trains with dropout
    # (Megatron's jit-fused bias_dropout_add_fused_train, megatron/core/fusions/
    # fused_bias_dropout.py: one pass that also writes the 1-byte mask), the MLP activation
    # (read the up-projection output, write its input to down-projection).
    qw, kvw = attn_proj_dims(model)
    hid = h / (tp if sequence_parallel else 1)
    dropout = 2 if model.bias else 0
    per_token = ACT_BYTES * (2 * 2 * hid + 2 * 3 * hid) + dropout * DROPOUT_MASK_BYTES * hid
    act_in = 2 if mlp_matrices(model) == 3 else 1
    per_token += ACT_BYTES * (act_in + 1) * ffn_local
    per_token += ACT_BYTES * 2 * (qw + kvw) / tp  # rotary/bias on q, k (read + write)
    fwd_el = stream_time(tokens * per_token, gpu, 8, C)
    bwd_el = stream_time(BWD_ELEMENTWISE_TRAFFIC_RATIO * tokens * per_token, gpu, 12, C)
    return LayerTimes(fwd_gemm, bwd_gemm, fwd_attn, bwd_attn, fwd_el, bwd_el, q_fwd, q_bwd)


# Bytes per logit element Megatron's eager vocab-parallel cross entropy moves (megatron-core
# tensor_parallel/cross_entropy.py, the same steps in Megatron-LM 2021 mpu/cross_entropy.py):
# forward .float() (read 2, write 4), max (read 4), subtract the max in place (8), exp in place
# (8), sum (read 4), divide in place (8) = 38; backward mul_ by the loss gradient (8) and the cast of
# the fp32 gradient back to the 16-bit logits (read 4, write 2) = 14. The default of layer_costs; each
# engine's own figures are its profile's ``loss`` block (Engine.loss_kernels).
MEGATRON_LOSS_BYTES = (38.0, 14.0)


@lru_cache(maxsize=8192)
def logits_times(model: ModelSpec, gpu: GpuSpec, precision: str, micro_batch: int, seq_len: int, tp: int, cp: int, C: Constants,
                 loss_bytes: tuple[float, float] = MEGATRON_LOSS_BYTES) -> tuple[float, float]:
    """(forward, backward) seconds of the output layer and cross-entropy on the last stage:
    the logits GEMMs and ``loss_bytes`` (forward, backward) per logit element streamed by the
    cross-entropy's kernels (Engine.loss_bytes)."""
    tokens = micro_batch * seq_len / cp
    prec = "bf16" if precision == "fp8" else precision  # the output layer stays in 16-bit
    f, b = _gemm_fwd_bwd(tokens, model.vocab / tp, model.hidden, gpu, prec, C)
    elems = tokens * model.vocab / tp
    return f + stream_time(elems * loss_bytes[0], gpu, 3, C), b + stream_time(elems * loss_bytes[1], gpu, 3, C)


def layer_kernels(model: ModelSpec, tp: int, sequence_parallel: bool, flash: bool, moe_layer: bool, ep: int) -> tuple[int, int]:
    """(forward, backward) kernels one layer launches per micro-batch, as :func:`layer_times`
    prices them: the GEMMs (backward: data and weight gradient), the attention core (flash 1
    forward, 3 backward: preprocess, main, dq conversion; unfused 4 / 6), 8 / 12 elementwise
    kernels, and 2 / 2 tensor-parallel collectives (4 / 4 with sequence parallelism). An MoE
    layer adds the router, top-k/softmax/auxiliary loss, permute and unpermute, the two
    all-to-alls and the expert GEMMs (one grouped call). The host time to issue them is what bounds small
    layers (:func:`planner.cost.stages.layer_costs`)."""
    g = len(_attention_gemms(model, 1.0, tp)) + 2
    f = g + (1 if flash else 4) + 8
    b = 2 * g + (3 if flash else 6) + 12
    if tp > 1:
        c = 4 if sequence_parallel else 2
        f, b = f + c, b + c
    if model.moe is not None and moe_layer:
        # Counted from Megatron-core's MoE forward as the Megatron-Bridge recipes run it (router
        # and permute fusion on, alltoall dispatcher, TEGroupedMLP; docs/cost_model_modern.md
        # "MoE host work"): the router gate GEMM (router.py gating) and the fused top-k/softmax
        # and aux-loss kernels (moe_utils.py, 7); the dispatcher's split bookkeeping with its
        # count all-gather (token_dispatcher.py preprocess, 7) and 4 device-to-host copies; 3
        # all-to-alls; TE's permute (4), the two chunk sorts (2 + 2) and the unpermute (1); the
        # grouped fc1, the activation and the grouped fc2 (3), in place of the dense MLP's 4.
        # The grouped GEMMs' per-expert cuBLAS calls are issued from one C++ loop (TE
        # GroupedLinear), so each grouped call counts once. Backward, by the same count: 41
        # kernels against the dense layer's 23 (autograd of the fused router, permutes and
        # all-to-alls, the grouped data and weight gradients once each).
        f += 1 + 7 + 7 + 4 + 3 + 4 + 2 + 2 + 1 + 3 - 4
        b += 18
        if model.moe.shared_experts:
            f, b = f + 2, b + 4
    return f, b
