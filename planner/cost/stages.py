"""Per-layer and per-stage quantities of one resolved configuration: time per micro-batch
(compute and exposed tensor/context/expert-parallel traffic), memory, and the once-per-step
work (gradient synchronisation as (seconds, compute window) parts, optimizer step).

:func:`planner.cost.step.assemble` turns them into the step time; :func:`planner.cost.estimate.
estimate` and the layer-split and mixed-cluster programs (:mod:`planner.search.split`,
:mod:`planner.search.hetero`) all take them from here.
"""

from __future__ import annotations

from functools import lru_cache

from planner.cost import memory as M
from planner.cost.comm import (GroupLinks, alltoall_time, cp_ring_exposed, cp_ring_time, degree_links, flex_dispatch_time,
                               group_links, moe_dispatch_bytes, mtp_tp_time, p2p_time, tp_allreduce_time)
from planner.cost.compute import MEGATRON_LOSS_BYTES, gemm_time, layer_kernels, layer_times, logits_times, moe_load_factor, stream_time
from planner.cost.constants import Constants
from planner.cost.flops import kv_exchange_width
from planner.cost.memory_peak import stage_peak
from planner.cost.recompute import op_sac_recomputed_gemm_share
from planner.engines.policy import fp8_casts, fp8_gather_bytes
from planner.engines.profile import Engine
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, is_flash

__all__ = ["p2p_send_time", "pp_comm_exposed", "layer_costs", "engine_layer_costs", "a2a_merged_fraction", "stage_time_parts", "dense_in", "dense_counts", "stage_memory", "stage_sync", "overlap_exposed",
           "embedding_sync_time", "StageSync", "host_exposed", "layer_host_s", "stage_fw"]


def _per_rank_links(g: GroupLinks, cluster: ClusterSpec) -> GroupLinks:
    """The same group with one rank per domain: each rank drives only its own NIC share. Where
    the scale-up domain is larger than a host (GB200 NVL72: 72 GPUs over 18 trays), the group's
    ranks in one domain talk over NVLink, so it keeps both levels."""
    if g.m > 1 and not (g.k > 1 and cluster.nvlink_domain > cluster.gpus_per_node):
        return GroupLinks(g.size, 1, g.size, g.intra, g.inter)
    return g


def p2p_send_time(model: ModelSpec, cluster: ClusterSpec, job: Job, tp: int, pp: int, dp: int, cp: int, mb: int) -> float:
    """Seconds of one pipeline send/recv of a micro-batch's hidden state between adjacent stages
    (16-bit, b s h / (cp tp) elements: each tensor rank sends its shard)."""
    return p2p_time(degree_links(cluster, tp, cp, dp, pp)["pp"], mb * job.seq_len / cp * model.hidden * 2 / tp)


def a2a_merged_fraction(par: ParallelConfig, m: int) -> float:
    """The share of a rank's passes that Megatron-core's combined 1F1B merges with a pass of
    another micro-batch (``--overlap-moe-expert-parallel-comm``): every pass but the warm-up
    forwards and the cool-down backwards. Without a pipeline the first forward and the last
    backward run alone (combined_1f1b_schedule_for_no_pipelining); interleaved, rank 0 runs
    2 (p - 1) + (v - 1) p + 1 warm-up chunk forwards (schedules.py
    get_pp_rank_microbatches: one more than without the overlap) and as many lone backwards."""
    v = par.vpp or 1
    if par.pp <= 1:
        return max(0.0, (m - 1) / m)
    total = m * v
    warm = min(total, 2 * (par.pp - 1) + (v - 1) * par.pp + 1)
    return (total - warm) / total


