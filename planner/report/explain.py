"""Why a plan takes the time and memory it does, and which single changes would help most.

* Step time: every exposed term of :attr:`Estimate.time_breakdown_s` (they add up to the step
  time), with the link each kind of communication crosses and how much of it is hidden
  behind compute (``Estimate.comm``: total vs exposed).
* Memory: :attr:`Estimate.stages` per pipeline stage (consecutive identical stages merged).
* Changes: the plan's neighbours (one knob moved: +/- one virtual stage, the next micro-batch
  size up or down, recompute one level lighter or heavier, tp x2 with pp or dp / 2 and back,
  pp x2 / dp / 2 and back, the next ZeRO stage, sequence parallelism toggled), each predicted
  with :func:`planner.cost.estimate.estimate`; the fastest that fit come first, then the ones
  that would not fit (with their peak memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.console import Group
from rich.text import Text

from planner.cost.constants import DEFAULT_CONSTANTS, Constants
from planner.cost.estimate import estimate
from planner.cost.result import Estimate
from planner.errors import InputError
from planner.report.tables import GIB, compact_table, fmt_time, gib, plural, short_link
from planner.specs import ClusterSpec, Job, ModelSpec, ParallelConfig

__all__ = ["TimeRow", "Change", "Explanation", "time_rows", "neighbours", "changes", "explain", "render_explanation"]

_TERMS = (  # breakdown key, label, comm kind (for the link and the hidden part)
    ("compute_s", "compute (fwd + bwd)", None),
    ("recompute_s", "recompute", None),
    ("tp_comm_exposed_s", "tensor-parallel comm", "tp"),
    ("cp_comm_exposed_s", "context-parallel comm", "cp"),
    ("ep_comm_exposed_s", "expert all-to-all", "ep"),
    ("pp_comm_exposed_s", "pipeline send/recv", "pp"),
    ("host_exposed_s", "host (kernel launch) time", None),
    ("bubble_s", "pipeline bubble", None),
    ("dp_comm_exposed_s", "data-parallel/ZeRO comm", "dp"),
    ("optimizer_s", "optimizer step", None),
    ("embedding_sync_s", "embedding sync", None),
    ("overhead_s", "step overhead", None),
)


@dataclass(frozen=True)
class TimeRow:
    label: str
    exposed_s: float
    hidden_s: float  # communication overlapped with compute (0 for non-communication terms)
    link: str


@dataclass(frozen=True)
class Change:
    label: str
    parallel: ParallelConfig
    estimate: Estimate
    delta_s: float  # new step time - old step time

    @property
    def fits(self) -> bool:
        return self.estimate.fits


@dataclass(frozen=True)
class Explanation:
    parallel: ParallelConfig
    estimate: Estimate
    rows: list[TimeRow]
    changes: list[Change]
    mfu_ceiling: float | None = None  # the MFU of a step whose every FLOP ran at the model's best matmul rate (mfu_ceiling())
    # MFU with attention counted as its kernels execute it: the causal half under flash attention
    # (which skips the masked blocks), the full square unfused; this one stays below mfu_ceiling
    mfu_executed: float | None = None

    def as_dict(self) -> dict:
        return {
            "mfu": self.estimate.mfu,
            "mfu_ceiling": self.mfu_ceiling,
            "mfu_executed": self.mfu_executed,
            "time": [{"term": r.label, "exposed_s": r.exposed_s, "hidden_s": r.hidden_s, "link": r.link} for r in self.rows],
            "changes": [{"change": c.label, "step_time_s": c.estimate.step_time_s, "delta_s": c.delta_s, "fits": c.fits,
                         "memory_peak_bytes": c.estimate.memory_peak_bytes} for c in self.changes],
            "memory": {"peak_stage": self.estimate.memory_peak_stage, "peak_moment": self.estimate.memory_peak_moment,
                       "usable_bytes": self.estimate.memory_usable_bytes,
                       "stages": [{"stage": s.stage, "moment": s.moment, "allocated_bytes": s.allocated_bytes,
                                   "reserved_bytes": s.reserved_bytes, "total_bytes": s.total_bytes, "parts_bytes": dict(s.parts)}
                                  for s in self.estimate.stages]},
        }


def time_rows(e: Estimate) -> list[TimeRow]:
    """The step-time terms that are not zero (or are hidden communication), in a fixed order."""
    comm = {c["kind"]: c for c in e.comm}
    rows = []
    for key, label, kind in _TERMS:
        exposed = e.time_breakdown_s.get(key, 0.0)
        c = comm.get(kind) if kind else None
        hidden = max(0.0, c["time_s"] - c["exposed_s"]) if c else 0.0
        if exposed > 0 or hidden > 0:
            rows.append(TimeRow(label, exposed, hidden, short_link(c["link"]) if c else ""))
    return rows


def _fmt(par: ParallelConfig) -> str:
    return f"tp={par.tp} pp={par.pp} dp={par.dp} cp={par.cp}" + (f" ep={par.ep}" if par.ep > 1 else "") + \
        f" mb={par.micro_batch_size} vpp={par.vpp} recompute={par.recompute} zero={par.zero}"


def neighbours(par: ParallelConfig) -> list[tuple[str, dict]]:
    """One-knob moves from ``par``: (label, fields to replace). Validity is checked by the caller."""
    out: list[tuple[str, dict]] = []
    if par.pp > 1:
        out.append((f"vpp {par.vpp} -> {par.vpp + 1}", {"vpp": par.vpp + 1}))
        if par.vpp > 1:
            out.append((f"vpp {par.vpp} -> {par.vpp - 1}", {"vpp": par.vpp - 1}))
    mb = par.micro_batch_size
    out.append((f"micro-batch {mb} -> {2 * mb}", {"micro_batch_size": 2 * mb}))
    if mb > 1:
        out.append((f"micro-batch {mb} -> {mb // 2}", {"micro_batch_size": mb // 2}))
    levels = ("none", "selective", "full")
    i = levels.index(par.recompute)
    if i > 0:
        out.append((f"recompute {par.recompute} -> {levels[i - 1]}", {"recompute": levels[i - 1]}))
    if i < 2:
        out.append((f"recompute {par.recompute} -> {levels[i + 1]}", {"recompute": levels[i + 1]}))
    for a, b in (("tp", "pp"), ("tp", "dp"), ("pp", "dp"), ("cp", "dp")):
        x, y = getattr(par, a), getattr(par, b)
        if y % 2 == 0:
            out.append((f"{a} x2, {b} /2 ({a}={2 * x}, {b}={y // 2})", {a: 2 * x, b: y // 2}))
        if x % 2 == 0:
            out.append((f"{a} /2, {b} x2 ({a}={x // 2}, {b}={2 * y})", {a: x // 2, b: 2 * y}))
    if par.zero < 3:
        out.append((f"ZeRO {par.zero} -> {par.zero + 1}", {"zero": par.zero + 1}))
    if par.zero > 0:
        out.append((f"ZeRO {par.zero} -> {par.zero - 1}", {"zero": par.zero - 1}))
    if par.tp > 1:
        sp = par.sequence_parallel
        out.append((f"sequence parallel {'off' if sp else 'on'}", {"sequence_parallel": not sp}))
    return out


def _try(model, cluster, job, par: ParallelConfig, engine: str, C: Constants, fields: dict) -> tuple[ParallelConfig, Estimate] | None:
    """The neighbour's estimate, or None when the engines would reject it. A changed pp drops
    the layer split and the interleaving it can no longer divide."""
    attempts = []
    if "pp" in fields:
        attempts = [{**fields, "layers_per_stage": None}, {**fields, "layers_per_stage": None, "vpp": 1}]
    else:
        attempts = [fields, {**fields, "layers_per_stage": None}]
    # The engine re-decides its own fields (sequence parallelism, overlaps) for the neighbour.
    free = {k: None for k in ("sequence_parallel", "tp_comm_overlap", "overlap_param_gather", "schedule") if k not in fields}
    for f in attempts:
        try:
            cand = replace(par, **{**free, **f})
            if cand.vpp == 1 and cand.schedule == "interleaved":
                cand = replace(cand, schedule="1f1b")
            e = estimate(model, cluster, job, cand, engine, C)
            return e.parallel, e
        except InputError:
            continue
    return None


def changes(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, engine: str, C: Constants,
            base: Estimate, k: int = 3) -> list[Change]:
    """The ``k`` most helpful one-knob changes: fastest that fit first, then those that do not."""
    seen = set()
    found: list[Change] = []
    for label, fields in neighbours(par):
        got = _try(model, cluster, job, par, engine, C, fields)
        if got is None or got[0] in seen:
            continue
        seen.add(got[0])
        found.append(Change(label, got[0], got[1], got[1].step_time_s - base.step_time_s))
    found.sort(key=lambda c: (not c.fits, c.estimate.step_time_s if c.fits else c.estimate.memory_peak_bytes, c.label))
    return found[:k]


def mfu_ceiling(gpu, precision: str, C: Constants) -> float:
    """The MFU a step would reach if every FLOP ran at the best matmul rate the cost model allows:
    the GPU's measured achievable matmul (MAMF, ``GpuSpec.matmul_ceiling``; kernel_throughput.md
    sec. 1.1) times the in-training fraction ``TRAINING_KERNEL_EFFICIENCY``, at the precision's
    peak, over the dense BF16 peak MFU is counted against. No kernel is priced faster
    (:func:`planner.cost.compute.gemm_time`), so no prediction's MFU exceeds it."""
    return gpu.ceiling(precision) * C.TRAINING_KERNEL_EFFICIENCY * gpu.peak(precision) / gpu.peak("bf16")


