"""DeepSpeed: the JSON config, a hostfile and a ``deepspeed`` launcher script.

Keys follow DeepSpeed master @ edaa7221 (``deepspeed/runtime/config.py``,
``docs/_pages/config-json.md``; launch_formats.md sec. 3). Rules enforced here:
``train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x DP``
(DP = world / (TP x PP) when the training script hands DeepSpeed its mpu/topology, sec. 3.1);
the pipeline engine rejects ZeRO-2/3 (sec. 3.1 "Hard rule"); DeepSpeed has no context
parallelism (Ulysses ``sequence_parallel_size`` is a different scheme) and its pipeline engine
has no interleaved schedule.

The JSON carries a top-level ``"_planner"`` key with the provenance: DeepSpeedConfig reads
the keys it knows and ignores unknown top-level keys (verified by tests/emit against the
installed DeepSpeed); the same text is in plan_summary.txt.
"""

from __future__ import annotations

import json

from planner.cost.memory import grad_dtype
from planner.emit.common import LaunchSpec, PlanView, comment, provenance_lines
from planner.errors import InputError

__all__ = ["DEEPSPEED_TARGET", "DS_CONFIG", "deepspeed_config", "deepspeed_launch_spec", "deepspeed_files", "hostnames"]

DEEPSPEED_TARGET = "DeepSpeed master @ edaa7221 (checked against deepspeed 0.19.x)"
DS_CONFIG = "ds_config.json"
HOSTFILE = "hostfile"
DS_SCRIPT = "deepspeed_launch.sh"


def hostnames(n: int) -> list[str]:
    """Placeholder node names node001, node002, ... (replace with the real hosts)."""
    return [f"node{i:03d}" for i in range(1, n + 1)]


def _check(v: PlanView) -> None:
    p = v.parallel
    if p.cp > 1:
        raise InputError("parallel.cp", p.cp, "1 for DeepSpeed (it has no context parallelism)")
    if p.vpp > 1 or p.schedule not in ("1f1b",):
        raise InputError("parallel.schedule", p.schedule if p.vpp == 1 else f"{p.schedule} (vpp={p.vpp})",
                         "1f1b without virtual stages for DeepSpeed's pipeline engine")
    if p.pp > 1 and p.zero >= 2:
        raise InputError("parallel.zero", p.zero, f"at most 1 with DeepSpeed pipeline parallelism (pp={p.pp})")


def deepspeed_config(v: PlanView) -> dict:
    """The DeepSpeed JSON config as a dict (validated)."""
    _check(v)
    p, j = v.parallel, v.job
    cfg: dict = {
        "_planner": {
            "note": "provenance written by planner; DeepSpeed ignores unknown top-level keys",
            "lines": provenance_lines(v, "DeepSpeed", DEEPSPEED_TARGET),
            "plan_rank": v.rank,
            "degrees": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "zero": p.zero},
            "predicted": v.predicted,
        },
        # sec. 3.1: emit the batch triple consistently; W = data-parallel world size.
        "train_batch_size": p.micro_batch_size * v.num_microbatches * p.dp,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": v.num_microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if j.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    else:  # bf16; fp8 has no DeepSpeed JSON switch (Transformer Engine in the model code)
        cfg["bf16"] = {"enabled": True}
    # The gradient dtype the prediction assumed (memory.grad_dtype), for both the held gradients
    # and their reduction. Without ZeRO, DeepSpeed accepts only gradients in the model dtype
    # (engine _do_optimizer_sanity_check): then the default stays and deepspeed_notes says so.
    gdt = grad_dtype(j.precision, j.grad_reduce)
    if p.zero >= 1 or gdt == _model_dtype(v):
        cfg["data_types"] = {"grad_accum_dtype": gdt}
        cfg["communication_data_type"] = gdt
    zero: dict = {"stage": p.zero}
    if p.zero >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
                     "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000})
    if p.zero == 3:
        zero.update({"stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
                     "stage3_gather_16bit_weights_on_model_save": True})
    cfg["zero_optimization"] = zero
    if p.recompute != "none":
        # Configures deepspeed.checkpointing only; the model code must call it (sec. 3.1).
        cfg["activation_checkpointing"] = {
            "partition_activations": p.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": v.model.layers if p.recompute == "full" else None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
        if cfg["activation_checkpointing"]["number_checkpoints"] is None:
            del cfg["activation_checkpointing"]["number_checkpoints"]
    if p.pp > 1:
        # PP degree is set in code: PipelineModule(num_stages=PP); this block is runtime options.
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}  # AutoTP training
    if p.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": p.ep, "expert_tensor_parallel_size": 1}
    return cfg


