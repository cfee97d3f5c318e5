"""Memory per GPU, per pipeline stage, term by term from the engine's own behaviour.

Every term is a formula with its source; the engine's choices come from its profile
(:class:`planner.engines.profile.MemoryProfile`, ``memory:`` in ``profiles/*.yaml``). How the
terms meet at the peak (which micro-batch, which moment) is :mod:`planner.cost.memory_schedule`.

Model states (Rajbhandari et al. 2020, ZeRO, sec. 3.1: 2 + 2 + K bytes per parameter, K = 12
for mixed-precision Adam), by engine (:func:`state_bytes_per_param`):

* Megatron (``states: megatron``): 16-bit weights 2 B, the gradient buffer in the gradient dtype
  (fp32 main grads for bf16: 4 B, fp16: 2 B), fp32 master + Adam m, v 12 B sharded by the
  distributed optimizer (megatron/training/theoretical_memory_usage.py: 18 or 6 + 12/d).
  The optimizer step of 16-bit gradients adds their fp32 copy (``_copy_model_grads_to_main_grads``).
* FSDP2 (``states: fsdp2``, torchtitan): the fp32 shard is the parameter (4 B/d) and AdamW keeps
  two fp32 moments (8 B/d); gradients are allocated by the backward (fp32 reduce-scatter outputs,
  4 B/d) and freed by ``zero_grad(set_to_none=True)``; under pipelining gradient sync is off until
  the last micro-batch and FSDP2 accumulates unsharded fp32 gradients (4 B per TP-local
  parameter, ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``).
* DeepSpeed (``states: deepspeed``): flat 16-bit weights and gradients, fp32 master and Adam
  partitions; ZeRO-1/2 copy the gradient partition to fp32 for the step (stage_1_and_2.py).

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), sec. 4.1-4.2, eqs. 1-6:
``s b h (34 + 5 a s / h)`` bytes without parallelism, ``s b h (10 + 24/t + 5 a s/(h t))``
with tensor parallelism, ``s b h (34/t + 5 a s/(h t))`` with sequence parallelism too,
``s b h 34/t`` with selective recompute, ``2 s b h / t`` with full recompute. The code
itemises the same tensors so that GQA, SwiGLU, dropout-free models and flash attention (which
stores no s x s matrices, Dao et al. 2022) follow from the same list; torchtitan's per-op
selective policy saves a different list (:func:`sac_op_bytes_per_layer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from planner.cost.constants import Constants
from planner.cost.flops import attn_proj_dims, embedding_params, layer_params, mlp_matrices
from planner.engines.profile import has_dropout  # the engine's dropout rule (re-exported)
from planner.specs import ModelSpec

__all__ = [
    "grad_bytes",
    "StageMemory",
    "bytes_per_param",
    "state_bytes_per_param",
    "expert_shard",
    "grad_dtype",
    "activation_bytes_per_layer",
    "has_dropout",
    "sac_op_bytes_per_layer",
    "weight_grad_kept_bytes_per_layer",
    "inflight_microbatches",
    "chunk_layers",
    "stage_params",
    "tp_overlap_buffer_bytes",
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
    """Megatron's model-state bytes per parameter held by one GPU, after ZeRO sharding over ``dp``
    (ZeRO 1 shards the optimizer, 2 the gradients too, 3 the weights; with FP8, Transformer
    Engine's cached FP8 weight and transpose, Constants.FP8_WEIGHT_COPY_BYTES_PER_PARAM)."""
    fp8 = C.FP8_WEIGHT_COPY_BYTES_PER_PARAM if precision == "fp8" else 0.0
    g = grad_bytes(precision, grad_reduce)
    return {
        "weights": 2.0 / dp if zero >= 3 else 2.0 + fp8,
        "gradients": g / dp if zero >= 2 else g,
        "optimizer": 12.0 / dp if zero >= 1 else 12.0,
    }


def expert_shard(shard: int, tp: int, ep: int, etp: int | None) -> int:
    """The ranks an expert weight's optimizer state is sharded over, given the dense weights'
    ``shard`` (dp x cp, or the ZeRO shard degree): the expert data-parallel group, the world of
    tp x dp x cp less the expert grid ep x etp (Megatron-core's expert data-parallel group;
    etp None: tp)."""
    return max(1, shard * tp // (ep * (etp or tp)))


@lru_cache(maxsize=16384)
def state_bytes_per_param(precision: str, zero: int, shard: int, grad_reduce: str, C: Constants, states: str,
                          grad_sync: str = "step", fp8_cache: float = 2.0, foreach_temp: float = 0.0,
                          fp8_params: bool = False) -> dict[str, float]:
    """Model-state bytes per parameter on one GPU for an engine's recipe (module doc):
    ``weights``, ``gradients`` (held the whole step), ``optimizer`` (master copy and moments),
    ``step_gradients`` (allocated by the step's first backward, kept to its end: FSDP2),
    ``step_gradients_unsharded`` (1 when FSDP2 accumulates unsharded gradients under pipelining)
    and ``optimizer_step`` (allocated only inside ``optimizer.step()``). ``grad_sync`` is the
    sharding mode's (:class:`planner.engines.Sharding`). ``fp8_params``: the weights are FP8 tensors
    (Megatron --fp8-param-gather, Transformer Engine fp8_model_init): 1 B each and no cached copy
    (the fp32 master stays in the optimizer)."""
    d = max(1, shard)
    g = grad_bytes(precision, grad_reduce)
    out = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0, "step_gradients": 0.0, "step_gradients_unsharded": 0.0,
           "optimizer_step": 0.0}
    if states == "fsdp2":
        if zero == 0:  # torchtitan's DDP (replicate): fp32 parameters, gradients and AdamW moments
            out.update(weights=4.0, gradients=4.0, optimizer=8.0, optimizer_step=foreach_temp)
            return out
        out.update(weights=4.0 / d, optimizer=8.0 / d, optimizer_step=foreach_temp / d)
        if grad_sync == "step":  # no-sync accumulation under pipelining: unsharded fp32, then one reduce-scatter
            out.update(step_gradients=4.0, step_gradients_unsharded=1.0)
        else:
            out["step_gradients"] = 4.0 / d  # fp32 reduce-scatter outputs (MixedPrecisionPolicy reduce_dtype float32)
        return out
    base = bytes_per_param(precision, zero, d, grad_reduce, C)
    w = base["weights"] - (C.FP8_WEIGHT_COPY_BYTES_PER_PARAM - fp8_cache if precision == "fp8" and zero < 3 else 0.0)
    if fp8_params:
        w = 1.0 / d if zero >= 3 else 1.0
    out.update(weights=w, gradients=base["gradients"], optimizer=base["optimizer"])
    if g < 4.0:  # fp32 copy of the 16-bit gradients for the optimizer (Megatron MixedPrecisionOptimizer, DeepSpeed)
        out["optimizer_step"] = 4.0 / d if zero >= 1 else 4.0
    elif states == "deepspeed":  # ZeRO's averaged gradient partition converted to fp32 for step()
        out["optimizer_step"] = 4.0 / d if zero >= 1 else 0.0
    return out


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
    dropout: str | bool | None = None,
    rope_copies: bool = False,
    selective: str = "korthikanti",
    gathered_inputs: bool = False,
    fp8_saved_bytes: float | None = None,
) -> float:
    """Bytes one layer keeps for its backward pass, for one micro-batch, on one GPU.

    ``precision="fp8"``: the saved inputs of linear layers (QKV input, out-projection input,
    fc1 input, fc2 input) are FP8, 1 B per element (constants.FP8_ACTIVATION_BYTES); the
    attention output is kept in 16-bit as well because flash attention's backward reads it.
    ``moe_load``: routed-token multiplier of the busiest rank (compute.moe_load_factor).
    Context parallelism divides every term by ``cp`` (each rank holds s/cp tokens; Megatron-core
    context parallelism, Korthikanti's terms with s -> s/cp). ``dropout``: the engine's rule
    (``always``, ``never``, ``model`` = the model's biases say GPT-era, the default).
    ``rope_copies``: the rotary embedding writes new Q and K while the QKV GEMM output stays saved
    (Megatron-Core: V is a view of it; attention.py get_query_key_value_tensors, rope_utils.py).
    ``selective="op"``: torchtitan's per-op policy (:func:`sac_op_bytes_per_layer`).
    ``gathered_inputs``: the column-parallel linears save their all-gathered (full-sequence)
    input, as DTensor's ColwiseParallel does; Megatron saves the sequence shard and gathers it
    again in backward. ``fp8_saved_bytes``: bytes per element of a saved FP8 GEMM input
    (Transformer Engine saves the FP8 cast, 1 B; torchao's Float8Linear the bf16 input, 2 B).
    """
    s = seq_len / cp
    b = micro_batch
    h = model.hidden
    u = 1.0 / tp if sequence_parallel else 1.0
    if recompute == "full":
        return 2.0 * s * b * h * u  # only the layer input (Korthikanti sec. 4.3)
    if recompute == "selective" and selective == "op":
        return s * b * sac_op_bytes_per_layer(model, tp, moe_layer, moe_load)
    lin = (C.FP8_ACTIVATION_BYTES if fp8_saved_bytes is None else fp8_saved_bytes) if precision == "fp8" else 2.0
    qw, kvw = attn_proj_dims(model)
    drop = has_dropout(model, dropout)
    a_loc = model.heads / tp
    sbh = s * b * h
    g = 1.0 if gathered_inputs else u  # the column-parallel inputs (QKV, fc1) as saved
    attn = 2 * sbh * u + lin * sbh * g  # norm input, QKV input (norm output)
    attn += 2 * s * b * (qw + kvw) / tp  # Q, K, V
    if rope_copies and model.position_embedding == "rope" and not model.is_mla:
        attn += 2 * s * b * (qw + kvw / 2) / tp  # rotated Q and K beside the saved QKV output
    attn += 2 * s * b * qw / tp  # attention output (flash backward; = out-projection input in 16-bit)
    attn += s * b * qw / tp if precision == "fp8" and lin < 2 else 0.0  # its FP8 copy saved by the out-projection
    attn += sbh * u if drop else 0.0  # attention-output dropout mask
    if not flash_attention and recompute != "selective":
        attn += (5.0 if drop else 2.0) * a_loc * s * seq_len * b  # softmax out, mask, dropout out
    elif flash_attention:
        attn += 4.0 * a_loc * s * b  # fp32 log-sum-exp per query row
    if model.moe is not None and moe_layer:
        moe = model.moe
        f = moe.expert_ffn_hidden * (moe.top_k * moe_load + moe.shared_experts) / tp
        mlp_in = lin * sbh * (moe.top_k * moe_load + 1) * g  # norm output + dispatched copies
    else:
        f = model.ffn_hidden / tp
        mlp_in = lin * sbh * g
    mlp = 2 * sbh * u + mlp_in  # norm input, fc1 input
    mlp += 2 * s * b * f * (2 if mlp_matrices(model) == 3 else 1)  # activation input(s)
    mlp += lin * s * b * f  # fc2 input
    mlp += sbh * u if drop else 0.0
    return attn + mlp


