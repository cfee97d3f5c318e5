"""Frozen, typed specifications: model, GPU, cluster, job and parallel configuration.

All quantities are SI inside (bytes, seconds, FLOP/s, bytes/s). Conversions from the
units people write in files (GB, GiB, Gb/s, TFLOP/s) happen in :mod:`planner.io.loaders`,
once, at the edge. Every constructor validates its own invariants and raises
:class:`planner.errors.InputError` naming the field, the value and what was expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from planner.errors import InputError

__all__ = [
    "MoESpec",
    "ModelSpec",
    "GpuSpec",
    "IntraNodeLink",
    "InterNodeNetwork",
    "ClusterSpec",
    "Job",
    "job_options",
    "JOB_OPTIONS",
    "ParallelConfig",
    "MLP_KINDS",
    "PRECISIONS",
    "FP8_RECIPES",
    "RECOMPUTE_KINDS",
    "SCHEDULES",
    "ATTENTION_KINDS",
    "FLASH_KINDS",
    "is_flash",
    "positions_note",
    "MOE_DISPATCHERS",
    "CUDA_GRAPHS",
    "ENGINE_FIELDS",
    "Tier",
]

MLP_KINDS = ("gelu", "swiglu", "relu2")
PRECISIONS = ("fp16", "bf16", "fp8")
GRAD_REDUCE = ("auto", "fp32", "bf16")
# FP8 scaling recipes, as the engines name them: Transformer Engine's through Megatron-core
# --fp8-recipe (delayed, tensorwise = per-tensor current scaling, mxfp8 = 1x32 blocks with E8M0
# scales on Blackwell, blockwise = 1x128 / 128x128 blocks) and torchao's through torchtitan's
# quantize.linear.float8.recipe_name (tensorwise, rowwise, rowwise_with_gw_hp); "auto" = the
# engine's default.
# How the loss's cross-entropy runs ("auto": the engine's default; planner.engines.profile.Engine.loss_kernels):
# Megatron's vocab-parallel cross entropy eager ("unfused"), under --cross-entropy-loss-fusion
# ("native", jit-fused; "te", Transformer Engine's Triton kernel), or PyTorch's F.cross_entropy on
# fp32 logits ("torch": torchtitan, Hugging Face models under DeepSpeed; "compiled": the same under
# torch.compile, torchtitan's compile.components with "loss").
CROSS_ENTROPY = ("auto", "unfused", "native", "te", "torch", "compiled")
FP8_RECIPES = ("auto", "delayed", "tensorwise", "mxfp8", "blockwise", "rowwise", "rowwise_with_gw_hp")
RECOMPUTE_KINDS = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2", "zb-v", "dualpipe")
# Attention kernels: "flash" is the engine's fused flash-style kernel for the GPU (FA3 / cuDNN on
# Hopper, FA4 / cuDNN on Blackwell, FlashAttention-2 on Ampere); "fa2" pins FlashAttention-2's
# kernels (the Ampere design: no TMA or warp-specialised WGMMA on Hopper), which PyTorch SDPA's
# default flash backend ran on Hopper until cuDNN came first (torchtitan before Oct 2025,
# pytorch/pytorch#142132) and Megatron-DeepSpeed's --use-flash-attn-v2 runs; "fa1" the first
# FlashAttention (flash-attn 1.x: Megatron-DeepSpeed's --use-flash-attn / --use-flash-attn-v1,
# the 2022 flash-attention training code); "unfused" the materialised s x s scores (Megatron's
# fused scale-mask-softmax).
ATTENTION_KINDS = ("flash", "fa2", "fa1", "unfused")
FLASH_KINDS = ("flash", "fa2", "fa1")  # flash-style: O(s) memory, tiled on chip
# What an engine with flash attention runs unless its profile lists its kernels (features.attention_kernels):
# flash-attn 1.x is only where a profile names it.
DEFAULT_ATTENTION_KERNELS = ("flash", "fa2", "unfused")


def positions_note(model: "ModelSpec", seq_len: int) -> str | None:
    """A note when ``seq_len`` is longer than the positions ``model`` was trained for, else None."""
    if model.max_seq_len is None or seq_len <= model.max_seq_len:
        return None
    how = ("its learned position embeddings stop there" if model.position_embedding == "learned"
           else "rotary positions that far need scaling or continued training")
    return (f"sequence {seq_len} is longer than {model.name}'s {model.max_seq_len} positions (max_seq_len): priced as given, "
            f"but {how}")


def is_flash(attention: str | None) -> bool:
    """Whether ``attention`` is a flash-style kernel (``flash``, ``fa2`` or ``fa1``)."""
    return attention in FLASH_KINDS
# MoE token dispatchers: the all-to-all one (a copy per routed expert) and Megatron-core's flex
# dispatcher with the DeepEP or HybridEP kernels (a copy per destination rank and node).
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
# CUDA-graph capture (Megatron-core --cuda-graph-impl): none, each transformer layer's forward
# and backward (local, whole layer), or the whole forward-backward step (full_iteration)
CUDA_GRAPHS = ("none", "layer", "full_iteration")
INTRA_KINDS = ("nvswitch", "nvlink", "pcie", "xgmi")
INTER_KINDS = ("infiniband", "roce", "ethernet", "omnipath", "none")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(name, value, "a positive integer")
    return value


def _positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(name, value, "a positive finite number")
    return float(value)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(name, value, "one of " + ", ".join(choices))
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts block (Fedus et al. 2021; DeepSeek-V3 report arXiv 2412.19437 sec. 2.1.2).

    >>> MoESpec(experts=8, top_k=2, expert_ffn_hidden=14336).capacity_factor is None   # dropless
    True
    """

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None  # None = dropless (token routing without drops)

    def __post_init__(self) -> None:
        _positive_int("model.moe.experts", self.experts)
        _positive_int("model.moe.top_k", self.top_k)
        _positive_int("model.moe.expert_ffn_hidden", self.expert_ffn_hidden)
        if self.top_k > self.experts:
            raise InputError("model.moe.top_k", self.top_k, f"at most experts ({self.experts})")
        if self.shared_experts < 0:
            raise InputError("model.moe.shared_experts", self.shared_experts, "a non-negative integer")
        if self.dense_layers < 0:
            raise InputError("model.moe.dense_layers", self.dense_layers, "a non-negative integer")
        if self.capacity_factor is not None:
            _positive_float("model.moe.capacity_factor", self.capacity_factor)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    ``kv_heads`` < ``heads`` is grouped-query attention (Ainslie et al. 2023);
    ``mlp`` selects two-matrix GeLU / squared-ReLU or three-matrix SwiGLU (Shazeer 2020).
    ``q_lora_rank``/``kv_lora_rank`` > 0 selects multi-head latent attention (DeepSeek-V2/V3).

    >>> m = ModelSpec(name="tiny", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=1024, vocab=1000, norm="rmsnorm")
    >>> m.head_dim, m.position_embedding
    (64, 'rope')
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    mlp: str = "gelu"
    tied_embeddings: bool = True
    head_dim: int | None = None
    moe: MoESpec | None = None
    bias: bool = True  # linear-layer biases (GPT-2/3, BLOOM, OPT) vs none (Llama)
    norm: str = "layernorm"  # layernorm | rmsnorm
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    position_embedding: str | None = None  # rope | learned; None: rope for RMSNorm (Llama-family) models, learned for GPT
    rope_theta: float | None = None  # rotary base (Llama 3: 500000); None: the model family's default is unknown
    # Multi-token prediction modules after the last layer (DeepSeek-V3 sec. 2.2, depth D = 1;
    # Megatron-core --mtp-num-layers): each is an embedding + hidden norm, a 2h -> h projection,
    # one transformer layer and the shared output head with its own loss.
    mtp_layers: int = 0
    # RMS norms on the query and key heads before the rotary embedding (Qwen3, OLMo 2: Megatron
    # --qk-layernorm), written to the launch files; not priced (two per-head norms, well under 1%
    # of a layer's time)
    qk_norm: bool = False
    source: str = ""
    # The sequence length the model's positions were trained for (a preset's max_seq_len, a Hugging
    # Face config's max_position_embeddings); None: unknown. A longer job is priced as given, with a
    # note (learned positions stop there; rotary ones need scaling or continued training).
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab"):
            _positive_int(f"model.{f}", getattr(self, f))
        if self.max_seq_len is not None:
            _positive_int("model.max_seq_len", self.max_seq_len)
        _choice("model.mlp", self.mlp, MLP_KINDS)
        _choice("model.norm", self.norm, ("layernorm", "rmsnorm"))
        if self.position_embedding is None:
            object.__setattr__(self, "position_embedding", "rope" if self.norm == "rmsnorm" else "learned")
        _choice("model.position_embedding", self.position_embedding, ("rope", "learned"))
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or not 0 <= self.mtp_layers <= 16:
            raise InputError("model.mtp_layers", self.mtp_layers, "an integer from 0 to 16")
        if self.rope_theta is not None:
            _positive_float("model.rope_theta", self.rope_theta)
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise InputError("model.heads", self.heads, f"a divisor of hidden ({self.hidden}) or an explicit head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        else:
            _positive_int("model.head_dim", self.head_dim)
        if self.heads % self.kv_heads:
            raise InputError("model.kv_heads", self.kv_heads, f"a divisor of heads ({self.heads})")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise InputError("model.moe.dense_layers", self.moe.dense_layers, f"at most layers ({self.layers})")
        if self.layers > 100_000 or self.hidden > 10_000_000 or self.vocab > 100_000_000:
            raise InputError("model", f"layers={self.layers}, hidden={self.hidden}", "a plausible transformer size")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """MoE layers: all but the first ``moe.dense_layers`` (DeepSeek-V3's layout)."""
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: the first ones (all of them in a dense model)."""
        return self.layers - self.moe_layers


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. Peaks are dense (no sparsity) FLOP/s per precision.

    >>> from planner import load_gpu
    >>> g = load_gpu("h100-sxm5-80gb")
    >>> g.peak("bf16") / 1e12, round(g.memory_bytes / 2**30, 1)
    (989.0, 79.6)
    """

    id: str
    name: str
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float] = field(hash=False)  # keys: fp16, bf16, fp8, tf32
    matmul_ceiling: dict[str, float] = field(hash=False)  # best achievable matmul / dense peak (MAMF)
    nvlink_bandwidth_bytes_per_s: float  # per GPU, per direction (0 for PCIe-only parts)
    intra_node: str = "nvswitch"
    nvlink_generation: int = 0
    gpus_per_node: int = 8
    nvlink_domain: int = 0  # GPUs one scale-up (NVLink switch) domain joins; 0 = one node (gpus_per_node)
    sm_count: int = 108
    tdp_w: float = 400.0
    sources: tuple[str, ...] = ()
    mx_formats: bool = False  # tensor cores with OCP microscaling (MXFP8) operands: Blackwell (sm_100)
    # the scale-out network of the vendor's reference node for this GPU ((kind, Gb/s per NIC, NICs
    # per node); DGX A100: 8 x 200 Gb/s HDR): a cluster's default when none is given; None: 8 x 400 Gb/s
    scale_out: tuple | None = None

    def __post_init__(self) -> None:
        _positive_float(f"gpu[{self.id}].memory_bytes", self.memory_bytes)
        _positive_float(f"gpu[{self.id}].hbm_bandwidth_bytes_per_s", self.hbm_bandwidth_bytes_per_s)
        _choice(f"gpu[{self.id}].intra_node", self.intra_node, INTRA_KINDS)
        if not {"fp16", "bf16"} & set(self.peak_flops):  # Volta has fp16 only; every later GPU both
            raise InputError(f"gpu[{self.id}].peak_flops", sorted(self.peak_flops), "a 16-bit (fp16 or bf16) peak")

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for the matmul precision; one the GPU has none for falls back to its
        16-bit peak (bf16, or fp16 on a GPU without bf16), the reference of MFU. Which precisions a
        job may use is the keys of ``peak_flops`` (planner.cost.rules)."""
        return self.peak_flops.get(precision) or self.peak_flops.get("bf16") or self.peak_flops["fp16"]

    def ceiling(self, precision: str) -> float:
        return self.matmul_ceiling.get(precision) or self.matmul_ceiling.get("bf16") or self.matmul_ceiling.get("fp16", 0.8)


@dataclass(frozen=True)
class IntraNodeLink:
    """The scale-up domain: NVLink/NVSwitch (or PCIe) among ``domain_size`` GPUs.

    ``bandwidth_bytes_per_s`` is per GPU per direction (the figure NCCL's bus bandwidth
    approaches); ``efficiency`` is the usable fraction that NCCL reaches on large messages.
    """

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float
    domain_size: int

    def __post_init__(self) -> None:
        _choice("cluster.intra_node.kind", self.kind, INTRA_KINDS)
        _positive_float("cluster.intra_node.bandwidth", self.bandwidth_bytes_per_s)
        _positive_int("cluster.intra_node.domain_size", self.domain_size)
        if not 0 < self.efficiency <= 1:
            raise InputError("cluster.intra_node.efficiency", self.efficiency, "a fraction in (0, 1]")

    @property
    def usable_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


@dataclass(frozen=True)
class InterNodeNetwork:
    """The scale-out network: ``nics_per_node`` NICs of ``gbps_per_nic`` each.

    ``oversubscription`` >= 1 divides the bandwidth available to traffic that crosses
    the spine (1 = non-blocking fat tree).
    """

    kind: str
    gbps_per_nic: float
    nics_per_node: int
    latency_s: float
    efficiency: float
    oversubscription: float = 1.0
    rail_optimized: bool = True

    def __post_init__(self) -> None:
        _choice("hardware.inter_node.kind", self.kind, INTER_KINDS)
        _positive_float("hardware.inter_node.gbps_per_nic", self.gbps_per_nic)
        _positive_int("hardware.inter_node.nics_per_node", self.nics_per_node)
        if not 0 < self.efficiency <= 1:
            raise InputError("hardware.inter_node.efficiency", self.efficiency, "a fraction in (0, 1]")
        if not (self.oversubscription >= 1 and math.isfinite(self.oversubscription)):
            raise InputError("hardware.inter_node.oversubscription", self.oversubscription, "a ratio >= 1")

    @property
    def node_bytes_per_s(self) -> float:
        """Usable bytes/s per node, per direction."""
        return self.gbps_per_nic * 1e9 / 8 * self.nics_per_node * self.efficiency / self.oversubscription


@dataclass(frozen=True)
class Tier:
    """One switch tier of the scale-out network: ``nodes`` under one switch (None = all), and
    its downlink:uplink ratio (planner.cost.network has the model)."""

    name: str
    nodes: int | None
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError("inter_node.tiers[].name", self.name, "a non-empty string")
        if self.nodes is not None and (isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1):
            raise InputError(f"inter_node.tiers[{self.name}].nodes", self.nodes, "a positive integer or omitted")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) or o < 1:
            raise InputError(f"inter_node.tiers[{self.name}].oversubscription", o, "a ratio >= 1")


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs, nodes and the two levels of links (scale-up domain, scale-out network).

    >>> from planner import make_cluster
    >>> c = make_cluster("h100-sxm5-80gb", 64)
    >>> c.num_nodes, c.nvlink_domain, c.inter.kind
    (8, 8, 'infiniband')
    """

    name: str
    gpu: GpuSpec
    num_gpus: int
    gpus_per_node: int
    intra: IntraNodeLink
    inter: InterNodeNetwork
    # Switch tiers above the nodes (Tier), bottom up; empty = one flat
    # tier carrying inter.oversubscription.
    tiers: tuple[Tier, ...] = ()
    # Fixed cost of one collective call above its per-step latencies (NCCL's launch and set-up;
    # planner.cost.constants.NCCL_CALL_LATENCY_S by default).
    collective_latency_s: float = 38e-6

    def __post_init__(self) -> None:
        _positive_int("hardware.num_gpus", self.num_gpus)
        _positive_int("hardware.gpus_per_node", self.gpus_per_node)
        if self.num_gpus > 10_000_000:
            raise InputError("hardware.num_gpus", self.num_gpus, "at most 10,000,000")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise InputError(
                "hardware.num_gpus", self.num_gpus, f"a multiple of gpus_per_node ({self.gpus_per_node})"
            )

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def nvlink_domain(self) -> int:
        """GPUs that reach each other over the scale-up fabric."""
        return min(self.num_gpus, max(self.gpus_per_node, self.intra.domain_size))

    def with_gpus(self, num_gpus: int) -> "ClusterSpec":
        return replace(self, num_gpus=num_gpus)


