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
0.84
>>> DEFAULT_CONSTANTS.replace(TRAINING_KERNEL_EFFICIENCY=0.7).TRAINING_KERNEL_EFFICIENCY
0.7
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

__all__ = ["Constants", "DEFAULT_CONSTANTS", "LINK_DEFAULTS", "FITTABLE"]

# --- Links ------------------------------------------------------------------------------
# Per kind: (per-step latency alpha in seconds, usable fraction of the nominal per-direction
# bandwidth for large messages).
# * NVLink/NVSwitch: nccl-tests all_reduce_perf on DGX A100 reaches ~230 GB/s bus bandwidth at
#   1 GiB on 8 GPUs against 300 GB/s per direction (vTrain's A100 NCCL tables,
#   ../shared/validation/VTRAIN.md: 229 GB/s) -> 0.77; NCCL's per-hop NVLink latency is ~1 us
#   (NCCL src/graph/tuning.cc hwLat for NVLink, LL128 protocol ~0.6-1.0 us).
# * InfiniBand: NCCL reaches ~90-93% of line rate on HDR/NDR (nccl-tests inter-node bus
#   bandwidth ~23 GB/s per 200 Gb/s NIC); NCCL's network latency per step ~5 us
#   (tuning.cc: baseLat + hwLat[NET] ~ 5-8 us for ring).
# * RoCE: same NICs, slightly lower efficiency (congestion control, PFC); ~0.85.
# * Ethernet (TCP sockets, no RDMA): ~60% of line rate and ~20 us latency (NCCL socket
#   transport; cloud VMs without EFA/GPUDirect).
# * PCIe Gen4 x16: 32 GB/s per direction nominal, ~0.75 usable through the host bridge.
LINK_DEFAULTS: Mapping[str, tuple[float, float]] = MappingProxyType({
    "nvswitch": (1.0e-6, 0.77),
    "nvlink": (1.0e-6, 0.77),
    "xgmi": (1.5e-6, 0.70),
    "pcie": (3.0e-6, 0.75),
    "infiniband": (5.0e-6, 0.92),
    "omnipath": (6.0e-6, 0.85),
    "roce": (6.0e-6, 0.85),
    "ethernet": (2.0e-5, 0.60),
    "none": (5.0e-6, 0.92),
})


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
    # on average; ``planner calibrate`` refits it for a user's cluster.
    TRAINING_KERNEL_EFFICIENCY: float = 0.84

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

    # --- Memory ------------------------------------------------------------------------------
    # PyTorch's caching allocator keeps freed blocks; fragmentation typically costs 5-15% on top of
    # what is allocated (Megatron/torch memory reports: max_reserved / max_allocated ~1.05-1.15).
    # Only memory that is allocated and freed during the step fragments: activations, logits and
    # ZeRO-3's gathered layers. Model states sit in buffers allocated once at start-up (Megatron-core
    # ParamAndGradBuffer and the distributed optimizer's shards; DeepSpeed's flat fp16/fp32
    # partitions with contiguous_gradients; PyTorch DDP's gradient buckets), so the reserve is 10%
    # of the dynamic bytes only. Charging it on the model states too rejected layouts that NVIDIA
    # runs in production (NeMo's H100 Nemotron-4 340B pre-training config, TP8/PP8/VP12 without
    # recompute, needs 76.7 GiB of states, activations and buffers by this model: 96% of 79.6 GiB).
    ALLOCATOR_RESERVE_FRACTION: float = 0.10
    # CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: ~1.5-3 GiB per GPU in practice
    # (CUDA context ~0.5-0.8 GiB; NCCL channel buffers 4 MiB x channels x peers; cuBLAS workspace).
    FRAMEWORK_BUFFER_BYTES: float = 2.5 * 2**30

    # --- Overlap -----------------------------------------------------------------------------
    # Megatron overlaps the backward TP all-reduce of the input gradient with the weight-gradient
    # GEMM (Korthikanti et al. 2022 sec. 5: that overlap is why full recompute costs 39%, not 33%).
    TP_BWD_OVERLAP_FRACTION: float = 0.5
    # When communication runs concurrently with compute (prefetched ZeRO-3 gathers, bucketed
    # gradient reduction), both compete for SMs and HBM; only this fraction of the shorter of
    # the two is hidden: exposed = comm + compute - eta * min(comm, compute). Calibrated on the
    # ZeRO-3 rows of Narayanan et al. 2021 Table 2 (the only published runs here where the
    # overlap dominates) and shared by every overlap in the model.
    COMM_COMPUTE_OVERLAP_EFFICIENCY: float = 0.6


    # --- Optimizer ---------------------------------------------------------------------------
    # Fused Adam with fp32 master weights and two fp32 moments: reads and writes 12 B of state
    # plus the gradient and the 16-bit weight copy: ~28-30 B of HBM traffic per locally held
    # parameter (kernel_throughput.md sec. 5.9, derived).
    OPTIMIZER_BYTES_PER_PARAM: float = 30.0

    # Per-step fixed cost outside the layers (data loader, logging, loss scaling checks, grad
    # norm all-reduce launch): a few ms in Megatron logs.
    STEP_OVERHEAD_S: float = 0.02


    # --- Modern training: FP8, context parallelism, MoE, long context (docs/cost_model_modern.md) --
    # Flash-attention efficiency rises with the key/value length a kernel call sees and saturates:
    # FA3 fwd, hdim 128, B*S = 16k, on Hopper: 430 / 517 / 566 / 590 / 614 / 621 TFLOP/s at
    # s = 512 / 1k / 2k / 4k / 8k / 16k (pytorch/benchmark PR #2391; kernel_throughput.md sec. 2).
    # eff(s) proportional to s / (s + s_half) reproduces the ratios to 8k (0.70 0.84 0.92 0.96) with
    # s_half = 220 tokens (0.72 0.85 0.93 0.97 at 512, 1K, 2K, 4K). FLASH_ATTENTION_EFFICIENCY holds at the reference
    # length 8192 (the in-step H200 measurement), so eff(s) = table * f(s) / f(8192).
    FLASH_ATTENTION_SEQ_HALF: float = 220.0
    FLASH_ATTENTION_REFERENCE_SEQ: float = 8192.0

    # FP8 (Transformer Engine, Micikevicius et al. 2022 "FP8 Formats for Deep Learning",
    # arXiv 2209.05433): every FP8 GEMM input is produced by a fused cast-transpose kernel that
    # reads the bf16 tensor (2 B) and writes the FP8 tensor and its transpose (1 + 1 B): Hopper's FP8
    # tensor cores take only the TN layout, so the weight-gradient GEMM needs transposed copies
    # (TE ``cast_transpose``; NVIDIA TE user guide "Using FP8 with Transformer Engine"). 4 B of HBM
    # traffic per element, for the input in forward and for the output gradient in backward.
    FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT = 4.0
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

    def flash_attention_efficiency(self, generation: str) -> float:
        return self.FLASH_ATTENTION_EFFICIENCY[generation]

    def as_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Mapping) else v
        return out


DEFAULT_CONSTANTS = Constants()

# The efficiencies ``planner calibrate`` may fit (dimensionless, in (0, 1]); the scale-out link
# efficiency is a property of the cluster (``InterNodeNetwork.efficiency``), fitted as
# ``INTER_NODE_EFFICIENCY`` and applied to the cluster, not to Constants.
FITTABLE = ("TRAINING_KERNEL_EFFICIENCY", "HBM_STREAM_EFFICIENCY", "COMM_COMPUTE_OVERLAP_EFFICIENCY", "INTER_NODE_EFFICIENCY")
