"""Multi-token prediction (ModelSpec.mtp_layers; DeepSeek-V3 sec. 2.2, Megatron-core
--mtp-num-layers): on the last pipeline stage one more layer of the decoder's last kind, the
2h -> h projection and a second pass of the shared output head and loss, and their parameters;
megatron-core runs it, the other engines refuse it; the launch files write it and check reads it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from planner.check.job import Overrides
from planner.check.read import read_job
from planner.cost import memory as M
from planner.cost.compute import logits_times
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.stages import layer_costs
from planner.emit.common import load_plan_view
from planner.emit.megatron import _model_args
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster, model_from_dict
from planner.specs import Job, ModelSpec, ParallelConfig
from conftest import run_cli

MOE = load_model("qwen3-30b-a3b")
MTP = dataclasses.replace(MOE, mtp_layers=1)
CLUSTER = make_cluster("h100-sxm5-80gb", 16)
JOB = Job(4096, 64, "bf16")
PAR = ParallelConfig(tp=1, pp=2, dp=8, ep=8, vpp=1, micro_batch_size=1, recompute="none")


def test_the_field_is_checked_and_read():
    with pytest.raises(InputError, match="model.mtp_layers"):
        dataclasses.replace(MOE, mtp_layers=-1)
    d = {"name": "m", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 1024, "vocab": 1000, "mtp_layers": 1}
    assert model_from_dict(d).mtp_layers == 1
    assert ModelSpec(**{k: v for k, v in d.items() if k != "mtp_layers"}).mtp_layers == 0


def test_last_stage_adds_one_layer_the_projection_and_the_head():
    base, mtp = layer_costs(MOE, CLUSTER, JOB, PAR, C), layer_costs(MTP, CLUSTER, JOB, PAR, C)
    layer = sum(base[1].values())  # one MoE layer per micro-batch
    lg_f, lg_b = logits_times(MOE, CLUSTER.gpu, "bf16", 1, 4096, 1, 1, C)
    extra = sum(mtp[2].values()) - sum(base[2].values())
    assert extra > layer + lg_f + lg_b  # plus the 2h -> h projection
    assert extra < layer + 2 * (lg_f + lg_b)
    assert base[0] == mtp[0] and base[1] == mtp[1]  # the decoder layers are unchanged
    # the module's layer keeps its kinds: its expert all-to-all is communication, not compute
    assert base[1]["ep_comm"] > 0 and mtp[2]["ep_comm"] - base[2].get("ep_comm", 0.0) == pytest.approx(base[1]["ep_comm"])
    assert mtp[2]["compute"] - base[2]["compute"] > base[1]["compute"] + lg_f + lg_b


def test_tensor_parallel_traffic_of_the_module():
    """With tp > 1 the module's embedding, eh_proj (2h input) and its output gather move b*s*h
    activations over the tensor group beyond its layer's and the head's exchanges."""
    par = PAR.replace(tp=2, dp=4, ep=4, sequence_parallel=True)
    base, mtp = layer_costs(MOE, CLUSTER, JOB, par, C), layer_costs(MTP, CLUSTER, JOB, par, C)
    head = base[2]["tp_comm"]
    assert head > 0  # the output layer's own all-gather and reduce-scatter
    more = mtp[2]["tp_comm"] - head
    assert more > base[1]["tp_comm"] + head  # its layer, a second head pass, and the module's own traffic
    assert layer_costs(MOE, CLUSTER, JOB, PAR, C)[2]["tp_comm"] == 0.0  # nothing at tp 1


def test_untied_model_keeps_an_embedding_copy_on_the_last_stage():
    """Megatron-core's MTP embeds the shifted tokens on the last stage: an untied model keeps a
    copy of the word embedding there, all-reduced with stage 0's (language_module.py,
    finalize_model_grads.py); a tied model's last stage holds it already."""
    from planner.cost.comm import GroupLinks
    from planner.cost.stages import embedding_sync_time

    assert not MOE.tied_embeddings
    emb = MOE.vocab * MOE.hidden
    last = M.stage_params(MTP, 24, 1, 2, 1, 8, n_dense=0)
    assert last["embedding"] == emb and M.stage_params(MOE, 24, 1, 2, 1, 8, n_dense=0)["embedding"] == 0
    assert M.stage_params(MTP, 48, 0, 1, 1, 8, n_dense=0)["embedding"] == emb  # pp 1: one copy
    tied = dataclasses.replace(MTP, tied_embeddings=True)
    assert M.stage_params(tied, 24, 1, 2, 1, 8, n_dense=0)["embedding"] == 0
    links = GroupLinks(2, 1, 2, *_levels())
    assert embedding_sync_time(MOE, PAR, 2, links) == 0.0 < embedding_sync_time(MTP, PAR, 2, links)


def _levels():
    from planner.cost.comm import cluster_levels

    return cluster_levels(CLUSTER)


