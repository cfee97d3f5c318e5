"""Engine-specific memory terms against hand computation from their cited source.

* Model states: the ZeRO paper (Rajbhandari et al. 2020 sec. 3.1) 2 + 2 + 12 B per parameter
  for fp16 Adam; Megatron's distributed optimizer 6 + 12/d for bf16; FSDP2 (torchtitan): the
  fp32 shard is the parameter, 4 + 8 B / d, gradients 4 B / d from the backward, unsharded fp32
  accumulators (4 B per TP-local parameter) under pipelining.
* Activations: Korthikanti et al. 2022 (test_memory.py); torchtitan's per-op policy saves
  2 (h + q + kv/2 + q + f + h) + 4 a bytes per token and layer (Llama 3.1 8B: 63,616 B);
  the Zero Bubble fork keeps 32 s b h per GPT layer from B to W (zb_schedules.py w_mem).
* FSDP2 buffers: [norm, output] and one block unsharded at the loss without a pipeline, the
  whole stage with one; the all-gather and reduce-scatter stream pools.
* Schedules: 1F1B holds min(p - i, m) micro-batches (Narayanan 2021), interleaving its closed
  form, ZB-H1 p - i plus i pending W passes, ZB-H2 2p - i.
* Loss: Megatron-Core 6 B per logit at the loss, torchtitan 12 B (16 with loss parallelism).
"""

from __future__ import annotations

import pytest

from planner.cost import memory as M
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.memory_schedule import moment_table, rank_ops
from planner.engines import get_engine
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ModelSpec, ParallelConfig

GIB = 2**30


def gpt(layers=24, hidden=2048, heads=16):
    return ModelSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=51200, mlp="gelu", tied_embeddings=True, bias=True, norm="layernorm")


# --- model states ------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 8, 64])
def test_states_megatron_zero_paper_and_distributed_optimizer(d):
    st = M.state_bytes_per_param("fp16", 0, d, "auto", C, "megatron")
    assert st["weights"] + st["gradients"] + st["optimizer"] == 16.0  # ZeRO paper: 2 + 2 + 12
    assert st["optimizer_step"] == 4.0  # the fp32 copy of the fp16 gradients inside step()
    st = M.state_bytes_per_param("bf16", 1, d, "auto", C, "megatron")
    assert st["weights"] + st["gradients"] + st["optimizer"] == pytest.approx(6 + 12 / d)
    assert st["optimizer_step"] == 0.0  # fp32 main grads are the optimizer's gradients


@pytest.mark.parametrize("d", [1, 8, 128])
def test_states_fsdp2(d):
    st = M.state_bytes_per_param("bf16", 3, d, "auto", C, "fsdp2", "microbatch", 0.0, 4.0)
    assert (st["weights"], st["gradients"], st["optimizer"]) == pytest.approx((4 / d, 0.0, 8 / d))
    assert st["step_gradients"] == pytest.approx(4 / d) and st["optimizer_step"] == pytest.approx(4 / d)
    pp = M.state_bytes_per_param("bf16", 2, d, "auto", C, "fsdp2", "step", 0.0, 4.0)
    assert pp["step_gradients"] == 4.0 and pp["step_gradients_unsharded"] == 1.0


def test_states_fp8_weight_cache_is_the_engines():
    te = M.state_bytes_per_param("fp8", 1, 8, "auto", C, "megatron", fp8_cache=2.0)
    torchao = M.state_bytes_per_param("fp8", 1, 8, "auto", C, "megatron", fp8_cache=0.0)
    assert te["weights"] == 4.0 and torchao["weights"] == 2.0


# --- activations ---------------------------------------------------------------------------------

