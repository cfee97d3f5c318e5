"""From a plan document (``planner plan --json`` / ``planner estimate --json``) back to specs,
and from one plan entry to its simulated pipeline schedule.

Specs are rebuilt from the document's ``model``/``job``/``hardware`` blocks
(:func:`planner.io.loaders.model_from_dict`, :func:`planner.io.loaders.make_cluster`), the entry's
``parallel`` block and ``search.flash_attention``. The document does not carry every link
parameter of a custom cluster file (latency, efficiency, oversubscription), so
:class:`PlanContext` re-predicts the step and callers can compare it with the stored one.

Per-stage, per-micro-batch durations come from :func:`planner.cost.estimate.layer_costs` and
:func:`~planner.cost.estimate.stage_time_parts`: compute splits into forward and backward by
the dense layer's own forward/backward times (the output layer and loss by theirs), tensor-parallel
communication goes with the pass that issues it (2 all-reduces in forward, the exposed
part of 2 in backward, 2 more in a full recompute), context/expert-parallel communication
is split evenly over the passes that run it. Pipeline sends (their exposed share) are the simulator's ``p2p``
events. The simulated pipeline is followed, on every stage, by one ``dp_comm`` event and
one ``optimizer`` event so that each stage's row adds up to the predicted step time:
``optimizer`` is the predicted optimizer step, ``dp_comm`` the rest (exposed data-parallel
and ZeRO communication, embedding sync, fixed step overhead, and the difference between the
simulated pipeline and the closed form of :func:`planner.cost.step.pipeline_time`, reported in
:class:`PlanSchedule`). Zero-bubble entries draw the weight-gradient passes ("wgrad"); ZB-H2's
closed form counts each stage from its own first forward (optimizer post-validation), and so is
its drawing (:func:`planner.report.schedule.per_stage_view`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.estimate import estimate
from planner.cost.stages import dense_counts, engine_layer_costs, stage_fw, stage_time_parts
from planner.cost.step import pipeline_form, pipeline_time
from planner.engines import DEFAULT_ENGINE, default_split, get_engine
from planner.cost.result import Estimate
from planner.errors import InputError
from planner.io.loaders import make_cluster, model_from_dict, parallel_from_dict
from planner.report.schedule import Schedule, per_stage_view, simulate_schedule
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig, job_options

__all__ = ["PLAN_SCHEMAS", "PlanContext", "PlanSchedule", "read_plan_document", "plan_context", "stage_phases", "plan_schedule"]

PLAN_SCHEMAS = ("planner-plan/1", "planner-estimate/1")


@dataclass(frozen=True)
class PlanContext:
    """One plan entry with the specs it was predicted for."""

    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    parallel: ParallelConfig
    engine: str
    constants: Constants
    rank: int
    entry: dict

    @cached_property
    def estimate(self) -> Estimate:
        return estimate(self.model, self.cluster, self.job, self.parallel, self.engine, self.constants)

    @property
    def stored_step_time_s(self) -> float | None:
        return (self.entry.get("predicted") or {}).get("step_time_s")


def read_plan_document(path: str | Path) -> dict:
    """Read and check a plan document; one-line InputError when unreadable or of another schema."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("PLAN", str(path), f"a readable plan file ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("PLAN", str(path), f"JSON written by `planner plan --json` ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or doc.get("schema") not in PLAN_SCHEMAS:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"{path}.schema", got, " or ".join(PLAN_SCHEMAS) + " (written by `planner plan --json`)")
    return doc


def _block(doc: dict, key: str) -> dict:
    v = doc.get(key)
    if not isinstance(v, dict):
        raise InputError(f"plan.{key}", v, "an object")
    return v


def plan_context(doc: dict, rank: int = 1) -> PlanContext:
    """The entry ranked ``rank`` of a plan document, with rebuilt specs."""
    plans = doc.get("plans")
    if not isinstance(plans, list) or not plans:
        raise InputError("plan.plans", plans, "a non-empty list of ranked plans")
    entry = next((p for p in plans if isinstance(p, dict) and p.get("rank") == rank), None)
    if entry is None:
        raise InputError("--rank", rank, f"one of the ranks in the document {[p.get('rank') for p in plans if isinstance(p, dict)]}")
    m = dict(_block(doc, "model"))
    model = model_from_dict({k: v for k, v in m.items() if v is not None}, "plan.model")
    j = _block(doc, "job")
    try:
        job = Job(j["seq_len"], j["global_batch_size"], **job_options(j))
    except KeyError as exc:
        raise InputError(f"plan.job.{exc.args[0]}", None, "a value") from None
    hw = _block(doc, "hardware")
    for key in ("gpu", "num_gpus"):
        if key not in hw:
            raise InputError(f"plan.hardware.{key}", None, "a value")
    gpn = hw.get("gpus_per_node")
    intra = hw.get("intra_node")  # the full link description (documents since the intra_node block)
    if not isinstance(intra, dict):
        intra = {"domain_size": hw["nvlink_domain"]} if hw.get("nvlink_domain") and gpn and hw["nvlink_domain"] > gpn else None
    cluster = make_cluster(hw["gpu"], hw["num_gpus"], gpn, hw.get("inter_node"), intra)
    par_d = entry.get("parallel")
    if not isinstance(par_d, dict):
        raise InputError(f"plans[rank={rank}].parallel", par_d, "an object")
    try:
        par = parallel_from_dict(par_d)
    except TypeError as exc:
        raise InputError(f"plans[rank={rank}].parallel", par_d, f"ParallelConfig fields ({exc})") from None
    engine = get_engine(entry.get("engine") or doc.get("engine") or (doc.get("search") or {}).get("engine") or DEFAULT_ENGINE).name
    consts = doc.get("constants") or {}
    if not isinstance(consts, dict):
        raise InputError("plan.constants", consts, "an object of calibration constants")
    try:
        constants = DEFAULT_CONSTANTS.replace(**consts)
    except TypeError as exc:
        raise InputError("plan.constants", sorted(consts), f"names of calibration constants ({exc})") from None
    return PlanContext(model, cluster, job, par, engine, constants, rank, entry)


def stage_phases(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, engine: str, C: Constants) -> tuple[list[dict], float]:
    """Per stage ``{"fwd_s", "bwd_s", "recompute_s", "pp_comm_s"}`` for one micro-batch (all of
    the rank's virtual stages together) of the resolved ``par``, and the seconds of one pipeline send."""
    eng = get_engine(engine)
    costs = engine_layer_costs(model, cluster, job, par, C, eng)
    cost_d, cost_m, last_extra, pp_comm, raw = costs
    lps = par.layers_per_stage or default_split(model, par.pp, par.vpp, get_engine(engine))
    dcounts = dense_counts(model, tuple(lps))
    full = par.recompute == "full"
    fwd_frac = (cost_d["compute"] - raw["bwd_dense_s"]) / cost_d["compute"] if cost_d["compute"] > 0 else 1 / 3
    tp_f = raw["tp_fwd_exposed_s"]  # exposed tensor-parallel time of one layer's forward
    tp_b = raw["tp_bwd_exposed_s"]

    def split(cost: dict) -> tuple[float, float, float]:
        comp_f = cost["compute"] * fwd_frac
        tp_r = max(0.0, cost["tp_comm"] - tp_f - tp_b) if full else 0.0  # the recomputed forward's all-reduces
        rest = cost["cp_comm"] + cost["ep_comm"]
        share = rest / (3 if full else 2)
        # the host (launch) time follows the kernels: a third in forward, two in backward
        host = cost.get("host", 0.0)
        h_f, h_b, h_r = (host / 4, host / 2, host / 4) if full else (host / 3, 2 * host / 3, 0.0)
        return (comp_f + tp_f + share + h_f, cost["compute"] - comp_f + tp_b + share + h_b,
                cost["recompute"] + tp_r + (share if full else 0.0) + h_r)

    per_d, per_m = split(cost_d), split(cost_m)
    out = []
    for i, n in enumerate(lps):
        nd, nm = dcounts[i], n - dcounts[i]
        f, b, r = (nd * per_d[k] + nm * per_m[k] for k in range(3))
        if i == par.pp - 1:  # the output layer and loss (and any MTP modules), split as their forward and backward
            extra = sum(last_extra.values())
            share = min(1.0, raw["fw_last"][0] / extra) if extra > 0 else 0.0
            f += extra * share
            b += extra * (1 - share)
        if i == 0:  # the input embedding's tensor-parallel exchange: forward and backward halves
            extra0 = raw["first_extra"]["tp_comm"] + raw["first_extra"].get("compute", 0.0)
            f += extra0 / 2
            b += extra0 / 2
        fw_f, fw_w = stage_fw(costs, n, nd, i == par.pp - 1)
        pp_i = stage_time_parts(costs, n, nd, i == par.pp - 1, i == 0)["pp_comm"]  # what the schedule leaves exposed
        out.append({"fwd_s": f, "bwd_s": b, "recompute_s": r, "pp_comm_s": pp_i, "wgrad_s": fw_w, "fw_f_s": fw_f})
    # the simulator's one send time: the exposed share of a send (2 v sends per micro-batch on each
    # stage), so an engine that overlaps the interleaved send/recv is drawn as priced
    p2p = max(o["pp_comm_s"] for o in out) / (2 * max(1, par.vpp)) if par.pp > 1 and raw["t_p2p"] > 0 else 0.0
    return out, p2p


@dataclass(frozen=True)
class PlanSchedule:
    schedule: Schedule
    step_time_s: float          # predicted step time: every stage's row adds up to it
    pipeline_sim_s: float       # end of the last simulated pipeline event
    pipeline_model_s: float     # the cost model's closed form (planner.cost.step.pipeline_time)
    optimizer_s: float
    tail_s: float               # dp_comm + optimizer appended to every stage


def _kind(par: ParallelConfig) -> str:
    if par.schedule in ("zb-v", "dualpipe"):
        raise InputError("parallel.schedule", par.schedule,
                         "a schedule the timeline draws (1f1b, interleaved, gpipe, zb-h1, zb-h2); the V-shaped ones are priced by their closed form only")
    if par.vpp > 1:
        return "interleaved"
    return par.schedule if par.schedule in ("gpipe", "zb-h1", "zb-h2") else "1f1b"


def plan_schedule(ctx: PlanContext) -> PlanSchedule:
    """Simulate the entry's pipeline schedule; every stage's events add up to the predicted step time."""
    est = ctx.estimate
    par = est.parallel
    phases, p2p = stage_phases(ctx.model, ctx.cluster, ctx.job, par, ctx.engine, ctx.constants)
    tiny = 1e-12  # a stage without layers still has a (zero-length) place in the order
    kw = dict(
        pp=par.pp, vpp=par.vpp, num_microbatches=est.num_microbatches, kind=_kind(par),
        fwd_s=[max(tiny, s["fwd_s"]) for s in phases], bwd_s=[max(tiny, s["bwd_s"]) for s in phases],
        recompute_s=[s["recompute_s"] for s in phases], p2p_s=p2p,
        wgrad_s=[min(s["wgrad_s"], 0.999 * max(tiny, s["bwd_s"])) for s in phases],
    )
    # ZB-H2 is priced per stage (optimizer post-validation): its drawing is the per-stage view
    view = per_stage_view if par.schedule == "zb-h2" and par.pp > 1 else (lambda x: x)
    bare = view(simulate_schedule(**kw))
    span = bare.makespan_s
    m, v, t = est.num_microbatches, par.vpp, est.stage_times_s
    form = pipeline_form(par.schedule, m, v, par.pp)
    model_pipe = pipeline_time(t, [s["wgrad_s"] for s in phases], [s["fw_f_s"] for s in phases], m, form)
    step = est.step_time_s
    tail = max(0.0, step - span)
    opt = min(est.time_breakdown_s.get("optimizer_s", 0.0), tail)
    sched = view(simulate_schedule(**kw, optimizer_s=opt, dp_exposed_s=tail - opt))
    return PlanSchedule(sched, step, span, model_pipe, opt, tail)
