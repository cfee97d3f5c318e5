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
    extra = mtp[2] - base[2]
    assert extra > layer + lg_f + lg_b  # plus the 2h -> h projection
    assert extra < layer + 2 * (lg_f + lg_b)
    assert base[0] == mtp[0] and base[1] == mtp[1]  # the decoder layers are unchanged


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