def layer_costs(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, C: Constants, merged: float | None = None,
                sac: str = "korthikanti", fp8: str = "te", p2p_overlap: bool = False, tp_copies: bool = False,
                loss: tuple[float, float] = MEGATRON_LOSS_BYTES) -> tuple:
    """Per layer and micro-batch on one GPU: (dense costs, MoE costs, last-stage extra,
    per-stage pipeline send/recv, raw times), each cost a dict of seconds by kind.
    ``merged``: the share of passes whose expert all-to-all overlaps another micro-batch's
    compute (default: :func:`a2a_merged_fraction` when ``par.moe_a2a_overlap``, else 0).
    ``sac``: the engine's selective-recompute policy; ``fp8``: its FP8 cast scheme
    (:func:`planner.engines.fp8_casts`); ``p2p_overlap``: the engine runs the interleaved
    schedule's send/recv under other chunks' compute (:attr:`planner.engines.profile.Engine.overlap_p2p_comm`);
    ``tp_copies``: its sequence-parallel collectives re-lay their tensors in HBM
    (:attr:`planner.engines.profile.Engine.tp_sequence_dim_copies`); ``loss``: (forward, backward)
    bytes per logit element of its cross-entropy (:meth:`planner.engines.profile.Engine.loss_bytes`).

    Cached on the fields that matter (not ZeRO or the layer split), so the search reuses it."""
    if merged is None:
        merged = a2a_merged_fraction(par, par.num_microbatches(job.global_batch_size)) if par.moe_a2a_overlap else 0.0
    key = (par.tp, par.pp, par.dp, par.cp, par.ep, par.vpp, par.micro_batch_size, par.recompute,
           bool(par.sequence_parallel and par.tp > 1), bool(par.tp_comm_overlap), bool(par.async_tp_allreduce), par.attention if is_flash(par.attention) else "",
           par.etp or par.tp, merged, par.moe_dispatcher or "alltoall", par.cuda_graph or "none",
           sac if par.recompute == "selective" else "korthikanti", fp8 if job.precision == "fp8" else "",
           bool(p2p_overlap and par.pp > 1 and (par.vpp or 1) > 1), bool(tp_copies and par.tp > 1 and par.sequence_parallel),
           tuple(loss))
    return _layer_costs(model, cluster, job, key, C)


def engine_layer_costs(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, C: Constants, engine: Engine) -> tuple:
    """:func:`layer_costs` as ``engine`` runs the layers: its selective-recompute policy, FP8 cast
    scheme (for the configuration's ZeRO stage), interleaved send/recv overlap, TP re-layout copies
    and cross-entropy kernels (the job's, or the engine's default)."""
    return layer_costs(model, cluster, job, par, C, sac=engine.memory.selective, fp8=fp8_casts(engine, job, par.zero),
                       p2p_overlap=engine.overlap_p2p_comm, tp_copies=engine.tp_sequence_dim_copies,
                       loss=engine.loss_bytes(job.cross_entropy, par.tp, job.precision))


