"""estimate(model, cluster, job, parallel) -> Estimate: the one function that prices a configuration.

1. The engine (:mod:`planner.engines`, default ``megatron-core``) resolves every field left
   ``None`` (:func:`planner.engines.resolve`: vpp, sequence parallelism, ZeRO stage, overlaps,
   attention kernel, schedule) and the default layer split; :attr:`Estimate.resolved` names them.
2. The engine's rules and the divisibility rules are checked (:func:`planner.cost.rules.check_parallel`).
3. Per-layer costs, per-stage times, memory and once-per-step work (:mod:`planner.cost.stages`)
   are assembled into the step time by :func:`planner.cost.step.assemble` (docs/cost_model.md
   has every term with its source and known error).

``planner estimate`` (CLI), ``planner plan``, ``planner validate``, ``planner hetero``,
``planner sweep`` and calibration all price through this function.
"""

from __future__ import annotations

from planner.cost import memory as M
from planner.cost.comm import group_links
from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.flops import layer_flops, step_model_flops
from planner.cost.recompute import op_sac_recomputed_gemm_share
from planner.cost.result import Estimate
from planner.cost.rules import check_parallel
from planner.cost.stages import dense_counts, embedding_sync_time, engine_layer_costs, stage_fw, stage_memory, stage_sync, stage_time_parts
from planner.cost.step import assemble
from planner.engines import Engine, default_split, fp8_gathers, fp8_recipe, get_engine, resolve, resolve_job, tp_overlap_why
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, positions_note

__all__ = ["Estimate", "estimate", "price"]


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    par: ParallelConfig,
    engine: "str | Engine | None" = None,
    constants: Constants | None = None,
    validate: bool = True,
) -> Estimate:
    """Predict one configuration: step time, its breakdown, tokens/s, MFU, memory per stage.

    Fields of ``par`` left ``None`` take the engine's default (``Estimate.resolved`` lists them;
    ``Estimate.parallel`` is the configuration priced). ``constants``: a calibration profile
    (:class:`planner.cost.constants.Constants`), default the published values. Raises
    :class:`planner.errors.InputError` when the engine does not run the configuration.

    >>> import planner
    >>> model = planner.load_model("llama3.1-70b")
    >>> cluster = planner.make_cluster("h100-sxm5-80gb", 64)
    >>> est = planner.estimate(model, cluster, planner.Job(8192, 256), planner.ParallelConfig(tp=8, pp=4, dp=2))
    >>> est.parallel.sequence_parallel, est.engine
    (True, 'megatron-core')
    >>> 0 < est.mfu < 1 and est.fits
    True
    """
    eng = get_engine(engine)
    C = constants or DEFAULT_CONSTANTS
    job = resolve_job(job, eng)  # the FP8 recipe the engine runs (checked)
    par, filled = resolve(par, model, cluster, job, eng)
    if par.layers_per_stage is None:
        lps = default_split(model, par.pp, par.vpp, eng)
    else:
        lps = par.layers_per_stage
    if validate:
        check_parallel(model, cluster, job, par, eng, lps)
    return price(model, cluster, job, par, tuple(lps), eng, C, filled)


