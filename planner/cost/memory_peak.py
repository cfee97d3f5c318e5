"""The peak memory of one pipeline stage: the terms of :mod:`planner.cost.memory` met at the
moments of :mod:`planner.cost.memory_schedule`, as the stage's engine runs them.

Static (allocated once, held all step): weights, optimizer state, the gradient buffer where
the engine keeps one (Megatron, DeepSpeed), pipeline receive buffers (torch pipelining).
Per micro-batch in flight, on each model chunk: the layers' saved activations, the embedding
output (first chunk), the final norm and output-layer input and the loss's held working set
(last chunk); under Zero Bubble the part a W pass needs stays until it. At a backward: the
re-materialised layer (recompute), the loss backward's working set, FSDP's next block and the
current block's unsharded gradients. From a chunk's first backward: the gradients FSDP2
allocates (sharded reduce-scatter outputs, or unsharded fp32 accumulators under pipelining).
At the optimizer step: its temporaries. The peak is the largest moment; allocated bytes plus
the caching allocator's reserve (``reserve_fraction`` of what is allocated and freed within the
step: activations, logits, gathered parameters, per-step gradients; model states sit in
buffers allocated once) is the reserved peak; device memory outside the allocator (CUDA
context, NCCL, Transformer Engine userbuffers) is added for feasibility.
"""

from __future__ import annotations


from functools import lru_cache
from types import SimpleNamespace

from planner.cost import memory as M
from planner.cost.constants import Constants
from planner.cost.flops import attn_proj_dims
from planner.cost.memory_schedule import moment_table, steady_microbatches
from planner.engines.policy import fp8_gather_bytes, fp8_gathers
from planner.engines.profile import Engine
from planner.errors import InputError
from planner.specs import Job, ModelSpec, ParallelConfig, is_flash

__all__ = ["stage_peak", "describe_peak", "stage_grad_sync", "fsdp2_unsharded_all_step", "DEEPSPEED_REDUCE_BUCKET_ELEMENTS"]

# DeepSpeed's reduce_bucket_size default (deepspeed/runtime/zero/config.py, 5e8 elements): the
# contiguous gradient bucket ZeRO-2/3 allocates for its reductions (stage_1_and_2.py ipg buffer).
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 5e8


def _mode(engine: Engine, zero: int, pp: int):
    try:
        return engine.mode(zero, pp)
    except InputError:  # priced unchecked (validate=False): the engine's nearest semantics
        return None


def stage_grad_sync(engine: Engine, zero: int, pp: int) -> str:
    """When the engine's gradients are synchronised (planner.cost.memory.state_bytes_per_param's
    ``grad_sync``): its sharding mode's, except that torch pipelining turns FSDP2's gradient sync
    off until the last micro-batch (ZeRO >= 2 with pp > 1). The memory model and the search's
    memory bound (planner.search.bounds) both read it."""
    mode = _mode(engine, zero, pp)
    if engine.memory.states == "fsdp2" and pp > 1 and zero >= 2:
        return "step"
    return mode.grad_sync if mode is not None else "microbatch"


def fsdp2_unsharded_all_step(engine: Engine, zero: int, pp: int) -> bool:
    """Whether FSDP2 keeps every block unsharded from its forward to its backward: ZeRO >= 2
    under pipelining, or without reshard_after_forward (torchtitan parallelize.py apply_fsdp).
    The memory model and the search's memory bound (planner.search.bounds) both read it."""
    if engine.memory.states != "fsdp2" or zero < 2:
        return False
    mode = _mode(engine, zero, pp)
    return pp > 1 or (mode is not None and not mode.reshard_after_forward)


_PAR_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero",
               "zero_shard_degree", "schedule", "tp_comm_overlap", "attention")


def stage_peak(model: ModelSpec, job: Job, par: ParallelConfig, stage: int, n: int, params: dict, m: int, C: Constants,
               engine: Engine, moe_load: float = 1.0) -> M.StageMemory:
    """Bytes per GPU on pipeline stage ``stage`` (``n`` layers, parameters ``params`` from
    :func:`planner.cost.memory.stage_params`, ``m`` micro-batches) at its peak moment.
    Cached on the fields that matter (the search prices the same stage many times)."""
    key = tuple(getattr(par, f, None) for f in _PAR_FIELDS)
    items = tuple((k, params[k]) for k in ("layers", "experts", "embedding", "output"))
    ek = (engine.name, engine.memory, engine.sharding)  # what the memory model reads of the engine (hashable)
    _ENGINES.setdefault(ek, engine)
    return _stage_peak(model, job, key, stage, n, items, m, C, ek, moe_load)


