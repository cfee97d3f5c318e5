"""Physical calibration constants, each named, with its source, shared by every case.

Nothing here is fitted to one row of validation data. Where a value is a judgement
between published measurements, the range and the reason for the pick are given.
``docs/cost_model.md`` lists the same constants with their known error.

The constants are one frozen value, :class:`Constants`; :data:`DEFAULT_CONSTANTS` holds the
published values below. A calibration profile is another ``Constants`` (``planner calibrate``,
``plan --profile``), passed down explicitly (``estimate(..., constants=...)``,
``plan(..., constants=...)``); nothing edits module state. ``LINK_DEFAULTS`` are the physical
defaults a loader puts into a new :class:`planner.specs.ClusterSpec` (read-only); a cluster
carries its own link efficiencies from then on.

>>> from planner.cost.constants import DEFAULT_CONSTANTS
>>> DEFAULT_CONSTANTS.TRAINING_KERNEL_EFFICIENCY
0.835
>>> DEFAULT_CONSTANTS.replace(TRAINING_KERNEL_EFFICIENCY=0.7).TRAINING_KERNEL_EFFICIENCY
0.7
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

__all__ = ["Constants", "DEFAULT_CONSTANTS", "LINK_DEFAULTS", "NCCL_CALL_LATENCY_S", "FITTABLE"]

# --- Links ------------------------------------------------------------------------------
# Per kind: (per-step latency alpha in seconds, usable fraction of the nominal per-direction
# bandwidth for large messages).
# * NVLink/NVSwitch: nccl-tests all_reduce_perf on DGX A100 reaches ~230 GB/s bus bandwidth at
#   1 GiB on 8 GPUs against 300 GB/s per direction (vTrain's A100 NCCL tables,
#   ../shared/validation/VTRAIN.md: 229 GB/s) -> 0.77; the per-step NVLink latency of a ring is
#   2.5 us: fit to vTrain's measured all-reduce tables (trace/a100/AR_GPU{2..8}_1M_1024M_LUT,
#   2-8 GPUs, 1 MiB-1 GiB: t = 38 us + 2 (p-1) 2.5 us + 2 (p-1)/p n / 215 GB/s, mean |log
#   ratio| 0.07), between NCCL's tuning.cc hwLat for NVLink LL128 (1.9 us) and Simple (3.4 us).
# * InfiniBand: NCCL reaches ~90-93% of line rate on HDR/NDR (nccl-tests inter-node bus
#   bandwidth ~23 GB/s per 200 Gb/s NIC); NCCL's network latency per step ~5 us
#   (tuning.cc: baseLat + hwLat[NET] ~ 5-8 us for ring).
# * RoCE: same NICs, slightly lower efficiency (congestion control, PFC); ~0.85.
# * Ethernet (TCP sockets, no RDMA): ~60% of line rate and ~20 us latency (NCCL socket
#   transport; cloud VMs without EFA/GPUDirect).
# * PCIe Gen4 x16: 32 GB/s per direction nominal, ~0.75 usable through the host bridge.
LINK_DEFAULTS: Mapping[str, tuple[float, float]] = MappingProxyType({
    "nvswitch": (2.5e-6, 0.77),
    "nvlink": (2.5e-6, 0.77),
    "xgmi": (1.5e-6, 0.70),
    "pcie": (3.0e-6, 0.75),
    "infiniband": (5.0e-6, 0.92),
    "omnipath": (6.0e-6, 0.85),
    "roce": (6.0e-6, 0.85),
    "ethernet": (2.0e-5, 0.60),
    "none": (5.0e-6, 0.92),
})

# Fixed cost of one collective call, above its per-step latencies: NCCL's kernel launch, channel
# set-up and small-message protocol work. 38 us is the intercept of the fit above to vTrain's
# measured nccl-tests all-reduce tables (A100, NCCL of 2023); NCCL's own tuner charges a
# baseLat of 8.4 us for Ring/Simple (src/graph/tuning.cc), a lower bound. A cluster carries it
# as ``ClusterSpec.collective_latency_s``.
NCCL_CALL_LATENCY_S = 38e-6


@dataclass(frozen=True)
class Constants:
    """Every calibration constant of the cost model, as one immutable value (see module doc).

    Field names are the constants' documented names (docs/cost_model.md); ``replace`` gives a
    copy with some of them changed.

    >>> import planner
    >>> slow = planner.DEFAULT_CONSTANTS.replace(TRAINING_KERNEL_EFFICIENCY=0.6)
    >>> m, c, j = planner.load_model("llama3.1-8b"), planner.make_cluster("h100-sxm5-80gb", 8), planner.Job(8192, 64)
    >>> p = planner.ParallelConfig(tp=1, pp=1)
    >>> planner.estimate(m, c, j, p, constants=slow).step_time_s > planner.estimate(m, c, j, p).step_time_s
    True
    """

    # --- Compute ----------------------------------------------------------------------------
    # Fixed cost of one GEMM kernel: ~5 us for tiny GEMMs on H100- and B200-class parts in XLA's
    # measured GEMM table; ~2.5 us per launch of a small streaming kernel (RRZE gpu-small-kernels,
    # H200 and A100). kernel_throughput.md sec. 3.2 and 5.2.
    GEMM_KERNEL_OVERHEAD_S: float = 5.0e-6
    ELEMENTWISE_KERNEL_OVERHEAD_S: float = 2.5e-6

    # Shape efficiency of a GEMM: time = t0 + FLOP / (peak * ceiling) * (1 + d_half / d_min),
    # d_min the smallest GEMM dimension. XLA's H100 BF16 table is reproduced within ~15% by
    # d_half ~= 80 (kernel_throughput.md sec. 5.2). The dimension needed to fill a GPU grows
    # with its throughput per SM (sec. 5.3: "faster chips need bigger GEMMs"), so d_half is
    # expressed per (dense TFLOP/s per SM): H100 BF16 = 989/132 = 7.49 TFLOP/s per SM -> 80/7.49.
    GEMM_SHAPE_HALF_DIM_PER_TFLOPS_PER_SM: float = 80.0 / 7.49

    # Fraction of the short-burst MAMF that GEMM and attention kernels sustain inside a training
    # step: MAMF is the best of a brute-force shape search, 100 iterations after warm-up
    # (kernel_throughput.md sec. 1.1); a training step runs for seconds at the power limit
    # (H100 SXM sustains ~1.75 GHz of its 1.98 GHz boost under dense GEMM load, A100 ~1.3-1.41 GHz),
    # with launch gaps between eager-mode kernels and L2/SM interference from overlapped NCCL
    # kernels (DeepSeek-V3 reserves 20 of 132 SMs for communication, arXiv 2412.19437 sec. 3.2.2).
    # This is a calibration constant shared by every GPU and case, set so that the per-layer
    # times of Korthikanti et al. 2022 Table 4 and the end-to-end runs in shared/validation agree
    # on average; ``planner calibrate`` refits it for a user's cluster. History: 0.84, then 0.855
    # while the norm/dropout traffic of layers without sequence parallelism was priced ~1.5x too
    # high (a separate dropout pass; backward twice the forward bytes), which slowed every
    # Megatron-DeepSpeed run and pulled the GEMMs faster to compensate; with that traffic counted
    # per kernel (compute.BWD_ELEMENTWISE_TRAFFIC_RATIO) it is 0.835 (docs/research/steptime.md sec. 7).
    TRAINING_KERNEL_EFFICIENCY: float = 0.835

    # Streaming (memory-bound) kernels reach 85-90% of HBM spec bandwidth (RRZE gpu-stream:
    # A100 85-99%; QuACK on H100 ~90%); fused-but-unoptimised PyTorch elementwise chains are
    # lower (torch.compile softmax 56%). 0.7 is taken for the mix of layernorm, dropout, bias,
    # activation and residual kernels of a training step (kernel_throughput.md sec. 3.1, 5.5).
    HBM_STREAM_EFFICIENCY: float = 0.7

    # FlashAttention fwd+bwd achieved / dense peak, by GPU generation, measured inside training
    # (kernel_throughput.md sec. 2): A100 FA2 50-73% (arXiv 2307.08691); H100/H200 FA3 in a real
    # 8B step 45% (ml-engineering when-to-upgrade); B200 FA4 in-step 37%. Backward runs at
    # ~0.85-0.9 of forward efficiency. Values are for causal attention at s >= 2k. "other" (AMD
    # MI300X through Composable Kernel) has no in-training measurement here: 0.40 is a judgement
    # below Hopper, consistent with MI300X's lower matmul ceiling (kernel_throughput.md sec. 1.1).
    FLASH_ATTENTION_EFFICIENCY: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({"ampere": 0.55, "hopper": 0.45, "blackwell": 0.37, "other": 0.40}), hash=False)
    # FlashAttention-2's kernels (ParallelConfig.attention "fa2") relative to the generation's own
    # flash kernel above, each as a fraction of its GPU's peak. Hopper: 329.5 TFLOP/s for PyTorch
    # SDPA's default flash backend (FA2) against 631.3 for cuDNN and 631.8 for FA3 on H100, fwd,
    # (1, 24, 4608, 128) (pytorch/pytorch#142132, torch 2.6 nightly, Dec 2024): 0.52; consistent
    # with the FA3 paper's ~35% for FA2 against FA3's 75% (arXiv 2407.08608, abstract) and cuDNN's
    # 1.7-2.3x over SDPA's flash backend for training shapes on Hopper (huggingface/transformers
    # PR #48163). Blackwell: FA2 v2.7.4 on B200 fwd, head 64, 16k: 379 TFLOP/s = 17% of 2250
    # (Dao-AILab/flash-attention#1589) against FA4 at 1243 = 50% of 2500 (PR #2605): 0.34.
    # Ampere and the rest: FA2 is the kernel the figure above measures (1.0).
    FA2_ATTENTION_RATIO: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({"ampere": 1.0, "hopper": 0.52, "blackwell": 0.34, "other": 1.0}), hash=False)
    # The first FlashAttention's kernels (flash-attn 1.x, ParallelConfig.attention "fa1") relative
    # to FlashAttention-2's on the same GPU. FA2 paper (Dao 2023, arXiv 2307.08691) Fig. 4 (A100
    # 80GB SXM4) and Fig. 6 (H100 SXM5), forward + backward, causal, FlashAttention against
    # FlashAttention-2 in TFLOP/s at sequence 2k and 8k (the figures in Dao-AILab/flash-attention
    # assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png): A100 head
    # 64: 77/140, 92/165; head 128: 69/155, 80/182; H100 head 64: 136/232, 149/273; head 128:
    # 108/265, 135/308. Mean 0.50 on each GPU (0.41-0.59); one value for every generation.
    FA1_TO_FA2_RATIO: float = 0.5

    # --- Memory ------------------------------------------------------------------------------
    # PyTorch's caching allocator keeps freed blocks, so its reserved peak exceeds the allocated
    # peak by what fragments: a fraction of the bytes allocated and freed within the step
    # (activations, logits, gathered parameters, per-step gradients; model states sit in buffers
    # allocated once), charged by planner.cost.memory_peak (an engine profile may carry its own,
    # MemoryProfile.reserve_fraction; FSDP2's per-stream pools are modelled apart). Published logs
    # that give the allocation after the step as well as both peaks: (max reserved - max
    # allocated) / (max allocated - allocated) = 0.31 (Megatron-Core, NVIDIA/Megatron-LM#5662),
    # 2.07 (GPT-2 2.6B on V100, 2020, NVIDIA/Megatron-LM#60); torchtitan's Dec-2024 benchmark
    # (validation/memory_runs.json) reads 0.18-0.20 against this model's allocated peak, the Zero
    # Bubble runs 0.10-0.20. One value for every engine (the same allocator): 0.20.
    ALLOCATOR_RESERVE_FRACTION: float = 0.20
    # Device memory outside PyTorch's allocator, so in no torch counter but in what the GPU must
    # have: the CUDA context with its loaded kernels (~0.5-0.8 GiB on Hopper with lazy module
    # loading), cuBLAS/cuDNN handles and NCCL's per-communicator channel buffers (NCCL_BUFFSIZE
    # 4 MiB x channels x peers x protocols, over the TP/PP/DP/CP communicators a 3-D job opens):
    # ~1.5-3 GiB per GPU in practice; a same-process measurement of nvidia-smi minus torch's
    # reserved bytes on an 8-GPU FSDP2 job shows 5.8-7.3 GiB (ISEEKYAN/Megatron-LM#150), NVLS
    # buffers included. 2.5 GiB is kept as the typical figure; Transformer Engine's TP-overlap
    # userbuffers are added where a plan uses them (planner.cost.memory.tp_overlap_buffer_bytes).
    FRAMEWORK_BUFFER_BYTES: float = 2.5 * 2**30
    # Fraction of the GPU's capacity a plan leaves free (plan, estimate, --memory-margin): the
    # memory model's stated error bound. Its predictions of the reserved peak fall within -5%..+15%
    # of the published measurements (validation/memory_runs.json, benchmarks/memory_by_source.py),
    # none more than 5% under, so a prediction at 95% of the capacity is a job that fits.
    MEMORY_MARGIN_FRACTION: float = 0.05

    # --- Overlap -----------------------------------------------------------------------------
    # Megatron overlaps the backward TP all-reduce of the input gradient with the weight-gradient
    # GEMM (Korthikanti et al. 2022 sec. 5: that overlap is why full recompute costs 39%, not 33%).
    TP_BWD_OVERLAP_FRACTION: float = 0.5
    # When communication runs concurrently with compute (prefetched ZeRO-3 gathers, bucketed
    # gradient reduction), both compete for SMs and HBM; only this fraction of the shorter of
    # the two is hidden: exposed = comm + compute - eta * min(comm, compute). Physically, compute
    # slowed by a factor (1 + sigma) while a collective runs beside it exposes sigma / (1 + sigma)
    # of the collective: eta = 1 / (1 + sigma). The one direct measurement, Lee et al. 2025
    # (arXiv 2507.03114: A100, H100 and MI250, NCCL/RCCL collectives beside GPT and Llama layers),
    # finds a compute slowdown of 18.9% on average (eta 0.84) and at most 40% (eta 0.71). The
    # planner takes the worst measured case, sigma = 0.40: a plan should not count on more overlap
    # than any measured pair of kernels gave. (A single-wave GEMM pushed into a second wave by
    # NCCL's CTAs can slow ~2x, NVIDIA forum thread 337991 on H100 with 24 blocks; that is a
    # shape-specific tail, not the typical layer.) History: 0.6 (sigma 0.67, outside the measured
    # range), first calibrated on the ZeRO-3 rows of Narayanan et al. 2021 Table 2 at an earlier
    # model; at the model of 2026-12 those rows centred near 0.8. The in-sample trade is in
    # docs/cost_model.md sec. 6.
    COMM_COMPUTE_OVERLAP_EFFICIENCY: float = 1.0 / 1.40


    # --- Optimizer ---------------------------------------------------------------------------
    # Mixed-precision Adam per locally held parameter, HBM bytes: unscale and overflow check of
    # the 16-bit gradient (2), grad-norm pass (2), 16-bit -> fp32 gradient copy (6), fused Adam
    # over fp32 master weight and two moments (read 16, write 12), fp32 -> 16-bit weight copy (6):
    # ~40 B. Measured: vtrain_single's per-step intercept at tp1 is 38-40 ms for 1.31 B parameters
    # per GPU, the same at dp 2/4/8, i.e. ~29 ns = 40 B per parameter at 0.7 x 2.0 TB/s
    # (kernel_throughput.md sec. 5.9 derives 28-30 B for the Adam kernel alone).
    OPTIMIZER_BYTES_PER_PARAM: float = 40.0

    # Per-step fixed cost outside the layers and the optimizer (data loader, logging, loss-scale
    # checks, grad-norm all-reduce launch): the per-step intercept of vtrain_single's tp8 runs
    # (step time against micro-batch count at a fixed configuration, where the optimizer is
    # tiny) is 0.9-3.5 ms; "a few ms" in Megatron logs.
    STEP_OVERHEAD_S: float = 0.003

    # --- Host (CPU) side of a training step ------------------------------------------------------
    # Eager PyTorch issues every kernel from Python (module call, autograd, dispatcher, hooks).
    # Small layers are bound by that host time, not the GPU: vtrain_single's step times, split
    # into a part per layer and micro-batch, show a floor of 3.0-3.4 ms that does not change with
    # the hidden size (1024 vs 2048) or the tensor degree (1-4) although the GPU work changes 4-8x
    # (Megatron-DeepSpeed, A100). vTrain's own simulator replays these inter-kernel gaps from
    # CUPTI traces (VIA-Research/vTrain src/predictor.py parse_traces). Over the ~44 kernels a
    # dense layer launches as compute.layer_kernels counts them, that is 70 us per modelled
    # kernel (real layers launch ~2x more small ops: ~35 us each). The host and the device
    # overlap only as far as the CPU can run ahead (collectives and syncs stop it), so a
    # layer takes (g^k + h^k)^(1/k) for GPU time g and host time h, with k = 1.75 (k = 1: sum,
    # k -> inf: max) the exponent that fits both regimes of that file. These two values are
    # identified on the only published runs small enough to expose the host; on large layers
    # (tens of ms of GPU time) they add under 1%. A CUDA-graph or compiled engine launches from
    # far less host code and would have a lower figure.
    HOST_SECONDS_PER_KERNEL: float = 70e-6
    HOST_DEVICE_OVERLAP_EXPONENT: float = 1.75
    # Kernels of the output layer and the loss (logits GEMM fwd/bwd, vocab-parallel softmax and
    # cross-entropy, their reductions and casts) and of the embedding: ~23 (same accounting).
    HOST_LOGITS_KERNELS: float = 23.0


    # --- Modern training: FP8, context parallelism, MoE, long context (docs/cost_model_modern.md) --
    # Flash-attention efficiency rises with the key/value length a kernel call sees and saturates:
    # FA3 fwd, hdim 128, B*S = 16k, on Hopper: 430 / 517 / 566 / 590 / 614 / 621 TFLOP/s at
    # s = 512 / 1k / 2k / 4k / 8k / 16k (pytorch/benchmark PR #2391; kernel_throughput.md sec. 2).
    # eff(s) proportional to s / (s + s_half) reproduces the ratios to 8k (0.70 0.84 0.92 0.96) with
    # s_half = 220 tokens (0.72 0.85 0.93 0.97 at 512, 1K, 2K, 4K). FLASH_ATTENTION_EFFICIENCY holds at the reference
    # length 8192 (the in-step H200 measurement), so eff(s) = table * f(s) / f(8192).
    FLASH_ATTENTION_SEQ_HALF: float = 220.0
    FLASH_ATTENTION_REFERENCE_SEQ: float = 8192.0
    # ... and with the head dimension d: each key/value tile is reused d times per loaded score,
    # so a narrow head does less matmul work per softmax step. FA4 on Blackwell (2.5 PFLOP/s,
    # 148 SMs: 16.9 TFLOP/s per SM), fwd non-causal: hdim 64 at 1087 -> 1243 TFLOP/s against
    # hdim 128 at 1540 -> 1882 from 1k to 16k (Dao-AILab/flash-attention PR #2605;
    # kernel_throughput.md sec. 2): 0.66-0.71 of hdim 128, 0.68 in the middle. eff(d)
    # proportional to d / (d + d_half) gives 0.68 with d_half = 114, i.e. 6.75 per (TFLOP/s per
    # SM), scaled by throughput per SM as the GEMM shape law is (Hopper 51, Ampere 20).
    # FLASH_ATTENTION_EFFICIENCY holds at d = 128 (its in-step measurements are Llama heads).
    FLASH_ATTENTION_HEAD_HALF_DIM_PER_TFLOPS_PER_SM: float = 114.0 / (2500.0 / 148)
    FLASH_ATTENTION_REFERENCE_HEAD_DIM: float = 128.0

    # FP8 (Transformer Engine, Micikevicius et al. 2022 "FP8 Formats for Deep Learning",
    # arXiv 2209.05433): every FP8 GEMM input is produced by a fused cast-transpose kernel that
    # reads the bf16 tensor (2 B) and writes the FP8 tensor and its transpose (1 + 1 B): Hopper's FP8
    # tensor cores take only the TN layout, so the weight-gradient GEMM needs transposed copies
    # (TE ``cast_transpose``; NVIDIA TE user guide "Using FP8 with Transformer Engine"). 4 B of HBM
    # traffic per element, for the input in forward and for the output gradient in backward.
    FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT = 4.0
    # torchao's dynamic casts (torchtitan Float8; planner.cost.fp8): an amax reduction that reads
    # the 16-bit tensor (2 B), then the scaled cast that reads it again and writes FP8 (2 + 1 B):
    # torchao/float8/float8_scaling_utils.py hp_tensor_to_float8_dynamic (tensor_to_amax, then
    # hp_tensor_and_scale_to_float8). Inductor could fuse a row's reduction with its cast (3 B);
    # taken unfused for every recipe.
    TORCHAO_CAST_BYTES_PER_ELEMENT: float = 5.0
    # torch._scaled_mm with row-wise scales (a CUTLASS kernel in PyTorch, fast accumulation)
    # against the tensor-wise cuBLAS kernel on H100: "most shapes are within 90-100% of
    # tensor-wise efficiency, but there's a long tail going down to 50%" (pytorch/pytorch#147971,
    # Feb 2025): the lower end of the bulk.
    TORCHAO_ROWWISE_GEMM_EFFICIENCY: float = 0.9
    # TE keeps the bf16 (16-bit) weights as the parameters and caches an FP8 copy and its
    # transpose for the step (``is_first_microbatch`` caching in Megatron-core's TE layers):
    # +2 B per locally held parameter; with ZeRO-3/FSDP the copies exist only for gathered layers.
    FP8_WEIGHT_COPY_BYTES_PER_PARAM = 2.0
    # Inputs of FP8 linear layers are saved for backward in FP8 (1 B per element, TE saves the
    # quantised input, not the bf16 one); norms, residuals, attention Q/K/V/O, softmax statistics
    # and the SwiGLU input stay 16-bit (attention runs in BF16).
    FP8_ACTIVATION_BYTES = 1.0

    # Dropless MoE (MegaBlocks, Gale et al. 2022, arXiv 2211.15841; Megatron-core grouped GEMM)
    # computes every routed token, so the slowest expert-parallel rank sets the pace of the expert
    # GEMMs and of the all-to-all it receives. With load-balancing loss or DeepSeek-V3's
    # auxiliary-loss-free bias (arXiv 2412.19437 sec. 2.1.2; Wang et al. 2024, arXiv 2408.15664)
    # the most loaded rank carries a few to ~20% more than the mean per micro-batch. 1.1 is a
    # judgement in that range (no per-rank trace was read); with ep = 1 every GPU holds all experts
    # and the sum is exact (factor 1). A capacity factor (Fedus et al. 2021, Switch Transformer
    # sec. 2.2: capacity = tokens/experts x factor) replaces it: buffers are padded to capacity.
    MOE_DROPLESS_IMBALANCE: float = 1.1

    def replace(self, **values: float) -> "Constants":
        """A copy with ``values`` changed (unknown names raise TypeError)."""
        return replace(self, **values)

    def __repr__(self) -> str:
        """Only what differs from the published values: ``Constants(published)`` or the changes."""
        base = _published()
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) != getattr(base, f.name)]
        return "Constants(" + (", ".join(changed) if changed else "published") + ")"

    def flash_attention_efficiency(self, generation: str) -> float:
        return self.FLASH_ATTENTION_EFFICIENCY[generation]

    def as_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Mapping) else v
        return out


DEFAULT_CONSTANTS = Constants()


def _published() -> Constants:
    return DEFAULT_CONSTANTS

# The efficiencies ``planner calibrate`` may fit (dimensionless, in (0, 1]); the scale-out link
# efficiency is a property of the cluster (``InterNodeNetwork.efficiency``), fitted as
# ``INTER_NODE_EFFICIENCY`` and applied to the cluster, not to Constants.
FITTABLE = ("TRAINING_KERNEL_EFFICIENCY", "HBM_STREAM_EFFICIENCY", "COMM_COMPUTE_OVERLAP_EFFICIENCY", "INTER_NODE_EFFICIENCY")
