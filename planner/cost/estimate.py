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

from functools import lru_cache

from planner import constants as C
from planner.cost import memory as M
from planner.cost.comm import alltoall_time, cp_ring_exposed, cp_ring_time, dp_collective_time, group_links, moe_dispatch_bytes, p2p_time, tp_allreduce_time
from planner.cost.compute import supports_flash, layer_times, logits_times, moe_load_factor
from planner.cost.flops import kv_exchange_width, layer_flops, step_model_flops
from planner.cost.result import Estimate
from planner.errors import InputError
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["Estimate", "estimate", "check_parallel", "even_split", "default_flash", "layer_costs", "stage_time_parts", "stage_memory", "stage_sync", "dense_counts", "check_precision"]


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
    from planner.engines import default_generation, features  # noqa: PLC0415

    return features(default_generation(job))["flash_attention"]


def _per_rank_links(g):
    """The same group with one rank per domain: each rank drives only its own NIC share."""
    from planner.cost.comm import GroupLinks  # noqa: PLC0415

    return GroupLinks(g.size, 1, g.size, g.intra, g.inter) if g.m > 1 else g


def layer_costs(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, flash: bool) -> tuple:
    """Per layer and micro-batch on one GPU: (dense costs, MoE costs, last-stage extra,
    per-stage pipeline send/recv, raw times), each cost a dict of seconds by kind.

    Cached on the fields that matter (not ZeRO or the layer split), so the search reuses it."""
    key = (par.tp, par.pp, par.dp, par.cp, par.ep, par.vpp, par.micro_batch_size, par.recompute,
           par.sequence_parallel and par.tp > 1, par.tp_comm_overlap, par.async_tp_allreduce)
    return _layer_costs(model, cluster, job, key, flash)


@lru_cache(maxsize=65536)
def _layer_costs(model: ModelSpec, cluster: ClusterSpec, job: Job, key: tuple, flash: bool) -> tuple:
    tp_, pp_, dp_, cp_, ep_, v_, mb_, rec_, sp_, tpo_, asy_ = key
    par = ParallelConfig(tp=tp_, pp=pp_, dp=dp_, cp=cp_, ep=ep_, vpp=v_, micro_batch_size=mb_, recompute=rec_,
                         sequence_parallel=sp_, tp_comm_overlap=tpo_, async_tp_allreduce=asy_)
    gpu = cluster.gpu
    prec = job.precision
    mb, s, tp, cp, v = par.micro_batch_size, job.seq_len, par.tp, par.cp, par.vpp
    links = group_links(cluster, par)
    sp = par.sequence_parallel and tp > 1
    has_moe = model.moe is not None and model.moe_layers > 0
    lt_d = layer_times(model, gpu, prec, mb, s, tp, cp, sp, flash, False, par.ep)
    lt_m = layer_times(model, gpu, prec, mb, s, tp, cp, sp, flash, True, par.ep) if has_moe else lt_d
    act_bytes = mb * s / cp * model.hidden * 2  # one b*s*h activation in 16-bit
    t_tp = tp_allreduce_time(links["tp"], act_bytes, sp)
    tp_fwd = 2 * t_tp
    # The backward all-reduce of the input gradient overlaps the weight-gradient GEMM only with
    # Megatron's asynchronous TP all-reduce (Korthikanti 2022 sec. 5); legacy engines block.
    tp_bwd = 2 * t_tp * (1 - C.TP_BWD_OVERLAP_FRACTION) if par.async_tp_allreduce else 2 * t_tp
    if par.tp_comm_overlap and sp:
        # Transformer Engine's userbuffer overlap (Megatron-core --tp-comm-overlap) splits each
        # sequence-parallel all-gather / reduce-scatter into chunks pipelined with the adjacent
        # GEMM (Wang et al. 2022, "Overlap communication with dependent computation via
        # decomposition", ASPLOS'23); both compete for SMs, so only the shared overlap
        # efficiency of the shorter of the two is hidden.
        eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
        tp_fwd = 2 * t_tp - eta * min(2 * t_tp, lt_d.fwd_gemm_s)
        tp_bwd = 2 * t_tp - eta * min(2 * t_tp, lt_d.bwd_gemm_s)
    kv_chunk = 2 * mb * s / cp * kv_exchange_width(model, tp)  # 16-bit K and V of s/cp tokens
    t_cp_f = cp_ring_time(links["cp"], kv_chunk)
    # overlapped with the attention of the resident blocks (comm.cp_ring_exposed)
    cp_fwd, cp_bwd = cp_ring_exposed(links["cp"], kv_chunk, lt_d.fwd_attn_s, lt_d.bwd_attn_s)
    # two all-to-all (dispatch, combine) per MoE layer and pass; not overlapped under 1F1B
    ep_bytes = moe_dispatch_bytes(mb * s / cp, model.hidden, model.moe.top_k, moe_load_factor(model, par.ep)) if has_moe else 0.0
    t_a2a = alltoall_time(links["ep"], ep_bytes) if has_moe else 0.0
    full = par.recompute == "full"

    def cost(lt, moe: bool) -> dict[str, float]:
        a2a = 2 * t_a2a if moe else 0.0
        rec = lt.fwd_s if full else (lt.fwd_attn_s if par.recompute == "selective" else 0.0)
        return {
            "compute": lt.fwd_s + lt.bwd_s,
            "recompute": rec,
            "tp_comm": tp_fwd + tp_bwd + (tp_fwd if full else 0.0),
            "cp_comm": cp_fwd + cp_bwd + (cp_fwd if full else 0.0),
            "ep_comm": 2 * a2a + (a2a if full else 0.0),
        }

    lg_f, lg_b = logits_times(model, gpu, prec, mb, s, tp, cp)
    t_p2p = p2p_time(links["pp"], act_bytes / tp)
    raw = {"t_tp": t_tp, "t_cp": t_cp_f, "t_a2a": t_a2a, "t_p2p": t_p2p, "bwd_dense_s": lt_d.bwd_s,
           "tp_fwd_exposed_s": tp_fwd, "tp_bwd_exposed_s": tp_bwd}
    return cost(lt_d, False), cost(lt_m, True), lg_f + lg_b, (2 * v * t_p2p if par.pp > 1 else 0.0), raw