def explain(model: ModelSpec, cluster: ClusterSpec, job: Job, par: ParallelConfig, engine: str | None = None,
            constants: Constants | None = None, est: Estimate | None = None, k: int = 3) -> Explanation:
    """Why the configuration ``par`` takes its time and memory, and the ``k`` best one-knob changes."""
    C = constants or DEFAULT_CONSTANTS
    e = est or estimate(model, cluster, job, par, engine, C)
    return Explanation(e.parallel, e, time_rows(e), changes(model, cluster, job, e.parallel, e.engine, C, e, k),
                       mfu_ceiling(cluster.gpu, job.precision, C), mfu_executed(model, cluster, job, e))


def mfu_executed(model: ModelSpec, cluster: ClusterSpec, job: Job, e: Estimate) -> float:
    """``e``'s MFU with attention counted as its kernels execute it: over the causal half under a
    flash kernel (which skips the masked blocks; Dao 2023 sec. 3.1), over the full square unfused.
    The headline MFU counts the full square (Narayanan 2021 eq. 3), so at long sequences it can
    exceed :func:`mfu_ceiling`; this one cannot (tests/cost/test_ceiling.py)."""
    from planner.cost.flops import step_model_flops  # noqa: PLC0415
    from planner.specs import is_flash  # noqa: PLC0415

    if not is_flash(e.parallel.attention):
        return e.mfu
    flops = step_model_flops(model, job.global_batch_size, job.seq_len, causal=True)
    return flops / (e.step_time_s * cluster.num_gpus * cluster.gpu.peak("bf16"))


