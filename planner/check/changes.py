"""The best changes to a job, ranked by predicted gain.

Each candidate comes from the search or from a one-knob move, priced by
:func:`planner.estimate` on the job's engine:

* ``planner.plan`` with the job's fixed fields released a few at a time (:data:`GROUPS`: the
  micro-batch, recompute, sharding, the engine's overlaps, the pipeline split, the layout, then
  everything), the rest held at the job's values, so each change says what moving only those
  fields is worth;
* the neighbours of :func:`planner.report.explain.changes` (one knob at a time).

A job that does not fit ranks the changes that make it fit first (then by step time); a job
that fits keeps only changes that fit and are faster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.check.job import CheckedJob, estimate_as_written
from planner.cost.estimate import estimate
from planner.cost.result import Estimate
from planner.errors import InputError, NoFeasiblePlan, SolverFailure
from planner.report.explain import changes as one_knob
from planner.report.reasons import TIE_PCT
from planner.search.plan import plan
from planner.search.space import FIELDS, SearchOptions
from planner.specs import ParallelConfig

__all__ = ["Change", "GROUPS", "best_changes", "what_if"]

_OVERLAPS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "async_tp_allreduce")
_LAYOUT = ("tp", "pp", "dp", "cp", "ep", "vpp", "layers_per_stage", "schedule", "sequence_parallel", "tp_comm_overlap", "etp")
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("micro-batch", ("micro_batch_size",)),
    ("recompute", ("recompute",)),
    ("micro-batch and recompute", ("micro_batch_size", "recompute")),
    ("sharding", ("zero", "zero_shard_degree") + _OVERLAPS[:2]),
    ("engine overlaps", _OVERLAPS),
    ("pipeline split", ("vpp", "layers_per_stage", "schedule", "micro_batch_size")),
    ("layout", _LAYOUT + ("micro_batch_size",)),
    # the dispatcher and the CUDA-graph capture stay: the search never picks DeepEP/HybridEP (they
    # need their package) or CUDA graphs (their capture constraints are the user's to meet)
    ("everything", tuple(k for k in ParallelConfig.__dataclass_fields__ if k not in ("moe_dispatcher", "cuda_graph"))),
)


@dataclass(frozen=True)
class Change:
    label: str
    released: tuple
    parallel: ParallelConfig
    estimate: Estimate
    gain_s: float  # current step time - new step time (> 0 faster)
    source: str  # "search" | "neighbour"

    def fields_changed(self, base: ParallelConfig) -> dict:
        a, b = base.as_dict(), self.parallel.as_dict()
        return {k: (a.get(k), b.get(k)) for k in b if a.get(k) != b.get(k)}


def _uncontrolled(cj: CheckedJob) -> tuple:
    """The fields the job's editor cannot write that the engine decides for a change. One the
    job's file sets (Megatron-DeepSpeed's --use-flash-attn) stays as the file has it: the edit
    leaves that line, so the changed job runs it too."""
    return tuple(f for f in getattr(cj.editor, "uncontrolled", ())
                 if getattr((cj.sources.get(f"parallel.{f}") or (None, None))[1], "kind", None) != "file")


def _fixed(par: ParallelConfig, released: tuple, uncontrolled: tuple = (), held: tuple = ()) -> dict:
    """The job's fields held by a search: all but the released ones and those the job's format
    does not set (the engine decides them, as it would for the change); ``held``: fields the job's
    file sets and its editor cannot change, held even when released."""
    keep = set(FIELDS) | {"layers_per_stage", "zero_shard_degree"}
    return {k: v for k, v in par.as_dict().items()
            if k in keep and (k not in released or k in held) and k not in uncontrolled and v is not None}


MIN_GAIN = TIE_PCT / 100  # the fraction of the step a change must save to be listed: the plans' tie band


def what_if(cj: CheckedJob, **fields) -> Estimate | None:
    """The estimate of the job with ``fields`` changed (engine fields that follow from them
    re-decided by the engine), or None when the engine refuses it."""
    par = cj.parallel.replace(**fields)
    try:
        return estimate_as_written(replace(cj, parallel=par))  # as the files run it: their pipeline flushes kept
    except InputError:
        return None


def best_changes(cj: CheckedJob, base: Estimate, k: int = 5, time_limit_s: float = 30.0) -> list[Change]:
    """Up to ``k`` changes, best first (see the module docstring). ``time_limit_s`` bounds all
    the searches together; a search cut short gives its best plan so far (as ``planner plan``)."""
    import time  # noqa: PLC0415

    found: dict = {}
    cross = cj.parallel.tp > cj.cluster.nvlink_domain
    deadline = time.perf_counter() + time_limit_s
    unc = _uncontrolled(cj)  # what the engine decides for a change; the rest of the editor's blind spots are held
    held = tuple(f for f in getattr(cj.editor, "uncontrolled", ()) if f not in unc)
    for n, (label, released) in enumerate(GROUPS):
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        limit = max(0.05, left / (len(GROUPS) - n) if label != "everything" else left)
        opts = SearchOptions(fixed=_fixed(cj.parallel, released, unc, held), engine=cj.engine,
                             allow_tp_across_nodes=cross)
        try:
            res = plan(cj.model, cj.cluster, cj.job, top_k=1, options=opts, time_limit_s=limit)
            best = res.plans[0] if res.plans else None
        except SolverFailure as exc:
            plans = getattr(exc.best, "plans", None) or []
            best = plans[0] if plans else None
        except (NoFeasiblePlan, InputError):
            best = None
        if best is not None:
            _add(found, _priced(cj, f"release {label}", released, best.parallel, base, "search"))
    try:
        for c in one_knob(cj.model, cj.cluster, cj.job, cj.parallel, cj.engine, None, base, k=12):
            par = c.parallel
            if par.tp == cj.parallel.tp:  # one knob: the job's own switches stay as written
                keep = {f: getattr(cj.parallel, f) for f in ("sequence_parallel", "tp_comm_overlap", "overlap_grad_reduce",
                                                            "async_tp_allreduce") if f not in unc}
                if "overlap_param_gather" not in unc:
                    keep["overlap_param_gather"] = bool(cj.parallel.overlap_param_gather) and par.zero in (1, 2)
                par = par.replace(**keep)
            _add(found, _priced(cj, c.label, (), par, base, "neighbour"))
    except InputError:
        pass
    out = [c for c in found.values() if _key(c.parallel) != _key(cj.parallel)]
    if base.fits:
        # a change must gain more than the tie band of the plan tables (0.1%): smaller ones are below
        # what the cost model can rank
        out = [c for c in out if c.estimate.fits and c.gain_s > MIN_GAIN * base.step_time_s]
        out.sort(key=lambda c: (-c.gain_s, len(c.released), c.label))
    else:
        out.sort(key=lambda c: (not c.estimate.fits, c.estimate.step_time_s if c.estimate.fits else c.estimate.memory_peak_bytes, c.label))
    return out[:k]


def _key(par: ParallelConfig) -> tuple:
    d = par.as_dict()
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def _priced(cj: CheckedJob, label: str, released: tuple, par: ParallelConfig, base: Estimate, source: str) -> Change | None:
    """The change priced by planner.estimate on the job's engine (which also checks the
    engine's rules); None when the engine refuses it."""
    try:
        e = estimate(cj.model, cj.cluster, cj.job, par, cj.engine)
    except InputError:
        return None
    return Change(label, released, e.parallel, e, base.step_time_s - e.step_time_s, source)


def _add(found: dict, c: Change | None) -> None:
    if c is None:
        return
    key = _key(c.parallel)
    old = found.get(key)
    if old is None or len(c.released) < len(old.released):
        found[key] = c if old is None else replace(c, label=c.label)
