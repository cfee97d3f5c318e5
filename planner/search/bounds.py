"""Bounds that let the search skip work without losing the best plans (search_design.md sec. 2):
a lower bound on memory (model states only) valid for any layer split, a lower bound on step
time per candidate, and whether an uneven layer split could change a candidate's fate."""

from __future__ import annotations

from planner.cost.constants import Constants
from planner.cost.result import Estimate
from planner.cost.stages import layer_costs, stage_time_parts
from planner.cost.step import pipeline_form
from planner.cost.flops import embedding_params, layer_params
from planner.cost.memory import bytes_per_param, state_bytes_per_param
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["SPLIT_MIN_GAIN", "states_bound_fn", "per_layer_time", "p2p_per_stage", "step_lower_bound", "split_may_help"]

# An uneven split is sought only when it could shorten the step by more than this fraction
# (or when the even split does not fit): smaller gains are below the model's resolution.
SPLIT_MIN_GAIN = 0.002


def states_bound_fn(model: ModelSpec, precision: str, C: Constants, min_first: int = 1, grad_reduce: str = "auto", engine=None):
    """A fast function (tp, pp, dp, cp, ep, zero) -> model-state bytes per GPU on the most loaded
    stage, ignoring activations (a lower bound of the peak memory). ``engine``: its model-state
    recipe (planner.cost.memory.state_bytes_per_param: what every moment of its step holds)."""
    # With dense first layers (DeepSeek-V3) a stage may hold either kind, so each layer is
    # counted at the cheaper of the two: the bound stays a lower bound for any split.
    kinds = [layer_params(model, moe_layer=False)]
    if model.moe is not None and model.moe_layers:
        kinds.append(layer_params(model, moe_layer=True))
        if model.moe_layers == model.layers:
            kinds = kinds[1:]
    emb_full = embedding_params(model)["embedding"]
    bpp_cache: dict = {}

    def bpp(zero: int, shard: int) -> float:
        if (zero, shard) not in bpp_cache:
            if engine is None:
                bpp_cache[(zero, shard)] = sum(bytes_per_param(precision, zero, shard, grad_reduce, C).values())
            else:
                mem = engine.memory
                st = state_bytes_per_param(precision, zero, shard, grad_reduce, C, mem.states, "step", mem.fp8_weight_cache)
                bpp_cache[(zero, shard)] = st["weights"] + st["gradients"] + st["optimizer"]
        return bpp_cache[(zero, shard)]

    def bound(tp: int, pp: int, dp: int, cp: int, ep: int, zero: int) -> float:
        shard = dp * cp
        b, be = bpp(zero, shard), bpp(zero, max(1, shard // ep))
        per = min(((k["attention"] + k["mlp"]) / tp + k["norms"]) * b + k["experts"] / (tp * ep) * be for k in kinds)
        emb = emb_full / tp
        layers = -(-model.layers // pp)  # some stage holds at least this many layers
        if pp == 1:
            return layers * per + emb * (1 if model.tied_embeddings else 2) * b
        # An uneven split may give the first stage (which holds the embedding) fewer layers,
        # but at least one; either that stage or the fullest one is the most loaded.
        return max(layers * per, min_first * per + emb * b)

    return bound


def per_layer_time(model: ModelSpec, cluster: ClusterSpec, job: Job, lk: tuple, C: Constants) -> tuple[float, float]:
    """(mean, least) seconds of one layer and micro-batch on one GPU over the model's layer
    kinds (dense, MoE): compute, recompute and the exposed tensor/context/expert-parallel
    traffic (no pipeline send/recv). ``lk`` = (tp, cp, ep, mb, recompute, sp, tp_comm_overlap,
    async_tp_allreduce, attention, etp)."""
    tp, cp, ep, mb, rec, sp, tpo, asy, attn, etp = lk
    par = ParallelConfig(tp=tp, cp=cp, ep=ep, dp=max(ep, 1), vpp=1, micro_batch_size=mb, recompute=rec, sequence_parallel=sp,
                         tp_comm_overlap=tpo, async_tp_allreduce=asy, attention=attn, etp=etp)
    costs = layer_costs(model, cluster, job, par, C)
    # Every split holds all layers, so the mean over the real mix of dense and MoE layers is
    # what the bound on sum(t_i) needs.
    dense = sum(stage_time_parts(costs, 1, 1, False).values()) - costs[3]
    moe = sum(stage_time_parts(costs, 1, 0, False).values()) - costs[3]
    n_moe = model.moe_layers if model.moe is not None else 0
    least = min(dense if n_moe < model.layers else moe, moe if n_moe else dense)
    return ((model.layers - n_moe) * dense + n_moe * moe) / model.layers, least


def p2p_per_stage(model: ModelSpec, cluster: ClusterSpec, job: Job, pk: tuple, C: Constants) -> float:
    """Seconds of pipeline send/recv one stage pays per micro-batch (all its virtual stages)."""
    tp, cp, dp, pp, mb, v = pk
    par = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, vpp=v, micro_batch_size=mb, recompute="none", sequence_parallel=False,
                         tp_comm_overlap=False, async_tp_allreduce=False, attention="unfused")
    return layer_costs(model, cluster, job, par, C)[3]


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


def split_may_help(est: Estimate, par: ParallelConfig, job: Job, cap: float, kth: list, top_k: int, unit: int | None = None) -> bool:
    """Whether an uneven layer split could make this candidate fit or enter the top K.

    The sum of stage times is the same for every split, so no split's step time is below
    (m - 1/v) * mean(t_i) + sum(t_i)/v + the split-independent terms; the bound below also
    credits the largest possible fall of the data-parallel and optimizer terms.
    """
    if par.vpp * par.pp == sum(est.layers_per_stage) or len(set(est.layers_per_stage)) == 1 and est.layers_per_stage[0] == par.vpp:
        return False  # one layer chunk per virtual stage: no other split exists
    t = est.stage_times_s
    m, v = est.num_microbatches, par.vpp
    lps = est.layers_per_stage
    # Any other split moves at least one unit of layers (a chunk of v, or one layer where the
    # engine takes uneven chunks) onto some stage, which then runs at least t_light + unit * a
    # (a: time per layer), unless the bottleneck keeps all its layers.
    light = min(range(len(t)), key=t.__getitem__)
    pp_comm = est.time_breakdown_s["pp_comm_exposed_s"] / max(1, m)
    a = max(0.0, t[light] - pp_comm) / max(1, lps[light])
    u = v if unit is None else unit
    t_lb = max(sum(t) / len(t), min(max(t), t[light] + u * a))
    # The data-parallel and optimizer terms grow with the parameters of the largest stage, which
    # no split brings below the mean (r = mean/max of the stages' parameters and layers). Both
    # are convex and increasing in that stage's size, so each falls by at most (1 - r) times its
    # full, unexposed time (tangent bound).
    w = [st.weights_bytes for st in est.stages]
    r = min((sum(w) / len(w)) / max(w) if max(w) > 0 else 1.0, (sum(lps) / len(lps)) / max(lps))
    dp_total = next((c["time_s"] for c in est.comm if c["kind"] == "dp"), 0.0)
    # The pipeline term: (m - a)(T - t_lb) where the bubble is a (sum t - T) (1F1B, interleaved);
    # where it also falls with the weight-gradient and forward parts (zero-bubble schedules,
    # DualPipeV), m (T - t_lb) plus the whole bubble.
    a, b, c = pipeline_form(par.schedule, m, v, par.pp)
    pipe_gain = (m - a) * (max(t) - t_lb) if not (b or c) else m * (max(t) - t_lb) + est.time_breakdown_s["bubble_s"]
    gain = pipe_gain + (1 - r) * (dp_total + est.time_breakdown_s["optimizer_s"])
    if est.fits and gain <= SPLIT_MIN_GAIN * est.step_time_s:
        return False
    return len(kth) < top_k or est.step_time_s - gain < -kth[0]