def sac_op_bytes_per_layer(model: ModelSpec, tp: int, moe_layer: bool = False, moe_load: float = 1.0) -> float:
    """Bytes per token one layer keeps under torchtitan's per-op selective checkpointing.

    The policy (torchtitan 0.2.2 models/llama3/infra/parallelize.py ``_op_sac_save_list``,
    distributed/activation_checkpoint.py) saves the outputs of ``aten.mm`` except every second
    one, of SDPA, and of ``reduce_scatter_tensor``; everything else is recomputed. mm order in a
    Llama block: wq (saved), wk, wv (saved), wo, w1 (saved), w3, w2 (saved). Saved per token: the
    block input (sequence-sharded under TP), wq and wv outputs, the flash output and its fp32
    log-sum-exp, w1's output, w2's output (its mm output is the full-sequence partial sum under
    TP) and, under TP, the reduce-scatter outputs of wo and w2. Float8 GEMMs are counted as
    mm (the Dec-2024 measurements show the same memory with and without Float8)."""
    h, d = model.hidden, model.head_dim
    q, kv_half = model.heads * d, model.kv_heads * d
    if model.moe is not None and moe_layer:
        f = model.moe.expert_ffn_hidden * (model.moe.top_k * moe_load + model.moe.shared_experts)
    else:
        f = model.ffn_hidden
    t = tp
    saved = 2 * h / t + 2 * q / t + 2 * kv_half / t + 2 * q / t + 4.0 * model.heads / t + 2 * f / t + 2 * h
    if t > 1:
        saved += 2 * 2 * h / t
    return saved