def test_torchtitan_op_sac_saved_set_llama3_8b():
    m = load_model("llama3.1-8b")
    h, q, kv2, f, a = 4096, 4096, 1024, 14336, 32
    assert M.sac_op_bytes_per_layer(m, 1) == 2 * (h + q + kv2 + q + f + h) + 4 * a == 63616
    # under TP: the sharded tensors divide, w2's mm output is the full-sequence partial sum and
    # the two reduce-scatter outputs are saved
    t = 8
    want = 2 * h / t + 2 * q / t + 2 * kv2 / t + 2 * q / t + 4 * a / t + 2 * f / t + 2 * h + 4 * h / t
    assert M.sac_op_bytes_per_layer(m, t) == pytest.approx(want)
    per_layer = M.activation_bytes_per_layer(m, 2, 8192, 1, 1, False, "selective", True, C=C, selective="op")
    assert per_layer == pytest.approx(2 * 8192 * 63616)


def test_zero_bubble_weight_gradient_store_is_32_sbh():
    m = gpt()
    s, b, h = 1024, 6, 2048
    assert M.weight_grad_kept_bytes_per_layer(m, b, s, 1, 1, False, "fp16", C) == pytest.approx(32 * s * b * h)


def test_rope_copies_and_dropout_switches():
    m = load_model("llama3.1-8b")
    s, b = 4096, 1
    base = M.activation_bytes_per_layer(m, b, s, 1, 1, False, "none", True, C=C, dropout="never")
    rope = M.activation_bytes_per_layer(m, b, s, 1, 1, False, "none", True, C=C, dropout="never", rope_copies=True)
    assert rope - base == pytest.approx(2 * s * b * (4096 + 1024))  # rotated Q and K
    drop = M.activation_bytes_per_layer(m, b, s, 1, 1, False, "none", True, C=C, dropout="always")
    assert drop - base == pytest.approx(2 * s * b * 4096)  # two 1-byte dropout masks


def test_gathered_column_parallel_inputs():
    m = load_model("llama3.1-70b")
    s, b, t = 8192, 1, 8
    shard = M.activation_bytes_per_layer(m, b, s, t, 1, True, "none", True, C=C)
    full = M.activation_bytes_per_layer(m, b, s, t, 1, True, "none", True, C=C, gathered_inputs=True)
    assert full - shard == pytest.approx(2 * 2 * s * b * 8192 * (1 - 1 / t))  # QKV and fc1 inputs, 16-bit


# --- schedules -----------------------------------------------------------------------------------

def _peak_held(schedule, rank, p, v, m, r_w=0.0):
    t = moment_table(schedule, rank, p, v, m, schedule.startswith("zb-h"), False)
    return max((t.held[i].sum() + r_w * t.pending[i].sum()) for i in range(len(t)))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24), (8, 4), (16, 48)])
def test_1f1b_holds_p_minus_i(p, m):
    for i in range(p):
        assert _peak_held("1f1b", i, p, 1, m) == min(p - i, m)


@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (8, 4)])
def test_interleaved_walk_matches_the_closed_form(p, v):
    m = 4 * p
    for i in range(p):
        assert _peak_held("interleaved", i, p, v, m) == pytest.approx(M.inflight_microbatches(i, p, v, m) * v)


@pytest.mark.parametrize("p", [4, 8])
def test_zero_bubble_pending_weight_passes(p):
    m, r_w = 3 * p, 0.4
    for i in range(p):
        # ZB-H1: p - i micro-batches and i pending W passes (Qi et al.: ZB-1p's p - i (1 - r_W))
        assert _peak_held("zb-h1", i, p, 1, m, r_w) == pytest.approx(p - i + i * r_w)
        assert _peak_held("zb-h2", i, p, 1, m) == min(m, 2 * p - i)
    ops, _ = rank_ops("zb-h1", 1, p, 1, m)
    assert sum(k == "W" for k, _, _ in ops) == m


