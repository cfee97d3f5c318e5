"""Findings about a job as written, each with its evidence (numbers from
:func:`planner.estimate` on the job's engine, the job's own and a what-if's).

* ``oom`` / ``oom-risk``: the worst stage over capacity, or within 5% of it.
* ``tp-across-nodes``: tensor parallelism larger than the NVLink domain, and what its
  all-reduces cost on the network.
* ``recompute-not-needed``: a lighter recompute level still fits and is faster.
* ``idle-memory``: memory left idle while a larger micro-batch fits and is faster.
* ``sharding-costs-more``: a lower ZeRO stage / sharding mode fits and is faster.
* ``pipeline-flushes``: torchtitan's gradient accumulation under pp runs the pipeline several
  times a step; the one-run step (and its edit: the whole local batch).
* ``unbalanced-split``: pipeline stages whose times (or memory) differ by more than 5% (20%): a
  warning with the split program's faster split (and its edit), else an info.
* ``hidden-by-engine-option``: exposed communication an engine switch would hide (Megatron's
  ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``).
* ``large-bubble``: the pipeline bubble is over 10% of the step.
* reader findings (the file itself: word splitting, flags the engine rejects) and settings the
  cost model does not price (``unmodelled``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.check.changes import what_if
from planner.check.job import CheckedJob, estimate_as_written, one_run_job
from planner.cost.result import Estimate
from planner.units import GIB

__all__ = ["Finding", "findings"]

_MARGIN = 0.05  # OOM risk below 5% headroom: fragmentation beyond the modelled reserve (estimate.py's own note)


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # error | warning | info
    message: str
    evidence: dict = field(default_factory=dict)
    edit: object = None  # planner.check.edits.Edit that applies the finding's option, where its format has one

    def as_dict(self) -> dict:
        out = {"id": self.id, "severity": self.severity, "message": self.message, "evidence": dict(self.evidence)}
        if self.edit is not None:
            out["edit"] = self.edit.as_dict()
        return out


def _gib(x: float) -> float:
    return round(x / GIB, 2)


def _pct(a: float, b: float) -> float:
    return round(100 * a / b, 1) if b else 0.0


def findings(cj: CheckedJob, e: Estimate, one_run: Estimate | None = None) -> list[Finding]:
    """The findings of ``cj`` priced ``e``; ``one_run``: its configuration in one pipeline run per
    step where it has pipeline flushes (computed here when not given)."""
    out: list[Finding] = []
    p, c = cj.parallel, cj.cluster
    cap = e.memory_capacity_bytes
    worst = max(e.stages, key=lambda s: s.total_bytes)
    margin = (cap - e.memory_peak_bytes) / cap
    ev = {"peak_gib": _gib(e.memory_peak_bytes), "capacity_gib": _gib(cap), "stage": worst.stage, "margin_pct": round(100 * margin, 1),
          "weights_gib": _gib(worst.weights_bytes), "gradients_gib": _gib(worst.gradients_bytes),
          "optimizer_gib": _gib(worst.optimizer_bytes), "activations_gib": _gib(worst.activations_bytes)}
    if not e.fits:
        usable = e.memory_usable_bytes
        out.append(Finding("oom", "error", f"does not fit: stage {worst.stage} needs {_gib(e.memory_peak_bytes)} GiB, "
                           f"{_gib(usable)} GiB usable ({_gib(cap)} GiB less the {100 * e.memory_margin:.0f}% margin; "
                           f"{100 * (e.memory_peak_bytes - usable) / usable:.1f}% over)", ev))
    elif margin < _MARGIN:
        out.append(Finding("oom-risk", "warning", f"fits with {100 * margin:.1f}% headroom on stage {worst.stage}: little room for "
                           "fragmentation beyond the modelled reserve", ev))
    for fid, text in cj.findings:
        out.append(Finding(fid, "warning", text, {}))
    out += _flushes(cj, e, one_run)
    comm = {x["kind"]: x for x in e.comm}
    step = e.step_time_s
    if p.tp > c.nvlink_domain:
        t = comm.get("tp", {})
        out.append(Finding("tp-across-nodes", "warning", f"tensor parallelism {p.tp} spans {-(-p.tp // c.nvlink_domain)} NVLink domains of "
                           f"{c.nvlink_domain} GPUs: its per-layer collectives cross {t.get('link', 'the network')}",
                           {"tp": p.tp, "nvlink_domain": c.nvlink_domain, "tp_comm_exposed_s": t.get("exposed_s", 0.0),
                            "share_of_step_pct": _pct(t.get("exposed_s", 0.0), step)}))
    if e.fits and p.recompute != "none":
        for lighter in (("none", "selective") if p.recompute == "full" else ("none",)):
            alt = what_if(cj, recompute=lighter)
            if alt is not None and alt.fits and alt.step_time_s < step:
                out.append(Finding("recompute-not-needed", "warning", f"recompute {p.recompute} is not needed: {lighter} fits "
                                   f"({_gib(alt.memory_peak_bytes)} of {_gib(cap)} GiB) and saves {step - alt.step_time_s:.3g} s per step",
                                   {"recompute": p.recompute, "lighter": lighter, "peak_gib_with_lighter": _gib(alt.memory_peak_bytes),
                                    "step_s": step, "step_s_with_lighter": alt.step_time_s, "recompute_s": e.time_breakdown_s.get("recompute_s", 0.0),
                                    "parallel": {"recompute": lighter}}))
                break
    if e.fits and margin > 0.25:
        m = e.num_microbatches
        for mb in (2 * p.micro_batch_size, 4 * p.micro_batch_size):
            if cj.job.global_batch_size % (mb * p.dp):
                continue
            alt = what_if(cj, micro_batch_size=mb)
            if alt is not None and alt.fits and alt.step_time_s < step * 0.99:
                out.append(Finding("idle-memory", "info", f"{100 * margin:.0f}% of memory is idle; micro-batch {mb} fits "
                                   f"({_gib(alt.memory_peak_bytes)} GiB) and is {100 * (step - alt.step_time_s) / step:.1f}% faster",
                                   {"micro_batch": p.micro_batch_size, "micro_batches": m, "idle_gib": _gib(cap - e.memory_peak_bytes),
                                    "alt_micro_batch": mb, "alt_peak_gib": _gib(alt.memory_peak_bytes), "alt_step_s": alt.step_time_s,
                                    "parallel": {"micro_batch_size": mb}}))
                break
    if e.fits and p.zero > 0:
        for z in range(p.zero - 1, -1, -1):
            alt = what_if(cj, zero=z, overlap_param_gather=p.overlap_param_gather and z in (1, 2))
            if alt is not None and alt.fits and alt.step_time_s < step * 0.995:
                out.append(Finding("sharding-costs-more", "warning", f"ZeRO {p.zero} costs more than it saves: ZeRO {z} fits "
                                   f"({_gib(alt.memory_peak_bytes)} GiB) and saves {step - alt.step_time_s:.3g} s per step "
                                   f"(data-parallel traffic exposed now: {e.time_breakdown_s.get('dp_comm_exposed_s', 0.0):.3g} s)",
                                   {"zero": p.zero, "alt_zero": z, "dp_comm_exposed_s": e.time_breakdown_s.get("dp_comm_exposed_s", 0.0),
                                    "alt_peak_gib": _gib(alt.memory_peak_bytes), "alt_step_s": alt.step_time_s,
                                    "parallel": {"zero": z, "overlap_param_gather": p.overlap_param_gather and z in (1, 2)}}))
                break
    if p.pp > 1:
        times = list(e.stage_times_s)
        mean = sum(times) / len(times)
        mems = [s.total_bytes for s in e.stages]
        if max(times) > 1.05 * mean:
            out.append(_unbalanced(cj, e, times, mean))
        elif max(mems) > 1.2 * (sum(mems) / len(mems)):
            out.append(Finding("unbalanced-split", "info", f"stage memory is uneven: {_gib(max(mems))} GiB on the fullest stage, "
                               f"{_gib(min(mems))} GiB on the emptiest", {"memory_by_stage_gib": [_gib(x) for x in mems]}))
        bubble = e.time_breakdown_s.get("bubble_s", 0.0)
        if bubble > 0.10 * step:
            runs = (f"{cj.flushes} pipeline runs of {e.num_microbatches // cj.flushes} micro-batches (the pipeline-flushes finding)"
                    if cj.flushes > 1 else f"{e.num_microbatches} micro-batches")
            out.append(Finding("large-bubble", "warning", f"the pipeline bubble is {_pct(bubble, step)}% of the step ({runs} "
                               f"over pp {p.pp}, vpp {p.vpp})",
                               {"bubble_s": bubble, "micro_batches": e.num_microbatches, "pp": p.pp, "vpp": p.vpp}))
    out += _overlaps(cj, e)
    out += _loss_fusion(cj, e)
    for u in cj.unmodelled:
        out.append(Finding("unmodelled", "info", u, {}))
    return out


def _unbalanced(cj: CheckedJob, e: Estimate, times: list, mean: float) -> Finding:
    """Stages whose times differ: a warning with the faster split where the split program
    (planner.search.split.optimal_split) finds one, else an info (the first and last stages
    hold the embedding and the loss; no whole-layer split evens them)."""
    from planner.cost.constants import DEFAULT_CONSTANTS  # noqa: PLC0415
    from planner.engines import get_engine  # noqa: PLC0415
    from planner.errors import InputError  # noqa: PLC0415
    from planner.search.split import optimal_split  # noqa: PLC0415

    lps = list(e.layers_per_stage)
    text = f"pipeline stages are unbalanced: the slowest takes {100 * (max(times) / mean - 1):.0f}% more than the mean (layers {lps})"
    ev = {"layers_per_stage": lps, "stage_times_s": [round(t, 6) for t in times]}
    if not get_engine(cj.engine).custom_split:
        return Finding("unbalanced-split", "info", f"{text}; {cj.engine} partitions the layers itself (PipelineModule "
                       "partition_method), so no other split is offered", ev)
    try:
        best = optimal_split(cj.model, cj.cluster, one_run_job(cj), cj.parallel, e.memory_usable_bytes, DEFAULT_CONSTANTS, get_engine(cj.engine),
                             time_limit_s=2.0)
    except InputError:
        best = None
    if best is None:
        return Finding("unbalanced-split", "warning", f"{text}; the split program found no split that fits (or ran out of time)", ev)
    alt = what_if(cj, layers_per_stage=tuple(best)) if list(best) != lps else None
    if alt is not None and alt.fits and alt.step_time_s < e.step_time_s * 0.995:
        return Finding("unbalanced-split", "warning", f"{text}; the split {list(best)} saves {e.step_time_s - alt.step_time_s:.3g} s "
                       "per step", {**ev, "alt_layers_per_stage": list(best), "alt_step_s": alt.step_time_s,
                                    "parallel": {"layers_per_stage": tuple(best)}})
    return Finding("unbalanced-split", "info", f"{text}, but no other whole-layer split is faster (the first and last stages "
                   "also hold the embedding and the loss)", ev)


def _flushes(cj: CheckedJob, e: Estimate, one: Estimate | None = None) -> list[Finding]:
    """Gradient accumulation around the pipeline (torchtitan: local_batch_size below global / dp
    under pp): every accumulation step is a pipeline run with its own bubble and gradient sync."""
    import dataclasses  # noqa: PLC0415

    if cj.flushes <= 1:
        return []
    one = one or estimate_as_written(dataclasses.replace(cj, flushes=1))
    F, m, mb = cj.flushes, e.num_microbatches, cj.parallel.micro_batch_size
    gain = e.step_time_s - one.step_time_s
    text = (f"the step runs the pipeline {F} times (gradient accumulation of {m // F} micro-batch(es) each: local_batch_size "
            f"{mb * m // F}), each run with its own bubble and gradient reduce-scatter; one run of all {m} micro-batches "
            f"(local_batch_size {mb * m}) takes {one.step_time_s:.4g} s" + (f", {_pct(gain, e.step_time_s)}% faster" if gain > 0 else "")
            + ("" if one.fits else f", but needs {_gib(one.memory_peak_bytes)} GiB"))
    return [Finding("pipeline-flushes", "warning" if one.fits and gain > 0.01 * e.step_time_s else "info", text,
                    {"flushes": F, "micro_batches": m, "step_s": e.step_time_s, "one_pipeline_step_s": one.step_time_s,
                     "one_pipeline_fits": one.fits, "one_pipeline": one.fits})]


def _loss_fusion(cj: CheckedJob, e: Estimate) -> list[Finding]:
    """Megatron-core's eager cross entropy where its fused one (--cross-entropy-loss-fusion) is faster."""
    import dataclasses  # noqa: PLC0415

    from planner.cost.estimate import estimate  # noqa: PLC0415
    from planner.engines import get_engine  # noqa: PLC0415

    if cj.engine != "megatron-core" or cj.job.cross_entropy not in ("auto", "unfused"):
        return []
    alt = estimate_as_written(cj, dataclasses.replace(cj.job, cross_entropy="native"))
    step = e.step_time_s
    if alt.step_time_s >= step * 0.999:
        return []
    (f0, b0), (f1, b1) = (get_engine(cj.engine).loss_bytes(x, cj.parallel.tp, cj.job.precision) for x in ("unfused", "native"))
    return [Finding("hidden-by-engine-option", "warning", f"the loss runs Megatron's eager cross entropy ({f0:g} + {b0:g} bytes per logit); "
                    f"--cross-entropy-loss-fusion ({f1:g} + {b1:g}) would save {step - alt.step_time_s:.3g} s ({_pct(step - alt.step_time_s, step)}% of the step)",
                    {"option": "cross_entropy_loss_fusion", "step_s": step, "step_s_with_option": alt.step_time_s})]


