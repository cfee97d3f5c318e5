"""SLURM: an sbatch script that starts the chosen engine on the plan's nodes with torchrun.

Shape A of launch_formats.md sec. 8 (Megatron-LM examples, torchtitan's
``multinode_trainer.slurm``): one task per node (``--ntasks-per-node=1``), torchrun spawns the
GPUs, c10d rendezvous on the first host keyed by ``$SLURM_JOB_ID``. DeepSpeed runs under plain
torchrun (it reads RANK/LOCAL_RANK/WORLD_SIZE, sec. 3.2), so its hostfile is not needed here.
Cluster-specific settings (partition, account, NCCL/EFA variables) stay in a marked site
block the user edits (sec. 8, checklist item 7).
"""

from __future__ import annotations

from planner.emit import deepspeed as ds
from planner.emit import megatron as mg
from planner.emit import torchtitan as tt
from planner.emit import torchtitan030 as tt030
from planner.emit.common import PlanView, comment, provenance_lines, render_torchrun
from planner.units import plural
from planner.errors import InputError

__all__ = ["SLURM_ENGINES", "slurm_script_name", "slurm_files"]

SLURM_ENGINES = ("megatron", "deepspeed", "torchtitan")


def slurm_script_name(engine: str) -> str:
    return f"slurm_{engine}.sbatch"


SITE_BLOCK = """\
# ===== site settings: edit for your cluster (not decided by the planner) =====
# export NCCL_SOCKET_IFNAME=ib0
# export NCCL_IB_HCA=mlx5
# export FI_PROVIDER=efa            # AWS EFA clusters
# module load cuda                  # or: source /path/to/venv/bin/activate
# ===== end of site settings =====
"""


def _engine_parts(v: PlanView, engine: str) -> tuple[object, list[str], dict[str, str], str]:
    """(launch spec, provenance/notes lines, engine files needed next to the script, user block)."""
    from planner.emit.common import for_engine  # noqa: PLC0415

    v = {"megatron": mg.megatron_view, "deepspeed": ds.deepspeed_view,
         "torchtitan": lambda w: for_engine(w, tt.TITAN_ENGINE)}.get(engine, lambda w: (w, []))(v)[0]  # priced on that engine
    if engine == "megatron":
        spec = mg.megatron_launch_spec(v)
        lines = provenance_lines(v, "Megatron-LM under SLURM", mg.MEGATRON_TARGET) + mg.megatron_notes(v)
        user = mg.megatron_env(v) + mg.USER_BLOCK.format(vocab=v.model.vocab)
        return spec, lines, {}, user
    if engine == "deepspeed":
        spec = ds.deepspeed_launch_spec(v)
        lines = provenance_lines(v, "DeepSpeed under SLURM (torchrun)", ds.DEEPSPEED_TARGET) + ds.deepspeed_notes(v)
        files = {k: c for k, c in ds.deepspeed_files(v).items() if k == ds.DS_CONFIG}
        return spec, lines, files, ds.train_block(v, ds.deepspeed_engine(v))
    if engine == "torchtitan":
        spec = tt.torchtitan_launch_spec(v)
        target = tt.TORCHTITAN_TARGET if "--job.config_file" in spec.arg_lines[0] else "torchtitan 0.3.0 config module"
        lines = provenance_lines(v, "torchtitan under SLURM", target) + tt.torchtitan_notes(v)
        files = {k: c for k, c in tt.torchtitan_files(v).items() if k in (tt.TITAN_CONFIG, f"{tt030.TITAN030_MODULE}.py")}
        if tt.TITAN_CONFIG in files:
            files.pop(f"{tt030.TITAN030_MODULE}.py", None)
            user = "# Run from a torchtitan 0.2.2 checkout.\n"
        else:
            user = f'export PYTHONPATH="${{SLURM_SUBMIT_DIR:-$PWD}}:${{PYTHONPATH:-}}"  # for --module {tt030.TITAN030_MODULE}\n'
        user += 'export PYTORCH_ALLOC_CONF="expandable_segments:True"\n'
        return spec, lines, files, user
    raise InputError("slurm_engine", engine, "one of " + ", ".join(SLURM_ENGINES))


def slurm_files(v: PlanView, engine: str) -> dict[str, str]:
    """``slurm_<engine>.sbatch`` plus the engine config it starts (ds_config.json / TOML)."""
    spec, lines, files, user = _engine_parts(v, engine)
    cpus = "# #SBATCH --cpus-per-task=<all cores of a node>   (site)\n"
    script = "".join([
        "#!/bin/bash\n",
        f"#SBATCH --job-name=planner-{v.model_id}-r{v.rank}\n",
        f"#SBATCH --nodes={v.num_nodes}\n",
        "#SBATCH --ntasks-per-node=1\n",
        f"#SBATCH --gpus-per-node={v.gpus_per_node}\n",
        "#SBATCH --exclusive\n",
        "#SBATCH --time=04:00:00\n",
        "# #SBATCH --partition=<partition>   (site)\n",
        "# #SBATCH --account=<account>       (site)\n",
        cpus,
        comment(lines),
        "\nset -euo pipefail\n\n",
        SITE_BLOCK,
        "\n",
        f'if [ "${{SLURM_NNODES}}" -ne {v.num_nodes} ]; then\n',
        f'    echo "this plan needs {plural(v.num_nodes, "node")}, the allocation has ${{SLURM_NNODES}}" >&2\n',
        "    exit 1\n",
        "fi\n",
        'head_node=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)\n',
        'export MASTER_ADDR="${head_node}"\n',
        'export MASTER_PORT="${MASTER_PORT:-29500}"\n\n',
        user,
        "\n",
        render_torchrun(spec, v.gpus_per_node, "c10d", prefix="srun --ntasks-per-node=1 "),
    ])
    return {slurm_script_name(engine): script, **files}
