"""Parameters and FLOPs of a decoder-only transformer.

Conventions (reported with every figure):

* ``model`` FLOPs count each matmul as 2 m n k, attention scores over the full s x s
  square (the convention of Narayanan et al. 2021, eq. 3, and of Megatron's reported
  TFLOP/s), forward + backward = 3 x forward, no recompute. MFU uses these.
* ``executed`` (hardware) FLOPs add recomputation and count what the kernels run: causal
  flash attention skips the masked half of the square (Dao 2023, FlashAttention-2 sec. 4;
  Megatron's non-flash fused softmax computes the full square). HFU uses these.

Per layer, per sequence of length s (Narayanan 2021 sec. 5.1 / eq. 2, generalised to
grouped-query attention (Ainslie et al. 2023) and three-matrix SwiGLU (Shazeer 2020)):

    QKV      2 s h (a d + 2 g d)        out-proj  2 s (a d) h
    scores   2 s^2 a d                  context   2 s^2 a d
    MLP      2 s h f x (2 | 3)          logits    2 s h V   (once per sequence)

With h = a d, g = a, f = 4h and two MLP matrices this is 24 s h^2 + 4 s^2 h per layer,
Narayanan's eq. 2 term; x3 for fwd+bwd gives eq. 3's 72 B s l h^2 (1 + s/6h + V/12lh).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs import ModelSpec

__all__ = [
    "LayerFlops",
    "layer_params",
    "embedding_params",
    "param_count",
    "layer_flops",
    "logits_flops",
    "step_model_flops",
    "mlp_matrices",
    "attn_proj_dims",
    "attn_core_head_dims",
    "kv_exchange_width",
]


def mlp_matrices(model: ModelSpec) -> int:
    """Weight matrices in one MLP: SwiGLU has gate, up and down (Shazeer 2020); GeLU and
    squared ReLU (So et al. 2021, Primer) have two."""
    return 3 if model.mlp == "swiglu" else 2


def attn_proj_dims(model: ModelSpec) -> tuple[int, int]:
    """(q width, k+v width) of the attention input projections.

    MLA (DeepSeek-V2 sec. 2.1, V3 sec. 2.1.1) is approximated by its parameter-equivalent
    widths: the low-rank down projections plus the up projections to per-head keys/values.
    """
    d = model.head_dim or model.hidden // model.heads
    if model.is_mla:
        return model.heads * (d + model.qk_rope_head_dim), model.heads * (d + (model.v_head_dim or d))
    return model.heads * d, 2 * model.kv_heads * d


def attn_core_head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key width, value width) per head inside the attention kernel.

    MLA (DeepSeek-V2 arXiv 2405.04434 sec. 2.1.3; V3 arXiv 2412.19437 eq. 1-11): keys and
    queries carry the no-RoPE part d_h plus the decoupled RoPE part d_h^R (128 + 64), values
    v_head_dim (128). Standard attention: d and d.
    """
    d = model.head_dim or model.hidden // model.heads
    if model.is_mla:
        return d + model.qk_rope_head_dim, model.v_head_dim or d
    return d, d


def kv_exchange_width(model: ModelSpec, tp: int) -> float:
    """Elements per token of the K and V that one tensor-parallel rank holds: what ring
    attention passes between context-parallel ranks (Liu et al. 2023, arXiv 2310.01889).

    GQA keeps kv_heads heads, at least one per rank when tp > kv_heads (replicated). MLA
    under context parallelism exchanges the up-projected per-head K and V (Megatron-core MLA
    runs TE's ring attention on them), not the compressed latent.
    """
    dqk, dv = attn_core_head_dims(model)
    kvh = model.heads if model.is_mla else model.kv_heads
    return max(kvh / tp, 1.0) * (dqk + dv)


def _attn_params(model: ModelSpec) -> int:
    h = model.hidden
    d = model.head_dim or h // model.heads
    if model.is_mla:
        qr, kvr, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        vd = model.v_head_dim or d
        q = (h * qr + qr * model.heads * (d + rope)) if qr else h * model.heads * (d + rope)
        kv = h * (kvr + rope) + kvr * model.heads * (d + vd)
        out = model.heads * vd * h
        return q + kv + out
    qw, kvw = attn_proj_dims(model)
    bias = (qw + kvw + h) if model.bias else 0
    return h * (qw + kvw) + qw * h + bias


def _mlp_params(model: ModelSpec, ffn: int) -> int:
    h = model.hidden
    bias = (ffn * (mlp_matrices(model) - 1) + h) if model.bias else 0
    return mlp_matrices(model) * h * ffn + bias


def layer_params(model: ModelSpec, moe_layer: bool | None = None) -> dict[str, int]:
    """Parameters of one transformer layer: attention, dense MLP or experts, norms."""
    h = model.hidden
    norms = (4 if model.norm == "layernorm" else 2) * h
    out = {"attention": _attn_params(model), "norms": norms, "mlp": 0, "experts": 0, "router": 0}
    is_moe = model.moe is not None and (moe_layer if moe_layer is not None else True)
    if is_moe:
        moe = model.moe
        out["experts"] = moe.experts * _mlp_params(model, moe.expert_ffn_hidden)
        out["mlp"] = moe.shared_experts * _mlp_params(model, moe.expert_ffn_hidden)
        out["router"] = h * moe.experts
    else:
        out["mlp"] = _mlp_params(model, model.ffn_hidden)
    return out


