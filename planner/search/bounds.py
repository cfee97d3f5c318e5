"""Bounds that let the search skip work without losing the best plans (search_design.md sec. 2):
a lower bound on memory (model states only) valid for any layer split, a lower bound on step
time per candidate, and whether an uneven layer split could change a candidate's fate."""

from __future__ import annotations

from planner.cost.constants import Constants
from planner.cost.result import Estimate
from planner.cost.stages import layer_costs, p2p_send_time, stage_time_parts
from planner.cost.step import pipeline_form
from planner.cost.flops import embedding_params, layer_params
from planner.cost.memory import activation_bytes_per_layer, state_bytes_per_param
from planner.cost.memory_peak import fsdp2_unsharded_all_step, stage_grad_sync
from planner.engines.policy import fp8_gathers
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["SPLIT_MIN_GAIN", "split_gain", "only_split", "states_bound_fn", "memory_bound_fn", "in_flight_lower_bound", "per_layer_time", "p2p_per_stage", "step_lower_bound", "split_may_help",
           "peak_grows_with_micro_batch"]

# An uneven split is sought only when it could shorten the step by more than this fraction
# (or when the even split does not fit): smaller gains are below the model's resolution.
SPLIT_MIN_GAIN = 0.002


def peak_grows_with_micro_batch(engine, zero: int) -> bool:
    """Whether, at fixed degrees, ZeRO stage and schedule, a stage's peak memory grows with the
    micro-batch and with less recompute, as the search's group prune needs
    (planner.search.plan.GROUP_PRUNE). In-flight activations grow (min(pp - i, m) x mb with m =
    B / (mb dp)), and so do the held logits and receive buffers; but where FSDP2 shards the
    gradients (ZeRO >= 2), the unsharded gradients it holds between a stage's backwards and its
    reduce-scatter depend on the micro-batch count, which falls as the micro-batch grows:
    torchtitan under pipelining peaks lower at a larger micro-batch (gpt3-2.7b tp2 pp2 ZeRO-2,
    9.75 GiB at mb 1 against 8.99 at mb 2). Those are left out (all of FSDP2 with ZeRO >= 2,
    pipelined or not: tests/search/test_dominance.py samples the rest)."""
    return not (engine.memory.states == "fsdp2" and zero >= 2)


