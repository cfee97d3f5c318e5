"""DeepSpeed: JSON config, hostfile and launcher line, parsed back and checked against the plan."""

from __future__ import annotations

import copy
import json

import pytest

from emit_helpers import bash_n, command_words, load
from planner.emit import emit_bundle, emit_files
from planner.emit.common import load_plan_view
from planner.errors import InputError

# (engine deepspeed: tp 1, pp 1 | tp 1, pp 2), (megatron-deepspeed: tp 4 x pp 16, ZeRO 0 and 1),
# engine-less plans DeepSpeed runs as megatron-deepspeed (tp 2 / tp 4 with ZeRO-3, no pipeline;
# tp 8 x pp 32 with MoE).
DS_PLANS = [("deepspeed_llama8b_16gpu", 1), ("deepspeed_llama8b_16gpu", 2), ("megatron_deepspeed_llama70b_64gpu", 1),
            ("megatron_deepspeed_llama70b_64gpu", 2), ("gpt_dense_16gpu", 1), ("llama8b_fsdp_64gpu", 1), ("deepseek_v3_1024gpu", 1)]


@pytest.mark.parametrize("fixture,rank", DS_PLANS)
def test_config_matches_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    p = v.parallel
    cfg = json.loads(emit_files(doc, "deepspeed", rank)["ds_config.json"])
    mbs, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    # DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel size.
    dp = v.num_gpus // (p.tp * p.pp)
    assert dp == p.dp and mbs * gas * dp == v.job.global_batch_size
    assert (mbs, gas) == (p.micro_batch_size, v.num_microbatches)
    # The full triple only where every path sees W = dp (no tensor or pipeline parallelism).
    assert ("train_batch_size" in cfg) == (p.tp == 1 and p.pp == 1)
    assert cfg.get("train_batch_size", v.job.global_batch_size) == v.job.global_batch_size
    assert cfg["zero_optimization"]["stage"] == p.zero
    assert p.pp == 1 or cfg["zero_optimization"]["stage"] <= 1
    if v.job.precision == "fp16":
        assert cfg["fp16"]["enabled"] is True and "bf16" not in cfg
    else:
        assert cfg["bf16"]["enabled"] is True and "fp16" not in cfg
    assert ("activation_checkpointing" in cfg) == (p.recompute != "none")
    assert "tensor_parallel" not in cfg and "expert_parallel" not in cfg  # TP is Megatron-DeepSpeed's, no EP
    assert cfg["_planner"]["plan_rank"] == rank and cfg["_planner"]["degrees"]["tp"] == p.tp
    assert cfg["_planner"]["engine"] == (doc.get("engine") if doc.get("engine") in ("deepspeed", "megatron-deepspeed")
                                         else ("megatron-deepspeed" if p.tp > 1 else "deepspeed"))


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
    d = copy.deepcopy(doc)
    d["plans"][0]["parallel"]["recompute"] = "full"
    with pytest.raises(InputError, match="schedule"):
        emit_files(d, "deepspeed", 1)  # interleaved
    with pytest.raises(InputError, match="recompute"):
        emit_files(doc, "deepspeed", 1)  # selective recompute: DeepSpeed checkpoints whole layers
    with pytest.raises(InputError, match="parallel.cp"):
        emit_files(load("tiny_moe_8gpu"), "deepspeed", 2)
    with pytest.raises(InputError, match="parallel.ep"):
        emit_files(load("tiny_moe_8gpu"), "deepspeed", 1)


def test_notes_say_what_the_script_must_pass():
    from planner.emit.deepspeed import deepspeed_notes  # noqa: PLC0415

    notes = " ".join(deepspeed_notes(load_plan_view(load("llama8b_fsdp_64gpu"), 1)))  # tp 4, no pipeline
    assert "mpu" in notes and "get_data_parallel_world_size() is 16" in notes and "world size (64)" in notes
    notes = " ".join(deepspeed_notes(load_plan_view(load("deepspeed_llama8b_16gpu"), 2)))  # pp 2
    assert "PipelineModule" in notes


# --- DeepSpeed's own code (pip install deepspeed) --------------------------------------------

class _Mpu:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _ds_config(cfg: dict, *, dp: int | None, world: int):
    """DeepSpeedConfig as deepspeed.initialize builds it: with an mpu reporting ``dp`` (Megatron,
    Megatron-DeepSpeed, a PipelineModule's grid), or without one (world size from the process
    group). No process group on a test box: dist.get_rank / get_world_size are stood in for
    (config.py asks them first and would otherwise fall back to world size 1)."""
    from unittest import mock  # noqa: PLC0415

    import deepspeed.comm as dscomm  # noqa: PLC0415
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

    with mock.patch.object(dscomm, "get_rank", return_value=0), mock.patch.object(dscomm, "get_world_size", return_value=world):
        return DeepSpeedConfig(copy.deepcopy(cfg), mpu=None if dp is None else _Mpu(dp))