def test_norm_parameters_follow_the_norm():
    ln = dataclasses.replace(MTP, norm="layernorm", position_embedding="rope")
    rms = M.stage_params(MTP, 24, 1, 2, 1, 8, n_dense=0)["layers"] - M.stage_params(MOE, 24, 1, 2, 1, 8, n_dense=0)["layers"]
    lnd = (M.stage_params(ln, 24, 1, 2, 1, 8, n_dense=0)["layers"]
           - M.stage_params(dataclasses.replace(ln, mtp_layers=0), 24, 1, 2, 1, 8, n_dense=0)["layers"])
    # enorm, hnorm and the final norm: h each for RMSNorm, 2h (weight and bias) for LayerNorm;
    # the layer's own norms differ too, which layer_params counts
    from planner.cost.flops import layer_params

    lnorm = layer_params(ln, moe_layer=True)["norms"] - layer_params(MOE, moe_layer=True)["norms"]
    assert lnd - rms == pytest.approx(3 * MOE.hidden + lnorm)


def test_model_flops_count_the_modules_as_megatron_does():
    """training.py num_floating_point_operations: the MTP layers, eh_proj and a second logits pass."""
    from planner.cost.flops import layer_flops, logits_flops, step_model_flops

    b, s = 8, 4096
    last = layer_flops(MOE, b, s, True)
    want = 3 * (last.matmul + last.attn_core + 2 * b * s * 2 * MOE.hidden ** 2 + logits_flops(MOE, b, s))
    assert step_model_flops(MTP, b, s) - step_model_flops(MOE, b, s) == pytest.approx(want)


def test_last_stage_holds_its_parameters():
    first = M.stage_params(MTP, 24, 0, 2, 1, 8, n_dense=0)
    last, last0 = M.stage_params(MTP, 24, 1, 2, 1, 8, n_dense=0), M.stage_params(MOE, 24, 1, 2, 1, 8, n_dense=0)
    assert first == M.stage_params(MOE, 24, 0, 2, 1, 8, n_dense=0)
    assert last["experts"] == pytest.approx(last0["experts"] * 25 / 24)
    assert last["layers"] - last0["layers"] > 2 * MOE.hidden * MOE.hidden  # the layer's attention plus eh_proj


def test_step_is_longer_on_megatron_core_and_refused_elsewhere():
    assert estimate(MTP, CLUSTER, JOB, PAR).step_time_s > estimate(MOE, CLUSTER, JOB, PAR).step_time_s
    with pytest.raises(InputError, match="model.mtp_layers.*torchtitan"):
        estimate(MTP, CLUSTER, JOB, PAR.replace(zero=3), "torchtitan")


def _args(tmp_path, mtp: int) -> list[str]:
    f = tmp_path / f"m{mtp}.yaml"
    f.write_text(yaml.safe_dump({"name": "mtp", "layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
                                 "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "bias": False, "mtp_layers": mtp}))
    code, out, err = run_cli(["plan", "--model", str(f), "--gpus", "8", "-s", "2048", "-b", "16", "--tp", "1", "--pp", "2", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["mtp_layers"] == mtp  # the plan document carries it for launch
    return [str(a) for a in _model_args(load_plan_view(doc))]


def test_launch_writes_it_and_check_reads_it(tmp_path):
    args = _args(tmp_path, 1)
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert "--mtp-num-layers" not in _args(tmp_path, 0)
    p = tmp_path / "flags.txt"
    p.write_text("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --max-position-embeddings 2048 "
                 "--micro-batch-size 1 --global-batch-size 16 --bf16 --vocab-size 32000 --mtp-num-layers 1\n")
    assert read_job([str(p)], Overrides(gpus=8)).model.mtp_layers == 1


def test_what_megatron_refuses_is_refused():
    """arguments.py: MTP with rope (or no) position embeddings only; transformer_config.py: at
    most one MTP layer beside --overlap-moe-expert-parallel-comm."""
    from planner.engines import a2a_overlap_why, get_engine
    from planner.search.plan import plan
    from planner.search.space import SearchOptions

    learned = dataclasses.replace(load_model("gpt3-1.3b"), mtp_layers=1)
    with pytest.raises(InputError, match="model.mtp_layers.*learned position"):
        estimate(learned, make_cluster("h100-sxm5-80gb", 8), Job(2048, 16, "bf16"), ParallelConfig(tp=1, pp=1, dp=8))
    two = dataclasses.replace(MOE, mtp_layers=2)
    eng = get_engine("megatron-core")
    assert a2a_overlap_why(eng, MTP, 8, "selective", 1, 1, None) is None
    assert "multi-token" in a2a_overlap_why(eng, two, 8, "selective", 1, 1, None)
    with pytest.raises(InputError, match="parallel.moe_a2a_overlap"):
        estimate(two, CLUSTER, JOB, PAR.replace(pp=1, dp=16, moe_a2a_overlap=True))
    with pytest.raises(InputError, match="parallel.moe_a2a_overlap"):
        plan(two, CLUSTER, JOB, options=SearchOptions(fixed={"moe_a2a_overlap": True}))


def test_check_edits_write_the_modules_in_a_layout(tmp_path):
    """A suggested uneven split keeps the 'm' Megatron counts against --mtp-num-layers."""
    from planner.check.edits_shell import megatron_flags

    old = PAR.replace(pp=4, dp=4, zero=1, layers_per_stage=(12, 12, 12, 12))
    new = old.replace(layers_per_stage=(11, 12, 14, 11))  # uneven middle stages: a layout
    want = megatron_flags(new, old, MTP, False, 48)
    assert want["--pipeline-model-parallel-layout"][0].endswith("tmL")