def weight_grad_kept_bytes_per_layer(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int,
                                     sequence_parallel: bool, precision: str = "bf16", C: Constants | None = None) -> float:
    """Bytes one layer keeps from its input-gradient pass (B) to its weight-gradient pass (W)
    under a Zero Bubble schedule: every linear's input and output gradient
    (``WeightGradStore.put(total_input, grad_output, weight)``, Qi et al.'s fork
    core/tensor_parallel/layers.py). For a GPT layer this is 32 s b h, the fork's own
    ``w_mem = -32 h`` (zb_schedules.py)."""
    s = seq_len / cp
    b = micro_batch
    h = model.hidden
    u = 1.0 / tp if sequence_parallel else 1.0
    lin = (C.FP8_ACTIVATION_BYTES if C is not None else 1.0) if precision == "fp8" else 2.0
    qw, kvw = attn_proj_dims(model)
    f = model.ffn_hidden
    fc1_out = f * (2 if mlp_matrices(model) == 3 else 1)
    inputs = lin * h * u + 2 * qw / tp + lin * h * u + lin * f / tp  # QKV, out-proj, fc1, fc2 inputs
    grads = 2 * (qw + kvw) / tp + 2 * h * u + 2 * fc1_out / tp + 2 * h * u  # their output gradients
    return s * b * (inputs + grads)