_ENGINES: dict = {}


@lru_cache(maxsize=65536)
def _stage_peak(model: ModelSpec, job: Job, key: tuple, stage: int, n: int, params_items: tuple, m: int, C: Constants,
                ek: tuple, moe_load: float) -> M.StageMemory:
    import numpy as np  # noqa: PLC0415  (numpy on first use: CLI start-up)

    engine = _ENGINES[ek]
    par = SimpleNamespace(**dict(zip(_PAR_FIELDS, key)))
    params = dict(params_items)
    mem = engine.memory
    f_res = C.ALLOCATOR_RESERVE_FRACTION if mem.reserve_fraction is None else mem.reserve_fraction
    prec = job.precision
    mb, s, tp, cp, pp, v = par.micro_batch_size, job.seq_len, par.tp, par.cp, par.pp, max(1, par.vpp)
    sp = bool(par.sequence_parallel and tp > 1)
    u = 1.0 / tp if sp else 1.0
    flash = is_flash(par.attention)
    has_moe = model.moe is not None and model.moe_layers > 0
    zero = par.zero
    mode = _mode(engine, zero, pp)
    shard = par.zero_shard_degree or par.dp * par.cp
    shard_e = M.expert_shard(shard, par.tp, par.ep, par.etp)
    grad_sync = stage_grad_sync(engine, zero, pp)
    key = (prec, zero, job.grad_reduce, C, mem.states, grad_sync, mem.fp8_weight_cache, mem.foreach_optimizer_temp,
           fp8_gathers(engine, job, zero))
    st = M.state_bytes_per_param(key[0], key[1], shard, *key[2:])
    st_e = M.state_bytes_per_param(key[0], key[1], shard_e, *key[2:])
    copies = 1.0  # DualPipeV (the V-shaped DualPipe, two chunks per rank) keeps one copy of the parameters
    dense_p = params["layers"] + params["embedding"] + params["output"]
    exp_p = params["experts"]

    def states(k: str) -> float:
        return copies * (dense_p * st[k] + exp_p * st_e[k])

    weights, grads_static, optim, opt_step = states("weights"), states("gradients"), states("optimizer"), states("optimizer_step")
    step_grads = states("step_gradients")

    # --- parameters all-gathered (FSDP2, ZeRO-3) -----------------------------------------------------
    layer_p = (params["layers"] + exp_p) / max(1, n)
    lin_b, exp_b = fp8_gather_bytes(engine, job, zero)  # FP8 linear weights where the job gathers them
    layer_b = (lin_b * params["layers"] + exp_b * exp_p) / max(1, n)  # bytes of one layer gathered
    gathered, gathered_b, gathered_what = 0.0, 0.0, ""
    ag_pool = rs_pool = 0.0
    if mem.states == "fsdp2" and zero >= 2:
        if fsdp2_unsharded_all_step(engine, zero, pp):
            # reshard_after_forward=False: every block stays unsharded from its forward to its
            # backward; under pipelining for the whole step (parallelize.py apply_fsdp)
            gathered = copies * (lin_b * params["layers"] + exp_b * exp_p + 2.0 * (params["embedding"] + params["output"]))
            gathered_b = 2.0 * layer_p  # the block's bf16 gradients before they join the fp32 accumulators
            gathered_what = "all of the stage's parameters unsharded"
        else:
            # fully_shard per block: [norm, output] is not resharded after forward and the last
            # block is prefetched for the backward; in a block's backward the next is prefetched
            # and the block's unsharded bf16 gradients and their fp32 reduce-scatter input exist
            gathered = 2.0 * params["output"] + layer_b
            gathered_b = layer_b + (2.0 + 4.0) * layer_p
            gathered_what = "output group + one block unsharded"
        # FSDP2 allocates each all-gather output on its copy-in stream and each reduce-scatter
        # output (the sharded fp32 gradients are views of it) on the reduce-scatter stream
        # (_fsdp_collectives.py foreach_all_gather / foreach_reduce); the caching allocator reuses
        # a block only on the stream it was allocated on, so those pools stay reserved beside the
        # compute stream's: two groups' all-gather outputs (one prefetched) and the sharded
        # gradients, which zero_grad frees before the next step's peak.
        ag_pool = 2.0 * layer_b
        rs_pool = copies * (dense_p * 4.0 / max(1, shard) + exp_p * 4.0 / max(1, shard_e))
    elif zero >= 3 and mode is not None and mode.param_gather == "layer":
        gathered = 2 * layer_b  # the layer in use and the prefetched next one (Megatron-FSDP, ZeRO-3; FP8 with --fp8-param-gather)
        gathered_what = "two layers gathered"
    bucket = 0.0
    if mem.states == "deepspeed" and zero >= 2:
        bucket = min(dense_p + exp_p, DEEPSPEED_REDUCE_BUCKET_ELEMENTS) * M.grad_bytes(prec, job.grad_reduce)

    # --- per micro-batch, per chunk ----------------------------------------------------------------
    chunks = M.chunk_layers(stage, n, v, pp)
    n_stages = pp * v
    T = mb * s / cp
    x = 2.0 * T * model.hidden * u  # one sequence-sharded hidden-state tensor, 16-bit
    E = T * model.vocab / tp  # logits elements
    kw = dict(C=C, dropout=mem.dropout, rope_copies=mem.rope_copies, selective=mem.selective,
              gathered_inputs=mem.output_input_gathered and sp, fp8_saved_bytes=mem.fp8_saved_input_bytes)
    a_layer = M.activation_bytes_per_layer(model, mb, s, tp, cp, sp, par.recompute, flash, has_moe, prec, moe_load, **kw)
    a_none = M.activation_bytes_per_layer(model, mb, s, tp, cp, sp, "none", flash, has_moe, prec, moe_load, **kw)
    layer_tr = max(0.0, a_none - a_layer) if par.recompute != "none" else 0.0  # one layer re-materialised in its backward
    if cp > 1 and mem.cp_allgather_kv:
        # torch ring attention, allgather rotater (torch/distributed/tensor/experimental/
        # _context_parallel/_attention.py): the backward all-gathers every rank's K and V again
        # and accumulates the query/key/value gradients in fp32 (convert_to_f32), passing the
        # key/value gradients round the ring (the dkv rotater: the buffer sent and the one received)
        q_w, kv_w = attn_proj_dims(model)
        layer_tr += 2.0 * T * cp * kv_w / tp + 4.0 * T * (q_w + kv_w) / tp + 2 * 4.0 * T * kv_w / tp
    zb = par.schedule in ("zb-h1", "zb-h2") and pp > 1
    w_layer = M.weight_grad_kept_bytes_per_layer(model, mb, s, tp, cp, sp, prec, C) if zb else 0.0
    drop = M.has_dropout(model, mem.dropout)
    loss_extra = max(0.0, (mem.loss_peak_tp if tp > 1 else mem.loss_peak) - mem.loss_held) * E
    # per chunk c (virtual stage g = c pp + stage), as arrays
    kk = np.asarray(chunks, dtype=float)
    g = np.arange(v) * pp + stage
    first_g, last_g = g == 0, g == n_stages - 1
    act = kk * a_layer + first_g * (x * (1.5 if drop else 1.0))  # embedding output (+ its dropout mask)
    act = act + last_g * (mem.final_norm_bytes * T * model.hidden * u + 2.0 * T * model.hidden * (1.0 if mem.output_input_gathered else u))
    logit = last_g * ((mem.loss_held + (mem.pp_stage_output if pp > 1 else 0.0)) * E)
    recv = 0.0
    if mem.pp_recv_buffers and pp > 1:
        recv = m * x * float(np.sum((g > 0).astype(float) + (g < n_stages - 1)))  # one receive buffer per micro-batch and direction
        act = act + x * (g < n_stages - 1) - x * ((g > 0) & (kk > 0))  # output kept for backward; input = recv buffer
    act = np.maximum(0.0, act)
    if zb:
        wkeep = np.minimum(kk * w_layer + last_g * (2.0 * E + 2.0 * T * model.hidden * u), act + logit)
    else:
        wkeep = np.zeros(v)
    share = kk / n if n else np.full(v, 1.0 / v)
    fsh = share * (params["layers"] + exp_p)
    fsh[0] += params["embedding"]
    fsh[-1] += params["output"]
    first = step_grads * fsh / max(dense_p + exp_p, 1e-30)
    btr = np.where(kk > 0, layer_tr + gathered_b, 0.0)

    sched = par.schedule if pp > 1 else "1f1b"
    static = weights + grads_static + optim
    buffers_static = gathered + recv + bucket
    # Megatron-core's expert all-to-all overlap (combined 1F1B) runs one more warm-up forward but
    # pairs each merged step's forward layer i with backward layer L-1-i and releases each
    # layer's state as it goes (model_chunk_schedule_plan.py): the same peak as without it, plus
    # a layer's transient, which is not priced.
    tab = moment_table(sched, stage, pp, v, steady_microbatches(sched, pp, m), zb, bool(step_grads > 0))
    # Each row's memory is [held | pending | done] . [act | wkeep | first] plus what its pass adds
    # (one value per kind of pass: the loss, a layer's backward), priced for all rows at once.
    is_loss = (logit > 0) & (loss_extra >= btr - logit)
    is_lay = ~is_loss & (btr > 0)
    lay_on = is_lay & (kk > 0)
    d_act = np.concatenate(([0.0, 0.0], np.where(lay_on, layer_tr, 0.0)))
    d_buf = np.concatenate(([0.0, 0.0], np.where(lay_on, gathered_b, 0.0)))
    d_lg = np.concatenate(([0.0, loss_extra if logit[-1] > 0 else 0.0], np.where(is_loss, loss_extra, np.where(is_lay, -logit, 0.0))))
    sub = np.concatenate(([0, 1 if logit[-1] > 0 else 0], np.where(is_loss, 2, np.where(is_lay, 3, 0))))
    base = tab.hpd @ np.concatenate((act, wkeep, first)) + (d_act + d_lg + d_buf)[tab.group]
    if logit[-1] > 0:
        base = base + tab.held[:, v - 1] * logit[-1]
    key_m = base * (1 + f_res)
    if grad_sync != "step" and rs_pool > 0:
        key_m = key_m + np.maximum(0.0, rs_pool - tab.done @ first)
    r = int(np.argmax(key_m))
    gr = int(tab.group[r])
    grads = float(tab.done[r] @ first)
    acts = float(tab.held[r] @ act + tab.pending[r] @ wkeep + d_act[gr])
    lgs = float(tab.held[r] @ logit + d_lg[gr])
    buf = buffers_static + float(d_buf[gr])
    pools = ag_pool + (max(0.0, rs_pool - grads) if grad_sync != "step" else rs_pool)
    best = (static + acts + lgs + grads + buf + f_res * (acts + lgs + grads + buf - recv - bucket) + pools,
            acts, lgs, grads, buf, (r, int(sub[gr])), pools)
    step_grads_all = float(first.sum())
    pools = ag_pool + max(0.0, rs_pool - (step_grads_all if grad_sync != "step" else 0.0))
    step_key = static + step_grads_all + opt_step + buffers_static + f_res * (step_grads_all + opt_step + gathered) + pools
    if best is None or step_key > best[0] * (1 + 1e-12):
        best = (step_key, 0.0, 0.0, step_grads_all + opt_step, buffers_static, "the optimizer step", pools)
    _, acts, lgs, grads, buf, where, pools = best
    why = (tab, where[0], where[1], m, v, pp, bool(layer_tr), gathered_what) if isinstance(where, tuple) else (where,)
    dynamic = acts + lgs + grads + (buf - recv - bucket)
    reserve = f_res * dynamic + pools
    framework = C.FRAMEWORK_BUFFER_BYTES
    if par.tp_comm_overlap and sp and mem.states == "megatron":
        framework += M.tp_overlap_buffer_bytes(mb, s, cp, model.hidden, prec)
    parts = (("weights", weights), ("gradients", grads_static + grads), ("optimizer", optim), ("activations", acts),
             ("logits", lgs), ("gathered parameters", buf - recv - bucket), ("pipeline receive buffers", recv),
             ("gradient bucket", bucket), ("allocator reserve", reserve), ("outside the allocator", framework))
    return M.StageMemory(stage, n, weights, grads_static + grads, optim, acts, lgs, buf, reserve, framework, why,
                         tuple((k, v_) for k, v_ in parts if v_))


def describe_peak(why: tuple) -> str:
    """Words for a stage's peak moment (:attr:`planner.cost.memory.StageMemory.moment`)."""
    if len(why) == 1:
        return str(why[0])
    tab, r, sub, m, v, pp, recomputed, gathered_what = why
    what = tab.moment(r).describe(m, v, pp)
    what += {1: ": the loss", 2: ": the loss backward",
             3: ": its last layer's backward" + (" (re-materialised)" if recomputed else "")}.get(sub, "")
    return what + (f"; {gathered_what}" if gathered_what else "")