def _time_table(x: Explanation):
    e = x.estimate
    t = compact_table()
    for col, just in (("step time", "left"), ("exposed", "right"), ("share", "right"), ("hidden", "right"), ("link", "left")):
        t.add_column(col, justify=just, no_wrap=col != "step time")
    for r in x.rows:
        t.add_row(r.label, fmt_time(r.exposed_s), f"{100 * r.exposed_s / e.step_time_s:.1f}%",
                  fmt_time(r.hidden_s) if r.hidden_s > 0 else "", r.link)
    t.add_row(Text("total", style="bold"), Text(fmt_time(e.step_time_s), style="bold"), "100%", "", "")
    return t


def _memory_rows(e: Estimate) -> list[list]:
    """Stages with equal parts merged: [first, last, cells, total, moment]."""
    rows: list[list] = []
    for s in e.stages:
        vals = [str(s.layers), gib(s.weights_bytes), gib(s.gradients_bytes), gib(s.optimizer_bytes), gib(s.activations_bytes),
                gib(s.logits_bytes), gib(s.buffers_bytes + s.reserve_bytes + s.framework_bytes), gib(s.allocated_bytes),
                gib(s.total_bytes)]
        if rows and rows[-1][2] == vals and rows[-1][4] == s.moment:
            rows[-1][1] = s.stage
        else:
            rows.append([s.stage, s.stage, vals, s.total_bytes, s.moment])
    return rows


