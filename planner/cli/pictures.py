"""Pictures of plans: ``planner timeline`` (pipeline schedule), ``planner chart memory`` and
``planner chart scaling``. SVG or PNG by the suffix of ``--out``; existing files are kept
unless ``--force``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli import options as O
from planner.cli.app import app
from planner.errors import InputError, NoFeasiblePlan
from planner.report.tables import compact_table, console, fmt_time, fmt_tokens, track, wrap
from planner.units import gib, plural

__all__ = ["timeline_cmd", "chart_app", "memory_chart_cmd", "scaling_chart_cmd", "parse_counts"]

chart_app = typer.Typer(help="Charts: memory per pipeline stage of a plan, throughput and MFU against GPU count. "
                        "Examples: planner chart memory plan.json --out mem.svg; "
                        "planner chart scaling --model llama3.1-8b --gpu h100-sxm5-80gb --gpus 8,16,32,64 --out scaling.png",
                        no_args_is_help=True)
app.add_typer(chart_app, name="chart")

PlanArg = Annotated[str, typer.Argument(help="A plan document written by `planner plan --json`.", metavar="PLAN.json")]
OutOpt = Annotated[str, typer.Option("--out", "-o", help="Output file: .svg or .png.")]
RankOpt = Annotated[int, typer.Option("--rank", "-r", help="Which ranked plan of the document.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")]


def _suffix(out: str, force: bool) -> str:
    """The output format; InputError for another suffix, or an existing file without --force."""
    suffix = Path(out).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise InputError("--out", out, "a file name ending in .svg or .png")
    if Path(out).exists() and not force:
        raise InputError("--out", out, "a path that does not exist yet (or --force to overwrite it)")
    return suffix


@app.command("timeline")
def timeline_cmd(plan: PlanArg, out: OutOpt, rank: RankOpt = 1, force: ForceOpt = False,
                 whole: Annotated[bool, typer.Option("--whole", help="Draw every micro-batch (no cut of the steady state).")] = False) -> None:
    """Draw the pipeline schedule of one plan: a row per stage, forward, backward, recompute,
    communication and idle time to scale; each row adds up to the predicted step time.
    Interleaved chunks are shades of one colour (chunk 0 darkest). With more than 24
    micro-batches the steady state is cut (warm-up, a few periods, a marked cut, the
    cool-down); --whole draws it all.

    Examples:
      planner plan --pp 4 --vpp 2 --json > plan.json
      planner timeline plan.json --out timeline.svg
      planner timeline plan.json --out timeline.png --rank 2 --force
    """
    from planner.report.timeline_plan import plan_context, plan_schedule, read_plan_document  # noqa: PLC0415
    from planner.report.timeline_svg import write_png, write_svg  # noqa: PLC0415

    suffix = _suffix(out, force)
    ps = plan_schedule(plan_context(read_plan_document(plan), rank))
    s = ps.schedule
    written = (write_svg if suffix == ".svg" else write_png)(s, out, force=force, summarise=False if whole else None)
    diff = 100 * (ps.pipeline_sim_s - ps.pipeline_model_s) / ps.pipeline_model_s
    console().print(f"wrote {written}: {s.kind} pp={s.pp} vpp={s.vpp} m={s.num_microbatches}, step {fmt_time(ps.step_time_s)} "
                    f"(simulated pipeline {fmt_time(ps.pipeline_sim_s)}, {diff:+.2f}% vs the cost model's closed form; "
                    f"then {fmt_time(ps.tail_s - ps.optimizer_s)} dp_comm + overhead, {fmt_time(ps.optimizer_s)} optimizer)")


_MEMORY_KEYS = (("weights_bytes", "weights"), ("gradients_bytes", "gradients"), ("optimizer_bytes", "optimizer_states"),
                ("activations_bytes", "activations"), ("logits_bytes", "logits"), ("buffers_bytes", "buffers"),
                ("reserve_bytes", "reserve"), ("framework_bytes", "outside the allocator"))  # the bars add up to the peak


@chart_app.command("memory")
def memory_chart_cmd(plan: PlanArg, out: OutOpt, rank: RankOpt = 1, force: ForceOpt = False) -> None:
    """Stacked bars of memory per GPU on each pipeline stage (weights, gradients, optimizer
    states, activations, logits, buffers, allocator reserve, memory outside the allocator)
    against the GPU's capacity; each bar adds up to the stage's predicted peak.

    Examples:
      planner plan --json > plan.json
      planner chart memory plan.json --out memory.svg
    """
    from planner.report.charts import write_memory_chart  # noqa: PLC0415
    from planner.report.timeline_plan import read_plan_document  # noqa: PLC0415

    _suffix(out, force)
    doc = read_plan_document(plan)
    entry = next((p for p in doc.get("plans") or [] if isinstance(p, dict) and p.get("rank") == rank), None)
    if entry is None:
        raise InputError("--rank", rank, "a rank present in the document")
    pred = entry.get("predicted") or {}
    by_stage = pred.get("memory_by_stage")
    if not isinstance(by_stage, list) or not by_stage:
        raise InputError(f"plans[rank={rank}].predicted.memory_by_stage", by_stage, "a list of stages")
    stages = [{name: float(s.get(key, 0.0)) for key, name in _MEMORY_KEYS} for s in by_stage]
    par = entry.get("parallel") or {}
    title = (f"{(doc.get('model') or {}).get('name', 'model')}: memory per GPU by stage "
             f"(tp={par.get('tp')} pp={par.get('pp')} dp={par.get('dp')} cp={par.get('cp')} vpp={par.get('vpp')} "
             f"mb={par.get('micro_batch_size')} {par.get('recompute')} zero={par.get('zero')})")
    written = write_memory_chart(stages, pred.get("memory_capacity_bytes", 0), out, force=force, title=title)
    console().print(f"wrote {written}: {plural(len(stages), 'stage')}, peak {gib(pred.get('memory_peak_bytes', 0))} GiB "
                    f"of {gib(pred.get('memory_capacity_bytes', 0))} GiB")


def parse_counts(text: str) -> list[int]:
    """``"64,128,256"`` -> [64, 128, 256]; InputError on anything else."""
    try:
        counts = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts) or len(set(counts)) != len(counts):
        raise InputError("--gpus", text, "distinct positive GPU counts separated by commas, e.g. 64,128,256")
    return sorted(counts)


@chart_app.command("scaling")
def scaling_chart_cmd(
    out: OutOpt,
    gpus: Annotated[str, typer.Option("--gpus", "-n", help="GPU counts separated by commas, e.g. 64,128,256,512.")] = "64,128,256,512",
    model: O.ModelOpt = None, gpu: O.GpuOpt = None, cluster: O.ClusterOpt = None, gpus_per_node: O.GpnOpt = None,
    seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None,
    force: ForceOpt = False,
) -> None:
    """Tokens/s and MFU of the best plan at each GPU count (same model, batch and sequence).

    Examples:
      planner chart scaling --model llama3.1-70b --gpu h100-sxm5-80gb --gpus 64,128,256,512 --out scaling.svg
      planner chart scaling --model gpt3-175b --cluster dgx-a100-superpod --gpus 256,512,1024 -s 2048 -b 1536 --out s.png
    """
    from planner.cli.common import setup_from_flags  # noqa: PLC0415
    from planner.report.charts import write_scaling_chart  # noqa: PLC0415
    _suffix(out, force)
    counts = parse_counts(gpus)
    points, rows, skipped = [], [], []
    for n in track(counts, "planning", total=len(counts)):
        setup = setup_from_flags(model, gpu, n, gpus_per_node, cluster, None, None, None, seq_len, global_batch_size, precision, None, {})
        try:
            best = setup.best()
        except (NoFeasiblePlan, InputError) as exc:
            skipped.append(f"{n} GPUs: {str(exc).splitlines()[0]}")
            continue
        e, p = best.estimate, best.parallel
        points.append((n, e.tokens_per_s, e.mfu))
        rows.append((str(n), f"{p.tp}/{p.pp}/{p.dp}/{p.cp}", f"{p.micro_batch_size}x{e.num_microbatches}",
                     "sel" if p.recompute == "selective" else p.recompute, fmt_time(e.step_time_s),
                     fmt_tokens(e.tokens_per_s), f"{100 * e.mfu:.1f}%"))
    for line in skipped:
        typer.echo(f"skipped {line}", err=True)
    if not points:
        raise InputError("--gpus", gpus, "at least one GPU count with a plan that fits")
    name = setup.model.name
    j = setup.job
    title = f"{name} on {setup.cluster.gpu.id}, seq {j.seq_len}, batch {j.global_batch_size}"
    written = write_scaling_chart(points, out, force=force, title=title)
    t = compact_table()
    for col in ("GPUs", "tp/pp/dp/cp", "mb x n", "rec", "step", "tok/s", "MFU"):
        t.add_column(col, justify="left" if col in ("tp/pp/dp/cp", "rec") else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    con = console()
    con.print(title)
    con.print(t)
    # scaling efficiency (tokens/s per GPU against the smallest count's) above 100%: the smaller
    # count's best plan pays for something the larger one does not (recompute, a thinner layout)
    n0, tps0, _ = points[0]
    above = [f"{n} GPUs {100 * tps * n0 / (n * tps0):.0f}%" for n, tps, _ in points[1:] if tps * n0 > n * tps0 * 1.001]
    if above:
        con.print(wrap(f"note: scaling efficiency above 100% ({', '.join(above)} of {n0} GPUs' tokens/s per GPU): the smaller "
                       "count's best plan pays for memory it lacks (recompute, more model parallelism); compare the rows' "
                       "layouts above"), style="dim")
    con.print(f"wrote {written}")