def stage_time_parts(costs: tuple, n: int, n_dense: int, last: bool) -> dict[str, float]:
    """Seconds per micro-batch on one stage of ``n`` layers (``n_dense`` of them dense)."""
    cost_d, cost_m, last_extra, pp_comm, _ = costs
    parts = {k: n_dense * cost_d[k] + (n - n_dense) * cost_m[k] for k in cost_d}
    if last:
        parts["compute"] += last_extra
    parts["pp_comm"] = pp_comm
    return parts


def dense_counts(model: ModelSpec, lps: tuple) -> list[int]:
    """Dense layers on each stage: the first ``layers - moe_layers`` layers are dense."""
    dense = model.layers - model.moe_layers
    out, first = [], 0
    for n in lps:
        out.append(max(0, min(n, dense - first)))
        first += n
    return out


def stage_memory(model: ModelSpec, job: Job, par: ParallelConfig, flash: bool, stage: int, n: int, params: dict, m: int) -> M.StageMemory:
    """Bytes per GPU on pipeline stage ``stage`` holding ``n`` layers whose parameters are
    ``params`` (from :func:`planner.cost.memory.stage_params`) with ``m`` micro-batches."""
    mb, s, tp, cp, pp, v = par.micro_batch_size, job.seq_len, par.tp, par.cp, par.pp, par.vpp
    sp = par.sequence_parallel and tp > 1
    has_moe = model.moe is not None and model.moe_layers > 0
    shard = par.zero_shard_degree or par.dp * par.cp
    bpp = M.bytes_per_param(job.precision, par.zero, shard)
    bpp_e = M.bytes_per_param(job.precision, par.zero, max(1, shard // par.ep))
    load = moe_load_factor(model, par.ep)
    a_layer = M.activation_bytes_per_layer(model, mb, s, tp, cp, sp, par.recompute, flash, has_moe, job.precision, load)
    a_full = M.activation_bytes_per_layer(model, mb, s, tp, cp, sp, "none", flash, has_moe, job.precision, load) if par.recompute == "full" else 0.0
    dense_p = params["layers"] + params["embedding"] + params["output"]
    w = dense_p * bpp["weights"] + params["experts"] * bpp_e["weights"]
    g = dense_p * bpp["gradients"] + params["experts"] * bpp_e["gradients"]
    o = dense_p * bpp["optimizer"] + params["experts"] * bpp_e["optimizer"]
    # GPipe runs every forward before any backward, so each stage holds all m micro-batches
    # (Huang et al. 2019); 1F1B and interleaving bound it by the pipeline depth.
    inflight = float(m) if par.schedule == "gpipe" else M.inflight_microbatches(stage, pp, v, m)
    acts = a_layer * n * inflight + (a_full if n else 0.0)
    if stage == 0:
        u = 1.0 / tp if sp else 1.0
        acts += mb * s / cp * model.hidden * 2 * u * inflight * (1.5 if model.bias else 1.0)  # embedding output (+ dropout mask)
    logits = 6.0 * mb * s / cp * model.vocab / tp if stage == pp - 1 else 0.0  # 16-bit logits + fp32 softmax
    buffers = M.framework_buffers_bytes()
    if par.zero >= 3:
        buffers += 2 * 2 * (params["layers"] + params["experts"]) / max(1, n)  # two gathered layers in 16-bit (prefetch)
    reserve = C.ALLOCATOR_RESERVE_FRACTION * (w + g + o + acts + logits)
    return M.StageMemory(stage, n, w, g, o, acts, logits, buffers, reserve)


def stage_sync(cluster: ClusterSpec, job: Job, par: ParallelConfig, params: dict, n: int, stage_time_s: float, m: int, bwd_layer_s: float) -> dict:
    """Once-per-step work of one stage: gradient synchronisation (total and exposed), ZeRO-3
    gathers, and the optimizer step."""
    links = group_links(cluster, par)
    gpu = cluster.gpu
    grad_b = 2.0 if job.precision == "fp16" else 4.0
    shard = par.zero_shard_degree or par.dp * par.cp
    dense_p = params["layers"] + params["embedding"] + params["output"]
    exp_p = params["experts"]
    t_dp = dp_collective_time(links["dp_cp"], dense_p * grad_b, dense_p * 2, min(par.zero, 2))
    if exp_p:
        exp_dp = max(1, par.dp * par.cp // par.ep)
        el = group_links(cluster, ParallelConfig(tp=par.tp, cp=1, dp=exp_dp, pp=1))["dp"]
        t_dp += dp_collective_time(el, exp_p * grad_b, exp_p * 2, min(par.zero, 2))
    window = n * bwd_layer_s  # the last micro-batch's backward on this stage
    eta = C.COMM_COMPUTE_OVERLAP_EFFICIENCY
    exposed = t_dp - eta * min(t_dp, window) if par.overlap_grad_reduce else t_dp
    zero3 = 0.0
    if par.zero >= 3:
        # Weights gathered per layer in forward, backward (and the recomputed forward), every
        # micro-batch, gradients reduce-scattered per layer (Rajbhandari 2020 sec. 7.2.2). These
        # per-module collectives run rank by rank through the rank's own NIC share (k = 1), not
        # as one node-aggregated ring; prefetching overlaps them with compute at the shared
        # overlap efficiency.
        gathers = 3 if par.recompute == "full" else 2
        z3 = _per_rank_links(links["dp_cp"])
        layer_p = (dense_p + exp_p) / max(1, n)
        t_g = z3.time("allgather", layer_p * 2)
        t_rs = z3.time("reducescatter", layer_p * grad_b)
        comm = n * (gathers * t_g + t_rs)
        zero3 = m * (comm - eta * min(comm, stage_time_s)) + t_g
        exposed = 0.0
    held = (dense_p + exp_p) / (shard if par.zero >= 1 else 1)
    opt = held * C.OPTIMIZER_BYTES_PER_PARAM / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    if job.precision == "fp8":  # FP8 cast-transpose of the updated weights, once per step (TE weight cache)
        local = (dense_p + exp_p) / (shard if par.zero >= 3 else 1)
        opt += local * C.FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    return {"dp_s": t_dp, "dp_exposed_s": exposed, "zero3_exposed_s": zero3, "optimizer_s": opt}


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
    grad_b = 2.0 if prec == "fp16" else 4.0
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
        sync = stage_sync(cluster, job, par, sp_i, lps[i], stage_t[i], m, raw["bwd_dense_s"])
        dp_exposed = max(dp_exposed, sync["dp_exposed_s"])
        zero3_exposed = max(zero3_exposed, sync["zero3_exposed_s"])
        dp_t_max = max(dp_t_max, sync["dp_s"])
        opt_t = max(opt_t, sync["optimizer_s"])
    emb_sync = 0.0
    if pp > 1 and model.tied_embeddings:
        emb_bytes = model.vocab * model.hidden / tp * grad_b
        lvl = links["pp"].inter if links["pp"].m > 1 else links["pp"].intra
        emb_sync = lvl.latency_s + emb_bytes / lvl.bandwidth_bytes_per_s
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
