"""Why a search has no candidate: the first rule a fixed field breaks, named before the search
(:func:`check_fixed`), or the first rule that empties the candidate space (:func:`explain_no_candidates`),
in the order :mod:`planner.search.space` applies them. Each ends in one
:class:`planner.errors.InputError` (field, value, expected)."""

from __future__ import annotations

import math

from planner.cost.rules import tp_ok, tp_rule
from planner.engines import attention_kernel, cp_attention_why, precision_rule, cuda_graph_why, default_split, flash_kernel_why, flex_dispatcher_why, get_engine, interleaving_ok, mtp_rule
from planner.errors import InputError
from planner.search.space import divisors
from planner.specs import ParallelConfig

__all__ = ["check_fixed", "explain_no_candidates"]


def check_fixed(model, cluster, job, opts) -> None:
    """Raise InputError when a fixed field of ``opts`` (SearchOptions) breaks an engine rule on
    its own, whatever the free fields: called before the search, names the specific rule."""
    fixed = {k: v for k, v in (opts.fixed or {}).items() if v is not None}
    eng = get_engine(opts.engine)
    allow_tp_across_nodes = opts.allow_tp_across_nodes
    unknown = sorted(set(fixed) - set(ParallelConfig.__dataclass_fields__))
    if unknown:
        raise InputError(f"parallel.{unknown[0]}", fixed[unknown[0]], "a field of ParallelConfig")
    # ParallelConfig checks every value's type and range (one-line InputError naming the field).
    ParallelConfig(**{k: v for k, v in fixed.items() if k != "layers_per_stage"})
    precision_rule(job, eng)
    if fixed.get("moe_a2a_overlap") is True and not eng.moe_a2a_overlap:
        raise InputError("parallel.moe_a2a_overlap", True, f"false on {eng.name} (it has no expert all-to-all overlap)")
    if fixed.get("moe_a2a_overlap") is True and (model.moe is None or model.moe_layers == 0):
        raise InputError("parallel.moe_a2a_overlap", True, "false for a model without MoE layers")
    if fixed.get("moe_a2a_overlap") is True and model.mtp_layers > 1:
        raise InputError("parallel.moe_a2a_overlap", True, "false with more than one multi-token prediction layer (transformer_config.py)")
    if (why := flex_dispatcher_why(eng, model, fixed.get("moe_dispatcher"))) is not None:
        raise InputError("parallel.moe_dispatcher", fixed["moe_dispatcher"], f"alltoall {why}")
    if (why := cuda_graph_why(eng, model, fixed.get("cuda_graph"), fixed.get("recompute"))) is not None:
        raise InputError("parallel.cuda_graph", fixed["cuda_graph"], f"none {why}")
    mtp_rule(eng, model)
    att = fixed.get("attention")
    if att is not None and eng.attention_kernels and att not in eng.attention_kernels:  # as planner.estimate refuses it
        raise InputError("parallel.attention", att, f"{' or '.join(eng.attention_kernels)} on {eng.name}")
    if (why := flash_kernel_why(att, cluster.gpu)) is not None:  # as planner.estimate refuses it
        raise InputError("parallel.attention", att, why)
    if job.fp8_param_gather and fixed.get("zero") == 0:
        raise InputError("parallel.zero", 0, "1 or more with job.fp8_param_gather (FP8 weights are gathered by a sharded optimizer or FSDP)")
    n = cluster.num_gpus
    tp, pp, dp, cp, ep = (fixed.get(k) for k in ("tp", "pp", "dp", "cp", "ep"))
    vpp, mb, sp, zero = (fixed.get(k) for k in ("vpp", "micro_batch_size", "sequence_parallel", "zero"))
    for name, deg in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
        if deg is not None and n % deg:
            raise InputError(f"parallel.{name}", deg, f"a divisor of the GPU count ({n})")
    if tp is not None:
        tp_rule(model, tp)
        if tp > 1 and not eng.tensor_parallel:
            raise InputError("parallel.tp", tp, f"1 on {eng.name} (no tensor parallelism)")
        if not allow_tp_across_nodes and tp > cluster.nvlink_domain:
            raise InputError("parallel.tp", tp, f"at most the NVLink domain ({cluster.nvlink_domain} GPUs), or --allow-tp-across-nodes")
        if tp == 1 and sp:
            raise InputError("parallel.sequence_parallel", sp, "false when tp = 1")
    if cp is not None and cp > 1 and job.seq_len % (2 * cp):
        raise InputError("parallel.cp", cp, f"2*cp dividing the sequence length ({job.seq_len})")
    if pp is not None and pp > model.layers:
        raise InputError("parallel.pp", pp, f"at most the layer count ({model.layers})")
    if dp is not None and job.global_batch_size % dp:
        raise InputError("parallel.dp", dp, f"a divisor of the global batch ({job.global_batch_size})")
    if mb is not None:
        if job.global_batch_size % mb:
            raise InputError("parallel.micro_batch_size", mb, f"a divisor of the global batch ({job.global_batch_size})")
        if dp is not None and job.global_batch_size % (mb * dp):
            raise InputError("parallel.micro_batch_size", mb, f"micro_batch_size * dp ({mb}*{dp}) dividing the global batch {job.global_batch_size}")
    if ep is not None and ep > 1:
        if model.moe is None:
            raise InputError("parallel.ep", ep, "1 for a dense model")
        if model.moe.experts % ep:
            raise InputError("parallel.ep", ep, f"a divisor of the experts ({model.moe.experts})")
    if vpp is not None and vpp > 1:
        if pp == 1:
            raise InputError("parallel.vpp", vpp, "1 without pipeline parallelism (pp = 1)")
        if "interleaved" not in eng.schedules:
            raise InputError("parallel.vpp", vpp, f"1 on {eng.name} (no interleaved schedule)")
        if pp is not None:
            # The search's rule (planner.search.space): every stage holds vpp chunks of whole
            # layers (equal chunks unless the engine takes an uneven layout).
            lps = tuple(fixed["layers_per_stage"]) if fixed.get("layers_per_stage") else default_split(model, pp, vpp, eng)
            if not interleaving_ok(lps, vpp, eng):
                raise InputError("parallel.vpp", vpp, f"a divisor of every stage's layer count {list(lps)} on {eng.name}"
                                 if not eng.uneven_interleaving else f"at most the fewest layers on a stage ({min(lps)} of {list(lps)})")
    if zero is not None:
        if zero not in eng.zero_stages:
            raise InputError("parallel.zero", zero, f"a ZeRO stage {eng.name} implements ({', '.join(map(str, eng.zero_stages))})")
        if pp is not None and pp > 1 and not eng.mode(zero).with_pp:
            raise InputError("parallel.zero", zero, f"at most {eng.max_zero_with_pp} with pipeline parallelism on {eng.name} "
                             f"({eng.mode(zero).name} does not run with a pipeline)")
    if cp is not None and cp > 1 and not eng.context_parallel:
        raise InputError("parallel.cp", cp, f"1 on {eng.name} (no context parallelism)")
    if cp is not None and cp > 1 and (why := cp_attention_why(
            eng, attention_kernel(eng, cluster.gpu, fixed.get("attention")), cluster.gpu)) is not None:
        raise InputError("parallel.cp", cp, f"1 on {eng.name} {why}")
    if fixed.get("recompute") is not None and fixed["recompute"] not in eng.recompute:
        raise InputError("parallel.recompute", fixed["recompute"], f"one of {', '.join(eng.recompute)} on {eng.name}")
    fixed_deg = [(k, fixed[k]) for k in ("tp", "pp", "dp", "cp") if fixed.get(k) is not None]
    prod = math.prod(v for _, v in fixed_deg)
    if fixed_deg and (n % prod or (len(fixed_deg) == 4 and prod != n)):
        expr = "*".join(k for k, _ in fixed_deg) + " = " + "*".join(str(v) for _, v in fixed_deg) + f" = {prod}"
        raise InputError("parallel", expr, f"{'equal to' if len(fixed_deg) == 4 else 'a divisor of'} the GPU count ({n})")


