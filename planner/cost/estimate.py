"""estimate(model, cluster, job, parallel) -> Estimate: the whole step, assembled.

Step time (docs/cost_model.md has every term with its source and known error):

    T_step = T_pipeline + exposed DP/ZeRO communication + optimizer + embedding sync + overhead
    T_pipeline = m * t_max + (sum_i t_i - t_max) / v      (1F1B: v = 1)

where t_i is stage i's time for one micro-batch (forward, backward, recomputation, exposed
tensor/context/expert-parallel communication, pipeline send/recv). With equal stages this is
(m + (p - 1)/v) t: the bubble fraction (p - 1)/(v m) of Narayanan et al. 2021 eq. 1 and
sec. 2.2.2.
"""

from __future__ import annotations

from planner.cost import constants as C
from planner.cost import memory as M
from planner.cost.comm import GroupLinks, group_links
from planner.cost.compute import supports_flash
from planner.cost.flops import layer_flops, step_model_flops
from planner.cost.result import Estimate
from planner.cost.rules import check_parallel, check_precision, default_flash, even_split
from planner.cost.stages import _layer_costs, dense_counts, layer_costs, stage_memory, stage_sync, stage_time_parts  # noqa: F401
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["Estimate", "estimate", "check_parallel", "even_split", "default_flash", "layer_costs", "stage_time_parts",
           "stage_memory", "stage_sync", "dense_counts", "check_precision"]


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    par: ParallelConfig,
    flash_attention: bool | None = None,
    validate: bool = True,
) -> Estimate:
    """Predict one configuration. ``flash_attention=None`` resolves with :func:`default_flash`."""
    if flash_attention is None:
        flash_attention = default_flash(job)
    if validate:
        check_parallel(model, cluster, job, par)
    gpu = cluster.gpu
    prec = job.precision
    s, tp, pp, v = job.seq_len, par.tp, par.pp, par.vpp
    flash = flash_attention and supports_flash(gpu)
    m = par.num_microbatches(job.global_batch_size)
    lps = par.layers_per_stage or even_split(model.layers, pp, par.vpp)
    links = group_links(cluster, par)
    notes: list[str] = []
    if par.schedule == "zb":
        notes.append("zero-bubble schedule priced as 1F1B: its bubble is an upper bound (Qi et al. 2023 remove most of it)")

    costs = layer_costs(model, cluster, job, par, flash)
    raw = costs[4]
    t_tp, t_cp_f, t_a2a, t_p2p = raw["t_tp"], raw["t_cp"], raw["t_a2a"], raw["t_p2p"]
    dense_layers = model.layers - model.moe_layers
    dcounts = dense_counts(model, tuple(lps))
    stage_parts = [stage_time_parts(costs, n, dcounts[i], i == pp - 1) for i, n in enumerate(lps)]
    stage_t = [sum(p.values()) for p in stage_parts]
    t_max = max(stage_t)
    crit = stage_parts[stage_t.index(t_max)]
    t_pipe = m * t_max + (sum(stage_t) - t_max) / v
    bubble = t_pipe - m * t_max

    # --- data parallel, optimizer -------------------------------------------------------------
    grad_b = M.grad_bytes(prec, job.grad_reduce)
    # Stages with the same layer counts and role share every per-stage quantity below.
    keys = [(n, dcounts[i], i == 0, i == pp - 1) for i, n in enumerate(lps)]
    memo: dict = {}
    stage_params = []
    for i, key in enumerate(keys):
        if key not in memo:
            memo[key] = M.stage_params(model, lps[i], i, pp, tp, par.ep, n_dense=dcounts[i])
        stage_params.append(memo[key])
    dp_exposed = 0.0
    opt_t = 0.0
    zero3_exposed = 0.0
    dp_t_max = 0.0
    seen: set = set()
    for i, sp_i in enumerate(stage_params):
        if (keys[i], stage_t[i]) in seen:
            continue
        seen.add((keys[i], stage_t[i]))
        sync = stage_sync(cluster, job, par, sp_i, lps[i], stage_t[i], m, raw["bwd_dense_s"], raw["fwd_dense_s"])
        dp_exposed = max(dp_exposed, sync["dp_exposed_s"])
        zero3_exposed = max(zero3_exposed, sync["zero3_exposed_s"])
        dp_t_max = max(dp_t_max, sync["dp_s"])
        opt_t = max(opt_t, sync["optimizer_s"])
    emb_sync = 0.0
    if pp > 1 and model.tied_embeddings:
        # All-reduce of the tied embedding's gradient between the first and the last stage
        # (Megatron's embedding group: two ranks, on the level the pipeline group crosses).
        emb_bytes = model.vocab * model.hidden / tp * grad_b
        g = links["pp"]
        pair = GroupLinks(2, 1, 2, g.intra, g.inter) if g.m > 1 else GroupLinks(2, 2, 1, g.intra, g.inter)
        emb_sync = pair.time("allreduce", emb_bytes)
    step = t_pipe + dp_exposed + zero3_exposed + opt_t + emb_sync + C.STEP_OVERHEAD_S

    # --- FLOPs and utilisation ----------------------------------------------------------------
    gbs = job.global_batch_size
    model_flops = step_model_flops(model, gbs, s)
    fwd_matmul = 0.0
    fwd_core = 0.0
    for moe_l, count in ((False, dense_layers), (True, model.moe_layers)):
        if count:
            lf = layer_flops(model, gbs, s, moe_l)
            fwd_matmul += count * lf.matmul
            fwd_core += count * lf.attn_core
    # HFU adds the recomputed forward to the model FLOPs, in the same (full-square) attention
    # convention as MFU, so HFU >= MFU always (Korthikanti et al. 2022 sec. 6 define HFU this way).
    rec_flops = {"full": fwd_matmul + fwd_core, "selective": fwd_core}.get(par.recompute, 0.0)
    executed = model_flops + rec_flops
    n = cluster.num_gpus
    peak16 = gpu.peak("bf16")
    mfu = model_flops / (step * n * peak16)
    hfu = executed / (step * n * peak16)
    causal_flops = step_model_flops(model, gbs, s, causal=True)
    notes.append(f"MFU {100 * mfu:.1f}% counts attention over the full s x s square; with causal attention counted causally (what flash attention executes) MFU is {100 * causal_flops / (step * n * peak16):.1f}% ({causal_flops / step / n / 1e12:.0f} TFLOP/s per GPU)")
    if prec == "fp8":
        notes.append(f"fp8: MFU is over the dense BF16 peak; over the FP8 peak it is {100 * model_flops / (step * n * gpu.peak('fp8')):.1f}% (attention, router, output layer stay BF16)")

    # --- memory ---------------------------------------------------------------------------------
    stages = [stage_memory(model, job, par, flash, i, n_i, stage_params[i], m) for i, n_i in enumerate(lps)]
    peak_mem = max(st.total_bytes for st in stages)
    cap = gpu.memory_bytes

    tokens = gbs * s
    breakdown = {
        "compute_s": m * (crit["compute"]),
        "recompute_s": m * crit["recompute"],
        "tp_comm_exposed_s": m * crit["tp_comm"],
        "cp_comm_exposed_s": m * crit["cp_comm"],
        "ep_comm_exposed_s": m * crit["ep_comm"],
        "pp_comm_exposed_s": m * crit["pp_comm"],
        "bubble_s": bubble,
        "dp_comm_exposed_s": dp_exposed + zero3_exposed,
        "optimizer_s": opt_t,
        "embedding_sync_s": emb_sync,
        "overhead_s": C.STEP_OVERHEAD_S,
    }
    comm = [
        {"kind": "tp", "link": links["tp"].link, "time_s": m * max(lps) * (6 if par.recompute == "full" else 4) * t_tp, "exposed_s": breakdown["tp_comm_exposed_s"]},
        {"kind": "pp", "link": links["pp"].link, "time_s": m * 2 * v * t_p2p, "exposed_s": breakdown["pp_comm_exposed_s"]},
        {"kind": "dp", "link": links["dp_cp"].link, "time_s": dp_t_max, "exposed_s": breakdown["dp_comm_exposed_s"]},
        {"kind": "cp", "link": links["cp"].link, "time_s": m * max(lps) * 3 * t_cp_f, "exposed_s": breakdown["cp_comm_exposed_s"]},
        {"kind": "ep", "link": links["ep"].link, "time_s": m * model.moe_layers * 4 * t_a2a, "exposed_s": breakdown["ep_comm_exposed_s"]},
    ]
    bound_terms = {
        "compute": breakdown["compute_s"] + breakdown["recompute_s"],
        f"tp comm ({links['tp'].link})": breakdown["tp_comm_exposed_s"],
        "pipeline bubble": bubble,
        f"dp comm ({links['dp_cp'].link})": breakdown["dp_comm_exposed_s"],
        f"pp comm ({links['pp'].link})": breakdown["pp_comm_exposed_s"],
        f"cp comm ({links['cp'].link})": breakdown["cp_comm_exposed_s"],
        f"ep comm ({links['ep'].link})": breakdown["ep_comm_exposed_s"],
    }
    bound = max(bound_terms, key=bound_terms.get)
    if peak_mem > cap:
        bound = "memory (does not fit)"
    elif peak_mem > 0.95 * cap:
        notes.append(f"memory headroom {100 * (1 - peak_mem / cap):.1f}%: little room for fragmentation beyond the modelled reserve")
    return Estimate(
        step_time_s=step,
        tokens_per_s=tokens / step,
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
        num_microbatches=m,
        layers_per_stage=tuple(lps),
        bound=bound,
        notes=notes,
    )