def embedding_params(model: ModelSpec) -> dict[str, int]:
    """Input embedding, output layer (0 when tied) and the final norm."""
    emb = model.vocab * model.hidden
    return {"embedding": emb, "output": 0 if model.tied_embeddings else emb, "final_norm": model.hidden * (2 if model.norm == "layernorm" else 1)}


def param_count(model: ModelSpec) -> int:
    """Parameters of the model (embedding, layers, output layer when untied).

    >>> import planner
    >>> round(planner.param_count(planner.load_model("llama3.1-8b")) / 1e9, 2)
    8.03
    """
    total = model.dense_layers * sum(layer_params(model, moe_layer=False).values())
    if model.moe_layers:
        total += model.moe_layers * sum(layer_params(model, moe_layer=True).values())
    return total + sum(embedding_params(model).values())


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one layer for ``tokens`` tokens, split by kind (full-square attention)."""

    qkv: float
    out_proj: float
    attn_core: float  # scores + context over the full square
    mlp: float  # dense MLP, or the routed + shared experts actually used per token
    router: float

    @property
    def matmul(self) -> float:
        return self.qkv + self.out_proj + self.mlp + self.router

    @property
    def total(self) -> float:
        return self.matmul + self.attn_core


def layer_flops(model: ModelSpec, batch: int, seq_len: int, moe_layer: bool = False) -> LayerFlops:
    """Forward FLOPs of one layer over ``batch`` sequences of ``seq_len`` tokens."""
    h = model.hidden
    d = model.head_dim or h // model.heads
    t = batch * seq_len
    qw, kvw = attn_proj_dims(model)
    if model.is_mla:
        qkv = 2 * t * (_attn_params(model) - model.heads * (model.v_head_dim or d) * h)
        out = 2 * t * model.heads * (model.v_head_dim or d) * h
        # scores over (nope + rope) key width, context over the value width
        core = 2 * batch * seq_len**2 * model.heads * ((d + model.qk_rope_head_dim) + (model.v_head_dim or d))
    else:
        qkv = 2 * t * h * (qw + kvw)
        out = 2 * t * qw * h
        core = 4 * batch * seq_len**2 * model.heads * d
    if model.moe is not None and moe_layer:
        moe = model.moe
        mlp = 2 * t * h * moe.expert_ffn_hidden * mlp_matrices(model) * (moe.top_k + moe.shared_experts)
        router = 2 * t * h * moe.experts
    else:
        mlp = 2 * t * h * model.ffn_hidden * mlp_matrices(model)
        router = 0.0
    return LayerFlops(float(qkv), float(out), float(core), float(mlp), float(router))


def logits_flops(model: ModelSpec, batch: int, seq_len: int) -> float:
    """Forward FLOPs of the output layer (Narayanan 2021 eq. 2: 2 B s h V)."""
    return 2.0 * batch * seq_len * model.hidden * model.vocab


def step_model_flops(model: ModelSpec, global_batch: int, seq_len: int, causal: bool = False) -> float:
    """Model FLOPs of one optimizer step: 3 x forward, no recompute.

    ``causal=False``: full-square attention; for a GPT with g = a and f = 4h this equals
    Narayanan 2021 eq. 3 with the recompute factor removed: 72 B s l h^2 (1 + s/6h + V/12lh).
    ``causal=True``: the attention core counted over the causal half of the square (what
    flash attention executes, FlashAttention papers' causal convention) -- at 128K on
    Llama 3.1 405B the two differ by ~30%.

    >>> import planner
    >>> f = planner.step_model_flops(planner.load_model("gpt3-175b"), 1536, 2048)
    >>> round(f / (6 * 174.6e9 * 1536 * 2048), 2)   # ~6 N D, plus attention over the full square
    1.03
    """
    dense = model.dense_layers
    half = 0.5 if causal else 1.0
    lf = layer_flops(model, global_batch, seq_len, False)
    fwd = dense * (lf.matmul + half * lf.attn_core)
    if model.moe_layers:
        lm = layer_flops(model, global_batch, seq_len, True)
        fwd += model.moe_layers * (lm.matmul + half * lm.attn_core)
    fwd += logits_flops(model, global_batch, seq_len)
    if model.mtp_layers:
        # each multi-token prediction module: a layer of the decoder's last kind, eh_proj (2h -> h)
        # and a second pass of the output layer, as Megatron counts them (training.py
        # num_floating_point_operations: mtp layers, "MTP eh proj", logits x (mtp_num_layers + 1))
        last = layer_flops(model, global_batch, seq_len, bool(model.moe_layers))
        proj = 2.0 * global_batch * seq_len * 2 * model.hidden * model.hidden
        fwd += model.mtp_layers * (last.matmul + half * last.attn_core + proj + logits_flops(model, global_batch, seq_len))
    return 3.0 * fwd