@lru_cache(maxsize=65536)
def _layer_costs(model: ModelSpec, cluster: ClusterSpec, job: Job, key: tuple, C: Constants) -> tuple:
    tp, pp, dp, cp, ep, v, mb, rec, sp, tpo, asy, kernel, etp, merged, disp, graph, sac, fp8, p2p_ovl, copies, loss = key
    flash = bool(kernel)  # "flash", "fa2" or "fa1" (ParallelConfig.attention), "" unfused
    gpu = cluster.gpu
    prec = job.precision
    s = job.seq_len
    links = group_links(cluster, ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp))
    has_moe = model.moe is not None and model.moe_layers > 0
    lt_d = layer_times(model, gpu, prec, mb, s, tp, cp, sp, flash, False, ep, C=C, fp8=fp8, flash_kernel=kernel or "flash")
    lt_m = layer_times(model, gpu, prec, mb, s, tp, cp, sp, flash, True, ep, C=C, etp=etp, fp8=fp8, flash_kernel=kernel or "flash") if has_moe else lt_d
    act_bytes = mb * s / cp * model.hidden * 2  # one b*s*h activation in 16-bit
    # torchao's tensor-wise Float8 TP (Job.fp8_tp_gather: Float8ColwiseParallel /
    # Float8RowwiseParallel / PrepareFloat8ModuleInput, torchao float8_tensor_parallel.py) casts a
    # block's input to FP8 before its sequence all-gather and the gradient of its output before the
    # backward one: every layer all-gather carries 1-byte elements; the reduce-scatters stay 16-bit.
    ag_bytes = act_bytes / 2 if (sp and "+tp8" in fp8) else act_bytes
    t_tp = (links["tp"].time("reducescatter", act_bytes) + links["tp"].time("allgather", ag_bytes)) if sp else tp_allreduce_time(links["tp"], act_bytes, sp)
    # The HBM copy that re-lays a sequence-dimension all-gather's output (none when b = 1: a view)
    # and a reduce-scatter's input, each a read and a write of the whole b*s*h tensor, on the
    # compute stream (Engine.tp_sequence_dim_copies; torch functional collectives).
    copy_ag = stream_time(2 * ag_bytes, gpu, 1, C) if copies and mb > 1 else 0.0
    copy_rs = stream_time(2 * act_bytes, gpu, 1, C) if copies else 0.0
    copy16_ag = stream_time(2 * act_bytes, gpu, 1, C) if copies and mb > 1 else 0.0  # the embedding's and head's (16-bit)
    tp_fwd = 2 * t_tp
    # The backward all-reduce of the input gradient overlaps the weight-gradient GEMM only with
    # Megatron's asynchronous TP all-reduce (Korthikanti 2022 sec. 5); legacy engines block.
    tp_bwd = 2 * t_tp * (1 - C.TP_BWD_OVERLAP_FRACTION) if asy else 2 * t_tp
    if tpo and sp:
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
    # two all-to-all (dispatch, combine) per MoE layer and pass, exposed (but for the combined-1F1B overlap below).
    # Each rank sends its own sequence-parallel share (s / tp) of the tokens over the expert-
    # parallel group; with etp > 1 the received tokens are then all-gathered over the expert
    # tensor group (and the combine reduce-scattered) on that group's links (Megatron-core
    # MoEAlltoAllTokenDispatcher: token_dispatch all_to_all(ep_group), dispatch_postprocess
    # gather_from_sequence_parallel_region(tp_group = expt_tp), combine_preprocess
    # reduce_scatter_to_sequence_parallel_region).
    # The flex dispatcher (DeepEP / HybridEP) sends each token once per destination rank and, across
    # scale-up domains, once per destination domain (comm.flex_dispatch_time).
    t_ep_a2a = t_a2a = 0.0
    if has_moe:
        tokens, load = mb * s / cp / tp, moe_load_factor(model, ep, C)
        ep_bytes = moe_dispatch_bytes(tokens, model.hidden, model.moe.top_k, load)
        if disp == "alltoall":
            t_ep_a2a = alltoall_time(links["ep"], ep_bytes)
        else:
            t_ep_a2a = flex_dispatch_time(links["ep"], tokens, model.hidden, model.moe.experts, model.moe.top_k, load)
        t_a2a = t_ep_a2a + links["etp"].time("allgather", etp * ep_bytes)
    full = rec == "full"

    op_sac = rec == "selective" and sac == "op"

    def cost(lt, moe: bool) -> dict[str, float]:
        a2a = 2 * t_a2a if moe else 0.0
        if op_sac:
            # torchtitan's per-op policy keeps every other mm, SDPA and the reduce-scatters; the
            # backward re-runs the block's forward eagerly with those outputs cached: a share of
            # the GEMMs, every FP8 cast (torchao casts each GEMM input, the cached mms' too; only
            # aten.max is kept), every elementwise kernel and the sequence-parallel all-gathers.
            share = op_sac_recomputed_gemm_share(model, moe, ep, C)
            recomp = share * lt.fwd_gemm_s + lt.fwd_quant_s + lt.fwd_elementwise_s
            tp_re = (2 * links["tp"].time("allgather", ag_bytes) if sp else tp_fwd) if tp > 1 else 0.0
            copies_s = 4 * (copy_ag + copy_rs) + 2 * copy_ag  # forward, backward, the re-run gathers
        else:
            recomp = lt.fwd_s if full else (lt.fwd_attn_s if rec == "selective" else 0.0)
            tp_re = tp_fwd if full else 0.0
            copies_s = (6 if full else 4) * (copy_ag + copy_rs)  # 2 AG + 2 RS a pass (forward, backward, re-run)
        out = {
            "compute": lt.fwd_s + lt.bwd_s + copies_s,  # the re-layout copies are HBM work, not link time
            "recompute": recomp,
            "tp_comm": tp_fwd + tp_bwd + tp_re,
            "cp_comm": cp_fwd + cp_bwd + (cp_fwd if full else 0.0),
            "ep_comm": 2 * a2a + (a2a if full else 0.0),
        }
        if moe and merged > 0.0:
            # Combined 1F1B: a merged pass runs one micro-batch's forward and another's backward
            # layer by layer, each one's dispatch and combine under the other's compute
            # (combined_1f1b.py); the shared overlap efficiency of SM-competing collectives
            # applies (constants.COMM_COMPUTE_OVERLAP_EFFICIENCY). Full recompute is excluded. The
            # etp gather/scatter runs on the compute stream (routed_experts_compute) and stays.
            a2a_only = 4 * t_ep_a2a
            hidden = min(a2a_only, C.COMM_COMPUTE_OVERLAP_EFFICIENCY * (lt.fwd_s + lt.bwd_s))
            out["ep_comm"] -= merged * hidden
        # A per-op policy re-runs the block's whole forward in Python (saved ops return their
        # cached output), so its host side is a full forward's.
        out["host"] = host_exposed(sum(out.values()), layer_host_s(model, tp, sp, flash, moe, ep, full or op_sac, graph, C), C)
        return out

    lg_f, lg_b = logits_times(model, gpu, prec, mb, s, tp, cp, C, loss)
    if graph != "full_iteration":  # the output layer and loss run outside per-layer graphs
        lg_b += host_exposed(lg_f + lg_b, C.HOST_SECONDS_PER_KERNEL * C.HOST_LOGITS_KERNELS, C)
    a2a_f = 2 * t_a2a  # dispatch + combine of one forward

    def fw(lt, moe: bool) -> tuple[float, float]:
        """(forward, weight-gradient) seconds of one layer: what zero-bubble schedules move
        around. The weight-gradient GEMMs are half the backward GEMM time (the data- and
        weight-gradient GEMMs of each linear layer have equal FLOPs; Qi et al. 2024 sec. 2)."""
        return lt.fwd_s + tp_fwd + cp_fwd + (a2a_f if moe else 0.0), lt.bwd_gemm_s / 2
    # The output layer (ColumnParallelLinear) takes its input like a layer's column-parallel GEMM
    # (Megatron-core tensor_parallel/layers.py): all-gathered over the sequence with SP and its
    # gradient reduce-scattered in backward, else only the backward all-reduce; the backward one
    # overlaps the weight-gradient GEMM as the layers' do (asynchronous TP all-reduce).
    head_bwd = links["tp"].time("reducescatter" if sp else "allreduce", act_bytes)
    head_tp = (links["tp"].time("allgather", act_bytes) if sp else 0.0) + head_bwd * (1 - C.TP_BWD_OVERLAP_FRACTION if asy else 1.0)
    last_extra = {"compute": lg_f + lg_b + copy16_ag + copy_rs, "tp_comm": head_tp}
    head_tp_link = t_tp
    last_link = head_tp_link  # seconds on the tensor-parallel links of the last stage's extra work
    # Multi-token prediction (DeepSeek-V3 arXiv 2412.19437 sec. 2.2; Megatron-core
    # transformer/multi_token_prediction.py MultiTokenPredictionLayer), on the last stage after the
    # decoder: its embedding lookup, enorm + hnorm, eh_proj (2h -> h, column-parallel), one
    # transformer layer of the decoder's last kind, then the shared output head and its own
    # cross-entropy. Each module's kinds (its layer's recompute, communication and host time
    # included) add to the last stage's.
    mtp_f = mtp_w = 0.0
    if model.mtp_layers:
        kind = (lt_m, True) if has_moe else (lt_d, False)
        tok = mb * s / cp
        proj_f = gemm_time(tok, model.hidden / tp, 2 * model.hidden, gpu, prec, C)
        proj_w = gemm_time(2 * model.hidden, model.hidden / tp, tok, gpu, prec, C)
        proj_b = gemm_time(tok, 2 * model.hidden, model.hidden / tp, gpu, prec, C) + proj_w
        L = model.mtp_layers
        t_mtp = mtp_tp_time(links["tp"], act_bytes, sp)
        last_link += L * (head_tp_link + (6 if full else 4) * t_tp + t_mtp)
        for k, val in cost(*kind).items():
            last_extra[k] = last_extra.get(k, 0.0) + L * val
        last_extra["compute"] += L * (lg_f + lg_b + proj_f + proj_b)
        last_extra["tp_comm"] += L * (head_tp + t_mtp)
        f_k, w_k = fw(*kind)
        mtp_f = L * (f_k + lg_f + proj_f)
        mtp_w = L * (min(w_k, f_k) + proj_w)
    t_p2p = p2p_send_time(model, cluster, job, tp, pp, dp, cp, mb)
    # a layer's TP link time, hidden or not: 2 collectives each way a pass (t_tp is one pair), the
    # recomputed forward's under full recompute, the re-run all-gathers of torchtitan's per-op policy
    if tp == 1:
        tp_layer = 0.0
    elif full:
        tp_layer = 6 * t_tp
    elif op_sac:
        tp_layer = 4 * t_tp + (2 * links["tp"].time("allgather", ag_bytes) if sp else 2 * t_tp)
    else:
        tp_layer = 4 * t_tp
    raw = {"t_tp": t_tp, "tp_layer_s": tp_layer, "t_cp": t_cp_f, "t_a2a": t_a2a, "t_p2p": t_p2p, "bwd_dense_s": lt_d.bwd_s, "fwd_dense_s": lt_d.fwd_s,
           "tp_fwd_exposed_s": tp_fwd, "tp_bwd_exposed_s": tp_bwd, "fw_dense": fw(lt_d, False), "fw_moe": fw(lt_m, True),
           "fw_last": (lg_f + mtp_f, mtp_w), "last_tp_link_s": last_link,
           # the input embedding (VocabParallelEmbedding) on the first stage: its output all-reduced
           # over the tensor group, or with SP reduce-scattered (all-gathered in backward):
           # Megatron-core tensor_parallel/layers.py, one tensor-parallel exchange per micro-batch
           "first_extra": {"tp_comm": tp_allreduce_time(links["tp"], act_bytes, sp),  # 16-bit: not a Float8 module
                           "compute": copy16_ag + copy_rs},
           # Interleaved with overlap_p2p_comm (Megatron-core schedules.py): each chunk's send/recv
           # is posted asynchronously and waited before the chunk that needs it, under the other
           # chunks' compute; the shared overlap efficiency of the shorter of the two is hidden
           # (stages.pp_comm_exposed). Otherwise (1F1B, batched isend/irecv) it blocks.
           "p2p_overlap_eta": C.COMM_COMPUTE_OVERLAP_EFFICIENCY if p2p_ovl else 0.0}
    return cost(lt_d, False), cost(lt_m, True), last_extra, (2 * v * t_p2p if pp > 1 else 0.0), raw


