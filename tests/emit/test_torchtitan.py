"""torchtitan v0.2.x TOML: read back with tomllib, checked against the plan and torchtitan's rules."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
import types

import pytest

from emit_helpers import bash_n, command_words, load
from planner.emit import emit_files
from planner.emit.common import load_plan_view
from planner.errors import InputError

TT_PLANS = [("llama70b_64gpu", 1), ("llama70b_64gpu", 2), ("llama70b_64gpu", 3), ("tiny_moe_8gpu", 1), ("tiny_moe_8gpu", 2)]


def _stage_layers(par: dict, n_layers: int) -> list[int]:
    """Transformer layers of each model part, as torchtitan will split them."""
    if "module_fqns_per_model_part" in par:
        return [sum(1 for n in part if n.startswith("layers.")) for part in par["module_fqns_per_model_part"]]
    per = par["pipeline_parallel_layers_per_stage"]
    assert par["pipeline_parallel_first_stage_less_layers"] == 0 and par["pipeline_parallel_last_stage_less_layers"] == 0
    assert n_layers % per == 0
    return [per] * (n_layers // per)


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_toml_matches_plan(fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    p = v.parallel
    text = emit_files(doc, "torchtitan", rank)["torchtitan_job.toml"]
    assert "planner" in text.splitlines()[0] and "v0.2.2" in text.splitlines()[0]
    cfg = tomllib.loads(text)
    par, tr = cfg["parallelism"], cfg["training"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    assert rep * shard == p.dp
    assert rep * shard * par["context_parallel_degree"] * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] == v.num_gpus
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (p.tp, p.pp, p.cp)
    assert par["expert_parallel_degree"] == p.ep and par["expert_tensor_parallel_degree"] in (1, p.tp)
    assert tr["seq_len"] == v.job.seq_len and tr["global_batch_size"] == v.job.global_batch_size
    local = tr["local_batch_size"]
    # torchtitan: global % (local x dp) == 0 -> accumulation steps; with PP, local % microbatch == 0.
    assert tr["global_batch_size"] % (local * p.dp) == 0
    accum = tr["global_batch_size"] // (local * p.dp)
    if p.pp > 1:
        mb = par["pipeline_parallel_microbatch_size"]
        assert mb == p.micro_batch_size and local % mb == 0
        assert accum * (local // mb) == v.num_microbatches
        parts = _stage_layers(par, v.model.layers)
        assert len(parts) == p.pp * p.vpp and sum(parts) == v.model.layers
        # model part k = v * pp + r lives on pipeline rank r ("loop" placement)
        per_rank = [sum(parts[r::p.pp]) for r in range(p.pp)]
        assert per_rank == list(v.stage_layers)
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if p.vpp > 1 else "1F1B")
    else:
        assert local == p.micro_batch_size and accum == v.num_microbatches
    assert cfg["activation_checkpoint"]["mode"] == p.recompute
    assert tr["mixed_precision_param"] == "bfloat16"
    assert ("quantize.linear.float8" in cfg["model"].get("converters", [])) == (v.job.precision == "fp8")


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_launch_script(tmp_path, fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files = emit_files(doc, "torchtitan", rank)
    words = command_words(files["torchtitan_launch.sh"], "torchrun")
    assert words[words.index("--nproc-per-node") + 1] == str(v.gpus_per_node)
    assert words[words.index("-m") + 1] == "torchtitan.train"
    assert words[words.index("--job.config_file") + 1] == "torchtitan_job.toml"
    path = tmp_path / "torchtitan_launch.sh"
    path.write_text(files["torchtitan_launch.sh"])
    bash_n(path)


def test_fp16_rejected():
    with pytest.raises(InputError, match="precision"):
        emit_files(load("gpt_dense_16gpu"), "torchtitan", 1)


def _import_torchtitan_config():
    """torchtitan's config modules without its package __init__ (which imports triton kernels)."""
    pytest.importorskip("torch")
    pytest.importorskip("tyro")
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed")
        pkg = types.ModuleType("torchtitan")
        pkg.__spec__ = spec
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    try:
        from torchtitan.config.job_config import Parallelism  # noqa: F401
        from torchtitan.config.manager import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as exc:
        pytest.skip(f"torchtitan config modules not importable: {exc}")
    if not hasattr(Parallelism, "__dataclass_fields__") or "pipeline_parallel_layers_per_stage" not in Parallelism.__dataclass_fields__:
        pytest.skip("installed torchtitan is not the v0.2.x TOML config")
    return ConfigManager, ParallelDims


@pytest.mark.parametrize("fixture,rank", TT_PLANS)
def test_torchtitan_config_manager_accepts(tmp_path, fixture, rank):
    """torchtitan v0.2.2's own ConfigManager loads the TOML (unknown keys are an error there)
    and ParallelDims accepts the degrees for the plan's world size."""
    ConfigManager, ParallelDims = _import_torchtitan_config()
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    path = tmp_path / "torchtitan_job.toml"
    path.write_text(emit_files(doc, "torchtitan", rank)["torchtitan_job.toml"])
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    par = job.parallelism
    dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                        ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=v.num_gpus)
    assert dims.dp_shard * dims.dp_replicate == v.parallel.dp
    assert job.training.global_batch_size == v.job.global_batch_size
    assert job.training.local_batch_size % par.pipeline_parallel_microbatch_size == 0
