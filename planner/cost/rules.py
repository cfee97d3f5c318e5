"""The rules a parallel configuration must satisfy before it is priced (the engines' own
checks), the default layer split, and the default attention kernel."""

from __future__ import annotations

from planner.errors import InputError
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["even_split", "check_precision", "check_parallel", "default_flash"]


def even_split(layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """The default split: as even as possible, extra layers on the last stages. With
    interleaving, whole chunks of ``vpp`` layers are spread (each stage holds a multiple of
    ``vpp``: one equal share per virtual stage), which needs ``layers % vpp == 0``."""
    if vpp > 1 and layers % vpp == 0 and layers // vpp >= pp:
        return tuple(vpp * n for n in even_split(layers // vpp, pp))
    base, rem = divmod(layers, pp)
    return tuple(base + (1 if i >= pp - rem else 0) for i in range(pp))


def check_precision(cluster: ClusterSpec, job: Job) -> None:
    """The GPU must have tensor cores for the job's precision (no FP8 on A100, no BF16 on V100)."""
    if job.precision not in cluster.gpu.peak_flops:
        raise InputError("job.precision", job.precision,
                         f"a precision {cluster.gpu.id} supports ({', '.join(sorted(k for k in cluster.gpu.peak_flops if k != 'tf32'))})")


def check_parallel(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig) -> None:
    """Raise InputError when ``par`` breaks a rule the engines enforce."""
    check_precision(cluster, job)
    if par.world != cluster.num_gpus:
        raise InputError("parallel", f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {par.world}", f"the GPU count {cluster.num_gpus}")
    if model.heads % par.tp:
        raise InputError("parallel.tp", par.tp, f"a divisor of the attention heads ({model.heads})")
    if not model.is_mla and model.kv_heads % par.tp and par.tp % model.kv_heads:
        raise InputError("parallel.tp", par.tp, f"a divisor or multiple of the KV heads ({model.kv_heads})")
    if job.global_batch_size % (par.micro_batch_size * par.dp):
        raise InputError("parallel.micro_batch_size", par.micro_batch_size, f"micro_batch_size * dp ({par.micro_batch_size}*{par.dp}) dividing the global batch {job.global_batch_size}")
    if par.cp > 1 and job.seq_len % (2 * par.cp):
        raise InputError("parallel.cp", par.cp, f"2*cp dividing the sequence length {job.seq_len}")
    if par.zero >= 2 and par.pp > 1:
        raise InputError("parallel.zero", par.zero, "0 or 1 with pipeline parallelism (Megatron and DeepSpeed pipelines shard at most the optimizer)")
    if par.pp > model.layers:
        raise InputError("parallel.pp", par.pp, f"at most the layer count ({model.layers})")
    lps = par.layers_per_stage or even_split(model.layers, par.pp, par.vpp)
    if sum(lps) != model.layers:
        raise InputError("parallel.layers_per_stage", list(lps), f"stages summing to {model.layers} layers")
    if par.vpp > 1:
        if par.pp == 1:
            raise InputError("parallel.vpp", par.vpp, "1 without pipeline parallelism")
        if any(n % par.vpp for n in lps):
            raise InputError("parallel.vpp", par.vpp, f"a divisor of every stage's layer count {list(lps)}")
        if par.num_microbatches(job.global_batch_size) % par.pp:
            raise InputError("parallel.vpp", par.vpp, f"interleaving needs the micro-batch count ({par.num_microbatches(job.global_batch_size)}) divisible by pp ({par.pp})")
    if par.ep > 1:
        if model.moe is None:
            raise InputError("parallel.ep", par.ep, "1 for a dense model")
        if model.moe.experts % par.ep or (par.dp * par.cp) % par.ep:
            raise InputError("parallel.ep", par.ep, f"a divisor of the experts ({model.moe.experts}) and of dp*cp ({par.dp * par.cp})")


def default_flash(job: Job) -> bool:
    """Which attention kernel a run uses when nobody says.

    FlashAttention (Dao et al. 2022, arXiv 2205.14135) reached Megatron-LM and DeepSpeed in
    2023, when training had moved to bf16; fp16 runs are the earlier generation that used
    Megatron's fused scale-mask-softmax over the full s x s square (Narayanan 2021;
    Korthikanti 2022). So: flash for bf16 and fp8, unfused for fp16. Override it with
    ``flash_attention=`` (CLI ``--attention``).
    """
    from planner.engines import resolve_flash  # noqa: PLC0415

    return resolve_flash(job)