def layer_host_s(model: ModelSpec, tp: int, sp: bool, flash: bool, moe: bool, ep: int, full: bool, graph: str, C: Constants) -> float:
    """Host (CPU) seconds to issue one layer's work for one micro-batch. Eager: every kernel of
    the forward, backward and recomputed forward is issued from Python (compute.layer_kernels;
    Constants.HOST_SECONDS_PER_KERNEL each). A whole-layer CUDA graph (Megatron-core
    --cuda-graph-impl local: CudaGraphManager records each layer's forward and backward once and
    replays them) issues one graph per pass instead, one Python-level call each (the same
    per-call figure; the graph launch itself is a few microseconds, CUDA 12 constant-time
    launch of straight-line graphs). A full-iteration graph replays the whole step: no
    per-layer host work."""
    if graph == "full_iteration":
        return 0.0
    if graph == "layer":
        return C.HOST_SECONDS_PER_KERNEL * 2  # the forward graph and the backward graph
    kf, kb = layer_kernels(model, tp, sp, flash, moe, ep)
    return C.HOST_SECONDS_PER_KERNEL * (kf + kb + (kf if full else 0))


def host_exposed(gpu_s: float, host_s: float, C: Constants) -> float:
    """What the host (CPU) time to issue a layer's kernels adds to its GPU time: the layer takes
    (g^k + h^k)^(1/k) (Constants.HOST_DEVICE_OVERLAP_EXPONENT k; the CPU runs ahead of the GPU
    only so far), i.e. about h when the layer is host-bound and almost nothing when g >> h."""
    k = C.HOST_DEVICE_OVERLAP_EXPONENT
    if host_s <= 0:
        return 0.0
    return (gpu_s ** k + host_s ** k) ** (1.0 / k) - gpu_s


