"""The rules a resolved parallel configuration must satisfy before it is priced: the
divisibility rules every engine shares (each written once, here) and the engine's own
(:func:`planner.engines.check_engine`)."""

from __future__ import annotations

from planner.engines import Engine, check_engine, cp_attention_why, flash_kernel_why, tp_overlap_why
from planner.errors import InputError
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, is_flash

__all__ = ["tp_ok", "tp_rule", "check_precision", "check_parallel"]


def tp_ok(model: ModelSpec, tp: int) -> bool:
    """Tensor parallelism splits the attention heads, and the KV heads (or replicates them when
    tp exceeds their count): tp divides the heads, and divides or is a multiple of the KV heads
    (Megatron-core ``validate_args``; MLA has no KV heads to split)."""
    return model.heads % tp == 0 and (model.is_mla or model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def tp_rule(model: ModelSpec, tp: int) -> None:
    """Raise InputError naming the head rule :func:`tp_ok` breaks."""
    if model.heads % tp:
        raise InputError("parallel.tp", tp, f"a divisor of the attention heads ({model.heads})")
    if not tp_ok(model, tp):
        raise InputError("parallel.tp", tp, f"a divisor or multiple of the KV heads ({model.kv_heads})")


def check_precision(cluster: ClusterSpec, job: Job) -> None:
    """The GPU must have tensor cores for the job's precision (no FP8 on A100, no BF16 on V100) and
    its FP8 recipe (MXFP8 on Blackwell only)."""
    if job.precision not in cluster.gpu.peak_flops:
        raise InputError("job.precision", job.precision,
                         f"a precision {cluster.gpu.id} supports ({', '.join(sorted(k for k in cluster.gpu.peak_flops if k != 'tf32'))}; "
                         "--precision on the command line)")
    if job.fp8_recipe == "mxfp8" and not cluster.gpu.mx_formats:
        raise InputError("job.fp8_recipe", "mxfp8", f"a recipe {cluster.gpu.id} runs (MXFP8 needs Blackwell tensor cores; "
                         "delayed or tensorwise on this GPU)")


def check_parallel(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, engine: Engine, lps: tuple[int, ...]) -> None:
    """Raise InputError when the resolved ``par`` with layer split ``lps`` breaks a rule."""
    check_precision(cluster, job)
    if par.world != cluster.num_gpus:
        raise InputError("parallel", f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {par.world}", f"the GPU count {cluster.num_gpus}")
    tp_rule(model, par.tp)
    if job.global_batch_size % (par.micro_batch_size * par.dp):
        raise InputError("parallel.micro_batch_size", par.micro_batch_size, f"micro_batch_size * dp ({par.micro_batch_size}*{par.dp}) dividing the global batch {job.global_batch_size}")
    if par.cp > 1 and job.seq_len % (2 * par.cp):
        raise InputError("parallel.cp", par.cp, f"2*cp dividing the sequence length {job.seq_len}")
    if par.pp > model.layers:
        raise InputError("parallel.pp", par.pp, f"at most the layer count ({model.layers})")
    if len(lps) != par.pp or sum(lps) != model.layers or min(lps) < 1:
        raise InputError("parallel.layers_per_stage", list(lps), f"{par.pp} stages of at least one layer summing to {model.layers} layers")
    if par.ep > 1:
        if model.moe is None:
            raise InputError("parallel.ep", par.ep, "1 for a dense model")
        if model.moe.experts % par.ep:
            raise InputError("parallel.ep", par.ep, f"a divisor of the experts ({model.moe.experts})")
        if (par.tp * par.dp * par.cp) % (par.ep * par.etp):
            raise InputError("parallel.ep", par.ep, f"ep x etp ({par.ep}x{par.etp}) dividing tp*dp*cp ({par.tp * par.dp * par.cp}): the expert grid tiles the world")
    if par.tp % par.etp:
        raise InputError("parallel.etp", par.etp, f"a divisor of tp ({par.tp})")
    if par.cp > 1 and (why := cp_attention_why(engine, par.attention, cluster.gpu)) is not None:
        raise InputError("parallel.cp", par.cp, f"1 on {engine.name} {why}")
    if par.tp_comm_overlap and par.tp > cluster.nvlink_domain:
        raise InputError("parallel.tp_comm_overlap", True, f"false: {tp_overlap_why(engine, par.tp, True, cluster.nvlink_domain)}")
    if (why := flash_kernel_why(par.attention, cluster.gpu)) is not None:
        raise InputError("parallel.attention", par.attention, why)
    check_engine(model, job, par, engine, lps)
