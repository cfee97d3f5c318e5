"""DeepSpeed: the JSON config, a hostfile and a ``deepspeed`` launcher script.

Keys follow DeepSpeed 0.19.8 (``deepspeed/runtime/config.py``, ``docs/_pages/config-json.md``;
docs/research/titan_deepspeed.md sec. C). Only plans a DeepSpeed engine runs are written
(:func:`planner.emit.common.for_engine`): the plan's own engine when it is ``deepspeed`` or
``megatron-deepspeed``, else ``deepspeed`` (``megatron-deepspeed`` when the plan has tensor
parallelism, which DeepSpeed gets from Megatron-DeepSpeed's model code). Those profiles carry
DeepSpeed's rules: no context parallelism, no interleaved schedule, ZeRO <= 1 with the pipeline
engine (runtime/pipe/engine.py:76), no expert parallelism.

Batch. DeepSpeedConfig checks ``train_batch_size == micro x accumulation x W``
(config.py:590-605) where W is the data-parallel size of an mpu when one is passed, the world
size of torch.distributed when none is (config.py:456-474), and the PipelineModule's grid for a
pipeline (deepspeed/__init__.py: ``mpu = model.mpu()``). With tensor or pipeline parallelism
the two differ, so the config gives only the micro batch and the accumulation steps and
DeepSpeed derives ``train_batch_size`` from the W it sees (config.py:607-652): the file passes
on every path, and the notes say what the script must pass for W to be the plan's DP.

The JSON carries a top-level ``"_planner"`` key with the provenance: DeepSpeedConfig reads
the keys it knows and ignores unknown top-level keys (verified by tests/emit against the
installed DeepSpeed); the same text is in plan_summary.txt.
"""

from __future__ import annotations

import json

from planner.cost.memory import grad_dtype
from planner.emit.common import LaunchSpec, PlanView, attention_note, comment, for_engine, provenance_lines
from planner.errors import InputError

__all__ = ["DEEPSPEED_TARGET", "DS_CONFIG", "deepspeed_engine", "deepspeed_view", "deepspeed_config", "deepspeed_launch_spec",
           "deepspeed_files", "deepspeed_notes", "hostnames", "megatron_deepspeed_args", "train_block"]

DEEPSPEED_TARGET = "DeepSpeed 0.19.8"
DS_CONFIG = "ds_config.json"
HOSTFILE = "hostfile"
DS_SCRIPT = "deepspeed_launch.sh"
_DS_ENGINES = ("deepspeed", "megatron-deepspeed")


def hostnames(n: int) -> list[str]:
    """Placeholder node names node001, node002, ... (replace with the real hosts)."""
    return [f"node{i:03d}" for i in range(1, n + 1)]


def deepspeed_engine(v: PlanView) -> str:
    """The DeepSpeed engine profile that runs the plan: its own, or the one with its tensor parallelism."""
    if v.engine is not None and v.engine.name in _DS_ENGINES:
        return v.engine.name
    return "megatron-deepspeed" if v.parallel.tp > 1 else "deepspeed"


def deepspeed_view(v: PlanView) -> tuple[PlanView, list[str]]:
    """The plan as that engine runs it (InputError with the engine's reason otherwise)."""
    return for_engine(v, deepspeed_engine(v))


def _full_triple(v: PlanView) -> bool:
    """Whether every path DeepSpeed takes sees W = dp (no tensor or pipeline parallelism)."""
    return v.parallel.tp == 1 and v.parallel.pp == 1