def stage_time_parts(costs: tuple, n: int, n_dense: int, last: bool, first: bool = False) -> dict[str, float]:
    """Seconds per micro-batch on one stage of ``n`` layers (``n_dense`` of them dense); the last
    stage adds the output layer and loss (and any MTP modules), the first the input embedding's
    tensor-parallel exchange."""
    cost_d, cost_m, last_extra, pp_comm, raw = costs
    parts = {k: n_dense * cost_d[k] + (n - n_dense) * cost_m[k] for k in cost_d}
    extras = ([last_extra] if last else []) + ([raw["first_extra"]] if first else [])
    for extra in extras:
        for k, val in extra.items():
            parts[k] = parts.get(k, 0.0) + val
    parts["pp_comm"] = pp_comm_exposed(costs, parts["compute"] + parts["recompute"])
    return parts


def pp_comm_exposed(costs: tuple, compute_s: float) -> float:
    """Seconds per micro-batch of a stage's pipeline send/recv left on its critical path beside
    ``compute_s`` of its compute: all of it when the engine blocks on it, else what
    :func:`overlap_exposed` leaves with the raw ``p2p_overlap_eta`` efficiency."""
    pp_comm, eta = costs[3], costs[4]["p2p_overlap_eta"]
    return pp_comm - eta * min(pp_comm, compute_s)


