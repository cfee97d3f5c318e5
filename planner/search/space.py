"""The candidate space: every parallel configuration the engines accept for a job.

Each dimension lives on a small discrete set (search_design.md sec. 1): divisors of the GPU
count for tp x pp x dp x cp (x ep), tp inside the NVLink domain and dividing the heads,
micro-batch sizes dividing global_batch / dp, vpp dividing the layers per stage, three
recompute levels, ZeRO 0-3 (capped), sequence parallelism on/off. ``fixed`` pins any field
(the non-null fields of a scenario's ``parallel`` block).

Modern dimensions (docs/cost_model_modern.md): context parallelism ``cp`` ranges over divisors
of the GPU count up to ``max_cp`` with 2 cp dividing the sequence (load-balanced causal
chunks, Megatron-core); expert parallelism ``ep`` over divisors of the expert count that
divide dp x cp (experts are sharded over the data- and context-parallel ranks; expert tensor
parallelism = tp). Precision (bf16 / fp16 / fp8) is the user's choice (``Job.precision``,
``planner plan --precision fp8``), not searched: FP8 changes numerics, not just speed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from planner.engines import default_generation, features
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["SearchOptions", "divisors", "candidates", "candidate_tuples", "to_parallel", "FIELDS"]

FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero", "schedule")


@dataclass(frozen=True)
class SearchOptions:
    """What the search may choose. ``fixed`` maps a field of ParallelConfig to its value."""

    fixed: dict = field(default_factory=dict, hash=False)
    allow_tp_across_nodes: bool = False
    max_micro_batch: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    max_vpp: int = 16  # NeMo tunes up to 12-20 virtual stages (recommended_model_configs)
    max_cp: int = 64
    flash_attention: bool | None = None  # None: from the engine generation
    generation: str | None = None  # legacy | modern; None: planner.engines.default_generation
    uneven_split: bool = True


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pick(fixed: dict, name: str, options):
    if name in fixed and fixed[name] is not None:
        return [fixed[name]]
    return list(options)


def candidates(model: ModelSpec, cluster: ClusterSpec, job: Job, opts: SearchOptions):
    """Yield every ParallelConfig (even layer split) that satisfies the engines' rules."""
    for t in candidate_tuples(model, cluster, job, opts):
        yield to_parallel(t)


def to_parallel(t: tuple) -> ParallelConfig:
    tp, pp, dp, cp, ep, v, mb, rec, sp, z, tpo, asy, opg, ogr = t
    return ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=v, micro_batch_size=mb, recompute=rec, sequence_parallel=sp, zero=z,
                          tp_comm_overlap=tpo, async_tp_allreduce=asy, overlap_param_gather=opg, overlap_grad_reduce=ogr)


def candidate_tuples(model: ModelSpec, cluster: ClusterSpec, job: Job, opts: SearchOptions):
    """Yield (tp, pp, dp, cp, ep, vpp, micro_batch_size, recompute, sequence_parallel, zero, tp_comm_overlap, async_tp_allreduce,
    overlap_param_gather, overlap_grad_reduce)."""
    n = cluster.num_gpus
    fx = opts.fixed
    feats = features(opts.generation or default_generation(job))
    dom = cluster.nvlink_domain
    tps = [t for t in divisors(n) if model.heads % t == 0 and (model.is_mla or model.kv_heads % t == 0 or t % model.kv_heads == 0)]
    if not opts.allow_tp_across_nodes:
        tps = [t for t in tps if t <= dom]
    tps = _pick(fx, "tp", tps)
    max_cp = opts.max_cp if feats["context_parallel"] else 1
    cps = _pick(fx, "cp", [c for c in divisors(n) if c <= max_cp and (c == 1 or job.seq_len % (2 * c) == 0)])
    pps = _pick(fx, "pp", [p for p in divisors(n) if p <= model.layers])
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if fx.get("dp") not in (None, dp):
            continue
        if job.global_batch_size % dp:
            continue
        per_rank = job.global_batch_size // dp
        mbs = [b for b in range(1, min(per_rank, opts.max_micro_batch) + 1) if per_rank % b == 0]
        if fx.get("micro_batch_size") is not None:  # a fixed micro-batch must divide the per-rank batch
            mbs = [fx["micro_batch_size"]] if per_rank % fx["micro_batch_size"] == 0 else []
        eps = [1]
        if model.moe is not None:
            eps = [e for e in divisors(model.moe.experts) if (dp * cp) % e == 0]
        eps = _pick(fx, "ep", eps)
        sps = _pick(fx, "sequence_parallel", [True, False] if feats["sequence_parallel"] else [False]) if tp > 1 else [False]
        zeros = _pick(fx, "zero", opts.zero_stages)
        recs = _pick(fx, "recompute", [r for r in opts.recompute if r != "selective" or feats["selective_recompute"]])
        if pp == 1:
            vpps = [1]
        else:
            # Interleaving needs every stage to hold whole chunks: v | layers, at least one chunk
            # per virtual stage (stages may differ by whole chunks, as in Llama 3's 126 layers).
            L = model.layers
            top = max(opts.max_vpp, fx.get("vpp") or 0)  # a fixed vpp may exceed the searched range
            if L % pp == 0:  # equal stages: v divides each stage's layers
                vpps = [v for v in range(1, top + 1) if (L // pp) % v == 0]
            else:
                vpps = [v for v in range(1, top + 1) if L % v == 0 and L >= pp * v]
            if not vpps:
                vpps = [1]
        if fx.get("vpp") is not None:  # a fixed vpp must still satisfy the pipeline's rules
            vpps = [fx["vpp"]] if fx["vpp"] in vpps else []
        for mb, ep, sp, z, rec, v in itertools.product(mbs, eps, sps, zeros, recs, vpps):
            m = per_rank // mb
            if v > 1 and m % pp:
                continue
            if z >= 2 and pp > 1:
                continue  # Megatron/DeepSpeed pipelines accept ZeRO 0-1 only
            # TP overlap only ever hides time, so it is on wherever the engine has it (needs SP).
            tpo = fx.get("tp_comm_overlap", feats["tp_comm_overlap"]) and sp and tp > 1
            asy = fx.get("async_tp_allreduce", feats["async_tp_allreduce"])
            # Overlapping the weight gather only ever hides time; it needs ZeRO 1/2's gather.
            ogr = fx.get("overlap_grad_reduce", feats["overlap_grad_reduce"])
            opg = fx.get("overlap_param_gather", feats["overlap_param_gather"]) and z in (1, 2) and ogr
            yield (tp, pp, dp, cp, ep, v, mb, rec, sp, z, tpo, asy, opg, ogr)
