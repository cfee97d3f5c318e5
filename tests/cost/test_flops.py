"""Parameter and FLOP counts against closed forms and published counts.

* Narayanan et al. 2021 (SC21, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM"), eq. 2/3: model FLOPs per step of a GPT (g = a, f = 4h, two
  MLP matrices) = 72 B s l h^2 (1 + s/6h + V/12lh) without the recompute term.
* Same paper, Table 1: parameter counts 1.7B ... 1008B, with
  P = 12 l h^2 (1 + 13/12h + (V + s)/12lh). The planner counts no learned position
  embeddings (the s term) but does count the final LayerNorm (2h), so exactly
  param_count = 12 l h^2 (1 + 13/12h + V/12lh) + 2h.
* Grouped-query attention and SwiGLU, counted by hand: Llama 2 7B (6.74B), Llama 3.1 8B
  (8.03B), Llama 3.1 70B (70.6B).
"""

from __future__ import annotations

import math

import pytest

from planner.cost.flops import layer_flops, layer_params, logits_flops, param_count, step_model_flops
from planner.io.loaders import load_model
from planner.specs import ModelSpec

V_SC21 = 51200
S_SC21 = 2048

# SC21 Table 1: (published parameters in billions, heads, hidden, layers).
SC21_TABLE1 = [
    (1.7, 24, 2304, 24),
    (3.6, 32, 3072, 30),
    (7.5, 32, 4096, 36),
    (18.4, 48, 6144, 40),
    (39.1, 64, 8192, 48),
    (76.1, 80, 10240, 60),
    (145.6, 96, 12288, 80),
    (310.1, 128, 16384, 96),
    (529.6, 128, 20480, 105),
    (1008.0, 160, 25600, 128),
]


def gpt(layers: int, hidden: int, heads: int, vocab: int = V_SC21) -> ModelSpec:
    """A Megatron GPT: MHA, f = 4h, GeLU, biases, LayerNorm, tied embeddings."""
    return ModelSpec(name=f"gpt-l{layers}-h{hidden}", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn_hidden=4 * hidden, vocab=vocab, mlp="gelu", tied_embeddings=True, bias=True, norm="layernorm")