@dataclass(frozen=True)
class Job:
    """What one optimizer step processes: sequence length, sequences per step, precision.

    >>> Job(seq_len=8192, global_batch_size=256).tokens_per_step
    2097152
    """

    seq_len: int
    global_batch_size: int  # sequences per optimizer step
    precision: str = "bf16"
    # Gradient accumulation and reduction dtype: "auto" = the engines' default (fp16 gradients for
    # fp16 runs; fp32 main gradients for bf16/fp8, Megatron-LM's default), "fp32", or "bf16"
    # (Megatron --grad-reduce-in-bf16; NeMo's FP8 performance recipes).
    grad_reduce: str = "auto"
    # FP8 scaling recipe (FP8_RECIPES; "auto": the engine's default; only with precision fp8).
    fp8_recipe: str = "auto"
    # Whether FSDP all-gathers the linear weights in FP8 (torchao tensor-wise
    # enable_fsdp_float8_all_gather); None: what the engine's launch does for the recipe.
    fp8_param_gather: bool | None = None
    # Whether tensor parallelism all-gathers the activations in FP8 (torchao's Float8 TP styles with
    # the tensor-wise recipe: torchtitan before its converter became quantize.linear.float8, whose
    # apply_tp tests '"float8" in model.converters'); None: what the engine does (bf16 on every
    # engine the planner describes).
    fp8_tp_gather: bool | None = None
    # The loss's cross-entropy kernels (CROSS_ENTROPY; "auto": the engine's default).
    cross_entropy: str = "auto"

    def __post_init__(self) -> None:
        _positive_int("job.seq_len", self.seq_len)
        _positive_int("job.global_batch_size", self.global_batch_size)
        _choice("job.precision", self.precision, PRECISIONS)
        _choice("job.grad_reduce", self.grad_reduce, GRAD_REDUCE)
        _choice("job.fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        _choice("job.cross_entropy", self.cross_entropy, CROSS_ENTROPY)
        if self.fp8_recipe != "auto" and self.precision != "fp8":
            raise InputError("job.fp8_recipe", self.fp8_recipe, f"auto for a 16-bit ({self.precision}) run (a scaling recipe needs precision fp8)")
        for k in ("fp8_param_gather", "fp8_tp_gather"):
            v = getattr(self, k)
            if v is not None and not isinstance(v, bool):
                raise InputError(f"job.{k}", v, "true or false (or unset)")
            if v and self.precision != "fp8":
                raise InputError(f"job.{k}", v, f"false or unset for a {self.precision} run (FP8 gathers need precision fp8)")
        if self.grad_reduce == "bf16" and self.precision == "fp16":
            raise InputError("job.grad_reduce", self.grad_reduce, "auto or fp32 for an fp16 run (bf16 gradients need bf16 or fp8 training)")
        if self.seq_len > 16_777_216:
            raise InputError("job.seq_len", self.seq_len, "at most 16M tokens")
        if self.global_batch_size > 16_777_216:
            raise InputError("job.global_batch_size", self.global_batch_size, "at most 16,777,216 sequences per step")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size

    def as_dict(self) -> dict:
        """The job block of the planner's JSON documents (plan, check), every field."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# Job fields a job block may leave null (unknown: Job's default), after precision and grad_reduce.
JOB_OPTIONS = ("fp8_recipe", "fp8_param_gather", "fp8_tp_gather", "cross_entropy")


def job_options(block: dict) -> dict:
    """The optional Job fields a job block of a runs file or plan document gives (precision,
    grad_reduce and JOB_OPTIONS); Job's own defaults fill the rest."""
    out = {k: block[k] for k in ("precision", "grad_reduce") if k in block}
    out.update({k: block[k] for k in JOB_OPTIONS if block.get(k) is not None})  # null: unknown, the defaults
    return out


@dataclass(frozen=True)
class ParallelConfig:
    """One parallel configuration, in Megatron-LM's vocabulary.

    Degrees: ``tp``, ``pp``, ``cp``, ``ep`` (default 1) and ``dp`` (``None``: the rest of the
    GPUs, ``num_gpus / (tp pp cp)``). ``zero``: 0 none, 1 optimizer states sharded over data
    parallel (Megatron's distributed optimizer), 2 adds gradients, 3 adds parameters (ZeRO-3 /
    FSDP); how each stage communicates is the engine's (:mod:`planner.engines`).
    ``vpp``: virtual pipeline stages per rank (interleaved 1F1B when > 1; with ``schedule="1f1b"``
    refused, as the CLI refuses ``--schedule 1f1b --vpp N``).
    ``layers_per_stage``: explicit split of transformer layers over pipeline stages.

    Every field left ``None`` is the engine's default (:func:`planner.engines.resolve`): the
    setting the planner's launch files for that engine use. :func:`planner.estimate` resolves
    them and reports which it filled (``Estimate.resolved``); a resolved configuration has no
    ``None`` left (``is_resolved``).

    >>> ParallelConfig(tp=8, pp=4, dp=2).vpp is None
    True
    >>> ParallelConfig(tp=8, pp=4, dp=2, vpp=2).schedule
    'interleaved'
    """

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    ep: int = 1
    vpp: int | None = None
    micro_batch_size: int = 1
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    layers_per_stage: tuple[int, ...] | None = None
    schedule: str | None = None
    zero_shard_degree: int | None = None
    overlap_grad_reduce: bool | None = None  # bucketed gradient reduction overlapped with backward
    tp_comm_overlap: bool | None = None  # TP all-gather/reduce-scatter pipelined with GEMMs (needs SP)
    async_tp_allreduce: bool | None = None  # backward TP all-reduce overlapped with the weight-gradient GEMM
    overlap_param_gather: bool | None = None  # ZeRO 1/2 weight all-gather overlapped with the next forward
    attention: str | None = None  # flash | fa2 | fa1 | unfused (ATTENTION_KINDS)
    etp: int | None = None  # expert tensor parallelism (Megatron --expert-tensor-parallel-size); None: tp, or 1 where ep spans tp
    # Megatron-core --overlap-moe-expert-parallel-comm: the expert all-to-all of one micro-batch
    # overlapped with another's compute (combined 1F1B); None: the engine's default where it runs
    moe_a2a_overlap: bool | None = None
    # MoE token dispatcher: alltoall | deepep | hybridep (Megatron-core --moe-token-dispatcher-type
    # flex --moe-flex-dispatcher-backend); None: the engine's all-to-all
    moe_dispatcher: str | None = None
    # CUDA graphs: none | layer | full_iteration (Megatron-core --cuda-graph-impl local |
    # full_iteration); None: the engine's default (none)
    cuda_graph: str | None = None

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "cp", "ep", "micro_batch_size"):
            _positive_int(f"parallel.{f}", getattr(self, f))
        for f in ("dp", "vpp", "zero_shard_degree", "etp"):
            if getattr(self, f) is not None:
                _positive_int(f"parallel.{f}", getattr(self, f))
        if self.recompute is not None:
            _choice("parallel.recompute", self.recompute, RECOMPUTE_KINDS)
        if self.schedule is not None:
            _choice("parallel.schedule", self.schedule, SCHEDULES)
        if self.attention is not None:
            _choice("parallel.attention", self.attention, ATTENTION_KINDS)
        if self.moe_dispatcher is not None:
            _choice("parallel.moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS)
        if self.cuda_graph is not None:
            _choice("parallel.cuda_graph", self.cuda_graph, CUDA_GRAPHS)
        if self.zero is not None and (isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3)):
            raise InputError("parallel.zero", self.zero, "0, 1, 2 or 3")
        for f in ("sequence_parallel", "overlap_grad_reduce", "tp_comm_overlap", "async_tp_allreduce", "overlap_param_gather",
                  "moe_a2a_overlap"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise InputError(f"parallel.{f}", v, "true, false or null")
        if self.layers_per_stage is not None:
            lps = tuple(self.layers_per_stage)
            if len(lps) != self.pp or any(isinstance(n, bool) or (not isinstance(n, int)) or n < 0 for n in lps):
                raise InputError("parallel.layers_per_stage", list(lps), f"{self.pp} non-negative integers (one per stage)")
            object.__setattr__(self, "layers_per_stage", lps)
        if self.vpp is not None and self.vpp > 1 and self.schedule == "1f1b":
            # as the CLI refuses --schedule 1f1b --vpp N: virtual stages are the interleaved schedule
            raise InputError("parallel.schedule", "1f1b", f"interleaved with vpp {self.vpp} (or vpp 1 for 1F1B)")
        if self.vpp is not None and self.vpp > 1 and self.schedule is None:
            object.__setattr__(self, "schedule", "interleaved")

    @property
    def is_resolved(self) -> bool:
        """No field is left to the engine (``layers_per_stage``/``zero_shard_degree`` may stay None)."""
        return all(getattr(self, f) is not None for f in ENGINE_FIELDS + ("dp",))

    def _dp(self) -> int:
        if self.dp is None:
            raise InputError("parallel.dp", None, "a data-parallel degree (resolve the configuration first: planner.engines.resolve)")
        return self.dp

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def world(self) -> int:
        return self.tp * self.pp * self._dp() * self.cp

    def num_microbatches(self, global_batch_size: int) -> int:
        return max(1, global_batch_size // (self.micro_batch_size * self._dp()))

    def replace(self, **changes) -> "ParallelConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep,
            "vpp": self.vpp, "micro_batch_size": self.micro_batch_size,
            "recompute": self.recompute, "sequence_parallel": self.sequence_parallel,
            "zero": self.zero, "schedule": self.schedule, "tp_comm_overlap": self.tp_comm_overlap, "async_tp_allreduce": self.async_tp_allreduce,
            "overlap_grad_reduce": self.overlap_grad_reduce, "overlap_param_gather": self.overlap_param_gather,
            "attention": self.attention, "etp": self.etp, "moe_a2a_overlap": self.moe_a2a_overlap,
            "moe_dispatcher": self.moe_dispatcher, "cuda_graph": self.cuda_graph,
            "layers_per_stage": list(self.layers_per_stage) if self.layers_per_stage else None,
            "zero_shard_degree": self.zero_shard_degree,
        }

    def short(self) -> str:
        """One line: ``tp8 pp4 dp2 cp1 vpp2 mb1 selective z1`` (then the MoE dispatcher and the
        CUDA graphs where they are not the defaults: ``hybridep``, ``graph=layer``)."""
        extra = f" {self.moe_dispatcher}" if self.moe_dispatcher not in (None, "alltoall") else ""
        extra += f" graph={self.cuda_graph}" if self.cuda_graph not in (None, "none") else ""
        return (f"tp{self.tp} pp{self.pp} dp{self.dp} cp{self.cp}" + (f" ep{self.ep}" if self.ep > 1 else "")
                + f" vpp{self.vpp} mb{self.micro_batch_size} {self.recompute} z{self.zero}" + extra)

    def __repr__(self) -> str:
        quiet = {"cp": 1, "ep": 1, "moe_dispatcher": "alltoall", "cuda_graph": "none", "moe_a2a_overlap": False}  # defaults a reader need not see
        d = self.as_dict()
        if d.get("ep") == 1:
            d.pop("etp", None)  # no experts to shard
        set_fields = ", ".join(f"{k}={v!r}" for k, v in d.items() if v is not None and quiet.get(k, object()) != v)
        return f"ParallelConfig({set_fields})"


# Fields whose None means "the engine's default" (planner.engines.resolve).
ENGINE_FIELDS = ("vpp", "recompute", "sequence_parallel", "zero", "schedule", "overlap_grad_reduce", "tp_comm_overlap",
                 "async_tp_allreduce", "overlap_param_gather", "attention", "etp", "moe_a2a_overlap", "moe_dispatcher", "cuda_graph")