def _overlaps(cj: CheckedJob, e: Estimate) -> list[Finding]:
    """Exposed communication an engine switch would hide (priced with the switch on)."""
    from planner.engines import dp_overlap_why, get_engine, tp_overlap_why  # noqa: PLC0415

    out = []
    p, c, eng = cj.parallel, cj.cluster, get_engine(cj.engine)
    step = e.step_time_s
    dp_exposed = e.time_breakdown_s.get("dp_comm_exposed_s", 0.0)
    tp_exposed = e.time_breakdown_s.get("tp_comm_exposed_s", 0.0)
    tries = []
    # only where the engine's sharding mode runs it (DeepSpeed: overlap_comm is a ZeRO option)
    if not p.overlap_grad_reduce and eng.overlap_grad_reduce and dp_overlap_why(eng, "overlap_grad_reduce", p.zero, p.pp) is None \
            and p.dp * p.cp > 1:
        tries.append(("overlap_grad_reduce", {"overlap_grad_reduce": True}, dp_exposed, "data-parallel traffic",
                      "the gradient reduction beside the backward"))
    if not p.overlap_param_gather and dp_overlap_why(eng, "overlap_param_gather", p.zero, p.pp) is None and p.dp * p.cp > 1:
        tries.append(("overlap_param_gather", {"overlap_param_gather": True, "overlap_grad_reduce": True}, dp_exposed, "data-parallel traffic",
                      "the ZeRO weight all-gather beside the next forward"))
    if not p.tp_comm_overlap and tp_overlap_why(eng, p.tp, p.sequence_parallel, c.nvlink_domain) is None:
        how = ("parallelism.enable_async_tensor_parallel with compile.enable: each all-gather/reduce-scatter micro-pipelined with its matmul"
               if eng.name == "torchtitan" else "each all-gather/reduce-scatter pipelined with its GEMM")
        tries.append(("tp_comm_overlap", {"tp_comm_overlap": True}, tp_exposed, "tensor-parallel all-gather/reduce-scatter", how))
    for name, fields, exposed, what, how in tries:
        alt = what_if(cj, **fields)
        if alt is not None and alt.step_time_s < step * 0.999:
            out.append(Finding("hidden-by-engine-option", "warning", f"{exposed:.3g} s of {what} is exposed; {name.replace('_', '-')} "
                               f"({how}) would save {step - alt.step_time_s:.3g} s of it ({_pct(step - alt.step_time_s, step)}% of the step)",
                               {"option": name, "exposed_s": exposed, "step_s": step, "step_s_with_option": alt.step_time_s,
                                "parallel": dict(fields)}))
    return out
