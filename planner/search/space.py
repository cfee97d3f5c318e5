"""The candidate space: every parallel configuration an engine accepts for a job.

Each dimension lives on a small discrete set (search_design.md sec. 1): divisors of the GPU
count for tp x pp x dp x cp (x ep), tp inside the NVLink domain and dividing the heads
(:func:`planner.cost.rules.tp_ok`), micro-batch sizes dividing global_batch / dp, vpp such that
every stage holds whole chunks (or uneven chunks where the engine takes a layout), the
engine's recompute levels and ZeRO stages (:mod:`planner.engines`). Fields the engine decides
and that only ever help (sequence parallelism, the overlaps, the attention kernel) are not
searched: each candidate is resolved by :func:`planner.engines.resolve`, the same function
``estimate`` uses. ``fixed`` pins any field (the non-null fields of a scenario's ``parallel``
block, or the CLI's flags).

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

from planner.cost.rules import tp_ok
from planner.engines import Engine, a2a_overlap_why, dp_overlap_why, attention_kernel, cp_attention_why, cuda_graph_why, default_etp, default_split, flex_dispatcher_why, get_engine, interleaving_ok, resolve
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["SearchOptions", "divisors", "candidates", "candidate_tuples", "to_parallel", "schedules_for", "FIELDS", "TUPLE_FIELDS"]

# The fields a search may fix or choose.
FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero", "schedule",
          "attention", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce", "overlap_param_gather", "moe_a2a_overlap",
          "moe_dispatcher", "cuda_graph")
# A candidate tuple, in this order.
TUPLE_FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "zero", "schedule")

# The schedules the search tries by chunk count: one chunk a rank, or v chunks (the V-shaped
# ones take exactly two). GPipe is left out unless fixed: it has 1F1B's bubble and holds every
# micro-batch's activations (Narayanan et al. 2021 sec. 2.2.1).
_FLAT = ("1f1b", "zb-h1", "zb-h2")
_V_SHAPED = ("zb-v", "dualpipe")


@dataclass(frozen=True)
class SearchOptions:
    """What the search may choose. ``fixed`` maps a field of ParallelConfig to its value.

    ``engine``: the engine every plan must run on (name or profile; None: the default engine).

    >>> SearchOptions(fixed={"tp": 8}, engine="torchtitan").engine
    'torchtitan'
    """

    fixed: dict = field(default_factory=dict, hash=False)
    allow_tp_across_nodes: bool = False
    max_micro_batch: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    max_vpp: int = 16  # NeMo tunes up to 12-20 virtual stages (recommended_model_configs)
    max_cp: int = 64
    engine: "str | Engine | None" = None
    uneven_split: bool = True
    schedules: tuple[str, ...] | None = None  # the pipeline schedules to try (None: every one the engine runs)
    memory_margin: float | None = None  # fraction of GPU memory kept free; None: Constants.MEMORY_MARGIN_FRACTION


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pick(fixed: dict, name: str, options):
    if name in fixed and fixed[name] is not None:
        return [fixed[name]]
    return list(options)


def _natural_vpp(layers: int, pp: int, v: int, eng: Engine) -> bool:
    """The virtual-stage counts the search tries: those whose chunks hold equal numbers of
    layers (v divides the layers), counting the embedding and the loss as layers where the
    engine does (Megatron's account-for-embedding/loss split: (L + 2) / (pp v) slots a chunk).
    Other counts give chunks differing by a layer, which engines with a pipeline layout run
    (a fixed vpp is accepted), but they only trade the bubble against send/recv like their
    neighbours do."""
    return (layers % v == 0 and layers // v >= pp) or (eng.embedding_in_split and (layers + 2) % (pp * v) == 0)


def to_parallel(t: tuple, fixed: dict | None = None) -> ParallelConfig:
    """The ParallelConfig of a candidate tuple, with the fixed engine-decided fields; the rest
    stay None for :func:`planner.engines.resolve`."""
    kw = dict(zip(TUPLE_FIELDS, t))
    for k in ("sequence_parallel", "attention", "tp_comm_overlap", "async_tp_allreduce", "overlap_grad_reduce",
              "overlap_param_gather", "layers_per_stage", "zero_shard_degree", "etp", "moe_a2a_overlap", "moe_dispatcher", "cuda_graph"):
        if fixed and fixed.get(k) is not None:
            kw[k] = tuple(fixed[k]) if k == "layers_per_stage" else fixed[k]
    return ParallelConfig(**kw)


def schedules_for(eng: Engine, pp: int, v: int, fixed: str | None = None, allowed: tuple[str, ...] | None = None) -> list[str]:
    """The pipeline schedules a candidate with ``pp`` stages of ``v`` chunks may run on ``eng``
    (the fixed one if given and runnable; only those in ``allowed`` if given)."""
    if allowed is not None and fixed is None:
        return [s for s in schedules_for(eng, pp, v) if s in allowed or pp == 1]
    if pp == 1:
        return [fixed or eng.default_schedule]
    if v == 1:
        opts = [s for s in eng.schedules if s in _FLAT] or [eng.default_schedule]
        ok = ("gpipe", *_FLAT)
    else:
        opts = [s for s in eng.schedules if s == "interleaved" or (v == 2 and s in _V_SHAPED)]
        ok = ("interleaved", *_V_SHAPED) if v == 2 else ("interleaved",)
    if fixed is not None:
        return [fixed] if fixed in ok and fixed in eng.schedules else []
    return opts


def candidates(model: ModelSpec, cluster: ClusterSpec, job: Job, opts: SearchOptions):
    """Yield every resolved ParallelConfig (engine's default split) that satisfies the rules."""
    eng = get_engine(opts.engine)
    for t in candidate_tuples(model, cluster, job, opts):
        yield resolve(to_parallel(t, opts.fixed), model, cluster, job, eng)[0]


def candidate_tuples(model: ModelSpec, cluster: ClusterSpec, job: Job, opts: SearchOptions):
    """Yield (tp, pp, dp, cp, ep, vpp, micro_batch_size, recompute, zero, schedule) for every candidate."""
    n = cluster.num_gpus
    fx = opts.fixed
    eng = get_engine(opts.engine)
    if job.precision not in eng.precisions:
        return  # the engine does not train in this precision (planner.engines.precision_rule)
    dom = cluster.nvlink_domain
    tps = [t for t in divisors(n) if tp_ok(model, t) and (t == 1 or eng.tensor_parallel)]
    if not opts.allow_tp_across_nodes:
        tps = [t for t in tps if t <= dom]
    tps = _pick(fx, "tp", tps)
    max_cp = opts.max_cp if eng.context_parallel else 1
    if cp_attention_why(eng, attention_kernel(eng, cluster.gpu, fx.get("attention"))) is not None:
        max_cp = 1  # e.g. Megatron-core without flash attention (V100): no context parallelism
    cps = _pick(fx, "cp", [c for c in divisors(n) if c <= max_cp and (c == 1 or job.seq_len % (2 * c) == 0)])
    pps = _pick(fx, "pp", [p for p in divisors(n) if p <= model.layers])
    # FP8 weight gathers need a sharded optimizer or FSDP (Megatron arguments.py: --fp8-param-gather)
    zeros_all = [z for z in opts.zero_stages if z in eng.zero_stages and not (z == 0 and job.fp8_param_gather)]
    recs = _pick(fx, "recompute", [r for r in opts.recompute if r in eng.recompute])
    interleave = bool(schedules_for(eng, 2, 2, fx.get("schedule"), opts.schedules))  # some schedule runs v > 1 chunks
    a2a_fixed = fx.get("moe_a2a_overlap") is True
    disp_fixed = fx.get("moe_dispatcher") if fx.get("moe_dispatcher") in ("deepep", "hybridep") else None  # the flex kernels
    graph_fixed = fx.get("cuda_graph")
    recs = [r for r in recs if cuda_graph_why(eng, model, graph_fixed, r) is None]  # a fixed graph: the recompute it captures
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
        if model.moe is not None and eng.expert_parallel:
            # ep | dp x cp (expert tensor parallelism = tp), or ep | tp x dp x cp with etp = 1
            eps = [e for e in divisors(model.moe.experts) if (tp * dp * cp) % e == 0]
        eps = _pick(fx, "ep", eps)
        # a fixed stage too: the engine may not run it with a pipeline (DeepSpeed ZeRO-2/3)
        zeros = [z for z in _pick(fx, "zero", zeros_all) if z in eng.zero_stages and (pp == 1 or eng.mode(z).with_pp)]
        # a fixed data-parallel overlap: only the stages whose sharding mode runs it
        zeros = [z for z in zeros if not any(fx.get(f) is True and dp_overlap_why(eng, f, z, pp) is not None
                                             for f in ("overlap_grad_reduce", "overlap_param_gather"))]
        if pp == 1:
            vpps = [1]
        else:
            top = max(opts.max_vpp, fx.get("vpp") or 0)  # a fixed vpp may exceed the searched range
            lps_fixed = tuple(fx["layers_per_stage"]) if fx.get("layers_per_stage") else None
            vpps = [1] + [v for v in range(2, top + 1) if interleave and _natural_vpp(model.layers, pp, v, eng) and
                          interleaving_ok(lps_fixed or default_split(model, pp, v, eng), v, eng)]
        if fx.get("vpp") is not None:
            # A fixed vpp is taken wherever the engine runs it (uneven chunks included).
            v = fx["vpp"]
            lps = tuple(fx["layers_per_stage"]) if fx.get("layers_per_stage") else default_split(model, pp, v, eng)
            vpps = [v] if v == 1 or (pp > 1 and interleave and interleaving_ok(lps, v, eng)) else []
        for mb, ep, z, rec, v in itertools.product(mbs, eps, zeros, recs, vpps):
            for sched in schedules_for(eng, pp, v, fx.get("schedule"), opts.schedules):
                if sched == "interleaved" and (per_rank // mb) % pp:
                    continue  # interleaving needs the micro-batch count divisible by pp
                if a2a_fixed and a2a_overlap_why(eng, model, ep, rec, pp, v, sched) is not None:
                    continue  # a fixed expert all-to-all overlap: only where the engine runs it
                if disp_fixed and flex_dispatcher_why(eng, model, disp_fixed, ep, fx.get("etp") or default_etp(tp, dp, cp, ep)):
                    continue  # a fixed dispatcher: only where the engine runs it (DeepEP: expert tp x ep > 1)
                yield (tp, pp, dp, cp, ep, v, mb, rec, z, sched)
