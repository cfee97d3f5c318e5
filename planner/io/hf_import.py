"""Hugging Face ``config.json`` -> :class:`planner.specs.ModelSpec`.

Reads the field names that ``transformers`` configuration classes store (see
/work/shared/reference/launch_formats.md section 9): Llama / Mistral / Mixtral / Qwen2 /
Qwen2-MoE / Qwen3(-MoE) / Gemma / Llama 4 (``LlamaConfig`` & co.), DeepSeek-V2/V3
(``DeepseekV3Config``, multi-head latent attention + routed/shared experts), GPT-2
(``GPT2Config``: ``n_layer``/``n_embd``/``n_head``/``n_inner``), GPT-NeoX (``GPTNeoXConfig``),
Falcon (``FalconConfig`` and the older RefinedWeb names), Nemotron (``NemotronConfig``,
squared ReLU) and multimodal wrappers that nest the language model under ``text_config``
(``LlavaConfig``, ``Llama4Config``, ``Qwen2VLConfig`` as re-saved by transformers v5).

Every bad value raises :class:`planner.errors.InputError` naming the JSON field as
``config.json.<field>`` (``config.json.text_config.<field>`` inside a wrapper).
"""

from __future__ import annotations

import math
import re
from typing import Any

from planner.errors import InputError
from planner.specs import ModelSpec, MoESpec

__all__ = ["import_notes", "looks_like_hf_config", "model_from_hf_config"]

ROOT = "config.json"

# Families whose MLP is gated (gate_proj + up_proj + down_proj: three matrices), whatever the
# activation: LlamaMLP (silu), GemmaMLP (gelu_pytorch_tanh, i.e. GeGLU), DeepseekV3MLP, ...
# The planner's "swiglu" kind stands for any three-matrix gated MLP.
_GATED = {
    "llama", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2",
    "granite", "cohere", "internlm2", "ministral", "smollm3",
}
# Families normalised with RMSNorm (LlamaRMSNorm and copies); Nemotron's LayerNorm1P, GPT-2,
# GPT-NeoX and Falcon use LayerNorm.
_RMS = _GATED - {"cohere"}
_LAYERNORM = {"gpt2", "gpt_neox", "falcon", "RefinedWeb", "RefinedWebModel", "nemotron",
              "phi", "opt", "bloom", "gptj", "gpt_bigcode", "starcoder2", "stablelm", "persimmon"}
_FALCON = {"falcon", "RefinedWeb", "RefinedWebModel"}
# Families with biases on every linear layer (GPT2Attention/GPT2MLP Conv1D; GPTNeoXMLP and
# attention_bias=True by default).
_BIASED = {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "phi", "starcoder2"}
# tie_word_embeddings default when the file omits it: PretrainedConfig says True; these
# classes override it to False (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
# Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV3Config, GPTNeoXConfig, NemotronConfig,
# Llama4TextConfig). GPT2Config, FalconConfig and GemmaConfig keep True.
_UNTIED_DEFAULT = {
    "llama", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "gpt_neox", "nemotron",
}
# Sub-configs are saved by transformers' ``recursive_diff_dict``, which drops values equal to
# the sub-config class defaults (llava-hf/llava-1.5-7b-hf's text_config holds no layer count).
# These are the class defaults of LlamaConfig and MistralConfig, used only inside text_config.
_NESTED_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
              "tie_word_embeddings": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_act": "silu", "tie_word_embeddings": False},
}

# Aliases, canonical (transformers attribute) name first; GPT-2 style files store n_* names.
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN = ("hidden_size", "n_embd", "n_embed", "d_model")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_KV = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_FFN = ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
_ACT = ("hidden_act", "hidden_activation", "activation_function", "activation")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

_TYPICAL = {"num_hidden_layers", "n_layer", "hidden_size", "n_embd", "num_attention_heads",
            "n_head", "intermediate_size", "vocab_size", "text_config"}


# model types (and architecture names) that are not decoder-only attention transformers: the
# planner's layer is attention + MLP (Mamba / Mamba-2 SSM blocks, RWKV and xLSTM recurrences,
# Jamba / Zamba / Falcon-H1 hybrids, T5 / BART encoder-decoders are not).
_NOT_DECODER_TRANSFORMER = {"mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "xlstm", "jamba", "zamba", "zamba2",
                            "falcon_h1", "recurrent_gemma", "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "whisper", "bamba",
                            # hybrids of attention with Mamba / linear-attention / convolution blocks, and
                            # a cross-attention multimodal model
                            "nemotron_h", "qwen3_next", "granitemoehybrid", "lfm2", "mllama"}
_NOT_DECODER_ARCH = r"Mamba|RWKV|xLSTM|Jamba|Zamba|RecurrentGemma"