@pytest.mark.parametrize("fixture,rank", DS_PLANS)
def test_deepspeed_config_class_accepts(fixture, rank):
    """DeepSpeedConfig parses the JSON (with the "_planner" key) and checks the batch triple on
    both paths: with an mpu (W = dp: the plan's global batch) and without (W = world size)."""
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed.runtime.config")
    from deepspeed.launcher.runner import _parse_hostfile  # noqa: PLC0415

    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files = emit_files(doc, "deepspeed", rank)
    raw = json.loads(files["ds_config.json"])
    with_mpu = _ds_config(raw, dp=v.parallel.dp, world=v.world)
    assert with_mpu.world_size == v.parallel.dp
    assert with_mpu.train_batch_size == v.job.global_batch_size
    assert with_mpu.gradient_accumulation_steps == v.num_microbatches
    assert with_mpu.zero_optimization_stage == v.parallel.zero
    assert with_mpu.bfloat16_config.enabled == (v.job.precision != "fp16")
    if v.parallel.pp > 1:  # runtime/pipe/engine.py:92-105 (micro_batches = gradient_accumulation_steps)
        assert with_mpu.train_batch_size == with_mpu.train_micro_batch_size_per_gpu * with_mpu.gradient_accumulation_steps * v.parallel.dp
    no_mpu = _ds_config(raw, dp=None, world=v.world)
    assert no_mpu.world_size == v.world
    assert no_mpu.gradient_accumulation_steps == v.num_microbatches
    assert no_mpu.train_batch_size == v.parallel.micro_batch_size * v.num_microbatches * v.world
    # A wrong triple is rejected by the same code (the check is live).
    bad = dict(raw, train_batch_size=v.job.global_batch_size + v.parallel.dp)
    with pytest.raises(AssertionError):
        _ds_config(bad, dp=v.parallel.dp, world=v.world)
    pool = _parse_hostfile(files["hostfile"].splitlines())
    assert list(pool.values()) == [v.gpus_per_node] * v.num_nodes


def test_zero_stage_rules_kept():
    doc = copy.deepcopy(load("gpt_dense_16gpu"))  # tp 2 ZeRO-3 (Megatron-DeepSpeed)
    cfg = json.loads(emit_files(doc, "deepspeed", 1)["ds_config.json"])
    assert cfg["zero_optimization"]["stage"] == 3 and "stage3_prefetch_bucket_size" in cfg["zero_optimization"]


def test_notes_say_which_overlaps_the_prediction_assumed_that_deepspeed_lacks():
    from planner.emit.deepspeed import deepspeed_notes  # noqa: PLC0415

    doc = copy.deepcopy(load("llama70b_64gpu"))  # rank 1: tp8 pp4 dp2 ZeRO-1 with overlap_param_gather
    doc["plans"][0]["parallel"].update(vpp=1, schedule="1f1b", recompute="full")  # as DeepSpeed runs it
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
    doc["plans"][0]["parallel"].update(zero=zero, vpp=1, schedule="1f1b", recompute="full")  # DeepSpeed's pipeline: no interleaving
    v = load_plan_view(doc, 1)
    cfg = deepspeed_config(v)
    if want is None:  # DeepSpeed without ZeRO accepts only model-dtype gradients: default kept, note says so
        assert "data_types" not in cfg and "communication_data_type" not in cfg
        assert any("without ZeRO keeps them in the model dtype" in n for n in deepspeed_notes(v))
    else:
        assert cfg["data_types"] == {"grad_accum_dtype": want} and cfg["communication_data_type"] == want


@pytest.mark.parametrize("argv", [
    ["--model", "gpt3-13b", "--gpus", "32", "--gpu", "a100-sxm4-80gb", "-s", "2048", "-b", "512", "--attention", "fa2"],
    ["--model", "llama3.1-8b", "--gpus", "16", "--gpu", "a100-sxm4-80gb", "-s", "4096", "-b", "64", "--attention", "fa1",
     "--tp", "2", "--pp", "1", "--recompute", "full"],
])
def test_megatron_deepspeed_launch_runs_pretrain_gpt_with_the_plan(tmp_path, argv):
    """A Megatron-DeepSpeed plan's DeepSpeed launch script runs its pretrain_gpt.py with the plan's
    degrees, model shape (GQA, SwiGLU, RMSNorm, rotary base, untied, bias-free for Llama), batch,
    precision, recompute and flash flag in TRAIN_ARGS, and `planner check` reads the script back
    to the same prediction."""
    import json

    from conftest import run_cli
    from planner.check import check_job, read_job

    code, out, err = run_cli(["plan", *argv, "--engine", "megatron-deepspeed", "--top", "1", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    files, _ = emit_bundle(doc, "deepspeed", 1)
    script = files["deepspeed_launch.sh"]
    assert 'TRAIN_SCRIPT="${TRAIN_SCRIPT:-pretrain_gpt.py}"' in script
    p = doc["plans"][0]["parallel"]
    assert f"--tensor-model-parallel-size {p['tp']} --pipeline-model-parallel-size {p['pp']}" in script
    assert ("--use-flash-attn-v2" if p["attention"] == "fa2" else "--use-flash-attn-v1") in script
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cj = read_job([str(tmp_path / "deepspeed_launch.sh")])
    assert cj.engine == "megatron-deepspeed" and cj.parallel.attention == p["attention"]
    assert check_job(cj, top=0).estimate.step_time_s == pytest.approx(doc["plans"][0]["predicted"]["step_time_s"], rel=1e-9)
