"""Memory per GPU, per pipeline stage: model states, activations, buffers, allocator reserve.

Model states (Rajbhandari et al. 2020, ZeRO, sec. 3.1: 2 + 2 + K bytes per parameter with
K = 12 for mixed-precision Adam; Megatron-LM ``docs/source/api-guide/dist_optimizer.md``:
bf16 parameters with fp32 main gradients take 6 + 12/d bytes per parameter under the
distributed optimizer):

    weights   2 B/param (16-bit), +2 B with FP8 (Transformer Engine's cached FP8 weight and
              its transpose; not persistent under ZeRO-3, where only gathered layers have them)
    gradients 4 B/param for bf16 (fp32 main grads), 2 B for fp16
    optimizer 12 B/param (fp32 master copy, Adam m and v)

ZeRO 1 shards the optimizer over the data-parallel group, 2 adds gradients, 3 adds weights.

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), sec. 4.1-4.2, eqs. 1-6:
``s b h (34 + 5 a s / h)`` bytes without parallelism, ``s b h (10 + 24/t + 5 a s/(h t))``
with tensor parallelism, ``s b h (34/t + 5 a s/(h t))`` with sequence parallelism too,
``s b h 34/t`` with selective recompute, ``2 s b h / t`` with full recompute. The code
itemises the same tensors so that GQA, SwiGLU, no-dropout models and flash attention (which
stores no s x s matrices, Dao et al. 2022) follow from the same list.

In-flight micro-batches: under 1F1B stage i holds min(p - i, m) of them (Narayanan et al.
2021 sec. 2.2.1); under interleaving rank r warms up (p - r - 1) 2 + (v - 1) p chunks, so
rank 0 holds p (1 + (p - 1)/(p v)) micro-batches' worth (Korthikanti 2022 sec. 4.2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.cost.constants import Constants
from planner.cost.flops import attn_proj_dims, embedding_params, layer_params, mlp_matrices
from planner.specs import ModelSpec

__all__ = [
    "grad_bytes",
    "StageMemory",
    "bytes_per_param",
    "grad_dtype",
    "activation_bytes_per_layer",
    "inflight_microbatches",
    "stage_params",
]


def grad_dtype(precision: str, grad_reduce: str = "auto") -> str:
    """The dtype gradients are held and reduced in. ``auto``: fp32 main gradients for bf16/fp8
    (Megatron-LM accumulates and reduces them in fp32 by default), fp16 for fp16
    (DeepSpeed/Megatron fp16); otherwise ``grad_reduce`` itself (``bf16``: Megatron
    ``--grad-reduce-in-bf16``)."""
    if grad_reduce == "auto":
        return "fp16" if precision == "fp16" else "fp32"
    return grad_reduce


def grad_bytes(precision: str, grad_reduce: str = "auto") -> float:
    """Bytes per gradient element held and reduced (:func:`grad_dtype`)."""
    return 4.0 if grad_dtype(precision, grad_reduce) == "fp32" else 2.0


@lru_cache(maxsize=4096)
def bytes_per_param(precision: str, zero: int, dp: int, grad_reduce: str, C: Constants) -> dict[str, float]:
    """Model-state bytes per parameter held by one GPU, after ZeRO sharding over ``dp``."""
    fp8 = C.FP8_WEIGHT_COPY_BYTES_PER_PARAM if precision == "fp8" else 0.0
    w = 2.0
    g = grad_bytes(precision, grad_reduce)
    o = 12.0
    return {
        "weights": w / dp if zero >= 3 else w + fp8,
        "gradients": g / dp if zero >= 2 else g,
        "optimizer": o / dp if zero >= 1 else o,
    }


@lru_cache(maxsize=65536)
def activation_bytes_per_layer(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    recompute: str,
    flash_attention: bool,
    moe_layer: bool = False,
    precision: str = "bf16",
    moe_load: float = 1.0,
    *,
    C: Constants,
) -> float:
    """Bytes one layer keeps for its backward pass, for one micro-batch, on one GPU.

    ``precision="fp8"``: the saved inputs of linear layers (QKV input, out-projection input,
    fc1 input, fc2 input) are FP8, 1 B per element (constants.FP8_ACTIVATION_BYTES); the
    attention output is kept in 16-bit as well because flash attention's backward reads it.
    ``moe_load``: routed-token multiplier of the busiest rank (compute.moe_load_factor).
    Context parallelism divides every term by ``cp`` (each rank holds s/cp tokens; Megatron-core
    context parallelism, Korthikanti's terms with s -> s/cp).
    """
    lin = C.FP8_ACTIVATION_BYTES if precision == "fp8" else 2.0
    s = seq_len / cp
    b = micro_batch
    h = model.hidden
    u = 1.0 / tp if sequence_parallel else 1.0
    if recompute == "full":
        return 2.0 * s * b * h * u  # only the layer input (Korthikanti sec. 4.3)
    qw, kvw = attn_proj_dims(model)
    dropout = model.bias  # GPT-era models train with dropout; Llama-era models do not
    a_loc = model.heads / tp
    sbh = s * b * h
    attn = 2 * sbh * u + lin * sbh * u  # norm input, QKV input (norm output)
    attn += 2 * s * b * (qw + kvw) / tp  # Q, K, V
    attn += 2 * s * b * qw / tp  # attention output (flash backward; = out-projection input in 16-bit)
    attn += s * b * qw / tp if precision == "fp8" else 0.0  # its FP8 copy saved by the out-projection
    attn += sbh * u if dropout else 0.0  # attention-output dropout mask
    if not flash_attention and recompute != "selective":
        attn += (5.0 if dropout else 2.0) * a_loc * s * seq_len * b  # softmax out, mask, dropout out
    elif flash_attention:
        attn += 4.0 * a_loc * s * b  # fp32 log-sum-exp per query row
    if model.moe is not None and moe_layer:
        moe = model.moe
        f = moe.expert_ffn_hidden * (moe.top_k * moe_load + moe.shared_experts) / tp
        mlp_in = lin * sbh * (moe.top_k * moe_load + 1) * u  # norm output + dispatched copies
    else:
        f = model.ffn_hidden / tp
        mlp_in = lin * sbh * u
    mlp = 2 * sbh * u + mlp_in  # norm input, fc1 input
    mlp += 2 * s * b * f * (2 if mlp_matrices(model) == 3 else 1)  # activation input(s)
    mlp += lin * s * b * f  # fc2 input
    mlp += sbh * u if dropout else 0.0
    return attn + mlp


def inflight_microbatches(stage: int, pp: int, vpp: int, num_microbatches: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak (in whole-stage units)."""
    if pp <= 1:
        return 1.0
    if vpp <= 1:
        return float(min(pp - stage, num_microbatches))
    chunks = (pp - stage - 1) * 2 + (vpp - 1) * pp + 1
    return min(chunks, num_microbatches * vpp) / vpp


def stage_params(model: ModelSpec, layers: int, stage: int, pp: int, tp: int, ep: int, n_dense: int,
                 etp: int | None = None) -> dict[str, float]:
    """Parameters one GPU of pipeline stage ``stage`` holds (tensor/expert shards).

    Layers are placed in order and the first ``model.dense_layers`` are dense
    (DeepSeek-V3 layout); ``n_dense`` is how many of this stage's layers are dense. Routed
    experts are sharded over ep x etp (expert tensor parallelism, default tp).
    """
    lp_d = layer_params(model, moe_layer=False)
    lp_m = layer_params(model, moe_layer=True) if model.moe else lp_d
    n_moe = layers - n_dense
    shard = lambda lp: lp["attention"] / tp + lp["mlp"] / tp + lp["norms"] + lp["router"]  # noqa: E731
    out = {"layers": n_dense * shard(lp_d) + n_moe * shard(lp_m), "experts": n_moe * lp_m["experts"] / ((etp or tp) * ep)}
    emb = embedding_params(model)
    out["embedding"] = emb["embedding"] / tp if stage == 0 else 0.0
    if stage == pp - 1:
        out["output"] = (emb["output"] or (emb["embedding"] if pp > 1 else 0)) / tp + emb["final_norm"]
    else:
        out["output"] = 0.0
    return out


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU on one pipeline stage."""

    stage: int
    layers: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    buffers_bytes: float
    reserve_bytes: float

    @property
    def model_states_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.model_states_bytes + self.activations_bytes + self.logits_bytes + self.buffers_bytes + self.reserve_bytes

    def as_dict(self) -> dict:
        return {
            "stage": self.stage, "layers": self.layers,
            "weights_bytes": self.weights_bytes, "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
            "logits_bytes": self.logits_bytes, "buffers_bytes": self.buffers_bytes,
            "reserve_bytes": self.reserve_bytes, "total_bytes": self.total_bytes,
        }


