"""The model flavors torchtitan ships, and which one (if any) is the plan's model.

A torchtitan job names a model and a flavor from the registry (0.2.2:
``torchtitan/models/<name>/__init__.py`` ``*_args``; 0.3.0: ``*_configs`` of the same files);
it cannot define new dimensions. So the plan's model must be one of these, dimension for
dimension, or the emitter refuses with the reason. The dimensions below are those of the
registry entries (read from the built models; tests/emit/test_torchtitan_engine.py builds each
one with torchtitan on the meta device and compares shapes and parameter counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InputError
from planner.specs import ModelSpec

__all__ = ["Flavor", "FLAVORS", "VERSIONS", "match_flavor"]

VERSIONS = ("0.2.2", "0.3.0")


@dataclass(frozen=True)
class Flavor:
    """One registry entry, in the planner's ModelSpec terms."""

    name: str  # [model] name (0.2.2) / module of torchtitan.models (0.3.0)
    flavor: str
    hf_repo: str  # where scripts/download_hf_assets.py fetches the tokenizer
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int | None  # dense MLP width; None when every layer is MoE
    vocab: int
    rope_theta: float
    tied_embeddings: bool = False
    moe: tuple[int, int, int, int, int] | None = None  # experts, top_k, expert ffn, shared experts, dense layers
    mla: tuple[int, int, int, int] | None = None  # q_lora_rank, kv_lora_rank, qk_rope_head_dim, v_head_dim
    versions: tuple[str, ...] = VERSIONS
    no_pipeline: tuple[str, ...] = ()  # versions whose train spec has no pipelining_fn
    no_cp: tuple[str, ...] = ()  # versions where the flavor's attention kernel does not run context parallelism

    def matches(self, m: ModelSpec) -> bool:
        if (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab, m.tied_embeddings) != \
                (self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.vocab, self.tied_embeddings):
            return False
        if m.rope_theta is not None and m.rope_theta != self.rope_theta:
            return False
        moe = None if m.moe is None else (m.moe.experts, m.moe.top_k, m.moe.expert_ffn_hidden, m.moe.shared_experts, m.moe.dense_layers)
        mla = (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim) if m.is_mla else None
        if moe != self.moe or mla != self.mla:
            return False
        if m.qk_norm and self.name != _Q3:  # only torchtitan's qwen3 normalises the query and key heads
            return False
        return self.ffn_hidden is None or m.ffn_hidden == self.ffn_hidden