def test_chunk_layers_uneven_and_padded():
    assert M.chunk_layers(0, 15, 2, 8) == (7, 8) and M.chunk_layers(7, 15, 2, 8) == (8, 7)
    assert M.chunk_layers(3, 16, 2, 8) == (8, 8)
    assert M.chunk_layers(0, 2, 3, 8) == (0, 1, 1) and M.chunk_layers(7, 2, 3, 8) == (1, 1, 0)


# --- FSDP2 (torchtitan) --------------------------------------------------------------------------

def _tt(par, model="llama3.1-8b", gpus=8, seq=8192, gbs=16, prec="bf16"):
    m = load_model(model)
    return m, estimate(m, make_cluster("h100-hbm2e-96gb", gpus), Job(seq, gbs, prec), par, "torchtitan")


def test_fsdp2_without_pipeline_holds_output_group_and_one_block():
    m, e = _tt(ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=2, recompute="selective", zero=3))
    st = e.stages[0]
    p = M.stage_params(m, m.layers, 0, 1, 1, 1, m.layers)
    layer = p["layers"] / m.layers
    assert dict(st.parts)["gathered parameters"] == pytest.approx(2.0 * p["output"] + 2.0 * layer)
    assert st.weights_bytes == pytest.approx(4.0 * (p["layers"] + p["embedding"] + p["output"]) / 8)
    assert st.gradients_bytes == 0.0  # zero_grad(set_to_none) before the first micro-batch
    # the loss: 12 B per logit (cross_entropy on the fp32 upcast)
    assert st.logits_bytes == pytest.approx(12.0 * 2 * 8192 * m.vocab)
    assert "the loss" in st.moment
    # the stream pools: two blocks' all-gather outputs and the freed sharded gradients
    pools = 2 * 2.0 * layer + 4.0 * (p["layers"] + p["embedding"] + p["output"]) / 8
    f = C.ALLOCATOR_RESERVE_FRACTION
    dyn = st.activations_bytes + st.logits_bytes + st.buffers_bytes
    assert st.reserve_bytes == pytest.approx(f * dyn + pools, rel=1e-9)


def test_fsdp2_under_pipelining_unsharded_stage_and_fp32_accumulators():
    m, e = _tt(ParallelConfig(tp=8, pp=8, dp=8, micro_batch_size=4, recompute="full", zero=2, schedule="1f1b",
                              layers_per_stage=(15, 16, 16, 16, 16, 16, 16, 15)), "llama3.1-405b", 512, 8192, 256, "fp8")
    st = e.stages[1]
    p = M.stage_params(m, 16, 1, 8, 8, 1, 16)
    assert st.gradients_bytes == pytest.approx(4.0 * p["layers"])  # unsharded fp32, from the first backward
    # every block unsharded in bf16 (the rowwise Float8 recipe all-gathers bf16), and at a block's
    # backward that block's bf16 gradients before they join the fp32 accumulators
    assert dict(st.parts)["gathered parameters"] == pytest.approx(2.0 * p["layers"] + 2.0 * p["layers"] / 16)
    assert "backward" in st.moment and "7 chunk-micro-batches" in st.moment  # 1F1B rank 1: p - 1 in flight
    x = 2.0 * 4 * 8192 * 16384 / 8  # one bf16 hidden state of the micro-batch, sequence-sharded
    assert dict(st.parts)["pipeline receive buffers"] == pytest.approx(2 * 8 * x)  # activation + gradient buffer per micro-batch
    assert dict(e.stages[0].parts)["pipeline receive buffers"] == pytest.approx(8 * x)  # the first stage receives no activation
    assert e.memory_peak_stage in (0, 1)


# --- loss ---------------------------------------------------------------------------------

def test_megatron_core_loss_is_six_bytes_a_logit():
    m = gpt(4, 1024, 8)
    e = estimate(m, make_cluster("h100-sxm5-80gb", 8), Job(2048, 8), ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1))
    assert e.stages[0].logits_bytes == pytest.approx(6.0 * 2048 * m.vocab)
    assert get_engine("megatron-core").memory.loss_held == 4.0
