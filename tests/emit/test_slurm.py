"""SLURM sbatch scripts: bash -n, #SBATCH values, and the srun torchrun line vs the local scripts."""

from __future__ import annotations

import re

import pytest

from emit_helpers import ALL_PLANS, bash_n, command_words, load
from planner.emit import emit_bundle, emit_files
from planner.emit.common import load_plan_view
from planner.errors import InputError


def _sbatch(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, flags=re.M))


@pytest.mark.parametrize("fixture,rank", ALL_PLANS + [("llama8b_fsdp_64gpu", 1), ("torchtitan_qwen3_moe_pp_32gpu", 1)])
def test_all_engines_scripts_parse(tmp_path, fixture, rank):
    doc = load(fixture)
    v = load_plan_view(doc, rank)
    files, skipped = emit_bundle(doc, "all", rank)
    scripts = [n for n in files if n.endswith((".sh", ".sbatch"))]
    assert scripts
    for name in scripts:
        path = tmp_path / name
        path.write_text(files[name])
        bash_n(path)
    for eng in ("megatron", "deepspeed", "torchtitan"):
        name = f"slurm_{eng}.sbatch"
        if eng in skipped:
            assert name not in files
            continue
        s = files[name]
        sb = _sbatch(s)
        assert sb["nodes"] == str(v.num_nodes) and sb["ntasks-per-node"] == "1"
        assert sb["gpus-per-node"] == str(v.gpus_per_node)
        words = command_words(s, "torchrun")
        assert words[:2] == ["srun", "--ntasks-per-node=1"]
        assert words[words.index("--nproc-per-node") + 1] == str(v.gpus_per_node)
        assert words[words.index("--rdzv-backend") + 1] == "c10d"
        assert words[words.index("--nnodes") + 1] == "${SLURM_NNODES}"
        # The engine arguments are the same as in the engine's own launch script.
        local_name = {"megatron": "megatron_launch.sh",
                      "torchtitan": "torchtitan_launch.sh" if "torchtitan_job.toml" in files else "torchtitan030_launch.sh"}.get(eng)
        if local_name:
            local = command_words(files[local_name], "torchrun")
            key = "${MEGATRON_DIR}/pretrain_gpt.py" if eng == "megatron" else "-m"
            assert words[words.index(key):] == local[local.index(key):]
        else:
            assert words[words.index("--deepspeed_config") + 1] == "ds_config.json" and "ds_config.json" in files
        assert "site settings" in s


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_slurm_engine_choice(engine):
    files = emit_files(load("llama8b_fsdp_64gpu"), "slurm", 1, slurm_engine=engine)
    assert f"slurm_{engine}.sbatch" in files
    needs = {"deepspeed": "ds_config.json", "torchtitan": "torchtitan_job.toml"}.get(engine)
    assert needs is None or needs in files


def test_bad_slurm_engine():
    with pytest.raises(InputError, match="slurm_engine"):
        emit_files(load("tiny_moe_8gpu"), "slurm", 1, slurm_engine="jax")


def test_slurm_torchtitan_uses_the_030_module_when_022_cannot():
    files = emit_files(load("torchtitan_qwen3_moe_pp_32gpu"), "slurm", 1, slurm_engine="torchtitan")  # qwen3 + pp: 0.3.0 only
    assert "planner_torchtitan_config.py" in files and "torchtitan_job.toml" not in files
    words = command_words(files["slurm_torchtitan.sbatch"], "torchrun")
    assert words[words.index("--module") + 1] == "planner_torchtitan_config"


@pytest.mark.parametrize("fixture,expect", [("torchtitan_qwen3_moe_pp_32gpu", "torchtitan"), ("gpt_dense_16gpu", "megatron")])
def test_slurm_alone_starts_the_plans_own_engine(fixture, expect):
    """`launch --engine slurm` without --slurm-engine writes the sbatch script of the plan's own
    engine (a torchtitan plan got Megatron-LM's, which refused its ZeRO/pipeline layout)."""
    from planner.emit.bundle import slurm_engine_of  # noqa: PLC0415

    doc = load(fixture)
    assert slurm_engine_of(load_plan_view(doc, 1)) == expect
    files = emit_files(doc, "slurm", 1)
    assert f"slurm_{expect}.sbatch" in files and not any(n.startswith("slurm_") and expect not in n for n in files)
