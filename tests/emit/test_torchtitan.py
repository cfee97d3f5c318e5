"""torchtitan 0.2.2 TOML and 0.3.0 config module: read back and checked against the plan and
torchtitan's rules; refusals of what torchtitan cannot express. torchtitan's own code runs them
in test_torchtitan_engine.py."""

from __future__ import annotations

import copy
import tomllib

import pytest

from emit_helpers import bash_n, command_words, load
from planner.emit import emit_files
from planner.emit.common import chunk_sizes, load_plan_view
from planner.errors import InputError
from planner.io.presets import read_preset

# Plans torchtitan runs: dense (llama3 8B, 70B), MoE (qwen3 30B-A3B, pp and not), MLA + MoE
# (deepseek_v3 671B, with and without CP) and engine-less megatron-core plans it also runs.
TT_PLANS = [("torchtitan_llama8b_16gpu", 1), ("torchtitan_llama8b_16gpu", 2), ("torchtitan_llama70b_64gpu", 1),
            ("torchtitan_qwen3_moe_32gpu", 1), ("torchtitan_qwen3_moe_pp_32gpu", 1), ("torchtitan_deepseek_v3_512gpu", 1),
            ("torchtitan_deepseek_v3_cp1_512gpu", 1), ("llama8b_fsdp_64gpu", 1), ("llama8b_fsdp_64gpu", 2), ("llama70b_64gpu", 2)]
# Which versions have files: qwen3 has no pipelining in 0.2.2; deepseek_v3's flavors do not run CP there.
NO_022 = {("torchtitan_qwen3_moe_pp_32gpu", 1), ("torchtitan_deepseek_v3_512gpu", 1)}