def states_bound_fn(model: ModelSpec, precision: str, C: Constants, min_first: int = 1, grad_reduce: str = "auto", engine=None,
                    parts: bool = False, fp8_params: bool = False):
    """A fast function (tp, pp, dp, cp, ep, zero, etp=None) -> model-state bytes per GPU on the most
    loaded stage, ignoring activations (a lower bound of the peak memory). ``etp``: the expert
    tensor degree the candidate runs (None: tp, Megatron-core's default; planner.engines.default_etp). ``engine``: its model-state
    recipe (planner.cost.memory.state_bytes_per_param: what every moment of its step holds).
    ``parts``: return (bytes per layer, bytes of the embedding on the first stage) held all step
    and the same two of what the optimizer-step moment adds (the gradients FSDP2 allocates per
    step, the optimizer's temporaries: planner.cost.memory_peak prices that moment as the held
    states plus these, so a stage needs at least both) instead; the bound itself counts both.
    ``fp8_params``: FP8 primary weights wherever the weights are sharded (ZeRO >= 1;
    planner.engines.fp8_gathers)."""
    # With dense first layers (DeepSeek-V3) a stage may hold either kind, so each layer is
    # counted at the cheaper of the two: the bound stays a lower bound for any split. The whole
    # step's bound (parts=False) also counts what the layer counts force (below).
    kinds = [layer_params(model, moe_layer=False)]
    counts = [model.layers]
    if model.moe is not None and model.moe_layers:
        kinds.append(layer_params(model, moe_layer=True))
        counts = [model.layers - model.moe_layers, model.moe_layers]
        if model.moe_layers == model.layers:
            kinds, counts = kinds[1:], counts[1:]
    emb_full = embedding_params(model)["embedding"]
    bpp_cache: dict = {}

    def bpp(zero: int, shard: int, pp: int) -> tuple[float, float]:
        """(held all step, added at the optimizer step) bytes per parameter."""
        key = (zero, shard, pp > 1)
        if key not in bpp_cache:
            # no engine: Megatron's recipe with TE's FP8 weight copy (memory.bytes_per_param)
            if engine is None:
                states, cache, sync, temp = "megatron", C.FP8_WEIGHT_COPY_BYTES_PER_PARAM, "step", 0.0
            else:
                states, cache, temp = engine.memory.states, engine.memory.fp8_weight_cache, engine.memory.foreach_optimizer_temp
                sync = stage_grad_sync(engine, zero, pp) if zero in engine.zero_stages else "step"
            st = state_bytes_per_param(precision, zero, shard, grad_reduce, C, states, sync, cache, temp,
                                       fp8_params=fp8_params and zero >= 1)
            bpp_cache[key] = (st["weights"] + st["gradients"] + st["optimizer"], st["step_gradients"] + st["optimizer_step"])
        return bpp_cache[key]

    def gathered(pp: int, zero: int) -> float:
        """Bytes per parameter FSDP2 keeps unsharded all step (memory_peak.fsdp2_unsharded_all_step),
        as planner.cost.memory_peak prices them (16-bit; FP8 all-gathers move 1 byte: the least)."""
        if engine is None or not fsdp2_unsharded_all_step(engine, zero, pp):
            return 0.0
        return 1.0 if precision == "fp8" else 2.0

    def kind_bytes(tp: int, ep: int, etp: int, b: float, be: float) -> list[float]:
        """Bytes of one layer of each kind at b (be for the experts) bytes per parameter."""
        return [((k["attention"] + k["mlp"]) / tp + k["norms"]) * b + k["experts"] / (etp * ep) * be for k in kinds]

    def per_layer(tp: int, ep: int, etp: int, b: float, be: float) -> float:
        return min(kind_bytes(tp, ep, etp, b, be))

    def bound(tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, etp: int | None = None):
        etp = etp or tp
        shard = dp * cp
        g = gathered(pp, zero)
        # the experts' states are sharded over the ranks that hold the same experts (memory_peak's shard_e)
        (b, b_step), (be, be_step) = bpp(zero, shard, pp), bpp(zero, max(1, shard * tp // (ep * etp)), pp)
        b, be = b + g, be + g
        emb = emb_full / tp
        emb_copies = 1 if (pp > 1 or model.tied_embeddings) else 2
        if parts:
            return (per_layer(tp, ep, etp, b, be), emb * b * emb_copies,
                    per_layer(tp, ep, etp, b_step, be_step), emb * b_step * emb_copies)
        b, be = b + b_step, be + be_step  # the optimizer-step moment holds both
        c = kind_bytes(tp, ep, etp, b, be)
        per = min(c)
        layers = -(-model.layers // pp)  # some stage holds at least this many layers
        most = layers * per
        if len(kinds) > 1:
            # of two layer kinds: the fullest stage holds at most all of the cheaper kind, the
            # rest of its layers are the dearer; and some stage holds ceil(n_k / pp) of each kind k
            cheap = 0 if c[0] <= c[1] else 1
            most = max(most + max(0, layers - counts[cheap]) * (c[1 - cheap] - c[cheap]),
                       *(-(-n // pp) * ck for n, ck in zip(counts, c)))
        if pp == 1:
            return most + emb * (1 if model.tied_embeddings else 2) * b
        # An uneven split may give the first stage (which holds the embedding) fewer layers,
        # but at least one; either that stage or the fullest one is the most loaded.
        return max(most, min_first * per + emb * b)

    return bound


def in_flight_lower_bound(schedule: str, stage: int, pp: int, m: int) -> int:
    """Micro-batches of all its layers' activations that stage ``stage`` holds at some moment of
    its step, at least: 1F1B's ``min(m, pp - stage)`` after its warm-up (Narayanan et al. 2021
    sec. 2.2.1), also for interleaved 1F1B (each chunk holds that many at the rank's first
    backward: ``(v - 1) pp + 2 (pp - stage - 1) + 1`` chunk forwards run, chunk by chunk) and
    for ZB-H1/H2 (more warm-up forwards, weight gradients held longer); GPipe holds all m; the
    V-shaped schedules at least one micro-batch (both chunks of micro-batch 0 before its first
    backward)."""
    if schedule == "gpipe":
        return m
    if schedule in ("zb-v", "dualpipe"):
        return 1
    return max(1, min(m, pp - stage))


def memory_bound_fn(model: ModelSpec, job: Job, C: Constants, engine, capacity_bytes: float):
    """A fast test, for one candidate, that no layer split can fit in ``capacity_bytes``.

    Every stage i of n_i layers needs at least the framework's device memory, its model states
    (per layer the cheaper layer kind's, the embedding on stage 0: :func:`states_bound_fn`'s
    terms) and ``in_flight_lower_bound`` micro-batches of its layers' saved activations
    (:func:`planner.cost.memory.activation_bytes_per_layer` of the cheaper layer kind, less one
    hidden-state tensor a chunk where the engine counts it as a pipeline receive buffer), and on
    the last rank the loss's held logits of those micro-batches; the bytes allocated and freed
    within the step carry the caching allocator's reserve: mem_i >= r_i + n_i (p + (1 + f) k_i a); at
    the optimizer step it holds the states and what the step adds (FSDP2's per-step gradients, the
    optimizer's temporaries, q per layer): mem_i >= r_i + n_i (p + (1 + f) q). A split fits only if
    every stage's n_i is within both (in whole units of layers, at least the engine's fewest a stage,
    :func:`planner.engines.least_layers`) and those maxima add up to the model's layers.
    Returns ``may_fit(tp, pp, dp, cp, ep, v, mb, recompute, zero, schedule, sp, flash, unit, etp=None)``
    (``etp``: the expert tensor degree, None for tp)."""
    import numpy as np  # noqa: PLC0415  (numpy is imported only where used: CLI start-up)

    mem = engine.memory
    states = states_bound_fn(model, job.precision, C, grad_reduce=job.grad_reduce, engine=engine, parts=True,
                             fp8_params=fp8_gathers(engine, job, 1))
    kinds = [False] if model.moe is None or not model.moe_layers else ([True] if model.moe_layers == model.layers else [False, True])
    L, s, h = model.layers, job.seq_len, model.hidden
    kw = dict(C=C, dropout=mem.dropout, rope_copies=mem.rope_copies, selective=mem.selective, fp8_saved_bytes=mem.fp8_saved_input_bytes)
    outer_short = engine.uneven_interleaving and engine.embedding_in_split  # least_layers: v - 1 on the outer ranks
    # What the caching allocator reserves beside what is allocated and freed within the step
    # (planner.cost.memory_peak): activations and held logits count (1 + reserve) times.
    grow = 1.0 + (C.ALLOCATOR_RESERVE_FRACTION if mem.reserve_fraction is None else mem.reserve_fraction)
    logits = mem.loss_held  # bytes per held logit (the loss's saved softmax)
    acts: dict = {}
    in_flight: dict = {}
    held_most: dict = {}

    def may_fit(tp, pp, dp, cp, ep, v, mb, rec, zero, schedule, sp, flash, unit, etp=None) -> bool:
        per, emb, per_step, emb_step = states(tp, pp, dp, cp, ep, zero, etp)
        spx = bool(sp and tp > 1)
        ak = (tp, cp, spx, mb, rec, flash)
        a = acts.get(ak)
        if a is None:
            a = acts[ak] = min(activation_bytes_per_layer(model, mb, s, tp, cp, spx, rec, flash, k, job.precision, 1.0,
                                                          gathered_inputs=mem.output_input_gathered and spx, **kw) for k in kinds)
        x = 2.0 * mb * s / cp * h / (tp if spx else 1) if (mem.pp_recv_buffers and pp > 1) else 0.0
        m = job.global_batch_size // (mb * dp)
        room0 = capacity_bytes - C.FRAMEWORK_BUFFER_BYTES
        k0 = in_flight_lower_bound(schedule if pp > 1 else "1f1b", 0, pp, m)
        held = logits * mb * s / cp * model.vocab / tp  # one micro-batch's held logits, on the last rank
        # the optimizer-step moment: the held states and the step's gradients and temporaries
        # (allocated within the step: they carry the allocator's reserve), per layer
        step_layer = per + grow * per_step
        if pp == 1:  # one stage, first and last: every layer, the embedding and the held logits at the loss
            return (L * (per + grow * k0 * a) + grow * k0 * held <= room0 - emb
                    and L * step_layer <= room0 - emb - grow * emb_step)
        if L * (per + grow * k0 * a) <= room0 - emb + grow * k0 * v * x and L * step_layer <= room0 - emb - grow * emb_step:
            return True  # the fullest stage could hold every layer at both moments: any split's stages can
        kk = (schedule, pp, m)
        ks = in_flight.get(kk)
        if ks is None:
            ks = in_flight[kk] = np.array([in_flight_lower_bound(schedule, i, pp, m) for i in range(pp)], dtype=float)
        # torch pipelining's receive buffers: one per micro-batch and direction on each chunk that
        # has a neighbour there (planner.cost.memory_peak), allocated once, whatever the split
        recv = m * x * (2.0 * v - (np.arange(pp) == 0) - (np.arange(pp) == pp - 1)) if x else 0.0
        room = room0 + grow * ks * v * x - recv
        room[0] -= emb
        if schedule not in ("zb-v", "dualpipe"):
            room[-1] -= grow * ks[-1] * held  # the loss's held logits, last rank
        if room.min() < 0:
            return False
        n_act = room / (per + grow * ks * a)
        room_step = np.full(pp, room0) - recv
        room_step[0] -= emb + grow * emb_step
        n_lim = np.minimum(n_act, room_step / step_layer)
        if v > 1:
            # Chunk-micro-batches held at the schedule's fullest moment (the memory model's own
            # moment table), each chunk of a stage of n layers holding at least floor(n / v) - d
            # of them (d = 1 on the outer ranks, whose chunks may give a slot to the embedding or
            # the loss: memory.chunk_layers), each less one hidden-state tensor where the engine
            # counts it as a receive buffer: mem_i(n) >= r_i + n p + (1 + f) a H_i ((n - v + 1) / v - d_i) - (1 + f) H_i x.
            hk = (schedule, pp, v, m)
            hs = held_most.get(hk)
            if hs is None:
                hs = held_most[hk] = _held_most(schedule, pp, v, m)
            d = np.zeros(pp)
            d[0] = d[-1] = 1.0
            room_h = np.full(pp, room0) - recv + grow * hs * x + grow * a * hs * ((v - 1) / v + d)
            room_h[0] -= emb
            n_lim = np.minimum(n_lim, room_h / (per + grow * a * hs / v))
        n_max = np.minimum(L, unit * np.floor(n_lim / unit * (1 + 1e-12)))
        least = np.full(pp, v)
        if v > 1 and outer_short:
            least[0] = least[-1] = v - 1
        return bool((n_max >= least).all() and n_max.sum() >= L)

    return may_fit


def _held_most(schedule: str, pp: int, v: int, m: int):
    """Per rank, the most chunk-micro-batches it holds at one moment of its step
    (planner.cost.memory_schedule.moment_table, as planner.cost.memory_peak walks it); zeros (no
    bound from it) where the tables are large: building them for every candidate would cost more
    memory and time than the bound saves (the 10,000-layer test)."""
    import numpy as np  # noqa: PLC0415

    from planner.cost.memory_schedule import is_small_table, most_held, steady_microbatches  # noqa: PLC0415

    steady = steady_microbatches(schedule, pp, m)
    if not is_small_table(schedule, pp, v, steady):
        return np.zeros(pp)
    zb = schedule in ("zb-h1", "zb-h2")
    return np.array([float(most_held(schedule, i, pp, v, steady, zb)) for i in range(pp)])


def per_layer_time(model: ModelSpec, cluster: ClusterSpec, job: Job, lk: tuple, C: Constants, sac: str = "korthikanti",
                   fp8: str = "te") -> tuple[float, float]:
    """(mean, least) seconds of one layer and micro-batch on one GPU over the model's layer
    kinds (dense, MoE): compute, recompute and the exposed tensor/context/expert-parallel
    traffic (no pipeline send/recv). ``lk`` = (tp, cp, ep, mb, recompute, sp, tp_comm_overlap,
    async_tp_allreduce, attention, etp, moe_a2a_overlap, moe_dispatcher, cuda_graph); with the overlap every
    pass counts as merged (the least all-to-all any schedule exposes). ``sac``: the engine's
    selective-recompute policy (:attr:`planner.engines.profile.MemoryProfile.selective`); ``fp8``: its
    FP8 cast scheme with the fewest casts any sharding runs (:func:`planner.engines.fp8_casts`)."""
    tp, cp, ep, mb, rec, sp, tpo, asy, attn, etp, a2a, disp, graph = lk
    par = ParallelConfig(tp=tp, cp=cp, ep=ep, dp=max(ep, 1), vpp=1, micro_batch_size=mb, recompute=rec, sequence_parallel=sp,
                         tp_comm_overlap=tpo, async_tp_allreduce=asy, attention=attn, etp=etp, moe_dispatcher=disp,
                         cuda_graph=graph)
    costs = layer_costs(model, cluster, job, par, C, merged=1.0 if a2a else 0.0, sac=sac, fp8=fp8)
    # Every split holds all layers, so the mean over the real mix of dense and MoE layers is
    # what the bound on sum(t_i) needs.
    dense = sum(stage_time_parts(costs, 1, 1, False).values()) - costs[3]
    moe = sum(stage_time_parts(costs, 1, 0, False).values()) - costs[3]
    n_moe = model.moe_layers if model.moe is not None else 0
    least = min(dense if n_moe < model.layers else moe, moe if n_moe else dense)
    return ((model.layers - n_moe) * dense + n_moe * moe) / model.layers, least


def p2p_per_stage(model: ModelSpec, cluster: ClusterSpec, job: Job, pk: tuple, C: Constants, overlap: bool = False) -> float:
    """The least seconds of pipeline send/recv one stage leaves exposed per micro-batch (all its
    virtual stages): all of it, or with ``overlap`` (an engine that overlaps the interleaved
    schedule's send/recv, stages.pp_comm_exposed) the share no compute window hides."""
    tp, cp, dp, pp, mb, v = pk
    if pp <= 1:
        return 0.0
    hidden = C.COMM_COMPUTE_OVERLAP_EFFICIENCY if (overlap and v > 1) else 0.0
    return (1 - hidden) * 2 * v * p2p_send_time(model, cluster, job, tp, pp, dp, cp, mb)


def step_lower_bound(layers: int, pp: int, v: int, m: int, per_layer: tuple[float, float], p2p_s: float, overhead_s: float,
                     unit: int | None = None, form: tuple[float, float, float] | None = None) -> float:
    """A step time no layer split of this candidate goes below.

    Every split has step >= (m - a) T + a sum(t) + the fixed overhead (a = 1/v: the bubble
    a (sum t - T) of the schedule ``form`` of :func:`planner.cost.step.pipeline_form`, default
    1F1B / interleaved; a zero-bubble form, whose bubble also falls with the weight-gradient
    and forward parts, is bounded by m T alone, its bubble being >= 0), with sum(t) the same
    for every split (all layers at their mean time ``per_layer[0]``, every stage's pipeline
    send/recv ``p2p_s``) and T the slowest stage: at least the mean stage, and at least a stage
    of ceil(L / (u pp)) units of u layers at the least per-layer time ``per_layer[1]`` (some
    stage holds that many: layers come in whole units, u = v chunks unless the engine takes
    uneven chunks, :func:`planner.search.split.split_unit`)."""
    u = v if unit is None else unit
    mean_l, least_l = per_layer
    total = mean_l * layers + pp * p2p_s
    fullest = least_l * u * -(-layers // (u * pp)) + p2p_s
    a, b, c = form or (1.0 / v, 0.0, 0.0)
    if b or c:
        return m * max(total / pp, fullest) + overhead_s
    return (m - a) * max(total / pp, fullest) + a * total + overhead_s


def split_gain(est: Estimate, par: ParallelConfig, unit: int | None = None, r: float | None = None) -> float:
    """The most any other layer split of this candidate could take off its step time.

    The sum of stage times is the same for every split. Any other split moves at least one unit
    of layers (a chunk of v, or one layer where the engine takes uneven chunks) onto some stage,
    which then runs at least t_light + unit * a (a: time per layer), unless the bottleneck keeps
    all its layers: the slowest stage falls to t_lb at best. The data-parallel and optimizer
    terms grow with the parameters of the largest stage, which no split brings below the mean
    (r = mean/max of the stages' parameters and layers; ``r=0`` where the stages' memory was
    not priced); both are convex and increasing in that stage's size, so each falls by at most
    (1 - r) times its full, unexposed time (tangent bound)."""
    t = est.stage_times_s
    m, v = est.num_microbatches, par.vpp
    lps = est.layers_per_stage
    light = min(range(len(t)), key=t.__getitem__)
    pp_comm = est.time_breakdown_s["pp_comm_exposed_s"] / max(1, m)
    a = max(0.0, t[light] - pp_comm) / max(1, lps[light])
    u = v if unit is None else unit
    t_lb = max(sum(t) / len(t), min(max(t), t[light] + u * a))
    if r is None:
        w = [st.weights_bytes for st in est.stages]
        r = min((sum(w) / len(w)) / max(w) if max(w) > 0 else 1.0, (sum(lps) / len(lps)) / max(lps))
    dp_total = next((c["time_s"] for c in est.comm if c["kind"] == "dp"), 0.0)
    # The pipeline term: (m - a)(T - t_lb) where the bubble is a (sum t - T) (1F1B, interleaved);
    # where it also falls with the weight-gradient and forward parts (zero-bubble schedules,
    # DualPipeV), m (T - t_lb) plus the whole bubble.
    fa, fb, fc = pipeline_form(par.schedule, m, v, par.pp)
    pipe_gain = (m - fa) * (max(t) - t_lb) if not (fb or fc) else m * (max(t) - t_lb) + est.time_breakdown_s["bubble_s"]
    return pipe_gain + (1 - r) * (dp_total + est.time_breakdown_s["optimizer_s"])


def only_split(est: Estimate, par: ParallelConfig) -> bool:
    """One layer chunk per virtual stage: no other split exists."""
    lps = est.layers_per_stage
    return par.vpp * par.pp == sum(lps) or (len(set(lps)) == 1 and lps[0] == par.vpp)


def split_may_help(est: Estimate, par: ParallelConfig, job: Job, cap: float, kth: list, top_k: int, unit: int | None = None) -> bool:
    """Whether an uneven layer split could make this candidate fit or enter the top K
    (:func:`split_gain`). A candidate whose every stage is over ``cap`` under its split cannot fit
    under any: a stage's memory grows with its layer count, and any other split gives some stage
    at least as many layers as it has now."""
    if only_split(est, par):
        return False
    if not est.fits and all(st.total_bytes > cap for st in est.stages):
        return False
    gain = split_gain(est, par, unit)
    if est.fits and gain <= SPLIT_MIN_GAIN * est.step_time_s:
        return False
    return len(kth) < top_k or est.step_time_s - gain < -kth[0]