_L3, _Q3, _DS = "llama3", "qwen3", "deepseek_v3"
FLAVORS: tuple[Flavor, ...] = (
    # llama3: dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier/multiple_of -> w1 width, vocab 128256, theta 5e5
    Flavor(_L3, "8B", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 500000),
    Flavor(_L3, "70B", "meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 500000),
    Flavor(_L3, "405B", "meta-llama/Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256, 500000),
    # qwen3 (head_dim 128, QK-norm, theta 1e6; 0.6B-4B tie the embeddings); 0.2.2's qwen3 train spec
    # has pipelining_fn=None (models/qwen3/__init__.py), so no pipeline there.
    Flavor(_Q3, "0.6B", "Qwen/Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 1000000, tied_embeddings=True, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "1.7B", "Qwen/Qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, 1000000, tied_embeddings=True, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "4B", "Qwen/Qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, 1000000, tied_embeddings=True, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "8B", "Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 1000000, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "14B", "Qwen/Qwen3-14B", 40, 5120, 40, 8, 128, 17408, 151936, 1000000, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "32B", "Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, 1000000, no_pipeline=("0.2.2",)),
    Flavor(_Q3, "30B-A3B", "Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 128, None, 151936, 1000000,
           moe=(128, 8, 768, 0, 0), no_pipeline=("0.2.2",)),
    Flavor(_Q3, "235B-A22B", "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 128, None, 151936, 5000000,
           moe=(128, 8, 1536, 0, 0), no_pipeline=("0.2.2",)),
    # deepseek_v3: MLA (head_dim = qk_nope_head_dim 128), DeepSeekMoE; theta 1e4. In 0.2.2 these
    # flavors use FlexAttention and context parallelism runs only SDPA
    # (models/deepseek_v3/model/args.py update_from_config raises NotImplementedError).
    Flavor(_DS, "16B", "deepseek-ai/deepseek-moe-16b-base", 27, 2048, 16, 16, 128, 10944, 102400, 10000,
           moe=(64, 6, 1408, 2, 1), mla=(0, 512, 64, 128), no_cp=("0.2.2",)),
    Flavor(_DS, "236B", "deepseek-ai/DeepSeek-V2", 60, 5120, 128, 128, 128, 12288, 102400, 10000,
           moe=(160, 6, 1536, 2, 1), mla=(1536, 512, 64, 128), no_cp=("0.2.2",)),
    Flavor(_DS, "671B", "deepseek-ai/DeepSeek-V3", 61, 7168, 128, 128, 128, 18432, 129280, 10000,
           moe=(256, 8, 2048, 1, 3), mla=(1536, 512, 64, 128), no_cp=("0.2.2",)),
    # llama4 Scout (every layer MoE: 16 experts, top-1, one shared); gone from 0.3.0.
    Flavor("llama4", "17bx16e", "meta-llama/Llama-4-Scout-17B-16E", 48, 5120, 40, 8, 128, None, 202048, 500000,
           moe=(16, 1, 8192, 1, 0), versions=("0.2.2",)),
)



def _moe_flavors(versions: tuple[str, ...]) -> str:
    return ", ".join(f"{f.name} {f.flavor}" + ("" if set(versions) <= set(f.versions) else f" ({'/'.join(f.versions)} only)")
                     for f in FLAVORS if f.moe and set(versions) & set(f.versions))


def _architecture(m: ModelSpec) -> list[str]:
    """What in ``m`` no torchtitan decoder has (they are RoPE + RMSNorm + SwiGLU without biases)."""
    out = []
    if m.position_embedding != "rope":
        out.append("learned absolute positions")
    if m.norm != "rmsnorm":
        out.append("LayerNorm")
    if m.mlp != "swiglu":
        out.append(f"a {m.mlp} MLP")
    if m.bias:
        out.append("linear biases")
    return out


def match_flavor(m: ModelSpec, model_id: str, version: str | tuple[str, ...]) -> Flavor:
    """The registry entry of torchtitan ``version`` (or of any of several) that is model ``m``;
    InputError saying why there is none (never a near miss: another flavor would train another
    model)."""
    versions = (version,) if isinstance(version, str) else tuple(version)
    version = " and ".join(versions)
    lacks = _architecture(m)
    if lacks:
        raise InputError("model", model_id, f"a model torchtitan can express; it cannot express {model_id}, because its "
                         f"decoders (llama3, llama4, qwen3, deepseek_v3) are RoPE + RMSNorm + SwiGLU without biases and "
                         f"{model_id} has {', '.join(lacks)}")
    for f in FLAVORS:
        if set(versions) & set(f.versions) and f.matches(m):
            return f
    if m.moe is not None:
        raise InputError("model", model_id, f"a model torchtitan {version} has a flavor for; it cannot express {model_id}, "
                         f"because no flavor has {m.moe.experts} experts top-{m.moe.top_k} of width {m.moe.expert_ffn_hidden} "
                         f"(its MoE flavors: {_moe_flavors(versions)}) and a dense flavor would drop the experts")
    raise InputError("model", model_id, f"a model torchtitan {version} has a flavor for; it cannot express {model_id}, "
                     f"because no flavor has layers={m.layers} hidden={m.hidden} heads={m.heads}/{m.kv_heads} "
                     f"ffn={m.ffn_hidden} vocab={m.vocab} and a job config cannot define new dimensions")
