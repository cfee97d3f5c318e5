"""torchtitan v0.2.x: the TOML job config and a torchrun launch script.

Targets torchtitan v0.2.2, the last release whose job config is a TOML file
(launch_formats.md sec. 4.1; keys of ``torchtitan/config/job_config.py`` @ v0.2.2, sec. 4.2).
torchtitan main after 2026-02-23 has no TOML: pin ``torchtitan==0.2.2`` to use this file.

Mapping (sec. 4.2 rules): ``dp_replicate x dp_shard x cp x tp x pp = world``; the planner's
DP becomes the FSDP axis ``data_parallel_shard_degree`` (FSDP keeps parameters sharded at
rest, so memory is at most what the plan predicts; ``fsdp_reshard_after_forward`` is
"always" for ZeRO-3 and "never" otherwise, which keeps gathered parameters from forward to
backward like ZeRO-2), except a pure data-parallel ZeRO-0 plan, which becomes DDP
(``data_parallel_replicate_degree``). With PP, ``local_batch_size`` is one step's batch per DP
rank split into ``local / pipeline_parallel_microbatch_size`` pipeline microbatches (no
gradient accumulation); without PP it is the micro batch and torchtitan accumulates
``global / (local x dp)`` times. Stage contents are written out explicitly
(``module_fqns_per_model_part``) when the split is uneven.
"""

from __future__ import annotations

import tomllib

import tomli_w

from planner.emit.common import LaunchSpec, PlanView, comment, provenance_lines, render_torchrun
from planner.errors import InputError

__all__ = ["TORCHTITAN_TARGET", "TITAN_CONFIG", "torchtitan_config", "torchtitan_launch_spec", "torchtitan_files", "model_flavor"]

TORCHTITAN_TARGET = "torchtitan v0.2.2 TOML job config"
TITAN_CONFIG = "torchtitan_job.toml"
TITAN_SCRIPT = "torchtitan_launch.sh"

# (layers, hidden, heads) -> (model.name, model.flavor) for the flavors torchtitan v0.2.2 ships.
_FLAVORS = {
    (32, 4096, 32): ("llama3", "8B"),
    (80, 8192, 64): ("llama3", "70B"),
    (126, 16384, 128): ("llama3", "405B"),
    (36, 4096, 32): ("qwen3", "8B"),
    (40, 5120, 40): ("qwen3", "14B"),
    (64, 5120, 64): ("qwen3", "32B"),
    (61, 7168, 128): ("deepseek_v3", "671B"),
}
_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe", "zb": "InterleavedZeroBubble"}


def model_flavor(v: PlanView) -> tuple[str, str, bool]:
    """(name, flavor, known) for torchtitan's model registry."""
    m = v.model
    key = (m.layers, m.hidden, m.heads)
    if key in _FLAVORS:
        return (*_FLAVORS[key], True)
    return ("deepseek_v3" if m.moe is not None else "llama3", f"planner-{v.model_id}", False)


def _check(v: PlanView) -> None:
    p = v.parallel
    if v.job.precision == "fp16":
        raise InputError("job.precision", "fp16", "bf16 or fp8 for torchtitan (mixed_precision_param is bfloat16 or float32)")
    if p.schedule == "zb" and p.vpp < 2:
        raise InputError("parallel.vpp", p.vpp, "at least 2 for torchtitan's zero-bubble schedule")
    if p.schedule == "gpipe" and p.vpp > 1:
        raise InputError("parallel.vpp", p.vpp, "1 with the GPipe schedule")


def _pipeline(v: PlanView) -> dict:
    p = v.parallel
    if p.pp == 1:
        return {"pipeline_parallel_degree": 1}
    out = {
        "pipeline_parallel_degree": p.pp,
        "pipeline_parallel_schedule": _SCHEDULES[p.schedule],
        "pipeline_parallel_microbatch_size": p.micro_batch_size,
        # Layer counts below are transformer layers only, as in the plan.
        "pipeline_parallel_first_stage_less_layers": 0,
        "pipeline_parallel_last_stage_less_layers": 0,
    }
    chunks = v.chunk_layers()
    sizes = {len(c) for c in chunks}
    if len(sizes) == 1:
        out["pipeline_parallel_layers_per_stage"] = sizes.pop()
    else:
        parts = []
        for k, layers in enumerate(chunks):
            names = (["tok_embeddings"] if k == 0 else []) + [f"layers.{i}" for i in layers]
            names += ["norm", "output"] if k == len(chunks) - 1 else []
            parts.append(names)
        out["module_fqns_per_model_part"] = parts
    return out


