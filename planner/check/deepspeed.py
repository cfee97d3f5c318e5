"""DeepSpeed: the JSON config plus what it does not say (the model, the degrees, the world).

Keys and defaults are DeepSpeed 0.19.8's (``SP/deepspeed``; docs/_pages/config-json.md):
the batch triple ``train_batch_size = train_micro_batch_size_per_gpu x
gradient_accumulation_steps x dp``, any one of them inferred (runtime/config.py:590-656);
``zero_optimization.stage`` 0-3 (zero/config.py:81-87), ``overlap_comm`` defaulting to
``stage == 3`` (:138, :384-387); the pipeline engine takes ZeRO <= 1 (runtime/pipe/engine.py:76);
``bf16``/``fp16`` ``enabled``; ``data_types.grad_accum_dtype``; ``activation_checkpointing`` only
configures ``deepspeed.checkpointing`` for the layers the model checkpoints.

The model and the degrees come from a Megatron-DeepSpeed script beside the JSON (its
``pretrain_gpt.py`` flags: engine ``megatron-deepspeed``), from ``--model``/``--tp``/``--pp``
on the command line, or from the provenance a planner-written file carries (``_planner``).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from planner.check.job import Draft
from planner.engines import attention_kernel, get_engine, supports_flash
from planner.errors import InputError

__all__ = ["read_deepspeed_json", "is_deepspeed_json", "DS_KEYS"]

# Top-level keys that set the cost (the rest are listed as ignored): docs/_pages/config-json.md.
DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16", "zero_optimization",
           "activation_checkpointing", "pipeline", "data_types", "communication_data_type", "tensor_parallel", "expert_parallel",
           "sequence_parallel_size", "optimizer", "amp", "torch_autocast", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
           "bfloat16"}  # bfloat16: bf16's older name (runtime/constants.py BFLOAT16_OLD)
# The other top-level keys DeepSpeed 0.19.8 reads (runtime/constants.py and the feature configs
# of docs/_pages/config-json.md): no effect on the step's cost, but a key near one of these (or of
# DS_KEYS) that is neither is most likely a typo, which DeepSpeed ignores without a word.
DS_OTHER_KEYS = {"gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler", "prescale_gradients",
                 "gradient_predivide_factor", "sparse_gradients", "dump_state", "flops_profiler", "tensorboard", "wandb",
                 "csv_monitor", "comet", "comms_logger", "checkpoint", "elasticity", "aio", "compression_training",
                 "data_efficiency", "curriculum_learning", "autotuning", "memory_breakdown", "seq_parallel_communication_data_type",
                 "eigenvalue", "progressive_layer_drop", "disable_allgather", "hybrid_engine", "nebula", "weight_quantization",
                 "compile", "timers", "sparse_attention", "dataloader_drop_last", "use_data_before_expert_parallelism",
                 "graph_harvesting", "load_universal_checkpoint", "use_node_local_storage", "monitor_config",
                 "gradient_accumulation_dtype", "zero_force_ds_cpu_optimizer", "checkpoint_parallel_write_pipeline"}
_UNMODELLED_ZERO = {"offload_optimizer": "optimizer states on CPU/NVMe (GPU memory much lower, a PCIe copy per step)",
                    "offload_param": "weights on CPU/NVMe", "zero_hpz_partition_size": "ZeRO++ secondary weight partition",
                    "zero_quantized_weights": "ZeRO++ quantized weight gathers", "zero_quantized_gradients": "ZeRO++ quantized gradients",
                    "stage3_prefetch_bucket_size": "ZeRO-3 prefetch depth", "stage3_max_live_parameters": "ZeRO-3 live weights",
                    "stage3_param_persistence_threshold": "ZeRO-3 persistent small weights", "reduce_bucket_size": "gradient bucket size",
                    "allgather_bucket_size": "gather bucket size", "sub_group_size": "ZeRO-3 optimizer sub-groups"}


def is_deepspeed_json(doc: dict) -> bool:
    return isinstance(doc, dict) and bool({"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                                            "gradient_accumulation_steps"} & set(doc))


def _load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(str(path), "malformed JSON", f"valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), type(doc).__name__, "a JSON object (a DeepSpeed config)")
    return doc


def _int_key(doc: dict, key: str, where: str):
    v = doc.get(key)
    if v is None or v == "auto":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{where}: {key}", v, "a positive integer")
    return v


def read_deepspeed_json(path: Path, base: Draft | None = None) -> Draft:
    """The draft of DeepSpeed config ``path``; ``base``: what a launch script beside it set
    (Megatron-DeepSpeed flags), which the JSON completes."""
    doc = _load(path)
    name = path.name
    d = base or Draft(fmt="deepspeed", engine="deepspeed", files=[str(path)])
    if base is not None:
        d.files.append(str(path))
        d.fmt = "megatron-deepspeed"
    prov = doc.get("_planner")
    if isinstance(prov, dict) and prov.get("engine") == "megatron-deepspeed" and d.engine == "deepspeed":
        # planner launch wrote it for Megatron-DeepSpeed (its tensor parallelism): the job runs there
        d.engine = "megatron-deepspeed"
        d.notes.append(f"{name}: written by planner launch for megatron-deepspeed (its _planner block): priced there")
    for k in doc:
        if k == "_planner":
            continue
        if k not in DS_KEYS:
            near = None if k in DS_OTHER_KEYS else difflib.get_close_matches(k, sorted(DS_KEYS | DS_OTHER_KEYS), n=1, cutoff=0.8)
            if near and near[0] not in doc:
                d.findings.append(("unknown-key", f"{name}: {k} is not a DeepSpeed config key (did you mean {near[0]}?); DeepSpeed "
                                                  "ignores top-level keys it does not know, so the job runs without it and is priced so"))
            d.ignored.append(f"{k} (DeepSpeed config: " + ("no effect on the step's cost)" if k in DS_OTHER_KEYS or not near
                                                           else f"not a DeepSpeed key; did you mean {near[0]}?)"))
    bf16 = doc.get("bf16") if "bf16" in doc else doc.get("bfloat16")  # DeepSpeed's older name (runtime/constants.py BFLOAT16_OLD)
    bf16 = bf16 if isinstance(bf16, dict) else {}
    if doc.get("fp16", {}).get("enabled") in (True, "auto") and bf16.get("enabled") is True:
        raise InputError(f"{name}: fp16.enabled and bf16.enabled", True, "one of the two (runtime/config.py)")
    if bf16.get("enabled") is True:
        d.set("job.precision", "bf16", "file", f"{name}: " + ("bf16" if "bf16" in doc else "bfloat16") + ".enabled")
    elif doc.get("fp16", {}).get("enabled") is True:
        d.set("job.precision", "fp16", "file", f"{name}: fp16.enabled")
    elif not d.has("job.precision"):
        raise InputError(f"{name}: bf16.enabled / fp16.enabled", "neither", "a 16-bit run (DeepSpeed trains in fp32 without them, "
                         "which the planner does not price)")
    zero = doc.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise InputError(f"{name}: zero_optimization", zero, "an object")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise InputError(f"{name}: zero_optimization.stage", stage, "0, 1, 2 or 3 (zero/config.py:81-87)")
    d.set("parallel.zero", stage, "file" if "stage" in zero else "default", f"{name}: zero_optimization.stage" if "stage" in zero
          else "DeepSpeed default: ZeRO disabled")
    overlap = zero.get("overlap_comm")
    d.set("parallel.overlap_grad_reduce", bool(stage == 3 if overlap is None else overlap) and stage >= 1,
          "file" if overlap is not None else "default",
          f"{name}: zero_optimization.overlap_comm" if overlap is not None else "DeepSpeed default: overlap_comm = (stage == 3) (zero/config.py:384)")
    d.set("parallel.overlap_param_gather", False, "default", "DeepSpeed gathers the updated partitions right after step()")
    for k, what in _UNMODELLED_ZERO.items():
        if zero.get(k) not in (None, False, {}) and k in zero and not (k.endswith("_size") and not k.startswith("zero_hpz")):
            d.unmodelled.append(f"zero_optimization.{k}: {what}")
    if zero.get("mics_shard_size", -1) not in (-1, None):
        d.set("parallel.zero_shard_degree", zero["mics_shard_size"], "file", f"{name}: zero_optimization.mics_shard_size (MiCS)")
    else:
        d.set("parallel.zero_shard_degree", None, "default", "ZeRO over the whole data-parallel group")
    gdt = (doc.get("data_types") or {}).get("grad_accum_dtype") or doc.get("communication_data_type")
    if gdt in ("bf16", "fp32", "fp16"):
        prec = d.get("job.precision")
        value = "auto" if (gdt == "fp32" and prec != "fp16") or (gdt == "fp16" and prec == "fp16") else gdt
        d.set("job.grad_reduce", value, "file", f"{name}: data_types.grad_accum_dtype {gdt}")
    elif not d.has("job.grad_reduce"):
        d.set("job.grad_reduce", "auto", "default", "DeepSpeed: gradient dtype not set (the planner's default)")
    ac = doc.get("activation_checkpointing")
    interval = (doc.get("pipeline") or {}).get("activation_checkpoint_interval", 0)
    if isinstance(ac, dict) or interval:
        d.set("parallel.recompute", "full", "file", f"{name}: " + ("activation_checkpointing" if isinstance(ac, dict) else "pipeline.activation_checkpoint_interval")
              + " (the layers the model checkpoints are recomputed)")
        if isinstance(ac, dict) and not interval and base is None:
            d.notes.append(f"{name}: activation_checkpointing read as full recompute; the block only configures "
                           "deepspeed.checkpointing, and DeepSpeed recomputes just the layers the model code wraps in "
                           "deepspeed.checkpointing.checkpoint (Megatron-DeepSpeed --checkpoint-activations; a Hugging Face model's "
                           "gradient checkpointing uses torch's own): if yours wraps none, read the changes that release recompute")
        if isinstance(ac, dict) and ac.get("cpu_checkpointing"):
            d.unmodelled.append("activation_checkpointing.cpu_checkpointing: checkpoints on CPU")
        if isinstance(ac, dict) and ac.get("partition_activations"):
            d.unmodelled.append("activation_checkpointing.partition_activations: checkpoints split over TP ranks (1/tp of the saved inputs)")
    elif not d.has("parallel.recompute"):
        d.set("parallel.recompute", "none", "default", "no activation_checkpointing block")
    tp = (doc.get("tensor_parallel") or {}).get("autotp_size")
    if tp and tp > 1:
        d.set("parallel.tp", tp, "file", f"{name}: tensor_parallel.autotp_size")
        if d.engine == "deepspeed":
            d.engine = "megatron-deepspeed"
            d.notes.append("tensor_parallel.autotp_size: DeepSpeed AutoTP priced as Megatron-style tensor parallelism (engine megatron-deepspeed)")
    ep = (doc.get("expert_parallel") or {}).get("autoep_size")
    if ep and ep > 1:
        d.set("parallel.ep", ep, "file", f"{name}: expert_parallel.autoep_size")
    if doc.get("sequence_parallel_size", 1) not in (1, None):
        d.unmodelled.append(f"sequence_parallel_size {doc['sequence_parallel_size']}: Ulysses sequence parallelism (priced without it)")
    mb = _int_key(doc, "train_micro_batch_size_per_gpu", name)
    ga = _int_key(doc, "gradient_accumulation_steps", name)
    tb = _int_key(doc, "train_batch_size", name)
    d.post.insert(0, lambda dd, cluster: _batch(dd, cluster, mb, ga, tb, name))
    d.raw_batch = (mb, ga, tb)  # type: ignore[attr-defined]
    for key in ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep"):
        d.default(key, 1, "DeepSpeed: 1 (the script or --tp/--pp sets it)")
    d.default("parallel.vpp", 1, "DeepSpeed's pipeline engine has no virtual stages")
    d.default("parallel.schedule", "1f1b", "DeepSpeed's pipeline engine: 1F1B (runtime/pipe/schedule.py TrainSchedule)")
    d.default("parallel.sequence_parallel", False, "DeepSpeed: no Megatron sequence parallelism")
    d.default("parallel.tp_comm_overlap", False, "DeepSpeed: no TP overlap")
    d.default("parallel.moe_a2a_overlap", False, "DeepSpeed: no expert all-to-all overlap")
    d.default("parallel.moe_dispatcher", "alltoall", "DeepSpeed MoE: all-to-all dispatch")
    d.default("parallel.cuda_graph", "none", "DeepSpeed: eager launches")
    d.default("parallel.async_tp_allreduce", False, "DeepSpeed: blocking TP all-reduces")
    if not d.has("parallel.attention"):
        d.post.append(_attention)
    d.post.append(_etp)
    from planner.check.edits import JsonEditor  # noqa: PLC0415

    d.editor = JsonEditor(path, doc, base.editor if base is not None else None)
    return d


def world_from_batch(d: Draft, where: str) -> None:
    """The world a DeepSpeed config implies when nothing else sets it: dp = train_batch /
    (micro x accumulation), times tp x pp."""
    mb, ga, tb = getattr(d, "raw_batch", (None, None, None))
    if d.has("hardware.num_gpus"):
        return
    if tb and mb and ga and tb % (mb * ga) == 0:
        tp, pp = d.get("parallel.tp", 1), d.get("parallel.pp", 1)
        d.set("hardware.num_gpus", tb // (mb * ga) * tp * pp, "file",
              f"{where}: train_batch_size / (micro x accumulation) x tp x pp = {tb} / ({mb} x {ga}) x {tp} x {pp}")


def _batch(d: Draft, cluster, mb, ga, tb, name: str) -> None:
    tp, pp, cp = d.get("parallel.tp", 1), d.get("parallel.pp", 1), d.get("parallel.cp", 1)
    n = cluster.num_gpus
    if n % (tp * pp * cp):
        raise InputError(f"{name}: tp x pp", f"{tp} x {pp}", f"a divisor of the world ({n} GPUs)")
    dp = n // (tp * pp * cp)
    if mb is None and ga is None and tb is None:
        raise InputError(f"{name}: train_batch_size", None, "two of train_batch_size, train_micro_batch_size_per_gpu, "
                         "gradient_accumulation_steps (runtime/config.py:607-652)")
    if tb is None:
        mb, ga = mb or 1, ga or 1
        tb = mb * ga * dp
    elif mb is None:
        ga = ga or 1
        mb = tb // (ga * dp)
    elif ga is None:
        ga = tb // (mb * dp)
    if mb < 1 or ga < 1 or tb != mb * ga * dp:
        raise InputError(f"{name}: train_batch_size", tb, f"train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp = "
                         f"{mb} x {ga} x {dp} (runtime/config.py:602-605)")
    d.set("parallel.micro_batch_size", mb, "file", f"{name}: train_micro_batch_size_per_gpu")
    d.set("job.global_batch_size", tb, "file", f"{name}: train_batch_size (micro x accumulation x dp = {mb} x {ga} x {dp})")
    if pp > 1 and d.get("parallel.zero", 0) >= 2:
        raise InputError(f"{name}: zero_optimization.stage", d.get("parallel.zero"), "at most 1 with pipeline parallelism "
                         "(runtime/pipe/engine.py:76)")


def _etp(d: Draft, cluster) -> None:
    if not d.has("parallel.etp"):
        ep, tp = d.get("parallel.ep", 1), d.get("parallel.tp", 1)
        d.set("parallel.etp", 1 if ep > 1 else tp, "default", "AutoEP: expert tensor parallel size 1" if ep > 1 else "no experts")


def _attention(d: Draft, cluster) -> None:
    ok = supports_flash(cluster.gpu)
    if d.engine == "megatron-deepspeed":
        d.set("parallel.attention", "unfused", "default", "Megatron-DeepSpeed: fused softmax unless --use-flash-attn")
    else:
        d.set("parallel.attention", attention_kernel(get_engine(d.engine), cluster.gpu), "default",
              "the model's SDPA / flash-attn 2 attention (FlashAttention-2's kernels)" if ok else "no flash kernel on the GPU")