def deepspeed_launch_spec(v: PlanView) -> LaunchSpec:
    """The training script started under torchrun (used by the SLURM emitter)."""
    deepspeed_config(v)
    return LaunchSpec(program=['"${TRAIN_SCRIPT}"'], arg_lines=[["--deepspeed", "--deepspeed_config", DS_CONFIG]],
                      tail=['"${TRAIN_ARGS[@]}"', '"$@"'])


def _model_dtype(v: PlanView) -> str:
    """DeepSpeed's model dtype: fp16 runs are fp16, bf16 and fp8 runs bf16 (no FP8 switch)."""
    return "fp16" if v.job.precision == "fp16" else "bf16"


def deepspeed_notes(v: PlanView) -> list[str]:
    p = v.parallel
    notes = [
        f"train_batch_size {p.micro_batch_size * v.num_microbatches * p.dp} = micro {p.micro_batch_size} x "
        f"accumulation {v.num_microbatches} x dp {p.dp} (dp = world / (tp x pp) = {v.world} / ({p.tp} x {p.pp})).",
    ]
    if p.pp > 1:
        notes.append(f"Pipeline degree is set in the training script: PipelineModule(layers, num_stages={p.pp}); "
                     f"pass DeepSpeed a topology/mpu with data-parallel size {p.dp}.")
    if p.recompute != "none":
        notes.append("activation_checkpointing only configures deepspeed.checkpointing: the model must call it.")
    if v.job.precision == "fp8":
        notes.append("fp8: DeepSpeed's JSON has no FP8 switch; the config runs bf16, FP8 needs Transformer Engine layers in the model.")
    if p.ep > 1:
        notes.append("AutoEP uses expert tensor parallel size 1 (its only supported value).")
    dp = p.dp * p.cp > 1
    gdt = grad_dtype(v.job.precision, v.job.grad_reduce)
    if p.zero == 0 and gdt != _model_dtype(v):
        notes.append(f"The prediction holds and reduces gradients in {gdt}; DeepSpeed without ZeRO keeps them "
                     "in the model dtype (half the gradient memory and traffic of the prediction).")
    if dp and p.overlap_param_gather and p.zero in (1, 2):
        notes.append("The prediction overlaps the ZeRO weight all-gather with the next forward (Megatron's "
                     "--overlap-param-gather); DeepSpeed gathers right after step(), so expect that gather exposed.")
    if dp and p.overlap_grad_reduce and p.zero == 0:
        notes.append("The prediction overlaps the gradient all-reduce with the backward; DeepSpeed without ZeRO "
                     "all-reduces after it (use zero_optimization.stage 1 with overlap_comm to overlap).")
    return notes


TRAIN_BLOCK = """\
# ---- not decided by the planner: your DeepSpeed training script and its arguments (edit) ----
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"
TRAIN_ARGS=()
"""


def deepspeed_files(v: PlanView) -> dict[str, str]:
    cfg = deepspeed_config(v)
    hosts = hostnames(v.num_nodes)
    hostfile = comment(provenance_lines(v, "DeepSpeed", DEEPSPEED_TARGET)
                       + ["Placeholder node names: replace node001.. with your hosts (format '<host> slots=<gpus>')."])
    hostfile += "".join(f"{h} slots={v.gpus_per_node}\n" for h in hosts)
    script = "".join([
        "#!/usr/bin/env bash\n",
        comment(provenance_lines(v, "DeepSpeed", DEEPSPEED_TARGET) + deepspeed_notes(v)),
        "# Start from the first host of the hostfile; DeepSpeed's launcher reaches the others over pdsh/ssh.\n",
        "set -euo pipefail\n\n",
        'MASTER_PORT="${MASTER_PORT:-29500}"\n',
        TRAIN_BLOCK,
        "\n",
        f'deepspeed --hostfile {HOSTFILE} --num_nodes {v.num_nodes} --num_gpus {v.gpus_per_node} '
        f'--master_addr {hosts[0]} --master_port "${{MASTER_PORT}}" \\\n'
        f'    "${{TRAIN_SCRIPT}}" --deepspeed --deepspeed_config {DS_CONFIG} "${{TRAIN_ARGS[@]}}" "$@"\n',
    ])
    return {DS_CONFIG: json.dumps(cfg, indent=2) + "\n", HOSTFILE: hostfile, DS_SCRIPT: script}