def stage_fw(costs: tuple, n: int, n_dense: int, last: bool) -> tuple[float, float]:
    """(forward, weight-gradient) seconds per micro-batch of one stage of ``n`` layers. The
    weight-gradient part is capped at the layers' forward: a zero-bubble schedule fills a wait
    of about one forward with one W, and a longer W does not fit whole (Qi et al. 2024
    sec. 3.1; the schedule simulator shows the closed form exact up to W = F)."""
    raw = costs[4]
    (fd, wd), (fm, wm) = raw["fw_dense"], raw["fw_moe"]
    f, w = n_dense * fd + (n - n_dense) * fm, n_dense * min(wd, fd) + (n - n_dense) * min(wm, fm)
    if last:
        f, w = f + raw["fw_last"][0], w + raw["fw_last"][1]
    return f, w


def dense_in(model: ModelSpec, first: int, n: int) -> int:
    """Dense layers among the ``n`` layers that start at layer index ``first``: the first
    ``layers - moe_layers`` layers of a model are dense (DeepSeek-V3's layout), all of a dense
    model's are."""
    return max(0, min(n, model.dense_layers - first))


def dense_counts(model: ModelSpec, lps: tuple) -> list[int]:
    """Dense layers on each stage of the split ``lps`` (layers placed in order)."""
    out, first = [], 0
    for n in lps:
        out.append(dense_in(model, first, n))
        first += n
    return out


