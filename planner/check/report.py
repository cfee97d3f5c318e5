"""The report of ``planner check``: the job as read (and where each setting came from), its
prediction (step time, tokens/s, MFU, memory per stage against capacity, bubble, exposed
communication by link), the findings and the ranked changes with their edits; as text and as
the ``planner-check/1`` JSON document (planner/schemas/check.json)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.check.changes import Change
from planner.check.job import CheckedJob
from planner.cost.result import Estimate
from planner.units import GIB, fmt_precision, plural

__all__ = ["CheckReport", "render_text", "as_json", "SCHEMA"]

SCHEMA = "planner-check/1"


@dataclass
class CheckReport:
    job: CheckedJob
    estimate: Estimate
    findings: list
    changes: list  # Change
    edits: list = field(default_factory=list)  # Edit per change (same order)
    # what the changes' gains are measured from: the job as written, or (with pipeline flushes,
    # planner.cost.accumulation) the same configuration in one pipeline run per step
    base: Estimate | None = None

    @property
    def fits(self) -> bool:
        return self.estimate.fits


def _edit_lines(ed) -> list[str]:
    """An edit's lines under a finding or a change: each changed setting, and why it was not read
    back where it was not (unless its summary already says so)."""
    if ed is None:
        return []
    out = [f"     edit: {line}" for line in ed.summary]
    if ed.verified is False and ed.problem not in " ".join(ed.summary):
        out.append(f"     (not checked: {ed.problem})")
    return out


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _par_line(p) -> str:
    s = f"tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp}" + (f" ep {p.ep} etp {p.etp}" if p.ep > 1 else "")
    s += f" vpp {p.vpp} mb {p.micro_batch_size} recompute {p.recompute} zero {p.zero}"
    s += f" sp {'on' if p.sequence_parallel else 'off'}"
    flags = [n for n, v in (("overlap-grad-reduce", p.overlap_grad_reduce), ("overlap-param-gather", p.overlap_param_gather),
                            ("tp-comm-overlap", p.tp_comm_overlap)) if v]
    return s + (" " + " ".join(flags) if flags else "")


def render_text(r: CheckReport, verbose: bool = False) -> str:
    cj, e = r.job, r.estimate
    m, c, j = cj.model, cj.cluster, cj.job
    L: list[str] = []
    L.append(f"{', '.join(cj.files)}  [{cj.fmt}, engine {cj.engine}]")
    L.append(f"  model {cj.model_id or m.name}: {m.layers} layers, hidden {m.hidden}, heads {m.heads}/{m.kv_heads}, ffn {m.ffn_hidden}, "
             f"vocab {m.vocab}" + (f", {m.moe.experts} experts top-{m.moe.top_k}" if m.moe else "")
             + (f", {m.mtp_layers} MTP module(s)" if m.mtp_layers else ""))
    L.append(f"  {c.num_gpus} x {c.gpu.id} ({c.num_nodes} node(s) x {c.gpus_per_node}); seq {j.seq_len}, global batch {j.global_batch_size}, "
             f"{fmt_precision(j.precision, j.fp8_recipe, bool(j.fp8_param_gather), bool(j.fp8_tp_gather))}"
             + (f", gradients {j.grad_reduce}" if j.grad_reduce != "auto" else ""))
    L.append(f"  as written: {_par_line(cj.parallel)}; layers per stage {list(e.layers_per_stage)}")
    moe_only = () if m.moe else ("parallel.ep", "parallel.etp", "parallel.moe_a2a_overlap", "parallel.moe_dispatcher")  # fields a dense model does not have
    defaults = [k for k, (v, s) in sorted(cj.sources.items()) if s.kind == "default" and k not in moe_only]
    flags = [k for k, (v, s) in sorted(cj.sources.items()) if s.kind == "flag"]
    if flags:
        L.append("  from the command line: " + ", ".join(f"{k}={cj.sources[k][0]}" for k in flags))
    if defaults:
        L.append("  not in the file (defaults): " + ", ".join(f"{k.split('.', 1)[1]}={_short(cj.sources[k][0])}" for k in defaults
                                                             if not k.startswith("model.") or k == "model.vocab"))
    L.append("")
    L.append(f"prediction ({cj.engine}):")
    L.append(f"  step {_fmt_s(e.step_time_s)}   {e.tokens_per_s:,.0f} tokens/s   MFU {100 * e.mfu:.1f}%   "
             f"{plural(e.num_microbatches, 'micro-batch', 'micro-batches')}")
    cap, usable = e.memory_capacity_bytes, e.memory_usable_bytes
    over = 100 * (e.memory_peak_bytes - usable) / usable
    L.append(f"  memory: peak {e.memory_peak_bytes / GIB:.1f} of {cap / GIB:.1f} GiB, "
             + (f"headroom {100 * (cap - e.memory_peak_bytes) / cap:.1f}%" if e.fits else
                f"{over:.1f}% over the {usable / GIB:.1f} GiB usable ({100 * e.memory_margin:.0f}% kept free; will not fit)"))
    rows = _stage_rows(e)
    for first, last, total, st in rows:
        name = f"stage {first}" if first == last else f"stages {first}-{last}"
        L.append(f"    {name:<14} {total / GIB:6.1f} GiB  (weights {st.weights_bytes / GIB:.1f}, grads {st.gradients_bytes / GIB:.1f}, "
                 f"optim {st.optimizer_bytes / GIB:.1f}, acts {st.activations_bytes / GIB:.1f}"
                 + (f", logits {st.logits_bytes / GIB:.1f}" if st.logits_bytes else "")
                 + f", other {(total - st.weights_bytes - st.gradients_bytes - st.optimizer_bytes - st.activations_bytes - st.logits_bytes) / GIB:.1f})" + ("  OOM" if total > cap else ""))
    b = e.time_breakdown_s
    L.append(f"  bubble {_fmt_s(b.get('bubble_s', 0.0))} ({100 * b.get('bubble_s', 0.0) / e.step_time_s:.1f}%)")
    for x in e.comm:
        if x["time_s"] > 0 or x["exposed_s"] > 0:
            L.append(f"  {x['kind']} communication on {x['link']}: {_fmt_s(x['time_s'])}, exposed {_fmt_s(x['exposed_s'])}")
    L.append("")
    L.append("findings:" if r.findings else "findings: none")
    for f in r.findings:
        if f.id == "unmodelled" and not verbose:
            continue
        L.append(f"  [{f.severity}] {f.id}: {f.message}")
        L.extend(_edit_lines(f.edit))
    unm = [f for f in r.findings if f.id == "unmodelled"]
    if unm and not verbose:
        L.append(f"  [info] {len(unm)} setting(s) the cost model does not price: " + "; ".join(f.message.split(": ")[0] for f in unm))
    L.append("")
    if not r.changes:
        L.append("changes: no other parallel configuration predicted to help (a local optimum of the search"
                 + ("; the engine options in the findings are not part of it)" if any(f.edit is not None for f in r.findings) else ")"))
    else:
        L.append("best changes (predicted, on the same engine):" if r.base is None else
                 f"best changes (predicted, on the same engine; from the job in one pipeline run per step, {_fmt_s(r.base.step_time_s)}: "
                 "the pipeline-flushes finding):")
    for i, (ch, ed) in enumerate(zip(r.changes, r.edits + [None] * len(r.changes)), 1):
        ce = ch.estimate
        gain = 100 * ch.gain_s / (r.base or e).step_time_s
        fit = f"{ce.memory_peak_bytes / GIB:.1f} GiB" + ("" if ce.fits else " DOES NOT FIT")
        how = f"{abs(gain):.1f}% {'faster' if ch.gain_s > 0 else 'slower'}" if ch.gain_s else "the same"
        L.append(f"  {i}. {ch.label}: step {_fmt_s(ce.step_time_s)} ({how}), MFU {100 * ce.mfu:.1f}%, {fit}")
        L.append(f"     {_par_line(ch.parallel)}")
        L.extend(_edit_lines(ed))
    if cj.ignored and verbose:
        L.append("")
        L.append("ignored (no effect on cost): " + "; ".join(cj.ignored))
    elif cj.ignored:
        L.append("")
        L.append(f"ignored: {len(cj.ignored)} setting(s) with no effect on cost (--verbose lists them)")
    for n in cj.notes:
        L.append(f"note: {n}")
    return "\n".join(L) + "\n"


def _short(v) -> str:
    s = str(list(v) if isinstance(v, tuple) else v)
    return s if len(s) < 40 else s[:37] + "..."


def _stage_rows(e: Estimate) -> list:
    rows = []
    for s in e.stages:
        if rows and abs(rows[-1][2] - s.total_bytes) < 1 and rows[-1][3].layers == s.layers:
            rows[-1][1] = s.stage
        else:
            rows.append([s.stage, s.stage, s.total_bytes, s])
    return rows


def _change_dict(ch: Change, ed, base) -> dict:
    out = {"label": ch.label, "source": ch.source, "released": list(ch.released), "gain_s": ch.gain_s,
           "step_time_s": ch.estimate.step_time_s, "tokens_per_s": ch.estimate.tokens_per_s, "mfu": ch.estimate.mfu,
           "memory_peak_bytes": ch.estimate.memory_peak_bytes, "fits": ch.estimate.fits, "parallel": ch.parallel.as_dict(),
           "changed": {k: {"from": a, "to": b} for k, (a, b) in ch.fields_changed(base).items()}}
    if ed is not None:
        out["edit"] = ed.as_dict()
    return out


def as_json(r: CheckReport) -> dict:
    cj, e = r.job, r.estimate
    m = cj.model
    return {
        "schema": SCHEMA,
        "files": list(cj.files),
        "format": cj.fmt,
        "engine": cj.engine,
        "fits": e.fits,
        "model": {"id": cj.model_id, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                  "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "mlp": m.mlp, "norm": m.norm, "bias": m.bias,
                  "tied_embeddings": m.tied_embeddings, "head_dim": m.head_dim,
                  "moe": None if m.moe is None else {k: getattr(m.moe, k) for k in m.moe.__dataclass_fields__},
                  "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank, "mtp_layers": m.mtp_layers},
        "hardware": {"gpu": cj.cluster.gpu.id, "num_gpus": cj.cluster.num_gpus, "gpus_per_node": cj.cluster.gpus_per_node,
                     "nvlink_domain": cj.cluster.nvlink_domain},
        "job": cj.job.as_dict(),
        "parallel": cj.parallel.as_dict(),
        "settings": cj.as_dict()["settings"],
        "ignored": list(cj.ignored),
        "unmodelled": list(cj.unmodelled),
        "notes": list(cj.notes),
        "predicted": e.as_dict(),
        "memory_margin_fraction": (e.memory_capacity_bytes - e.memory_peak_bytes) / e.memory_capacity_bytes,
        "findings": [f.as_dict() for f in r.findings],
        "changes": [_change_dict(ch, ed, cj.parallel) for ch, ed in zip(r.changes, r.edits + [None] * len(r.changes))],
        "changes_from_step_time_s": (r.base or e).step_time_s,
    }

