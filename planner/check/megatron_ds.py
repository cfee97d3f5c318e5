"""Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed): ``pretrain_gpt.py`` with Megatron's 2021
flags plus DeepSpeed's (``--deepspeed --deepspeed_config ds.json``, ``--zero-stage``,
``--no-pipeline-parallel``, ``--deepspeed-activation-checkpointing``; megatron/arguments.py
``_add_deepspeed_args`` there). The Megatron flags give the model and the degrees (read as the
2021 engine, :mod:`planner.check.megatron`), the JSON the batch, precision and ZeRO stage
(:mod:`planner.check.deepspeed`)."""

from __future__ import annotations

from pathlib import Path

from planner.check.job import Draft

__all__ = ["read_megatron_deepspeed", "DS_FLAGS"]

# flag -> (nargs, type, choices, meaning)
DS_FLAGS = {
    "--deepspeed": (0, None, None, "run under DeepSpeed"),
    "--deepspeed_config": (1, "str", None, "the DeepSpeed JSON"),
    "--deepspeed-config": (1, "str", None, "the DeepSpeed JSON"),
    "--zero-stage": (1, "int", None, "ZeRO stage handed to DeepSpeed (the JSON's zero_optimization.stage is what runs)"),
    "--no-pipeline-parallel": (0, None, None, "no PipelineModule (pp 1)"),
    "--deepspeed-activation-checkpointing": (0, None, None, "activation checkpointing through deepspeed.checkpointing"),
    "--partition-activations": (0, None, None, "checkpoints split over TP ranks"),
    "--contigious-checkpointing": (0, None, None, "contiguous checkpoint buffers"),
    "--checkpoint-in-cpu": (0, None, None, "checkpoints on CPU"),
    "--synchronize-each-layer": (0, None, None, "synchronise each layer"),
    "--profile-backward": (0, None, None, "profiling"),
    "--cpu-optimizer": (0, None, None, "optimizer on the CPU"),
    "--cpu_torch_adam": (0, None, None, "CPU Adam"),
    "--use-flash-attn-v2": (0, None, None, "FlashAttention 2"),
    "--use-flash-attn-v1": (0, None, None, "FlashAttention 1 (flash-attn 1.x)"),
    "--use-flash-attn-triton": (0, None, None, "FlashAttention (triton)"),
    "--ds-sequence-parallel-size": (1, "int", None, "Ulysses sequence parallelism"),
    "--num-key-value-heads": (1, "int", None, "KV heads (GQA)"),
    "--normalization": (1, "str", ["layernorm", "rmsnorm"], "the norm (Megatron-DeepSpeed's spelling)"),
    "--rotary-position-embeddings-theta": (1, "int", None, "rotary base"),
    "--no-query-key-layer-scaling": (0, None, None, "attention scaling"),
    "--ds-inference": (0, None, None, "inference"),
}


def read_megatron_deepspeed(path: Path) -> Draft:
    from planner.check.megatron import megatron_job  # noqa: PLC0415
    from planner.check.megatron_launch import find_launch  # noqa: PLC0415

    launch = find_launch(path)
    d = megatron_job(launch.args, path, launch, fmt="megatron-deepspeed", extra=DS_FLAGS)
    d.engine = "megatron-deepspeed"
    p = d.raw  # type: ignore[attr-defined]
    if p.has("--no-pipeline-parallel"):
        d.set("parallel.pp", 1, "file", f"{p.line('--no-pipeline-parallel')} --no-pipeline-parallel")
    if p.has("--num-key-value-heads"):
        d.set("model.kv_heads", p.int("--num-key-value-heads"), "file", f"{p.line('--num-key-value-heads')} --num-key-value-heads")
    if p.has("--rotary-position-embeddings-theta"):
        d.set("model.rope_theta", float(p.int("--rotary-position-embeddings-theta")), "file",
              f"{p.line('--rotary-position-embeddings-theta')} --rotary-position-embeddings-theta")
    if flag := next((f for f in ("--use-flash-attn-v2", "--use-flash-attn-triton", "--use-flash-attn-v1", "--use-flash-attn") if p.has(f)), None):
        d.post = [h for h in d.post if getattr(h, "__name__", "") != "by_gpu"]
        # --use-flash-attn-v2 (and the Triton form, priced alike): the flash-attn 2.x package, FlashAttention-2's
        # kernels, not Hopper's FA3; --use-flash-attn is --use-flash-attn-v1 (megatron/arguments.py): flash-attn 1.x
        kind = "fa1" if flag in ("--use-flash-attn-v1", "--use-flash-attn") else "fa2"
        d.set("parallel.attention", kind, "file", f"{p.line(flag)} {flag}")
    elif not d.has("parallel.attention") or d.values["parallel.attention"][1].kind == "default":
        d.post = [h for h in d.post if getattr(h, "__name__", "") != "by_gpu"]
        d.set("parallel.attention", "unfused", "default", "Megatron-DeepSpeed: fused softmax unless --use-flash-attn (megatron/arguments.py)")
    if p.has("--deepspeed-activation-checkpointing") or p.has("--checkpoint-activations"):
        d.set("parallel.recompute", "full", "file", f"{p.line('--checkpoint-activations')} --checkpoint-activations")
    for flag in ("--ds-sequence-parallel-size", "--cpu-optimizer", "--partition-activations", "--checkpoint-in-cpu"):
        if p.has(flag):
            d.unmodelled.append(f"{flag}: {DS_FLAGS[flag][3]}")
    d.notes = [n for n in d.notes if "2021 engine" not in n]
    d.notes.append("Megatron-DeepSpeed: model and degrees from the Megatron flags, batch, precision and ZeRO from the DeepSpeed JSON")
    return d
