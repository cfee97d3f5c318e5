"""Megatron-LM launch script: parse the torchrun line back and check every value against the plan."""

from __future__ import annotations

import copy
import re

import pytest

from emit_helpers import MEGATRON_PLANS, bash_n, command_words, flags_after, load
from planner.emit import emit_files
from planner.emit.common import load_plan_view
from planner.errors import InputError


def megatron_flags(doc: dict, rank: int) -> tuple[list[str], dict[str, list[str]]]:
    script = emit_files(doc, "megatron", rank)["megatron_launch.sh"]
    words = command_words(script, "torchrun")
    prog = next(i for i, w in enumerate(words) if w.endswith("pretrain_gpt.py"))
    return words, flags_after(words, prog + 1)


def unroll(layout: str) -> list[str]:
    """Megatron's reading of --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py
    from_str: commas dropped, one pass of (X)*n, one pass of c*n, split on |)."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return s.split("|")


def one(flags: dict, name: str) -> int:
    assert len(flags[name]) == 1, name
    return int(flags[name][0])


@pytest.mark.parametrize("fixture,rank", MEGATRON_PLANS)
def test_flags_match_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    p, m, j = v.parallel, v.model, v.job
    words, f = megatron_flags(doc, rank)
    assert words[words.index("--nproc-per-node") + 1] == str(v.gpus_per_node)
    tp, pp, cp = one(f, "--tensor-model-parallel-size"), one(f, "--pipeline-model-parallel-size"), one(f, "--context-parallel-size")
    assert (tp, pp, cp) == (p.tp, p.pp, p.cp)
    # Megatron's rule: dp = world / (tp x pp x cp); batch: GBS % (MBS x DP) == 0.
    assert v.num_gpus % (tp * pp * cp) == 0 and v.num_gpus // (tp * pp * cp) == p.dp
    mbs, gbs = one(f, "--micro-batch-size"), one(f, "--global-batch-size")
    assert (mbs, gbs) == (p.micro_batch_size, j.global_batch_size)
    assert gbs % (mbs * p.dp) == 0 and gbs // (mbs * p.dp) == v.num_microbatches
    # model shape
    assert one(f, "--num-layers") == m.layers and one(f, "--hidden-size") == m.hidden
    assert one(f, "--ffn-hidden-size") == m.ffn_hidden and one(f, "--num-attention-heads") == m.heads
    assert one(f, "--kv-channels") == m.head_dim
    assert one(f, "--seq-length") == j.seq_len
    heads = one(f, "--num-attention-heads")
    assert heads % tp == 0
    assert f["--position-embedding-type"] == ["rope" if m.position_embedding == "rope" else "learned_absolute"]
    if m.position_embedding == "rope" and m.rope_theta is not None:
        assert f["--rotary-base"] == [str(int(m.rope_theta))]  # an int: Megatron rejects 5e5
    else:
        assert "--rotary-base" not in f
    if m.is_mla:
        assert "--multi-latent-attention" in f and "--group-query-attention" not in f
        assert (one(f, "--kv-lora-rank"), one(f, "--qk-head-dim"), one(f, "--qk-pos-emb-head-dim"), one(f, "--v-head-dim")) == \
            (m.kv_lora_rank, m.head_dim, m.qk_rope_head_dim, m.v_head_dim)
        assert (one(f, "--q-lora-rank") if m.q_lora_rank else None) == (m.q_lora_rank or None)
    elif m.kv_heads != m.heads:
        assert "--group-query-attention" in f and one(f, "--num-query-groups") == m.kv_heads
        groups = m.kv_heads
        assert groups % tp == 0 or tp % groups == 0
    else:
        assert "--group-query-attention" not in f
    assert ("--swiglu" in f) == (m.mlp == "swiglu") and ("--squared-relu" in f) == (m.mlp == "relu2")
    assert ("--untie-embeddings-and-output-weights" in f) == (not m.tied_embeddings)
    assert ("--disable-bias-linear" in f) == (not m.bias)
    assert f["--normalization"] == ["RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    # sequence parallel only with TP > 1
    assert ("--sequence-parallel" in f) == (p.sequence_parallel and p.tp > 1)
    # pipeline split
    layers = one(f, "--num-layers")
    first = f.get("--decoder-first-pipeline-num-layers")
    last = f.get("--decoder-last-pipeline-num-layers")
    if "--pipeline-model-parallel-layout" in f:
        layout = unroll(f["--pipeline-model-parallel-layout"][0])
        assert len(layout) == pp * p.vpp and first is None and last is None
        per_rank = [sum(seg.count("t") for seg in layout[r::pp]) for r in range(pp)]
        assert per_rank == list(v.stage_layers) and sum(per_rank) == layers
        assert layout[0].startswith("E") and layout[-1].endswith("L")
        return
    if "--account-for-embedding-in-pipeline-split" in f:
        # Megatron: (L + 2) slots, equal per rank; the embedding and the loss take one each.
        assert "--account-for-loss-in-pipeline-split" in f and first is None and last is None
        per = (layers + 2) // pp
        assert (layers + 2) % (pp * p.vpp) == 0
        assert list(v.stage_layers) == [per - (r == 0) - (r == pp - 1) for r in range(pp)]
        assert one(f, "--num-virtual-stages-per-pipeline-rank") == p.vpp
        return
    if v.uneven:
        a, b = int(first[0]), int(last[0])
        assert (a, b) == (v.stage_layers[0], v.stage_layers[-1])
        rest, middle = layers - a - b, pp - 2
        assert (rest == 0) == (middle == 0) and (middle == 0 or rest % middle == 0)
    else:
        assert first is None and last is None and layers % pp == 0
    if p.vpp > 1:
        if "--num-layers-per-virtual-pipeline-stage" in f:
            per = one(f, "--num-layers-per-virtual-pipeline-stage")
            assert (layers // pp) % per == 0 and (layers // pp) // per == p.vpp
        else:
            assert one(f, "--num-virtual-stages-per-pipeline-rank") == p.vpp
        assert v.num_microbatches % pp == 0
    else:
        assert "--num-layers-per-virtual-pipeline-stage" not in f and "--num-virtual-stages-per-pipeline-rank" not in f
    assert "--virtual-pipeline-model-parallel-size" not in f  # not a Megatron-LM flag (sec. 2.3)
    # recompute
    if p.recompute == "none":
        assert "--recompute-granularity" not in f
    else:
        assert f["--recompute-granularity"] == [p.recompute]
        assert ("--recompute-method" in f) == (p.recompute == "full")
    assert ("--use-distributed-optimizer" in f) == (p.zero >= 1)
    assert ("--use-megatron-fsdp" in f) == (p.zero >= 2)
    # the overlaps the cost model credits are asked for (Megatron's defaults are off)
    assert ("--overlap-grad-reduce" in f) == (p.dp * p.cp > 1 and p.overlap_grad_reduce)
    assert ("--overlap-param-gather" in f) == (p.dp * p.cp > 1 and p.overlap_grad_reduce and p.zero in (1, 2) and p.overlap_param_gather)
    # precision
    assert ("--bf16" in f) == (j.precision in ("bf16", "fp8")) and ("--fp16" in f) == (j.precision == "fp16")
    assert (f.get("--fp8-format") == ["hybrid"]) == (j.precision == "fp8")
    assert ("--grad-reduce-in-bf16" in f) == (j.grad_reduce == "bf16")  # the gradient dtype the prediction assumed
    if p.zero >= 2 and j.precision != "fp16":  # Megatron FSDP keeps its own gradient dtype
        assert f["--megatron-fsdp-main-grads-dtype"] == ["bf16" if j.grad_reduce == "bf16" else "fp32"]
    else:
        assert "--megatron-fsdp-main-grads-dtype" not in f
    # MoE
    if m.moe is not None:
        assert one(f, "--num-experts") == m.moe.experts and one(f, "--moe-router-topk") == m.moe.top_k
        ep = one(f, "--expert-model-parallel-size")
        assert ep == p.ep and m.moe.experts % ep == 0
    else:
        assert "--num-experts" not in f and "--expert-model-parallel-size" not in f


@pytest.mark.parametrize("fixture,rank", MEGATRON_PLANS)
def test_bash_n(tmp_path, fixture, rank):
    files = emit_files(load(fixture), "megatron", rank)
    path = tmp_path / "megatron_launch.sh"
    path.write_text(files["megatron_launch.sh"])
    bash_n(path)


def test_uneven_middle_stages_use_the_layout_flag():
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"].update(vpp=1, schedule="1f1b", layers_per_stage=[18, 20, 24, 18])
    _, f = megatron_flags(doc, 1)
    assert f["--pipeline-model-parallel-layout"] == ["E" + "t" * 18 + "|" + "t" * 20 + "|" + "t" * 24 + "|" + "t" * 18 + "L"]
    assert "--decoder-first-pipeline-num-layers" not in f


def test_interleaved_uneven_layout_orders_virtual_stages_chunk_major():
    from planner.emit.megatron import pipeline_layout

    # 126 layers (Llama 3.1 405B) on 4 ranks x 2 chunks, ranks (30, 32, 32, 32): rank r holds
    # virtual stages r and r + 4.
    layout = unroll(pipeline_layout((30, 32, 32, 32), 2))
    assert [seg.count("t") for seg in layout] == [15, 16, 16, 16, 15, 16, 16, 16]
    assert layout[0].startswith("E") and layout[-1].endswith("L")


def test_uneven_first_only_and_vpp_uses_virtual_stages_flag():
    doc = copy.deepcopy(load("llama70b_64gpu"))
    _, f = megatron_flags(doc, 1)  # [18, 22, 22, 18] with vpp=2
    assert f["--num-virtual-stages-per-pipeline-rank"] == ["2"]
    assert "--num-layers-per-virtual-pipeline-stage" not in f


def test_uneven_chunks_use_the_layout():
    # [19, 21, 21, 19] with vpp 2: odd stages cannot be cut into equal chunks, nor is it the
    # account-flags split; the layout writes each chunk (embedding and loss counted as a slot).
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"]["layers_per_stage"] = [19, 21, 21, 19]
    _, f = megatron_flags(doc, 1)
    layout = f["--pipeline-model-parallel-layout"][0]
    assert layout == "E" + "t" * 9 + "|" + "t" * 11 + "|" + "t" * 11 + "|(" + "t" * 10 + "|)*4," + "t" * 9 + "L"
    assert "--num-virtual-stages-per-pipeline-rank" not in f and "--decoder-first-pipeline-num-layers" not in f


def test_llama405b_interleaved_uses_the_account_flags():
    _, f = megatron_flags(load("llama405b_512gpu"), 1)  # (15, 16 x 6, 15) on pp 8 x vpp 8
    assert "--account-for-embedding-in-pipeline-split" in f and "--account-for-loss-in-pipeline-split" in f
    assert f["--num-virtual-stages-per-pipeline-rank"] == ["8"] and "--pipeline-model-parallel-layout" not in f
    assert f["--rotary-base"] == ["500000"]


def test_deepseek_v3_mla_and_moe_flags():
    _, f = megatron_flags(load("deepseek_v3_1024gpu"), 3)
    assert f["--q-lora-rank"] == ["1536"] and f["--kv-lora-rank"] == ["512"] and f["--qk-pos-emb-head-dim"] == ["64"]
    assert f["--moe-layer-freq"] == ["([0]*3+[1]*58)"] and f["--expert-model-parallel-size"] == ["8"]
    assert f["--moe-router-score-function"] == ["sigmoid"] and f["--moe-shared-expert-intermediate-size"] == ["2048"]
    assert f["--rotary-base"] == ["10000"]


def test_megatron_fsdp_env_and_flags():
    script = emit_files(load("llama8b_fsdp_64gpu"), "megatron", 1)["megatron_launch.sh"]
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in script and "--ckpt-format fsdp_dtensor" in script
    assert "--data-parallel-sharding-strategy optim_grads_params" in script


def test_refuses_what_megatron_core_does_not_run():
    # Megatron-FSDP (ZeRO-2) with a pipeline: the megatron-core profile's reason.
    with pytest.raises(InputError, match="pipeline parallelism on megatron-core"):
        emit_files(load("llama70b_64gpu"), "megatron", 2)
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["plans"][0]["parallel"].update(schedule="zb-v", vpp=2)
    with pytest.raises(InputError, match="schedule"):
        emit_files(doc, "megatron", 1)


def test_rotary_base_must_be_an_integer():
    doc = copy.deepcopy(load("llama70b_64gpu"))
    doc["model"]["rope_theta"] = 500000.5
    with pytest.raises(InputError, match="rope_theta"):
        emit_files(doc, "megatron", 1)
    doc["model"]["rope_theta"] = 5e5  # a float that is a whole number is written as an int
    _, f = megatron_flags(doc, 1)
    assert f["--rotary-base"] == ["500000"]


def test_learned_positions_for_gpt():
    _, f = megatron_flags(load("gpt_dense_16gpu"), 1)
    assert f["--position-embedding-type"] == ["learned_absolute"] and f["--normalization"] == ["LayerNorm"]


# --- Megatron-core's own dataclasses (pip install megatron-core) -----------------------------

_RENAMES = {
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--num-experts": "num_moe_experts",
    "--fp8-format": "fp8",
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
}


@pytest.mark.parametrize("fixture,rank", MEGATRON_PLANS)
def test_megatron_core_transformer_config_accepts(fixture, rank):
    """Feed the emitted flags to megatron.core's TransformerConfig (its __post_init__ checks
    TP/heads, uneven PP and VPP divisibility, recompute combinations, MoE) and to its
    microbatch calculator (GBS % (MBS x DP))."""
    pytest.importorskip("megatron.core")
    import dataclasses

    import torch
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    doc = load(fixture)
    v = load_plan_view(doc, rank)
    _, f = megatron_flags(doc, rank)
    fields = {fl.name for fl in dataclasses.fields(TransformerConfig)}
    kw: dict = {}
    for flag, vals in f.items():
        name = _RENAMES.get(flag, flag[2:].replace("-", "_"))
        if name not in fields:
            continue
        if not vals:
            kw[name] = True
        else:
            kw[name] = int(vals[0]) if vals[0].isdigit() else vals[0]
    if "--num-layers-per-virtual-pipeline-stage" in f:
        per = int(f["--num-layers-per-virtual-pipeline-stage"][0])
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // kw["pipeline_model_parallel_size"] // per
    if "--swiglu" in f:
        kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if "--disable-bias-linear" in f:
        kw["add_bias_linear"] = False
    if "--normalization" in f:
        kw["normalization"] = f["--normalization"][0]
    if "--moe-ffn-hidden-size" in f:
        kw["moe_ffn_hidden_size"] = int(f["--moe-ffn-hidden-size"][0])
    if "--moe-layer-freq" in f:
        kw["moe_layer_freq"] = eval(f["--moe-layer-freq"][0], {})  # Megatron evaluates the same list expression
    if kw.get("fp8"):
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            kw.pop("fp8")  # MoE FP8 checks need Transformer Engine; not installable on a CPU box
    dtype = torch.bfloat16 if "--bf16" in f else torch.float16
    kw.update(params_dtype=dtype, pipeline_dtype=dtype, bf16="--bf16" in f, fp16="--fp16" in f)
    kw.pop("seq_length", None)
    cfg = TransformerConfig(**kw)
    assert cfg.tensor_model_parallel_size == v.parallel.tp
    assert cfg.pipeline_model_parallel_size == v.parallel.pp
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == v.parallel.vpp
    calc = ConstantNumMicroBatchesCalculator(
        global_batch_size=int(f["--global-batch-size"][0]), micro_batch_size=int(f["--micro-batch-size"][0]),
        data_parallel_size=v.parallel.dp, decrease_batch_size_if_needed=False, rank=0)
    assert calc.get() == v.num_microbatches