def looks_like_hf_config(data: object) -> bool:
    """True for a mapping shaped like a transformers ``config.json`` (not a planner model file)."""
    if not isinstance(data, dict):
        return False
    if "model_type" in data or "architectures" in data:
        return True
    return len(_TYPICAL & set(data)) >= 2 or "num_hidden_layers" in data or "n_layer" in data


class _Reader:
    """Typed access to one (possibly nested) config mapping, naming fields in errors."""

    def __init__(self, d: dict, where: str):
        self.d, self.where = d, where

    def field(self, key: str) -> str:
        return f"{self.where}.{key}"

    def find(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        """First alias present with a non-null value, else (canonical name, None)."""
        for k in keys:
            if self.d.get(k) is not None:
                return k, self.d[k]
        return keys[0], None

    def int_(self, keys: tuple[str, ...] | str, default: int | None = None, *, minimum: int = 1) -> int:
        keys = (keys,) if isinstance(keys, str) else keys
        key, v = self.find(keys)
        if v is None:
            if default is not None:
                return default
            raise InputError(self.field(key), None, "a positive integer (required)")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise InputError(self.field(key), v, what)
        return v

    def bool_(self, key: str, default: bool) -> bool:
        v = self.d.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InputError(self.field(key), v, "true or false")
        return v


def _mlp_kind(r: _Reader, family: str) -> str:
    """Planner MLP kind from the family and ``hidden_act`` (ACT2FN names in transformers)."""
    key, act = r.find(_ACT)
    if act is not None and not isinstance(act, str):
        raise InputError(r.field(key), act, "an activation name such as silu, gelu or relu2")
    a = (act or "").lower().replace("-", "_")
    if family in _GATED:
        return "swiglu"  # gate_proj * act(up_proj): three matrices (GeGLU for Gemma)
    if a in ("relu2", "squared_relu", "relu_squared"):
        return "relu2"  # Nemotron / Persimmon: relu(x)**2, two matrices
    if a.startswith("gelu") or a in ("relu", "quick_gelu", ""):
        return "gelu"  # two-matrix MLP (plain ReLU, e.g. OPT, costs the same)
    if a in ("silu", "swish", "swiglu"):
        return "swiglu"  # unknown family with silu: assume the Llama-style gated MLP
    raise InputError(r.field(key), act, "one of silu, swiglu, gelu*, relu, relu2")


def _kv_heads(r: _Reader, family: str, heads: int) -> int:
    if family in _FALCON and not r.bool_("new_decoder_architecture", False):
        # FalconAttention: kv heads = 1 when multi_query (FalconConfig default True), else heads.
        if r.bool_("multi_query", True):
            return 1
        return heads
    key, v = r.find(_KV)
    if v is None and r.bool_("multi_query", False):
        return 1  # GPTBigCode multi-query
    kv = r.int_(_KV, heads)
    if heads % kv:
        raise InputError(r.field(key), kv, f"a divisor of num_attention_heads ({heads})")
    return kv


def _moe(r: _Reader, family: str, layers: int, ffn: int, notes: list[str]) -> MoESpec | None:
    key, n = r.find(_EXPERTS)
    if n is None or n == 0:
        return None
    experts = r.int_(_EXPERTS)
    top_k = r.int_("num_experts_per_tok")
    if top_k > experts:
        raise InputError(r.field("num_experts_per_tok"), top_k, f"at most {key} ({experts})")
    # DeepSeek/Qwen-MoE: moe_intermediate_size; Mixtral/Llama 4: intermediate_size is per expert.
    expert_ffn = r.int_("moe_intermediate_size", ffn)
    shared = 0
    if r.d.get("n_shared_experts") is not None:  # DeepseekV3MoE.shared_experts
        shared = r.int_("n_shared_experts", minimum=0)
    elif r.d.get("shared_expert_intermediate_size"):  # Qwen2MoeSparseMoeBlock.shared_expert
        size = r.int_("shared_expert_intermediate_size")
        shared = math.ceil(size / expert_ffn)
        if size % expert_ffn:
            notes.append(f"shared expert {size} wide rounded up to {shared} x {expert_ffn}")
    elif family == "llama4_text":
        shared = 1  # Llama4TextMoe always adds one shared expert of intermediate_size
    moe_idx = _moe_layer_indices(r, family, layers)
    dense = layers - len(moe_idx)
    if moe_idx and moe_idx != list(range(dense, layers)):
        notes.append(f"{dense} dense layers interleaved with MoE layers (counted, not placed)")
    if not moe_idx:
        return None
    return MoESpec(experts=experts, top_k=top_k, expert_ffn_hidden=expert_ffn,
                   shared_experts=shared, dense_layers=dense)


def _moe_layer_indices(r: _Reader, family: str, layers: int) -> list[int]:
    d = r.d
    if isinstance(d.get("moe_layers"), list):  # Llama4TextConfig.moe_layers, when stored
        return sorted(i for i in d["moe_layers"] if isinstance(i, int) and 0 <= i < layers)
    if family == "llama4_text":
        step = r.int_("interleave_moe_layer_step", 1)
        return list(range(step - 1, layers, step))
    if "first_k_dense_replace" in d or "moe_layer_freq" in d:
        # DeepseekV3DecoderLayer: MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
        k = r.int_("first_k_dense_replace", 0, minimum=0)
        freq = r.int_("moe_layer_freq", 1)
        return [i for i in range(layers) if i >= k and i % freq == 0]
    if "decoder_sparse_step" in d or "mlp_only_layers" in d:
        # Qwen2MoeDecoderLayer: MoE when i not in mlp_only_layers and (i + 1) % step == 0
        step = r.int_("decoder_sparse_step", 1)
        only = d.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise InputError(r.field("mlp_only_layers"), only, "a list of layer indices")
        return [i for i in range(layers) if i not in only and (i + 1) % step == 0]
    return list(range(layers))  # Mixtral: every layer


def _text_part(data: dict) -> tuple[dict, str, list[str]]:
    """The language-model mapping: ``text_config`` merged with top-level vocab/tying, or data."""
    if "text_config" not in data:
        return data, ROOT, []
    text = data["text_config"]
    if not isinstance(text, dict):
        raise InputError(f"{ROOT}.text_config", text, "a JSON object (the language model's config)")
    text = dict(text)
    for key in ("vocab_size", "tie_word_embeddings"):
        if text.get(key) is None and data.get(key) is not None:
            text[key] = data[key]
    notes = [f"language model read from text_config of {data.get('model_type', 'a wrapper')}"]
    defaults = _NESTED_DEFAULTS.get(str(text.get("model_type", "")), {})
    filled = sorted(k for k in defaults if text.get(k) is None)
    for k in filled:
        text[k] = defaults[k]
    if filled:
        notes.append(f"{text['model_type']} class defaults for " + ", ".join(filled))
    return text, f"{ROOT}.text_config", notes


def model_from_hf_config(data: dict, name: str = "hf-model") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed Hugging Face ``config.json``."""
    if not isinstance(data, dict):
        raise InputError(ROOT, type(data).__name__, "a JSON object at the top level")
    d, where, notes = _text_part(data)
    r = _Reader(d, where)
    family = d.get("model_type") or ""
    if not isinstance(family, str):
        raise InputError(r.field("model_type"), family, "a string")
    arch = data.get("architectures")
    arch_names = [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []
    if ({family, data.get("model_type")} & _NOT_DECODER_TRANSFORMER or d.get("is_encoder_decoder")
            or any(re.search(_NOT_DECODER_ARCH, a, re.I) for a in arch_names)):
        raise InputError(r.field("model_type"), family or ",".join(arch_names), "a decoder-only transformer (attention + MLP layers; "
                         "state-space, recurrent, hybrid and encoder-decoder models are not modelled)")
    gpt2_style = family == "gpt2" or "n_embd" in d

    def names(keys: tuple[str, ...]) -> tuple[str, ...]:
        """GPT2Config stores n_layer/n_embd/n_head: name those in errors for GPT-2 files."""
        return keys[1:2] + keys[:1] + keys[2:] if gpt2_style else keys

    layers = r.int_(names(_LAYERS))
    hidden = r.int_(names(_HIDDEN))
    heads = r.int_(names(_HEADS))
    vocab = r.int_("vocab_size")

    mla = d.get("kv_lora_rank") is not None
    if mla:
        # DeepseekV3Attention: q/k head = qk_nope_head_dim + qk_rope_head_dim; v head = v_head_dim.
        # Every head has its own (latent-decompressed) K and V, so kv_heads = heads.
        # ModelSpec keeps the two apart (head_dim = the no-rope part, qk_rope_head_dim the rotary
        # part, as the presets and torchtitan's flavors: planner.cost.flops adds them).
        nope, rope = r.int_("qk_nope_head_dim"), r.int_("qk_rope_head_dim")
        head_dim: int | None = nope
        notes.append(f"MLA: q/k heads of qk_nope_head_dim + qk_rope_head_dim = {nope} + {rope}, v heads of v_head_dim")
    elif d.get("head_dim") is not None or d.get("kv_channels") is not None:
        # Explicit head size (Gemma, Qwen3, Mistral-Nemo, Minitron-8B; Megatron calls it kv_channels)
        head_dim = r.int_(("head_dim", "kv_channels"))
    else:
        if hidden % heads:
            hkey = r.find(names(_HEADS))[0]
            raise InputError(r.field(hkey), heads, f"a divisor of hidden size ({hidden}) or an explicit head_dim")
        head_dim = None
    kv_heads = heads if mla else _kv_heads(r, family, heads)

    if family in _FALCON or gpt2_style:
        ffn = r.int_(_FFN, 4 * hidden)  # GPT2MLP: n_inner or 4 * n_embd; FalconMLP: ffn_hidden_size or 4h
    else:
        ffn = r.int_(_FFN)
    if family == "llama4_text" and d.get("intermediate_size_mlp") is not None:
        dense_ffn = r.int_("intermediate_size_mlp")  # Llama4TextMLP in the dense layers
    else:
        dense_ffn = ffn

    mlp = _mlp_kind(r, family)
    moe = _moe(r, family, layers, ffn, notes)
    if family in _RMS:
        norm = "rmsnorm"
    elif family in _LAYERNORM:
        norm = "layernorm"
    else:
        norm = "rmsnorm" if "rms_norm_eps" in d else "layernorm"

    if family in _BIASED:
        bias = True
    elif family in _FALCON:
        bias = r.bool_("bias", False)  # FalconConfig.bias: biases on every linear layer
    elif family in _GATED or family == "nemotron":
        bias = r.bool_("attention_bias", False) or r.bool_("mlp_bias", False)
        if family in ("qwen2", "qwen2_moe"):
            notes.append("Qwen2 QKV projections carry a bias in code; modelled as bias=False (small effect)")
    else:
        bias = r.bool_("attention_bias", False) or r.bool_("mlp_bias", False) or mlp == "gelu"
    tied = r.bool_("tie_word_embeddings", family not in _UNTIED_DEFAULT)
    # Qwen3 and OLMo 2 normalise each query and key head (modeling_qwen3.py Qwen3Attention q_norm /
    # k_norm; modeling_olmo2.py q_norm / k_norm): Megatron --qk-layernorm
    qk_norm = family in ("qwen3", "qwen3_moe", "olmo2")
    window = d.get("sliding_window")
    if isinstance(window, int) and window > 0 and d.get("use_sliding_window", True) is not False:
        notes.append(f"sliding_window {window}: attention priced over the whole sequence (layers with a window attend at most "
                     f"{window} keys: an over-estimate of their attention for sequences longer than that)")
    if d.get("num_nextn_predict_layers"):
        # the checkpoint's MTP weights; whether a run trains them is the job's choice (megatron-core
        # --mtp-num-layers), so the import leaves model.mtp_layers at 0
        notes.append(f"{d['num_nextn_predict_layers']} multi-token-prediction layer(s) in the checkpoint not priced "
                     "(set mtp_layers in a model YAML to price them on megatron-core)")

    arch = data.get("architectures")
    label = ",".join(a for a in arch if isinstance(a, str)) if isinstance(arch, list) else ""
    source = f"Hugging Face config.json (model_type={data.get('model_type', '?')}"
    source += f", architectures={label})" if label else ")"
    if notes:
        source += "; " + "; ".join(notes)
    return ModelSpec(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        ffn_hidden=dense_ffn, vocab=vocab, mlp=mlp, tied_embeddings=tied, head_dim=head_dim,
        moe=moe, bias=bias, norm=norm,
        q_lora_rank=r.int_("q_lora_rank", 0, minimum=0) if mla else 0,
        kv_lora_rank=r.int_("kv_lora_rank") if mla else 0,
        qk_rope_head_dim=r.int_("qk_rope_head_dim") if mla else 0,
        v_head_dim=r.int_("v_head_dim") if mla else 0,
        position_embedding="rope" if (d.get("rope_theta") is not None or d.get("rotary_emb_base") is not None
                                      or family not in ("gpt2",)) else "learned",
        rope_theta=_rope_theta(d),
        qk_norm=qk_norm,
        source=source,
        max_seq_len=d.get("max_position_embeddings") if isinstance(d.get("max_position_embeddings"), int)
        and d.get("max_position_embeddings") > 0 else None,
    )


def _rope_theta(d: dict) -> float | None:
    """The rotary base of a transformers config (``rope_theta``; GPT-NeoX ``rotary_emb_base``)."""
    for key in ("rope_theta", "rotary_emb_base"):
        v = d.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


def import_notes(model) -> str | None:
    """What a Hugging Face import assumed (its notes ride on ``ModelSpec.source`` after "; "),
    for plan, estimate and check to print; None for presets and YAML files."""
    src = model.source
    if src.startswith("Hugging Face config.json") and "; " in src:
        return "model import notes: " + src.split("; ", 1)[1]
    return None
