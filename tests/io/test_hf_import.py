"""planner.io.hf_import: Hugging Face config.json -> ModelSpec.

Fixtures under tests/fixtures/hf/ copy the published config.json of these Hub repositories
(only the fields a config.json holds; nothing else is stored):

    llama-3.1-8b.json          meta-llama/Llama-3.1-8B
    llama-3.1-70b.json         meta-llama/Llama-3.1-70B
    mistral-7b-v0.1.json       mistralai/Mistral-7B-v0.1
    mixtral-8x7b-v0.1.json     mistralai/Mixtral-8x7B-v0.1
    qwen2.5-7b.json            Qwen/Qwen2.5-7B
    qwen2-57b-a14b.json        Qwen/Qwen2-57B-A14B
    qwen3-30b-a3b.json         Qwen/Qwen3-30B-A3B
    deepseek-v3.json           deepseek-ai/DeepSeek-V3
    gpt2-xl.json               openai-community/gpt2-xl
    gpt-neox-20b.json          EleutherAI/gpt-neox-20b
    falcon-40b.json            tiiuae/falcon-40b
    minitron-8b-base.json      nvidia/Minitron-8B-Base (Nemotron-4 architecture, relu2, head_dim 128)
    gemma-7b.json              google/gemma-7b (GeGLU, head_dim 256 != 3072/16, tied by GemmaConfig default)
    llava-1.5-7b-hf.json       llava-hf/llava-1.5-7b-hf (text_config relies on LlamaConfig defaults)
    llama-4-scout-17b-16e.json meta-llama/Llama-4-Scout-17B-16E (text_config; vision_config abridged)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.io.hf_import import looks_like_hf_config, model_from_hf_config
from planner.io.loaders import load_model

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _load(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


# name: layers, hidden, heads, kv_heads, ffn_hidden, vocab, mlp, tied, head_dim, norm, bias
EXPECTED = {
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, 128256, "swiglu", False, 128, "rmsnorm", False),
    "llama-3.1-70b": (80, 8192, 64, 8, 28672, 128256, "swiglu", False, 128, "rmsnorm", False),
    "mistral-7b-v0.1": (32, 4096, 32, 8, 14336, 32000, "swiglu", False, 128, "rmsnorm", False),
    "mixtral-8x7b-v0.1": (32, 4096, 32, 8, 14336, 32000, "swiglu", False, 128, "rmsnorm", False),
    "qwen2.5-7b": (28, 3584, 28, 4, 18944, 152064, "swiglu", False, 128, "rmsnorm", False),
    "qwen2-57b-a14b": (28, 3584, 28, 4, 18944, 151936, "swiglu", False, 128, "rmsnorm", False),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 6144, 151936, "swiglu", False, 128, "rmsnorm", False),
    "deepseek-v3": (61, 7168, 128, 128, 18432, 129280, "swiglu", False, 128, "rmsnorm", False),
    "gpt2-xl": (48, 1600, 25, 25, 6400, 50257, "gelu", True, 64, "layernorm", True),
    "gpt-neox-20b": (44, 6144, 64, 64, 24576, 50432, "gelu", False, 96, "layernorm", True),
    "falcon-40b": (60, 8192, 128, 8, 32768, 65024, "gelu", True, 64, "layernorm", False),
    "minitron-8b-base": (32, 4096, 48, 8, 16384, 256000, "relu2", False, 128, "layernorm", False),
    "gemma-7b": (28, 3072, 16, 16, 24576, 256000, "swiglu", True, 256, "rmsnorm", False),
    "llava-1.5-7b-hf": (32, 4096, 32, 32, 11008, 32064, "swiglu", False, 128, "rmsnorm", False),
    "llama-4-scout-17b-16e": (48, 5120, 40, 8, 16384, 202048, "swiglu", False, 128, "rmsnorm", False),
}

# name: experts, top_k, expert_ffn_hidden, shared_experts, dense_layers
EXPECTED_MOE = {
    "mixtral-8x7b-v0.1": (8, 2, 14336, 0, 0),
    "qwen2-57b-a14b": (64, 8, 2560, 8, 0),  # shared_expert_intermediate_size 20480 = 8 x 2560
    "qwen3-30b-a3b": (128, 8, 768, 0, 0),
    "deepseek-v3": (256, 8, 2048, 1, 3),
    "llama-4-scout-17b-16e": (16, 1, 8192, 1, 0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_imports_to_published_shape(name: str) -> None:
    data = _load(name)
    assert looks_like_hf_config(data)
    m = model_from_hf_config(data, name=name)
    layers, hidden, heads, kv, ffn, vocab, mlp, tied, head_dim, norm, bias = EXPECTED[name]
    got = (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.mlp,
           m.tied_embeddings, m.head_dim, m.norm, m.bias)
    assert got == EXPECTED[name]
    assert m.name == name
    assert "config.json" in m.source
    if name in EXPECTED_MOE:
        assert m.moe is not None
        assert (m.moe.experts, m.moe.top_k, m.moe.expert_ffn_hidden, m.moe.shared_experts,
                m.moe.dense_layers) == EXPECTED_MOE[name]
        assert m.moe.capacity_factor is None
    else:
        assert m.moe is None


def test_deepseek_v3_multi_head_latent_attention() -> None:
    m = model_from_hf_config(_load("deepseek-v3"))
    assert m.is_mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim) == (1536, 512, 64, 128)
    assert m.head_dim == 128  # the no-rope part; the rotary 64 is qk_rope_head_dim (flops.py adds them)
    assert m.moe_layers == 58
    # the same model as the preset: the same parameters (671.0 B), the same prediction
    from planner import Job, ParallelConfig, estimate, load_model, make_cluster, param_count  # noqa: PLC0415

    p = load_model("deepseek-v3")
    assert param_count(m) == param_count(p)
    mtp = m if m.mtp_layers == p.mtp_layers else __import__("dataclasses").replace(m, mtp_layers=p.mtp_layers)
    c, j, par = make_cluster("h100-sxm5-80gb", 256), Job(4096, 512), ParallelConfig(pp=16, ep=8, dp=16, recompute="full")
    assert estimate(mtp, c, j, par).step_time_s == pytest.approx(estimate(p, c, j, par).step_time_s, rel=1e-9)
    assert "multi-token-prediction" in m.source


def test_dense_models_carry_no_mla_fields() -> None:
    m = model_from_hf_config(_load("llama-3.1-8b"))
    assert not m.is_mla and (m.q_lora_rank, m.kv_lora_rank, m.v_head_dim) == (0, 0, 0)


def test_qwen2_bias_choice_is_noted() -> None:
    m = model_from_hf_config(_load("qwen2.5-7b"))
    assert m.bias is False and "QKV" in m.source


def test_explicit_head_dim_differs_from_hidden_over_heads() -> None:
    # Qwen3-30B-A3B: 32 heads x 128 = 4096 != hidden 2048; Minitron-8B: 48 x 128 = 6144 != 4096
    assert model_from_hf_config(_load("qwen3-30b-a3b")).head_dim == 128
    assert model_from_hf_config(_load("minitron-8b-base")).head_dim == 128
    kv_channels = {k: v for k, v in _load("minitron-8b-base").items() if k != "head_dim"}
    kv_channels["kv_channels"] = 128  # Megatron's name, written by NeMo -> HF converters
    assert model_from_hf_config(kv_channels).head_dim == 128


def test_nested_text_config_merges_top_level_vocab_and_tying() -> None:
    data = _load("llama-4-scout-17b-16e")
    del data["text_config"]["vocab_size"]
    data["vocab_size"] = 202048
    data["text_config"].pop("tie_word_embeddings", None)
    data["tie_word_embeddings"] = True
    m = model_from_hf_config(data)
    assert m.vocab == 202048 and m.tied_embeddings is True
    assert "text_config" in m.source


def test_llama4_interleaved_moe_counts_dense_layers() -> None:
    # Llama-4-Maverick style: interleave_moe_layer_step 2 -> layers 1, 3, 5, ... are MoE
    data = _load("llama-4-scout-17b-16e")
    data["text_config"]["interleave_moe_layer_step"] = 2
    data["text_config"]["num_local_experts"] = 128
    m = model_from_hf_config(data)
    assert m.moe is not None and m.moe.dense_layers == 24 and m.moe_layers == 24
    assert "interleaved" in m.source


def test_falcon_refinedweb_names_and_multi_query() -> None:
    # tiiuae/falcon-7b as first published (RefinedWeb names): 71 heads, multi-query
    rw = {"model_type": "RefinedWebModel", "architectures": ["RWForCausalLM"], "hidden_size": 4544,
          "n_head": 71, "n_layer": 32, "multi_query": True, "parallel_attn": True, "bias": False,
          "vocab_size": 65024}
    m = model_from_hf_config(rw)
    assert (m.layers, m.heads, m.kv_heads, m.ffn_hidden, m.head_dim) == (32, 71, 1, 18176, 64)
    assert m.norm == "layernorm" and m.tied_embeddings


def test_gpt2_explicit_n_inner_and_neox_parallel_residual_accepted() -> None:
    data = _load("gpt2-xl")
    data["n_inner"] = 4096
    assert model_from_hf_config(data).ffn_hidden == 4096
    assert model_from_hf_config(_load("gpt-neox-20b")).kv_heads == 64


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "llama-4-scout-17b-16e", "gpt2-xl"])
def test_load_model_end_to_end(name: str) -> None:
    m = load_model(str(FIX / f"{name}.json"))
    assert (m.layers, m.hidden) == EXPECTED[name][:2]


def test_load_model_on_a_config_json_directory_layout(tmp_path: Path) -> None:
    d = tmp_path / "Mixtral-8x7B-v0.1"
    d.mkdir()
    (d / "config.json").write_text((FIX / "mixtral-8x7b-v0.1.json").read_text())
    m = load_model(str(d / "config.json"))
    assert m.name == "Mixtral-8x7B-v0.1" and m.moe is not None and m.moe.experts == 8


def test_looks_like_hf_config_rejects_planner_model_files() -> None:
    assert not looks_like_hf_config({"name": "x", "layers": 2, "hidden": 64, "heads": 4,
                                     "ffn_hidden": 256, "vocab": 100})
    assert not looks_like_hf_config([1, 2])
    assert looks_like_hf_config({"n_layer": 2, "n_embd": 64})


# --- bad input ------------------------------------------------------------------------------

def _bad(mutate, name: str = "llama-3.1-8b") -> dict:
    data = copy.deepcopy(_load(name))
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_bad(lambda d: d.pop("num_hidden_layers")), "config.json.num_hidden_layers"),
        (_bad(lambda d: d.pop("n_layer"), "gpt2-xl"), "config.json.n_layer"),
        (_bad(lambda d: d.update(num_attention_heads=30)), "config.json.num_attention_heads"),
        (_bad(lambda d: d.update(num_key_value_heads=5)), "config.json.num_key_value_heads"),
        (_bad(lambda d: d.update(hidden_size="4096")), "config.json.hidden_size"),
        (_bad(lambda d: d.update(vocab_size=-128256)), "config.json.vocab_size"),
        (_bad(lambda d: d.update(num_hidden_layers=0)), "config.json.num_hidden_layers"),
        (_bad(lambda d: d.update(num_hidden_layers=True)), "config.json.num_hidden_layers"),
        (_bad(lambda d: d.pop("intermediate_size")), "config.json.intermediate_size"),
        (_bad(lambda d: d.update(tie_word_embeddings="no")), "config.json.tie_word_embeddings"),
        (_bad(lambda d: d.update(hidden_act="mish"), "gpt-neox-20b"), "config.json.hidden_act"),
        (_bad(lambda d: d.update(num_experts_per_tok=9), "mixtral-8x7b-v0.1"), "config.json.num_experts_per_tok"),
        (_bad(lambda d: d.pop("num_experts_per_tok"), "qwen3-30b-a3b"), "config.json.num_experts_per_tok"),
        (_bad(lambda d: d.update(qk_rope_head_dim=None), "deepseek-v3"), "config.json.qk_rope_head_dim"),
        (_bad(lambda d: d.update(text_config=[1]), "llava-1.5-7b-hf"), "config.json.text_config"),
        (_bad(lambda d: d["text_config"].pop("num_hidden_layers"), "llama-4-scout-17b-16e"),
         "config.json.text_config.num_hidden_layers"),
        ([{"num_hidden_layers": 2}], "config.json"),
    ],
)
def test_bad_config_names_the_field(data: object, field: str) -> None:
    with pytest.raises(InputError) as exc:
        model_from_hf_config(data)  # type: ignore[arg-type]
    assert exc.value.field == field
    assert field in str(exc.value)


def test_json_list_at_top_level_via_loader(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps([_load("llama-3.1-8b")]))
    with pytest.raises(InputError) as exc:
        load_model(str(p))
    assert "mapping" in str(exc.value) or "object" in str(exc.value)


def test_models_that_are_not_decoder_transformers_are_refused() -> None:
    """A Mamba, RWKV or encoder-decoder config is refused with the field named, not priced as a
    transformer from whatever keys it shares with one."""
    base = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 8192, "vocab_size": 50280}
    for extra in ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, {"model_type": "x", "architectures": ["RwkvForCausalLM"]},
                  {"model_type": "t5"}, {"model_type": "custom", "is_encoder_decoder": True}, {"model_type": "nemotron_h"},
                  {"model_type": "qwen3_next"}):
        with pytest.raises(InputError, match="decoder-only transformer"):
            model_from_hf_config({**base, **extra})


def test_sliding_window_is_noted() -> None:
    base = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 32000}
    assert "sliding_window 4096" in model_from_hf_config({**base, "sliding_window": 4096}).source
    assert "sliding_window" not in model_from_hf_config({**base, "sliding_window": 4096, "use_sliding_window": False}).source
    assert "sliding_window" not in model_from_hf_config({**base, "sliding_window": None}).source


def test_import_notes_reach_plan_estimate_and_check(tmp_path) -> None:
    """The import's assumptions (here Mistral's sliding window priced as full attention) are
    printed by every command that prices the model, not only by plan."""
    from tests.conftest import run_cli  # noqa: PLC0415

    cfg = str(FIX / "mistral-7b-v0.1.json")
    common = ["--model", cfg, "--gpu", "a100-sxm4-80gb", "--gpus", "8", "-s", "8192"]
    for argv in (["plan", *common, "--top", "1"], ["estimate", *common, "--tp", "2"]):
        code, out, err = run_cli(argv)
        assert code == 0, err
        assert "model import notes: sliding_window 4096" in out, argv[0]
    code, out, err = run_cli(["plan", *common, "--top", "1", "--emit", "megatron", "--out", str(tmp_path / "m")])
    assert code == 0, err
    code, out, err = run_cli(["check", str(tmp_path / "m" / "megatron_launch.sh"), "--model", cfg])
    assert code in (0, 1), err
    assert "note: model import notes: sliding_window 4096" in out


def test_qwen3_query_key_norms_reach_the_megatron_launch_file(tmp_path) -> None:
    """Qwen3 normalises each query and key head: the import says so (qk_norm), the Megatron launch
    file writes --qk-layernorm and check reads it back; Llama has none."""
    from tests.conftest import run_cli  # noqa: PLC0415

    assert model_from_hf_config(_load("qwen3-30b-a3b")).qk_norm is True
    assert model_from_hf_config(_load("llama-3.1-8b")).qk_norm is False
    assert load_model("qwen3-30b-a3b").qk_norm is True and load_model("llama3.1-8b").qk_norm is False
    for model, want in (("qwen3-30b-a3b", True), ("llama3.1-8b", False)):
        out = tmp_path / model
        code, _, err = run_cli(["plan", "--model", model, "--gpus", "16", "--top", "1", "--emit", "megatron", "--out", str(out)])
        assert code == 0, err
        assert ("--qk-layernorm" in (out / "megatron_launch.sh").read_text()) is want
        from planner.check import read_job  # noqa: PLC0415

        assert read_job([str(out / "megatron_launch.sh")]).model.qk_norm is want
