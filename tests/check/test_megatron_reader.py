"""Megatron-LM flags -> the configuration Megatron-LM runs (its own defaults and rules)."""

from __future__ import annotations

import pytest

from planner.check.megatron import layer_freq, parse_layout
from planner.check.read import read_job
from planner.errors import InputError

BASE = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
        "--micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 32000")


def _read(tmp_path, extra: str, gpus: int = 8, layers: int = 32):
    p = tmp_path / "flags.txt"
    p.write_text(BASE.replace("--num-layers 32", f"--num-layers {layers}") + " " + extra + "\n")
    from planner.check.job import Overrides

    return read_job([str(p)], Overrides(gpus=gpus))


def test_absent_overlaps_are_off_and_said_so(tmp_path):
    cj = _read(tmp_path, "--use-distributed-optimizer")
    p = cj.parallel
    assert p.zero == 1 and p.overlap_grad_reduce is False and p.overlap_param_gather is False and p.tp_comm_overlap is False
    assert cj.sources["parallel.overlap_grad_reduce"][1].kind == "default"
    assert "arguments.py:3121" in cj.sources["parallel.overlap_grad_reduce"][1].where
    cj = _read(tmp_path, "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tensor-model-parallel-size 2 "
               "--sequence-parallel --tp-comm-overlap")
    assert (cj.parallel.overlap_grad_reduce, cj.parallel.overlap_param_gather, cj.parallel.tp_comm_overlap) == (True, True, True)


def test_sequence_parallel_is_dropped_at_tp_1(tmp_path):
    assert _read(tmp_path, "--sequence-parallel").parallel.sequence_parallel is False


@pytest.mark.parametrize("extra,vpp,lps", [
    ("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2", 4, (8, 8, 8, 8)),
    ("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2", 2, (8, 8, 8, 8)),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 8", 1, (6, 9, 9, 8)),
    ("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 1, (8, 9, 9, 8)),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*7|t*8|t*8|t*9L'", 2, (15, 17)),
])
def test_pipeline_split(tmp_path, extra, vpp, lps):
    layers = 34 if "account" in extra else 32
    p = _read(tmp_path, extra, layers=layers).parallel
    assert (p.vpp, p.layers_per_stage) == (vpp, lps)
    assert p.schedule == ("interleaved" if vpp > 1 else "1f1b")


def test_layout_grammar():
    assert parse_layout("Et|(tt|)*62,tL", 126, 8, "x") == (8, (15, 16, 16, 16, 16, 16, 16, 15))
    with pytest.raises(InputError):
        parse_layout("Et*3|t*3L", 7, 2, "x")


def test_sharding_modes(tmp_path):
    assert _read(tmp_path, "--use-megatron-fsdp --ckpt-format fsdp_dtensor").parallel.zero == 3  # the CLI default strategy
    p = _read(tmp_path, "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads").parallel
    assert p.zero == 2 and p.overlap_grad_reduce is True  # forced on by Megatron-FSDP
    assert _read(tmp_path, "--use-distributed-optimizer --num-distributed-optimizer-instances 2").parallel.zero_shard_degree == 4


def test_recompute(tmp_path):
    assert _read(tmp_path, "--recompute-activations").parallel.recompute == "selective"
    cj = _read(tmp_path, "--recompute-granularity selective --recompute-modules core_attn mlp")
    assert cj.parallel.recompute == "selective" and any("mlp" in u for u in cj.unmodelled)
    assert _read(tmp_path, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1").parallel.recompute == "full"


def test_model_shape_defaults(tmp_path):
    cj = _read(tmp_path, "--swiglu --group-query-attention --num-query-groups 8 --normalization RMSNorm --position-embedding-type rope "
               "--rotary-base 500000 --untie-embeddings-and-output-weights --disable-bias-linear")
    m = cj.model
    assert (m.ffn_hidden, m.kv_heads, m.head_dim, m.mlp, m.norm, m.rope_theta, m.tied_embeddings, m.bias) == \
        (int(8 * 4096 / 3 / 64) * 64, 8, 128, "swiglu", "rmsnorm", 500000.0, False, False)
    assert cj.sources["model.ffn_hidden"][1].kind == "default"


def test_moe_and_mla(tmp_path):
    cj = _read(tmp_path, "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --moe-layer-freq ([0]*2+[1]*30) "
               "--expert-model-parallel-size 8 --multi-latent-attention --q-lora-rank 512 --kv-lora-rank 256")
    m = cj.model
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_ffn_hidden, m.moe.dense_layers) == (8, 2, 1024, 2)
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim) == (512, 256, 64, 128)
    assert layer_freq("2", 4, "x") == [1, 0, 1, 0]


@pytest.mark.parametrize("flags,want", [
    ("", "alltoall"),
    ("--moe-token-dispatcher-type alltoall", "alltoall"),
    ("--moe-token-dispatcher-type flex", "deepep"),  # TransformerConfig.moe_flex_dispatcher_backend default
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "hybridep"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep"),
])
def test_moe_dispatcher(tmp_path, flags, want):
    cj = _read(tmp_path, "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --expert-model-parallel-size 8 " + flags)
    assert cj.parallel.moe_dispatcher == want
    assert cj.sources["parallel.moe_dispatcher"][1].kind == ("file" if "flex" in flags else "default")


def test_fp8_and_gradient_dtype(tmp_path):
    j = _read(tmp_path, "--fp8-format hybrid --grad-reduce-in-bf16").job
    assert (j.precision, j.grad_reduce) == ("fp8", "bf16")


def test_legacy_flags_read_as_the_2021_engine(tmp_path):
    cj = _read(tmp_path, "--DDP-impl local --activations-checkpoint-method uniform")
    assert cj.engine == "megatron-legacy" and cj.parallel.recompute == "full" and cj.parallel.overlap_grad_reduce is False
    assert cj.parallel.attention == "unfused"


def test_an_unknown_tokenizer_says_the_vocabulary_was_assumed(tmp_path):
    p = tmp_path / "flags.txt"
    p.write_text(BASE.replace(" --vocab-size 32000", "") + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model org/unknown-model\n")
    from planner.check.job import Overrides

    cj = read_job([str(p)], Overrides(gpus=8))
    assert cj.model.vocab == 50257 and cj.sources["model.vocab"][1].kind == "default"
    assert any("org/unknown-model" in n and "--vocab-size" in n for n in cj.notes)
    assert not any("vocabulary assumed" in n for n in _read(tmp_path, "").notes)  # --vocab-size given: nothing assumed