def torchtitan_config(v: PlanView) -> dict:
    """The TOML document as a dict (validated)."""
    _check(v)
    p, j = v.parallel, v.job
    name, flavor, _ = model_flavor(v)
    pure_ddp = p.zero == 0 and p.tp == p.pp == p.cp == 1 and p.ep == 1
    parallelism = {
        "data_parallel_replicate_degree": p.dp if pure_ddp else 1,
        "data_parallel_shard_degree": 1 if pure_ddp else p.dp,
        "fsdp_reshard_after_forward": "always" if p.zero == 3 else "never",
        "tensor_parallel_degree": p.tp,
        **_pipeline(v),
        "context_parallel_degree": p.cp,
        "expert_parallel_degree": p.ep,
        "expert_tensor_parallel_degree": 1,
    }
    local = p.micro_batch_size * (v.num_microbatches if p.pp > 1 else 1)
    model = {"name": name, "flavor": flavor, "hf_assets_path": f"./assets/hf/{v.model_id}"}
    if j.precision == "fp8":
        model["converters"] = ["quantize.linear.float8"]
    ac = {"mode": p.recompute}
    if p.recompute == "selective":
        ac["selective_ac_option"] = "op"  # op-level selective recompute (attention ops)
    doc = {
        "job": {"dump_folder": "./outputs",
                "description": f"planner {v.model_id} plan rank {v.rank}: {v.degrees_text()}"},
        "model": model,
        "training": {
            "local_batch_size": local,
            "global_batch_size": j.global_batch_size,
            "seq_len": j.seq_len,
            "steps": 1000,
            "mixed_precision_param": "bfloat16",
            "mixed_precision_reduce": "float32",  # torchtitan 0.2.2 accepts only float32
        },
        "parallelism": parallelism,
        "activation_checkpoint": ac,
    }
    if j.precision == "fp8":
        doc["quantize"] = {"linear": {"float8": {"recipe_name": "rowwise"}}}
    return doc


def torchtitan_notes(v: PlanView) -> list[str]:
    p = v.parallel
    name, flavor, known = model_flavor(v)
    notes = [
        "torchtitan checks dp_replicate x dp_shard x cp x tp x pp = world "
        f"({v.world}) and global % (local x dp) == 0.",
        "Dry run without GPUs: NGPU=<world> COMM_MODE=fake_backend ./run_train.sh (torchtitan repo).",
    ]
    if v.job.grad_reduce == "bf16":
        notes.append("The prediction reduces gradients in bf16; torchtitan's FSDP reduces in float32 only "
                     "(training.mixed_precision_reduce), so expect twice the gradient traffic.")
    if not known:
        m = v.model
        notes.append(f"torchtitan v0.2.2 ships no flavor with these dimensions: register flavor {flavor!r} under "
                     f"model {name!r} (layers={m.layers}, dim={m.hidden}, heads={m.heads}, kv_heads={m.kv_heads}, "
                     f"ffn={m.ffn_hidden}, vocab={m.vocab}).")
    if p.tp > 1 and not p.sequence_parallel:
        notes.append("torchtitan v0.2.x always applies sequence parallelism inside TP (the plan has it off).")
    return notes


def torchtitan_launch_spec(v: PlanView) -> LaunchSpec:
    torchtitan_config(v)
    return LaunchSpec(program=["-m", "torchtitan.train"], arg_lines=[["--job.config_file", TITAN_CONFIG]], tail=['"$@"'])


def torchtitan_files(v: PlanView) -> dict[str, str]:
    doc = torchtitan_config(v)
    text = comment(provenance_lines(v, "torchtitan", TORCHTITAN_TARGET) + torchtitan_notes(v)) + "\n" + tomli_w.dumps(doc)
    if tomllib.loads(text) != doc:  # the comments must not change the document
        raise AssertionError("torchtitan TOML does not read back")
    script = "".join([
        "#!/usr/bin/env bash\n",
        comment(provenance_lines(v, "torchtitan", TORCHTITAN_TARGET) + torchtitan_notes(v)),
        "# Run from a torchtitan v0.2.2 checkout, the same command on every node with NODE_RANK set.\n",
        "set -euo pipefail\n\n",
        f'NNODES="${{NNODES:-{v.num_nodes}}}"\n',
        'NODE_RANK="${NODE_RANK:-0}"\n',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"\n',
        'MASTER_PORT="${MASTER_PORT:-29500}"\n',
        'export PYTORCH_ALLOC_CONF="expandable_segments:True"  # as torchtitan\'s run_train.sh\n\n',
        render_torchrun(torchtitan_launch_spec(v), v.gpus_per_node, "static"),
    ])
    return {TITAN_CONFIG: text, TITAN_SCRIPT: script}