def _per_rank(sizes: list[int], pp: int, v_style: bool) -> list[int]:
    """Transformer layers per pipeline rank of model parts ``sizes`` (loop or V placement)."""
    out = [0] * pp
    for k, n in enumerate(sizes):
        out[(k if k < pp else 2 * pp - 1 - k) if v_style else k % pp] += n
    return out


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_toml_matches_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    p = v.parallel
    files = emit_files(doc, "torchtitan", rank)
    assert ("torchtitan_job.toml" in files) == ((fixture, rank) not in NO_022)
    assert "planner_torchtitan_config.py" in files
    if "torchtitan_job.toml" not in files:
        assert "No torchtitan 0.2.2 files" in files["plan_summary.txt"]
        return
    text = files["torchtitan_job.toml"]
    assert "planner" in text.splitlines()[0] and "0.2.2" in text.splitlines()[0]
    cfg = tomllib.loads(text)
    par, tr = cfg["parallelism"], cfg["training"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    assert rep * shard == p.dp
    assert rep * shard * par["context_parallel_degree"] * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] == v.num_gpus
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (p.tp, p.pp, p.cp)
    assert par["expert_parallel_degree"] == p.ep and par["expert_tensor_parallel_degree"] in (1, p.tp)
    assert par["fsdp_reshard_after_forward"] == ("never" if p.zero == 2 else "default")
    assert tr["seq_len"] == v.job.seq_len and tr["global_batch_size"] == v.job.global_batch_size
    assert tr["seq_len"] % (p.tp * 2 * p.cp) == 0
    local = tr["local_batch_size"]
    # torchtitan: global % (local x dp) == 0 -> accumulation steps; with PP, local % microbatch == 0.
    assert tr["global_batch_size"] % (local * p.dp) == 0
    accum = tr["global_batch_size"] // (local * p.dp)
    if p.pp > 1:
        mb = par["pipeline_parallel_microbatch_size"]
        assert mb == p.micro_batch_size and local % mb == 0
        assert accum * (local // mb) == v.num_microbatches
        if "module_fqns_per_model_part" in par:
            parts = par["module_fqns_per_model_part"]
            sizes = [sum(1 for n in part if n.startswith("layers.")) for part in parts]
            assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        else:
            assert par["pipeline_parallel_first_stage_less_layers"] == 0 == par["pipeline_parallel_last_stage_less_layers"]
            sizes = [par["pipeline_parallel_layers_per_stage"]] * (p.pp * p.vpp)
        assert len(sizes) == p.pp * p.vpp and sum(sizes) == v.model.layers
        assert _per_rank(sizes, p.pp, p.schedule in ("zb-v", "dualpipe")) == list(v.stage_layers)
        assert par["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B"}[p.schedule]
    else:
        assert local == p.micro_batch_size and accum == v.num_microbatches
    assert cfg["activation_checkpoint"]["mode"] == p.recompute
    assert tr["mixed_precision_param"] == "bfloat16"
    assert ("quantize.linear.float8" in cfg["model"].get("converters", [])) == (v.job.precision == "fp8")
    assert cfg["model"]["hf_assets_path"].startswith("./assets/hf/")


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_config_module_matches_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    text = emit_files(doc, "torchtitan", rank)["planner_torchtitan_config.py"]
    compile(text, "planner_torchtitan_config.py", "exec")
    p = v.parallel
    for want in (f"tensor_parallel_degree={p.tp}", f"pipeline_parallel_degree={p.pp}", f"context_parallel_degree={p.cp}",
                 f"expert_parallel_degree={p.ep}", f"seq_len={v.job.seq_len}", f"global_batch_size={v.job.global_batch_size}",
                 "def planner_config():"):
        assert want in text, want
    assert "expert_tensor_parallel_degree" not in text  # gone in 0.3.0
    assert "disable_cuda_graphs=True" in text  # the planner prices eager launches (trainer.py graphs the step by default)
    if p.pp > 1 and len(set(chunk_sizes(v.stage_layers, p.vpp))) > 1:
        assert "'lm_head'" in text and "'output'" not in text  # 0.3.0's output module name


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_launch_scripts(tmp_path, fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files = emit_files(doc, "torchtitan", rank)
    for name, args in (("torchtitan_launch.sh", ["--job.config_file", "torchtitan_job.toml"]),
                       ("torchtitan030_launch.sh", ["--module", "planner_torchtitan_config", "--config", "planner_config"])):
        if name not in files:
            continue
        words = command_words(files[name], "torchrun")
        assert words[words.index("--nproc-per-node") + 1] == str(v.gpus_per_node)
        i = words.index("-m")
        assert words[i + 1] == "torchtitan.train" and words[i + 2:i + 2 + len(args)] == args
        assert "scripts/download_hf_assets.py --repo_id" in files[name]  # where the tokenizer comes from
        path = tmp_path / name
        path.write_text(files[name])
        bash_n(path)


def _with_model(preset: str) -> dict:
    doc = copy.deepcopy(load("llama8b_fsdp_64gpu"))  # tp 4, dp 16, ZeRO-3: a layout torchtitan runs
    doc["model"] = dict(read_preset("models", preset), id=preset)
    for plan in doc["plans"]:
        plan["parallel"]["layers_per_stage"] = None  # pp 1: the whole model
    return doc


def test_gpt3_refused_with_the_reason():
    with pytest.raises(InputError) as exc:
        emit_files(_with_model("gpt3-1.3b"), "torchtitan", 1)
    msg = str(exc.value)
    assert "cannot express gpt3-1.3b, because" in msg and "learned absolute positions" in msg and "\n" not in msg


def test_mixtral_refused_not_matched_to_llama3():
    with pytest.raises(InputError) as exc:
        emit_files(_with_model("mixtral-8x7b"), "torchtitan", 1)
    msg = str(exc.value)
    assert "cannot express mixtral-8x7b, because no flavor has 8 experts" in msg and "\n" not in msg


def test_other_refusals():
    with pytest.raises(InputError, match="precision"):
        emit_files(_with_model("llama3.1-8b") | {"job": {"seq_len": 8192, "global_batch_size": 256, "precision": "fp16"}}, "torchtitan", 1)
    with pytest.raises(InputError, match="ZeRO stage torchtitan implements"):
        emit_files(load("llama70b_64gpu"), "torchtitan", 1)  # ZeRO-1: torchtitan has FSDP (2, 3) or DDP
    with pytest.raises(InputError, match="cannot express llama2-7b"):
        emit_files(_with_model("llama2-7b"), "torchtitan", 1)  # no llama3 flavor has these dimensions


def test_v_schedule_places_two_parts_per_rank_in_a_v():
    doc = copy.deepcopy(load("torchtitan_llama8b_16gpu"))  # pp 2, [17, 15]
    doc["plans"][0]["parallel"].update(vpp=2, schedule="zb-v")
    par = tomllib.loads(emit_files(doc, "torchtitan", 1)["torchtitan_job.toml"])["parallelism"]
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    sizes = [sum(1 for n in part if n.startswith("layers.")) for part in par["module_fqns_per_model_part"]]
    assert _per_rank(sizes, 2, True) == [17, 15]


@pytest.mark.parametrize("fixture,base", [("torchtitan_llama8b_16gpu", "llama3_8b"), ("torchtitan_llama70b_64gpu", "llama3_70b"),
                                          ("torchtitan_qwen3_moe_32gpu", "qwen3_30b_a3b"), ("torchtitan_deepseek_v3_512gpu", "deepseek_v3_671b")])
def test_config_module_starts_from_its_flavors_registry_function(fixture, base):
    """The 0.3.0 module builds on the registry function of the plan's own size where torchtitan
    ships one (a 70B job gets llama3_70b's optimizer, not llama3_8b's)."""
    text = emit_files(load(fixture), "torchtitan", 1)["planner_torchtitan_config.py"]
    assert f"import {base} as _upstream" in text