def inflight_microbatches(stage: int, pp: int, vpp: int, num_microbatches: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak (in whole-stage units),
    closed form for equal chunks: min(p - i, m) under 1F1B (Narayanan et al. 2021 sec. 2.2.1);
    under interleaving rank r warms up (p - r - 1) 2 + (v - 1) p chunks, so rank 0 holds
    p (1 + (p - 1)/(p v)) micro-batches' worth (Korthikanti 2022 sec. 4.2.3). The estimate walks
    the schedule itself (:mod:`planner.cost.memory_schedule`); this is its closed form."""
    if pp <= 1:
        return 1.0
    if vpp <= 1:
        return float(min(pp - stage, num_microbatches))
    chunks = (pp - stage - 1) * 2 + (vpp - 1) * pp + 1
    return min(chunks, num_microbatches * vpp) / vpp


@lru_cache(maxsize=65536)
def chunk_layers(stage: int, n: int, vpp: int, pp: int) -> tuple[int, ...]:
    """Transformer layers of each of a rank's ``vpp`` model chunks (chunk c is virtual stage
    c pp + stage). Equal chunks when ``vpp`` divides ``n``; otherwise the embedding and the loss
    count as one slot each and the rank's slots are spread as evenly as possible, the extra ones
    first to the chunk holding the embedding (rank 0's first) or the loss (the last rank's last),
    as Megatron's --account-for-embedding/loss-in-pipeline-split and the Zero Bubble fork's
    --allow-padding-num-layers (a noop layer in those chunks) lay them out (planner.emit.common
    chunk_sizes does the same for launch files)."""
    if vpp <= 1:
        return (n,)
    if n % vpp == 0:
        return (n // vpp,) * vpp
    extra = [0] * vpp
    if stage == 0:
        extra[0] += 1
    if stage == pp - 1:
        extra[-1] += 1
    base, rem = divmod(n + sum(extra), vpp)
    order = sorted(range(vpp), key=lambda c: (-extra[c], c))
    slots = [base] * vpp
    for c in order[:rem]:
        slots[c] += 1
    out = [max(0, slots[c] - extra[c]) for c in range(vpp)]
    diff = n - sum(out)
    for c in range(vpp):  # slots of a chunk that held only the embedding/loss go back to the others
        if diff <= 0:
            break
        out[c] += 1
        diff -= 1
    return tuple(out)


def tp_overlap_buffer_bytes(micro_batch: int, seq_len: int, cp: int, hidden: int, precision: str) -> float:
    """Transformer Engine's userbuffers for ``--tp-comm-overlap``: Megatron passes the shape
    [seq x micro-batch / cp, hidden] (megatron/training/initialize.py _initialize_tp_communicators)
    and TE's ``initialize_ub`` registers one buffer of it for each overlapped GEMM: 4 ring-exchange
    (qkv/fc1 fprop, proj/fc2 dgrad), 2 pipelined (proj/fc2 fprop) and 4 bulk (qkv/fc1 dgrad and
    wgrad), FP8 (1 B) for the fprop buffers of an FP8 run, 16-bit otherwise. Allocated by TE, not
    by PyTorch's caching allocator."""
    elems = micro_batch * seq_len / cp * hidden
    fprop = 1.0 if precision == "fp8" else 2.0
    return elems * (4 * fprop + 6 * 2.0)


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
        if model.mtp_layers:
            # each MTP module (Megatron-core MultiTokenPredictionLayer): one layer of the decoder's
            # last kind, eh_proj (2h x h, column-parallel), enorm, hnorm and its final norm (h
            # each for RMSNorm, weight and bias for LayerNorm); the output head is the main
            # model's. The modules embed the shifted tokens themselves: on a last stage that is not
            # the first, an untied model keeps a copy of the word embedding there, kept in step
            # with stage 0's by the embedding group's gradient all-reduce (language_module.py
            # setup_embeddings_and_output_layer: "we also need to maintain duplicated embedding
            # weights in mtp process stage"; a tied model's last stage holds it already).
            lp = lp_m if model.moe_layers else lp_d
            norm_w = 2 if model.norm == "layernorm" else 1
            out["layers"] += model.mtp_layers * (shard(lp) + 2 * model.hidden * model.hidden / tp + 3 * norm_w * model.hidden)
            if model.moe_layers:
                out["experts"] += model.mtp_layers * lp_m["experts"] / ((etp or tp) * ep)
            if pp > 1 and emb["output"]:
                out["embedding"] += emb["embedding"] / tp
    else:
        out["output"] = 0.0
    return out


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU on one pipeline stage at its peak moment (``moment``).

    ``allocated_bytes`` is what tensors hold at that moment (``torch.cuda.max_memory_allocated``),
    ``reserved_bytes`` adds the caching allocator's reserve (``max_memory_reserved``), and
    ``total_bytes`` adds ``framework_bytes``, device memory outside the allocator (CUDA context,
    NCCL and Transformer Engine communication buffers): what the GPU must have.
    ``buffers_bytes`` are allocator-held buffers (all-gathered parameters, gradient buckets,
    pipeline receive buffers); ``parts`` itemises the peak (name -> bytes).
    """

    stage: int
    layers: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    buffers_bytes: float
    reserve_bytes: float
    framework_bytes: float = 0.0
    why: object = field(default="", compare=False, repr=False)  # where the peak is (a string, or planner.cost.memory_peak's record)
    parts: tuple = field(default=(), compare=False)

    @property
    def moment(self) -> str:
        """When the stage reaches its peak: which pass of which micro-batch (words)."""
        if isinstance(self.why, str):
            return self.why
        from planner.cost.memory_peak import describe_peak  # noqa: PLC0415  (words only when asked)

        return describe_peak(self.why)

    @property
    def model_states_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def allocated_bytes(self) -> float:
        return self.model_states_bytes + self.activations_bytes + self.logits_bytes + self.buffers_bytes

    @property
    def reserved_bytes(self) -> float:
        return self.allocated_bytes + self.reserve_bytes

    @property
    def total_bytes(self) -> float:
        return self.reserved_bytes + self.framework_bytes

    def as_dict(self) -> dict:
        return {
            "stage": self.stage, "layers": self.layers,
            "weights_bytes": self.weights_bytes, "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
            "logits_bytes": self.logits_bytes, "buffers_bytes": self.buffers_bytes,
            "reserve_bytes": self.reserve_bytes, "framework_bytes": self.framework_bytes,
            "allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
            "total_bytes": self.total_bytes, "peak_moment": self.moment,
            "parts_bytes": dict(self.parts),
        }