def stage_memory(model: ModelSpec, job: Job, par: ParallelConfig, stage: int, n: int, params: dict, m: int, C: Constants,
                 engine: Engine) -> M.StageMemory:
    """Bytes per GPU on pipeline stage ``stage`` holding ``n`` layers whose parameters are
    ``params`` (from :func:`planner.cost.memory.stage_params`) with ``m`` micro-batches, at the
    stage's peak moment as its engine reaches it (:func:`planner.cost.memory_peak.stage_peak`)."""
    return stage_peak(model, job, par, stage, n, params, m, C, engine, moe_load_factor(model, par.ep, C))


def overlap_exposed(comm_s: float, window_s: float, C: Constants) -> float:
    """What stays of ``comm_s`` when it runs beside ``window_s`` of compute: the shared overlap
    efficiency of the shorter of the two is hidden (the rule used for every overlap). A window
    of 0 means the communication is not overlapped."""
    return comm_s - C.COMM_COMPUTE_OVERLAP_EFFICIENCY * min(comm_s, window_s)


class StageSync(dict):
    """Once-per-step work of one stage (a dict, seconds): ``parts`` ((comm, window) pairs whose
    exposed time is :func:`overlap_exposed`; window 0 = not overlapped), ``exposed_s`` (their
    sum), ``total_s`` (communication time, hidden or not), ``optimizer_s``."""


