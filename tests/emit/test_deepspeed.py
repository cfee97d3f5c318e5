"""DeepSpeed: JSON config, hostfile and launcher line, parsed back and checked against the plan."""

from __future__ import annotations

import copy
import json

import pytest

from emit_helpers import bash_n, command_words, load
from planner.emit import emit_files
from planner.emit.common import load_plan_view
from planner.errors import InputError

DS_PLANS = [("tiny_moe_8gpu", 1), ("gpt_dense_16gpu", 1), ("gpt_dense_16gpu", 2)]


@pytest.mark.parametrize("fixture,rank", DS_PLANS)
def test_config_matches_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    p = v.parallel
    cfg = json.loads(emit_files(doc, "deepspeed", rank)["ds_config.json"])
    mbs, gas, tbs = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]
    # DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel size.
    dp = v.num_gpus // (p.tp * p.pp)
    assert dp == p.dp and tbs == mbs * gas * dp
    assert (mbs, gas, tbs) == (p.micro_batch_size, v.num_microbatches, v.job.global_batch_size)
    assert cfg["zero_optimization"]["stage"] == p.zero
    assert p.pp == 1 or cfg["zero_optimization"]["stage"] <= 1
    if v.job.precision == "fp16":
        assert cfg["fp16"]["enabled"] is True and "bf16" not in cfg
    else:
        assert cfg["bf16"]["enabled"] is True and "fp16" not in cfg
    assert ("activation_checkpointing" in cfg) == (p.recompute != "none")
    assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == p.tp
    assert cfg.get("expert_parallel", {}).get("autoep_size", 1) == p.ep
    assert cfg["_planner"]["plan_rank"] == rank and cfg["_planner"]["degrees"]["tp"] == p.tp


@pytest.mark.parametrize("fixture,rank", DS_PLANS)
def test_launcher_and_hostfile(tmp_path, fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files = emit_files(doc, "deepspeed", rank)
    words = command_words(files["deepspeed_launch.sh"], "deepspeed")
    assert words[0] == "deepspeed"
    assert words[words.index("--hostfile") + 1] == "hostfile"
    assert int(words[words.index("--num_nodes") + 1]) == v.num_nodes
    assert int(words[words.index("--num_gpus") + 1]) == v.gpus_per_node
    assert words[words.index("--deepspeed_config") + 1] == "ds_config.json" and "--deepspeed" in words
    hosts = [ln.split() for ln in files["hostfile"].splitlines() if ln and not ln.startswith("#")]
    assert [h for h, _ in hosts] == [f"node{i:03d}" for i in range(1, v.num_nodes + 1)]
    assert all(s == f"slots={v.gpus_per_node}" for _, s in hosts)
    path = tmp_path / "deepspeed_launch.sh"
    path.write_text(files["deepspeed_launch.sh"])
    bash_n(path)


def test_engine_rules_rejected():
    doc = load("llama70b_64gpu")
    with pytest.raises(InputError, match="zero"):
        emit_files(doc, "deepspeed", 2)  # pp=4 with ZeRO-2
    with pytest.raises(InputError, match="schedule"):
        emit_files(doc, "deepspeed", 1)  # interleaved
    with pytest.raises(InputError, match="cp"):
        emit_files(load("tiny_moe_8gpu"), "deepspeed", 2)


# --- DeepSpeed's own code (pip install deepspeed) --------------------------------------------

class _Mpu:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.mark.parametrize("fixture,rank", DS_PLANS)
def test_deepspeed_config_class_accepts(fixture, rank, monkeypatch):
    """DeepSpeedConfig parses the JSON (with the "_planner" key) and checks the batch triple
    against the data-parallel size an mpu reports; its hostfile parser reads the hostfile."""
    pytest.importorskip("torch")
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    from deepspeed.launcher.runner import _parse_hostfile

    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files = emit_files(doc, "deepspeed", rank)
    # No process group on a test box: DeepSpeedConfig asks dist for the rank first.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    cfg = ds_config.DeepSpeedConfig(json.loads(files["ds_config.json"]), mpu=_Mpu(v.parallel.dp))
    assert cfg.world_size == v.parallel.dp
    assert cfg.train_batch_size == v.job.global_batch_size
    assert cfg.gradient_accumulation_steps == v.num_microbatches
    assert cfg.zero_optimization_stage == v.parallel.zero
    assert cfg.bfloat16_config.enabled == (v.job.precision != "fp16")
    # A wrong triple is rejected by the same code (the check is live).
    bad = json.loads(files["ds_config.json"])
    bad["train_batch_size"] += 1
    with pytest.raises(AssertionError):
        ds_config.DeepSpeedConfig(bad, mpu=_Mpu(v.parallel.dp))
    pool = _parse_hostfile(files["hostfile"].splitlines())
    assert list(pool.values()) == [v.gpus_per_node] * v.num_nodes


def test_zero_stage_rules_kept():
    doc = copy.deepcopy(load("gpt_dense_16gpu"))
    cfg = json.loads(emit_files(doc, "deepspeed", 1)["ds_config.json"])
    assert cfg["zero_optimization"]["stage"] == 3 and "stage3_prefetch_bucket_size" in cfg["zero_optimization"]


def test_notes_say_which_overlaps_the_prediction_assumed_that_deepspeed_lacks():
    from planner.emit.deepspeed import deepspeed_notes  # noqa: PLC0415

    doc = load("llama70b_64gpu")  # rank 1: tp8 pp4 dp2 ZeRO-1 with overlap_param_gather
    v = load_plan_view(doc, 1)
    assert v.parallel.overlap_param_gather and v.parallel.zero == 1
    assert any("--overlap-param-gather" in n for n in deepspeed_notes(v))
    doc2 = copy.deepcopy(doc)
    doc2["plans"][0]["parallel"].update(zero=0, overlap_param_gather=False)
    v2 = load_plan_view(doc2, 1)
    notes = deepspeed_notes(v2)
    assert not any("--overlap-param-gather" in n for n in notes)
    assert any("all-reduces after it" in n for n in notes)


@pytest.mark.parametrize("zero,grad_reduce,want", [(1, "auto", "fp32"), (1, "bf16", "bf16"), (0, "bf16", "bf16"), (0, "auto", None)])
def test_gradient_dtype_is_the_predictions_where_deepspeed_allows_it(zero, grad_reduce, want):
    from planner.emit.deepspeed import deepspeed_config, deepspeed_notes  # noqa: PLC0415

    doc = copy.deepcopy(load("llama70b_64gpu"))  # bf16
    doc["job"]["grad_reduce"] = grad_reduce
    doc["plans"][0]["parallel"].update(zero=zero, vpp=1, schedule="1f1b")  # DeepSpeed's pipeline has no interleaving
    v = load_plan_view(doc, 1)
    cfg = deepspeed_config(v)
    if want is None:  # DeepSpeed without ZeRO accepts only model-dtype gradients: default kept, note says so
        assert "data_types" not in cfg and "communication_data_type" not in cfg
        assert any("without ZeRO keeps them in the model dtype" in n for n in deepspeed_notes(v))
    else:
        assert cfg["data_types"] == {"grad_accum_dtype": want} and cfg["communication_data_type"] == want