def explain_no_candidates(model, cluster, job, opts) -> InputError:
    """The InputError naming the first rule that leaves no parallel configuration."""
    fixed = {k: v for k, v in (opts.fixed or {}).items() if v is not None}
    try:
        check_fixed(model, cluster, job, opts)
    except InputError as exc:
        return exc
    n = cluster.num_gpus
    # Every (tp, cp, pp) the rules allow on their own, then dp = n / (tp cp pp) dividing the batch.
    eng = get_engine(opts.engine)
    tps = [t for t in divisors(n) if tp_ok(model, t) and (t == 1 or eng.tensor_parallel)]
    if not opts.allow_tp_across_nodes:
        tps = [t for t in tps if t <= cluster.nvlink_domain]
    cps = [c for c in divisors(n) if c <= opts.max_cp and (c == 1 or job.seq_len % (2 * c) == 0)]
    pps = [p for p in divisors(n) if p <= model.layers]
    tps = [fixed["tp"]] if "tp" in fixed else tps
    cps = [fixed["cp"]] if "cp" in fixed else cps
    pps = [fixed["pp"]] if "pp" in fixed else pps
    dps = sorted({n // (t * c * p) for t in tps for c in cps for p in pps if n % (t * c * p) == 0})
    if "dp" in fixed:
        dps = [d for d in dps if d == fixed["dp"]]
    if not dps:
        return InputError("parallel", fixed or "(none fixed)", f"degrees tp*pp*dp*cp multiplying to the GPU count ({n}) with the other fields")
    ok = [d for d in dps if job.global_batch_size % d == 0]
    if not ok:
        return InputError(
            "job.global_batch_size", job.global_batch_size,
            f"a multiple of the data-parallel degree; the smallest dp on {n} GPUs is {dps[0]} "
            f"(tp <= {max(tps)}, pp <= {max(pps)}, cp <= {max(cps)})",
        )
    if "micro_batch_size" in fixed:
        mb = fixed["micro_batch_size"]
        if not any((job.global_batch_size // d) % mb == 0 for d in ok):
            return InputError("parallel.micro_batch_size", mb, f"micro_batch_size * dp dividing the global batch ({job.global_batch_size}) for some dp in {ok[:8]}")
    if model.moe is not None and "ep" in fixed:
        ep = fixed["ep"]
        if not any((d * c) % ep == 0 for d in ok for c in cps):
            return InputError("parallel.ep", ep, "a divisor of dp*cp for some admissible dp and cp")
    if fixed.get("zero") is not None and all(p > 1 for p in pps) and not eng.mode(fixed["zero"]).with_pp:
        return InputError("parallel.zero", fixed["zero"], f"at most {eng.max_zero_with_pp} with pipeline parallelism on {eng.name}")
    if fixed.get("vpp", 1) > 1:
        return InputError("parallel.vpp", fixed["vpp"], "a degree for which pp divides the layers and the micro-batch count (interleaved 1F1B)")
    if fixed.get("sequence_parallel") and all(t == 1 for t in tps):
        return InputError("parallel.sequence_parallel", True, "false when tp = 1")
    return InputError(
        "parallel", fixed or "(none fixed)",
        f"a configuration the engines accept for {n} GPUs (degrees multiplying to the GPU count, "
        "heads divisible by tp, batch divisible by micro-batch x dp)",
    )