def stage_sync(cluster: ClusterSpec, job: Job, par: ParallelConfig, params: dict, n: int, stage_time_s: float, m: int,
               bwd_layer_s: float, fwd_layer_s: float, C: Constants, engine: Engine) -> StageSync:
    """The data-parallel work of one stage in one step, as the engine's sharding mode runs it
    (:meth:`planner.engines.Engine.mode`), and its optimizer step.

    * Gradients reduced once per step (``grad_sync: step``: DDP, Megatron's distributed
      optimizer, DeepSpeed ZeRO-1, FSDP under pipelining): one all-reduce (ZeRO 0) or
      reduce-scatter of the step's gradients, beside the last micro-batch's backward on this
      stage when ``overlap_grad_reduce`` (Megatron ``--overlap-grad-reduce``, DeepSpeed
      ``overlap_comm``), else after it.
    * Gradients reduced every micro-batch (``microbatch``: DeepSpeed ZeRO-2/3, FSDP,
      Megatron-FSDP): m reductions, each beside its micro-batch's backward (Rajbhandari et al.
      2020 sec. 5.2; DeepSpeed stage_1_and_2.py reduces at every backward with
      partition_gradients; FSDP2 reduce-scatters each block's gradients in every backward).
    * Weights gathered once per step (``param_gather: step``, ZeRO 1/2): the updated 16-bit
      shards all-gathered after the optimizer, beside the next step's first forward with
      ``overlap_param_gather`` (Megatron ``--overlap-param-gather``), else in the reduction's window.
    * Weights gathered per layer (``layer``, ZeRO-3 / FSDP FULL_SHARD): every micro-batch gathers
      each layer in forward and, with ``reshard_after_forward``, again in backward (and in the
      recomputed forward), and reduce-scatters its gradients (Rajbhandari 2020 sec. 7.2.2).
      These per-module collectives run rank by rank through the rank's own NIC share (k = 1),
      not as one node-aggregated ring; prefetching overlaps them with the micro-batch's compute
      at the shared overlap efficiency; the first layer's gather has nothing to hide behind.
    """
    links = group_links(cluster, par)
    gpu = cluster.gpu
    mode = engine.mode(par.zero, par.pp)
    grad_b = M.grad_bytes(job.precision, job.grad_reduce)
    shard = par.zero_shard_degree or par.dp * par.cp
    dense_p = params["layers"] + params["embedding"] + params["output"]
    exp_p = params["experts"]
    reduce_op = "allreduce" if par.zero == 0 or mode.grad_collective == "allreduce" else "reducescatter"
    gather_once = mode.param_gather == "step" and par.zero >= 1
    groups = [(links["dp_cp"], dense_p)]
    if exp_p:
        groups.append((links["edp"], exp_p))  # experts reduce over the expert data-parallel group
    red = sum(g.time(reduce_op, p * grad_b) for g, p in groups)
    # The weights gathered: 16-bit, or FP8 linear weights (Megatron --fp8-param-gather through the
    # distributed optimizer or Megatron-FSDP; torchao tensor-wise with enable_fsdp_float8_all_gather:
    # FSDP2 casts the shard before the all-gather, torchao/float8/fsdp_utils.py
    # WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather), as memory_peak holds them
    lin_b, exp_b = fp8_gather_bytes(engine, job, par.zero)
    gathered = [lin_b * params["layers"] + 2.0 * (params["embedding"] + params["output"]), exp_b * exp_p]  # per group
    gat = sum(g.time("allgather", b) for (g, _), b in zip(groups, gathered)) if gather_once else 0.0
    bwd_w, fwd_w = n * bwd_layer_s, n * fwd_layer_s
    ogr = bool(par.overlap_grad_reduce)
    if mode.param_gather == "layer":
        gathers = (3 if par.recompute == "full" else 2) if mode.reshard_after_forward else 1
        z3 = _per_rank_links(links["dp_cp"], cluster)
        layer_p = (dense_p + exp_p) / max(1, n)
        t_g = z3.time("allgather", sum(gathered) / max(1, n))
        t_rs = z3.time("reducescatter", layer_p * grad_b)
        comm = n * (gathers * t_g + t_rs)
        parts: tuple = ((m * comm, m * stage_time_s), (t_g, 0.0))
    else:
        if mode.grad_sync == "microbatch":
            reduction = (m * red, m * bwd_w if ogr else 0.0)
        else:
            reduction = (red, bwd_w if ogr else 0.0)
        if not gat:
            parts = (reduction,)
        elif ogr and par.overlap_param_gather:
            parts = (reduction, (gat, fwd_w))
        elif mode.grad_sync == "step":
            parts = ((red + gat, bwd_w if ogr else 0.0),)  # the gather joins the reduction's window
        else:
            parts = (reduction, (gat, 0.0))
    # the optimizer updates the shard each rank holds: dense weights over dp x cp, experts over the
    # expert data-parallel group (as memory_peak shards their states: dp x cp x tp / (ep x etp))
    shard_e = M.expert_shard(shard, par.tp, par.ep, par.etp)
    held = dense_p / shard + exp_p / shard_e if par.zero >= 1 else dense_p + exp_p
    opt = held * C.OPTIMIZER_BYTES_PER_PARAM / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    if job.precision == "fp8" and engine.fp8_casts == "te":  # FP8 cast-transpose of the updated weights, once per step (TE weight cache)
        local = (dense_p + exp_p) / (shard if par.zero >= 3 else 1)
        opt += local * C.FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    exposed = sum(overlap_exposed(s_, w_, C) for s_, w_ in parts)
    return StageSync(parts=parts, exposed_s=exposed, total_s=sum(s_ for s_, _ in parts), optimizer_s=opt)


def embedding_sync_time(model: ModelSpec, par: ParallelConfig, grad_bytes: float, pp_links: GroupLinks, crosses_network: bool | None = None) -> float:
    """All-reduce of the tied embedding's gradient between the first and the last stage
    (Megatron's embedding group: two ranks, on the level the pipeline group crosses, or on the
    network when ``crosses_network``). Multi-token prediction keeps a copy on the last stage of
    an untied model too (finalize_model_grads.py _get_shared_word_embedding_weight: "share
    embeddings ... or mtp_num_layers"). Zero without pipeline parallelism or a second copy."""
    if par.pp <= 1 or not (model.tied_embeddings or model.mtp_layers):
        return 0.0
    emb_bytes = model.vocab * model.hidden / par.tp * grad_bytes
    net = pp_links.m > 1 if crosses_network is None else crosses_network
    pair = GroupLinks(2, 1, 2, pp_links.intra, pp_links.inter) if net else GroupLinks(2, 2, 1, pp_links.intra, pp_links.inter)
    return pair.time("allreduce", emb_bytes)