def _memory_table(e: Estimate):
    """One row per stage (equal consecutive stages merged): the parts of its peak, what tensors
    hold (alloc) and what the GPU needs (total); other = buffers + allocator reserve + memory
    outside the allocator."""
    t = compact_table()
    for col in ("stage", "layers", "weights", "grads", "optim", "acts", "logits", "other", "alloc", "total"):
        t.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
    for first, last, vals, total, _ in _memory_rows(e):
        style = "red" if total > e.memory_usable_bytes else ("yellow" if total > 0.9 * e.memory_capacity_bytes else "")
        t.add_row(str(first) if first == last else f"{first}-{last}", *vals[:-1], Text(vals[-1], style=style))
    return t


def _memory_moments(e: Estimate) -> list[Text]:
    """When each stage reaches its peak."""
    return [Text(f"  stage {f if f == l_ else f'{f}-{l_}'}: {m}") for f, l_, _, _, m in _memory_rows(e)]


def render_explanation(x: Explanation, label: str = "plan") -> Group:
    """Rich renderable: the time table, the memory table, and the changes, each under a title line."""
    e = x.estimate
    cap = e.memory_capacity_bytes
    parts = [
        Text(f"{label}: {_fmt(x.parallel)}", style="bold"),
        Text(f"step {fmt_time(e.step_time_s)}, MFU {100 * e.mfu:.1f}%"
             + (f" ({100 * x.mfu_executed:.1f}% with attention counted causally, as flash attention runs it)"
                if x.mfu_executed is not None and abs(x.mfu_executed - e.mfu) > 5e-4 else "")
             + f", bound by {e.bound}; {plural(e.num_microbatches, 'micro-batch', 'micro-batches')}, layers per stage {list(e.layers_per_stage)}"),
        *([Text(f"MFU ceiling {100 * x.mfu_ceiling:.1f}%: every FLOP at the best matmul rate the model allows on this GPU "
                "(its measured achievable matmul x the in-training kernel efficiency); attention, memory-bound "
                "kernels, communication and the bubble keep a step below it"
                + (f"; compare it with the {100 * x.mfu_executed:.1f}% that counts attention as executed (the full-square "
                   "MFU also counts the masked half flash attention skips)"
                   if x.mfu_executed is not None and abs(x.mfu_executed - e.mfu) > 5e-4 else ""))] if x.mfu_ceiling else []),
        Text(""),
        Text("Where the step time goes (exposed: on the critical path; hidden: overlapped)", style="bold"),
        _time_table(x),
        Text(""),
        Text(f"Memory per GPU by pipeline stage at its peak (GiB; capacity {cap / GIB:.1f}, usable {e.memory_usable_bytes / GIB:.1f} "
             f"with the {100 * e.memory_margin:.0f}% margin; other = buffers, the allocator's reserve "
             "and memory outside it; weights to other add up to total; alloc = what tensors hold, a subtotal: total less the "
             "reserve and memory outside the allocator)", style="bold"),
        _memory_table(e),
        Text(f"The peak is on stage {e.memory_peak_stage}. Each stage's peak moment:"),
        *_memory_moments(e),
        Text(""),
        Text("Nearest changes, best first (one knob at a time, predicted)", style="bold"),
    ]
    if not x.changes:
        parts.append(Text("  no valid neighbouring configuration"))
    for i, c in enumerate(x.changes, 1):
        ce = c.estimate
        pct = 100 * c.delta_s / e.step_time_s
        fit = f"fits, {gib(ce.memory_peak_bytes)} GiB" if c.fits else f"does NOT fit, {gib(ce.memory_peak_bytes)} GiB"
        style = "green" if c.fits and c.delta_s < 0 else ("red" if not c.fits else "")
        how = f"{abs(pct):.1f}% {'slower' if c.delta_s > 0 else 'faster'}, {c.delta_s:+.3g} s" if c.delta_s else "the same"
        parts.append(Text(f"  {i}. {c.label}: step {fmt_time(ce.step_time_s)} ({how}), {fit}", style=style))
    if x.changes and all(c.delta_s >= 0 or not c.fits for c in x.changes):
        parts.append(Text("  no single change is faster and fits: the plan is a local optimum of the cost model"))
    return Group(*parts)