def price(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, lps: tuple[int, ...], eng: Engine,
          C: Constants, filled: tuple[str, ...] = (), memory: bool = True) -> Estimate:
    """The prediction of a resolved, checked configuration with the layer split ``lps`` (what
    :func:`estimate` and the search call; use :func:`estimate`). ``memory=False``: the time
    terms only (no stage memory, peak 0), for the search's check that a candidate cannot enter
    the top K whatever its memory."""
    gpu = cluster.gpu
    prec = job.precision
    s, tp, pp, v = job.seq_len, par.tp, par.pp, par.vpp
    m = par.num_microbatches(job.global_batch_size)
    links = group_links(cluster, par)
    notes: list[str] = []

    costs = engine_layer_costs(model, cluster, job, par, C, eng)
    raw = costs[4]
    t_tp, t_cp_f, t_a2a, t_p2p = raw["t_tp"], raw["t_cp"], raw["t_a2a"], raw["t_p2p"]
    dcounts = dense_counts(model, lps)
    stage_parts = [stage_time_parts(costs, n, dcounts[i], i == pp - 1, i == 0) for i, n in enumerate(lps)]
    stage_t = [sum(p.values()) for p in stage_parts]

    # --- once-per-step work (stages with the same layer counts and role share it) -----------------
    grad_b = M.grad_bytes(prec, job.grad_reduce)
    keys = [(n, dcounts[i], i == 0, i == pp - 1) for i, n in enumerate(lps)]
    memo: dict = {}
    stage_params, syncs = [], []
    for i, key in enumerate(keys):
        mk = (key, stage_t[i])
        if mk not in memo:
            sp_i = M.stage_params(model, lps[i], i, pp, tp, par.ep, n_dense=dcounts[i], etp=par.etp)
            memo[mk] = (sp_i, stage_sync(cluster, job, par, sp_i, lps[i], stage_t[i], m, raw["bwd_dense_s"], raw["fwd_dense_s"], C, eng))
        stage_params.append(memo[mk][0])
        syncs.append(memo[mk][1])
    emb_sync = embedding_sync_time(model, par, grad_b, links["pp"])
    fws = [stage_fw(costs, n, dcounts[i], i == pp - 1) for i, n in enumerate(lps)]
    parts = assemble(stage_t, [x["exposed_s"] for x in syncs], [x["optimizer_s"] for x in syncs], m=m, v=v,
                     schedule=par.schedule, extra_s=emb_sync + C.STEP_OVERHEAD_S,
                     stage_w=[w for _, w in fws], stage_f=[f for f, _ in fws])
    step = parts.step_s
    crit = stage_parts[parts.critical_stage]

    # --- FLOPs and utilisation ----------------------------------------------------------------
    gbs = job.global_batch_size
    model_flops = step_model_flops(model, gbs, s)
    fwd_matmul = fwd_core = op_matmul = 0.0
    for moe_l, count in ((False, model.dense_layers), (True, model.moe_layers)):
        if count:
            lf = layer_flops(model, gbs, s, moe_l)
            fwd_matmul += count * lf.matmul
            fwd_core += count * lf.attn_core
            op_matmul += count * lf.matmul * op_sac_recomputed_gemm_share(model, moe_l, par.ep, C)
    # HFU adds the recomputed forward to the model FLOPs, in the same (full-square) attention
    # convention as MFU, so HFU >= MFU always (Korthikanti et al. 2022 sec. 6 define HFU this way).
    # Selective: Megatron's re-runs the attention core, torchtitan's per-op policy a share of the
    # mms (cost.recompute).
    selective = op_matmul if eng.memory.selective == "op" else fwd_core
    rec_flops = {"full": fwd_matmul + fwd_core, "selective": selective}.get(par.recompute, 0.0)
    executed = model_flops + rec_flops
    n = cluster.num_gpus
    peak16 = gpu.peak("bf16")
    mfu = model_flops / (step * n * peak16)
    hfu = executed / (step * n * peak16)
    causal_flops = step_model_flops(model, gbs, s, causal=True)
    if par.cuda_graph == "full_iteration" and model.moe is not None and model.moe_layers and model.moe.capacity_factor is None:
        notes.append("full-iteration CUDA graph of dropless MoE layers: Megatron-Bridge captures it with capacity padding and "
                     "paged stashing, which this prediction does not price and the planner's Megatron launch files do not write")
    if (note := positions_note(model, s)) is not None:
        notes.append(note)
    if par.tp > cluster.nvlink_domain:
        notes.append(f"tensor parallelism {par.tp} spans {-(-par.tp // cluster.nvlink_domain)} NVLink domains of {cluster.nvlink_domain} GPUs: "
                     f"its collectives cross the {cluster.inter.kind} network (plan keeps tp within a domain unless --allow-tp-across-nodes)"
                     + (f"; no TP communication overlap: {why}" if eng.tp_comm_overlap and par.sequence_parallel
                        and (why := tp_overlap_why(eng, par.tp, True, cluster.nvlink_domain)) else ""))
    notes.append(f"MFU {100 * mfu:.1f}% counts attention over the full s x s square; with causal attention counted causally (what flash attention executes) MFU is {100 * causal_flops / (step * n * peak16):.1f}% ({causal_flops / step / n / 1e12:.0f} TFLOP/s per GPU)")
    if prec == "fp8":
        notes.append(f"fp8: MFU is over the dense BF16 peak; over the FP8 peak it is {100 * model_flops / (step * n * gpu.peak('fp8')):.1f}% (attention, router, output layer stay BF16)")

    # --- memory ---------------------------------------------------------------------------------
    stages = [stage_memory(model, job, par, i, n_i, stage_params[i], m, C, eng) for i, n_i in enumerate(lps)] if memory else []
    peak_mem = max(st.total_bytes for st in stages) if memory else 0.0
    cap = gpu.memory_bytes

    breakdown = {
        "compute_s": m * crit["compute"],
        "recompute_s": m * crit["recompute"],
        "tp_comm_exposed_s": m * crit["tp_comm"],
        "cp_comm_exposed_s": m * crit["cp_comm"],
        "ep_comm_exposed_s": m * crit["ep_comm"],
        "pp_comm_exposed_s": m * crit["pp_comm"],
        "host_exposed_s": m * crit["host"],
        "bubble_s": parts.bubble_s,
        "dp_comm_exposed_s": parts.sync_s,
        "optimizer_s": parts.optimizer_s,
        "embedding_sync_s": emb_sync,
        "overhead_s": C.STEP_OVERHEAD_S,
    }
    comm = [
        {"kind": "tp", "link": links["tp"].link, "time_s": m * max(n * raw["tp_layer_s"] + (raw["last_tp_link_s"] if i == pp - 1 else 0.0)
                                                                   + (raw["first_extra"]["tp_comm"] if i == 0 else 0.0)
                                                                   for i, n in enumerate(lps)), "exposed_s": breakdown["tp_comm_exposed_s"]},
        {"kind": "pp", "link": links["pp"].link, "time_s": m * 2 * v * t_p2p, "exposed_s": breakdown["pp_comm_exposed_s"]},
        {"kind": "dp", "link": links["dp_cp"].link, "time_s": max(x["total_s"] for x in syncs), "exposed_s": breakdown["dp_comm_exposed_s"]},
        {"kind": "cp", "link": links["cp"].link, "time_s": m * max(lps) * 3 * t_cp_f, "exposed_s": breakdown["cp_comm_exposed_s"]},
        {"kind": "ep", "link": links["ep"].link, "time_s": m * min(max(lps), model.moe_layers) * (6 if par.recompute == "full" else 4) * t_a2a, "exposed_s": breakdown["ep_comm_exposed_s"]},
    ]
    bound_terms = {
        "compute": breakdown["compute_s"] + breakdown["recompute_s"],
        f"tp comm ({links['tp'].link})": breakdown["tp_comm_exposed_s"],
        "pipeline bubble": parts.bubble_s,
        f"dp comm ({links['dp_cp'].link})": breakdown["dp_comm_exposed_s"],
        f"pp comm ({links['pp'].link})": breakdown["pp_comm_exposed_s"],
        f"cp comm ({links['cp'].link})": breakdown["cp_comm_exposed_s"],
        f"ep comm ({links['ep'].link})": breakdown["ep_comm_exposed_s"],
        "host (kernel launches)": breakdown["host_exposed_s"],
    }
    bound = max(bound_terms, key=bound_terms.get)
    usable = cap * (1.0 - C.MEMORY_MARGIN_FRACTION)
    if peak_mem > usable:
        bound = "memory (does not fit)"
    elif peak_mem > cap - 2 * (cap - usable):
        notes.append(f"memory headroom {100 * (1 - peak_mem / cap):.1f}% of capacity: within twice the {100 * C.MEMORY_MARGIN_FRACTION:.0f}% margin")
    if model.mtp_layers:
        notes.append(f"the last stage also runs {model.mtp_layers} multi-token prediction module(s) per micro-batch: one layer "
                     "of the decoder's last kind, eh_proj and a second output-head pass (Megatron-core --mtp-num-layers)")
    return Estimate(
        step_time_s=step,
        tokens_per_s=gbs * s / step,
        tflops_per_gpu=model_flops / step / n / 1e12,
        mfu=mfu,
        hfu=hfu,
        model_flops=model_flops,
        executed_flops=executed,
        time_breakdown_s=breakdown,
        comm=comm,
        stage_times_s=stage_t,
        stages=stages,
        memory_peak_bytes=peak_mem,
        memory_capacity_bytes=cap,
        memory_margin=C.MEMORY_MARGIN_FRACTION,
        num_microbatches=m,
        layers_per_stage=tuple(lps),
        bound=bound,
        notes=notes,
        parallel=par.replace(layers_per_stage=tuple(lps)),
        engine=eng.name,
        resolved=filled,
        fp8_recipe=fp8_recipe(eng, job),
        fp8_param_gather=fp8_gathers(eng, job, par.zero),
        fp8_tp_gather=bool(job.fp8_tp_gather and par.tp > 1),
        cross_entropy=eng.loss_name(job.cross_entropy),
    )