def eq3_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Narayanan 2021 eq. 3 without recompute: 72 B s l h^2 (1 + s/6h + V/12lh)."""
    return 72.0 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


# --- FLOPs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("_p,heads,hidden,layers", SC21_TABLE1)
def test_step_flops_equals_sc21_eq3_table1_shapes(_p, heads, hidden, layers):
    m = gpt(layers, hidden, heads)
    for B in (1, 512, 1536):
        got = step_model_flops(m, B, S_SC21)
        assert math.isclose(got, eq3_flops(B, S_SC21, layers, hidden, V_SC21), rel_tol=1e-12)


@pytest.mark.parametrize("layers,hidden,heads,seq,vocab,batch", [
    (12, 768, 12, 1024, 50257, 8),     # GPT-2 small
    (24, 1024, 16, 2048, 50257, 3),
    (96, 12288, 96, 2048, 50257, 1536),  # GPT-3 175B
    (4, 256, 4, 512, 1000, 2),
    (2, 64, 1, 8192, 32000, 1),        # attention-dominated (s >> h)
])
def test_step_flops_equals_eq3_other_gpt_shapes(layers, hidden, heads, seq, vocab, batch):
    m = gpt(layers, hidden, heads, vocab)
    assert math.isclose(step_model_flops(m, batch, seq), eq3_flops(batch, seq, layers, hidden, vocab), rel_tol=1e-12)


def test_layer_flops_terms_by_hand():
    # One GPT layer, forward: QKV 6 s h^2, out 2 s h^2, MLP 16 s h^2, core 4 s^2 h (per sequence).
    h, s, b = 1024, 2048, 3
    lf = layer_flops(gpt(4, h, 16), b, s)
    assert lf.qkv == 6 * b * s * h * h
    assert lf.out_proj == 2 * b * s * h * h
    assert lf.mlp == 16 * b * s * h * h
    assert lf.attn_core == 4 * b * s * s * h
    assert lf.router == 0
    assert lf.total == 24 * b * s * h * h + 4 * b * s * s * h
    assert logits_flops(gpt(4, h, 16), b, s) == 2 * b * s * h * V_SC21


def test_gqa_swiglu_flops_by_hand():
    # Llama 3.1 8B: a = 32, g = 8, d = 128, f = 14336, three MLP matrices.
    m = load_model("llama3.1-8b")
    s, b, h, d = 8192, 1, 4096, 128
    lf = layer_flops(m, b, s)
    assert lf.qkv == 2 * s * h * (32 * d + 2 * 8 * d)
    assert lf.out_proj == 2 * s * (32 * d) * h
    assert lf.mlp == 2 * s * h * 14336 * 3
    assert lf.attn_core == 4 * s * s * 32 * d
    total = 3 * (32 * lf.total + 2 * s * h * 128256)
    assert math.isclose(step_model_flops(m, b, s), total, rel_tol=1e-12)


# --- Parameters -------------------------------------------------------------------------------

@pytest.mark.parametrize("published_b,heads,hidden,layers", SC21_TABLE1)
def test_param_count_sc21_table1(published_b, heads, hidden, layers):
    m = gpt(layers, hidden, heads)
    h, l, V = hidden, layers, V_SC21
    closed = 12 * l * h**2 * (1 + 13 / (12 * h) + V / (12 * l * h))  # no position embeddings
    assert math.isclose(param_count(m), closed + 2 * h, rel_tol=1e-12)  # + final LayerNorm
    # Table 1's own formula includes the s x h position embeddings; ours omits them.
    with_pos = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + S_SC21) / (12 * l * h))
    assert abs(with_pos - param_count(m)) == pytest.approx(S_SC21 * h - 2 * h)
    # Published (rounded) counts within 2%, except the 1.7B row: the paper's own formula gives
    # 1.652B for l=24, h=2304 (2.8% under the printed 1.7B), so that row gets 3.5%.
    tol = 0.035 if published_b == 1.7 else 0.02
    assert abs(param_count(m) / (published_b * 1e9) - 1) < tol
    # From 39.1B up the printed counts agree with the closed form within 0.1%.
    if published_b >= 39.1:
        assert abs(with_pos / (published_b * 1e9) - 1) < 1e-3


@pytest.mark.parametrize("model_id", ["gpt-1.7b", "gpt-18.4b", "gpt-1t"])
def test_sc21_presets_match_table_shapes(model_id):
    m = load_model(model_id)
    row = {p: (a, h, l) for p, a, h, l in SC21_TABLE1}
    target = {"gpt-1.7b": 1.7, "gpt-18.4b": 18.4, "gpt-1t": 1008.0}[model_id]
    a, h, l = row[target]
    assert (m.heads, m.hidden, m.layers, m.vocab) == (a, h, l, V_SC21)
    assert param_count(m) == param_count(gpt(l, h, a))


def _llama_by_hand(l, h, a, g, f, V, tied=False):
    d = h // a
    attn = h * (a * d + 2 * g * d) + a * d * h
    mlp = 3 * h * f
    norms = 2 * h
    return l * (attn + mlp + norms) + V * h * (1 if tied else 2) + h


@pytest.mark.parametrize("model_id,shape,published", [
    ("llama2-7b", (32, 4096, 32, 32, 11008, 32000), 6.74e9),
    ("llama3.1-8b", (32, 4096, 32, 8, 14336, 128256), 8.03e9),
    ("llama3.1-70b", (80, 8192, 64, 8, 28672, 128256), 70.6e9),
])
def test_gqa_swiglu_param_counts(model_id, shape, published):
    m = load_model(model_id)
    l, h, a, g, f, V = shape
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == shape
    assert m.mlp == "swiglu" and not m.bias and not m.tied_embeddings and m.norm == "rmsnorm"
    assert param_count(m) == _llama_by_hand(l, h, a, g, f, V)
    assert abs(param_count(m) / published - 1) < 0.01


def test_layer_params_gpt_by_hand():
    h = 1024
    lp = layer_params(gpt(4, h, 16))
    assert lp["attention"] == 4 * h * h + 4 * h  # QKV + out weights, biases
    assert lp["mlp"] == 8 * h * h + 5 * h  # fc1 (4h bias) + fc2 (h bias)
    assert lp["norms"] == 4 * h  # two LayerNorms, weight + bias
    assert sum(lp.values()) == 12 * h * h + 13 * h