def deepspeed_config(v: PlanView) -> dict:
    """The DeepSpeed JSON config as a dict (validated)."""
    v, _ = deepspeed_view(v)
    p, j = v.parallel, v.job
    cfg: dict = {
        "_planner": {
            "note": "provenance written by planner; DeepSpeed ignores unknown top-level keys",
            "lines": provenance_lines(v, "DeepSpeed", DEEPSPEED_TARGET),
            "plan_rank": v.rank,
            "engine": deepspeed_engine(v),
            "degrees": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "zero": p.zero},
            "global_batch_size": j.global_batch_size,
            "predicted": v.predicted,
        },
    }
    if _full_triple(v):
        cfg["train_batch_size"] = p.micro_batch_size * v.num_microbatches * p.dp
    cfg.update({
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": v.num_microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    })
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
        # overlap_comm is the plan's overlap_grad_reduce (what it was priced with; DeepSpeed's own
        # default is stage == 3, zero/config.py)
        zero.update({"overlap_comm": bool(p.overlap_grad_reduce), "contiguous_gradients": True, "reduce_scatter": True,
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
    return cfg


def deepspeed_launch_spec(v: PlanView) -> LaunchSpec:
    """The training script started under torchrun (used by the SLURM emitter)."""
    deepspeed_view(v)
    return LaunchSpec(program=['"${TRAIN_SCRIPT}"'], arg_lines=[["--deepspeed", "--deepspeed_config", DS_CONFIG]],
                      tail=['"${TRAIN_ARGS[@]}"', '"$@"'])


def _model_dtype(v: PlanView) -> str:
    """DeepSpeed's model dtype: fp16 runs are fp16, bf16 and fp8 runs bf16 (no FP8 switch)."""
    return "fp16" if v.job.precision == "fp16" else "bf16"


def deepspeed_notes(v: PlanView) -> list[str]:
    planned = v.parallel  # the overlaps the prediction assumed (the notes below say what DeepSpeed does instead)
    v, adapted = deepspeed_view(v)
    adapted = [n for n in adapted if "overlap_grad_reduce" not in n and "overlap_param_gather" not in n]
    p, eng = v.parallel, deepspeed_engine(v)
    g = p.micro_batch_size * v.num_microbatches * p.dp
    notes = [f"Engine {eng}: micro {p.micro_batch_size} x accumulation {v.num_microbatches} x dp {p.dp} = global batch {g} "
             f"(dp = world / (tp x pp) = {v.world} / ({p.tp} x {p.pp}))."]
    if not _full_triple(v):
        how = (f"the PipelineModule's topology has data-parallel size {p.dp}" if p.pp > 1 else
               f"pass deepspeed.initialize(mpu=...) an mpu whose get_data_parallel_world_size() is {p.dp}")
        notes.append(f"train_batch_size is left to DeepSpeed (micro x accumulation x its data-parallel size W): {how}, so "
                     f"W = {p.dp} and train_batch_size = {g}. Without an mpu DeepSpeed takes W = the world size ({v.world}) "
                     f"and derives {p.micro_batch_size * v.num_microbatches * v.world}: the steps are the same, its "
                     "sample counts (logs, sample-based schedules) are not.")
    if eng == "megatron-deepspeed":
        notes.append(f"Megatron-DeepSpeed runs it: TRAIN_ARGS below are its pretrain_gpt.py arguments (tensor parallelism "
                     f"{p.tp} is its --tensor-model-parallel-size, its mpu goes to deepspeed.initialize; GPTModelPipe splits "
                     f"the layers with partition_method='type:transformer', {list(v.stage_layers)} per stage as priced).")
    elif p.pp > 1:
        notes.append(f"Pipeline degree is set in the training script: PipelineModule(layers, num_stages={p.pp}) "
                     f"(Megatron-DeepSpeed: --pipeline-model-parallel-size {p.pp}, whose GPTModelPipe partitions with "
                     f"partition_method='type:transformer'). The plan priced the transformer layers spread evenly, "
                     f"{list(v.stage_layers)} per stage: partition_method='type:<your transformer layer class>' gives it "
                     "(DeepSpeed's default 'parameters' balances parameter counts, which gives the embedding's stage fewer layers).")
    if p.recompute != "none":
        notes.append("activation_checkpointing only configures deepspeed.checkpointing: the model must call it.")
    if (note := attention_note(v, eng)) is not None:
        notes.append(note)
    if v.job.precision == "fp8":
        notes.append("fp8: DeepSpeed's JSON has no FP8 switch; the config runs bf16, FP8 needs Transformer Engine layers in the model.")
    dp = p.dp * p.cp > 1
    gdt = grad_dtype(v.job.precision, v.job.grad_reduce)
    if p.zero == 0 and gdt != _model_dtype(v):
        notes.append(f"The prediction holds and reduces gradients in {gdt}; DeepSpeed without ZeRO keeps them "
                     "in the model dtype (half the gradient memory and traffic of the prediction).")
    if dp and planned.overlap_param_gather and p.zero in (1, 2):
        notes.append("The prediction overlaps the ZeRO weight all-gather with the next forward (Megatron's "
                     "--overlap-param-gather); DeepSpeed gathers right after step(), so expect that gather exposed.")
    if dp and planned.overlap_grad_reduce and p.zero == 0:
        notes.append("The prediction overlaps the gradient all-reduce with the backward; DeepSpeed without ZeRO "
                     "all-reduces after it (use zero_optimization.stage 1 with overlap_comm to overlap).")
    return notes + adapted


TRAIN_BLOCK = """\
# ---- not decided by the planner: your DeepSpeed training script and its arguments (edit) ----
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"
TRAIN_ARGS=()
"""

# Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed megatron/arguments.py): its pretrain_gpt.py with
# the plan's degrees, model shape, batch, precision, recompute and attention kernel; data,
# tokenizer and schedule are the user's.
MDS_USER_BLOCK = """\
# ---- not decided by the planner: data, tokenizer, schedule (edit) ----
TRAIN_SCRIPT="${{TRAIN_SCRIPT:-pretrain_gpt.py}}"  # Megatron-DeepSpeed's, run from its checkout
DATA_ARGS=(--data-path my_text_document --tokenizer-type NullTokenizer --vocab-size {vocab}
    --train-iters 1000 --lr 1.0e-4 --min-lr 1.0e-5 --lr-decay-style cosine --lr-warmup-iters 100
    --weight-decay 0.1 --clip-grad 1.0 --log-interval 1)
"""


def megatron_deepspeed_args(v: PlanView) -> list[list[str]]:
    """pretrain_gpt.py's arguments for the plan on Megatron-DeepSpeed (flag names from its
    megatron/arguments.py: --use-flash-attn-v1/-v2, --checkpoint-activations, --no-pipeline-parallel,
    --num-key-value-heads, --rotary-position-embeddings-theta, --zero-stage)."""
    m, p, j = v.model, v.parallel, v.job
    par = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    if p.pp == 1:
        par.append("--no-pipeline-parallel")  # no PipelineModule (its GPTModelPipe needs pp > 1 to matter)
    shape = ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--ffn-hidden-size", str(m.ffn_hidden),
             "--num-attention-heads", str(m.heads)]
    if m.kv_heads != m.heads:
        shape += ["--num-key-value-heads", str(m.kv_heads)]
    if m.head_dim and m.head_dim * m.heads != m.hidden:
        shape += ["--kv-channels", str(m.head_dim)]
    arch = []
    if m.mlp == "swiglu":
        arch.append("--swiglu")
    if m.norm == "rmsnorm":
        arch += ["--normalization", "rmsnorm"]
    if (m.position_embedding or ("rope" if m.norm == "rmsnorm" else "learned")) == "rope":
        arch += ["--use-rotary-position-embeddings", "--no-position-embedding"]
        if m.rope_theta:
            arch += ["--rotary-position-embeddings-theta", str(int(m.rope_theta))]
    if not m.tied_embeddings:
        arch.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        arch.append("--disable-bias-linear")
    seq = ["--seq-length", str(j.seq_len), "--max-position-embeddings", str(max(j.seq_len, m.max_seq_len or 0))]
    batch = ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(j.global_batch_size),
             "--fp16" if j.precision == "fp16" else "--bf16", "--zero-stage", str(p.zero)]
    mem = ["--checkpoint-activations", "--deepspeed-activation-checkpointing"] if p.recompute == "full" else []
    mem += {"fa2": ["--use-flash-attn-v2"], "fa1": ["--use-flash-attn-v1"]}.get(p.attention or "", [])
    return [line for line in (par, shape, arch, seq, batch, mem) if line]


def train_block(v: PlanView, eng: str) -> str:
    """The user block, and for Megatron-DeepSpeed the plan's own pretrain_gpt.py arguments."""
    if eng != "megatron-deepspeed":
        return TRAIN_BLOCK
    lines = "\n".join("    " + " ".join(line) for line in megatron_deepspeed_args(v))
    return MDS_USER_BLOCK.format(vocab=v.model.vocab) + "# ---- the plan ----\nTRAIN_ARGS=(\n" + lines + '\n    "${DATA_ARGS[@]}"\n)\n'


def deepspeed_files(v: PlanView) -> dict[str, str]:
    v = deepspeed_view(v)[0]  # as DeepSpeed runs it, priced there (the provenance lines' prediction)
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
        train_block(v, deepspeed_engine(v)),
        "\n",
        f'deepspeed --hostfile {HOSTFILE} --num_nodes {v.num_nodes} --num_gpus {v.gpus_per_node} '
        f'--master_addr {hosts[0]} --master_port "${{MASTER_PORT}}" \\\n'
        f'    "${{TRAIN_SCRIPT}}" --deepspeed --deepspeed_config {DS_CONFIG} "${{TRAIN_ARGS[@]}}" "$@"\n',
    ])
    return {DS_CONFIG: json.dumps(cfg, indent=2) + "\n", HOSTFILE: hostfile, DS_SCRIPT: script}
