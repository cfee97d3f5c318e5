"""``planner sweep``: time, cost and goodput against GPU count, with the Pareto set marked.

For each power-of-two GPU count in ``--gpus LO..HI`` the best plan (``plan(top_k=1)``) gives
the failure-free throughput; :mod:`planner.studies.goodput` gives the goodput at that GPU count
(Young/Daly checkpointing, the Llama 3 failure rate) and :mod:`planner.studies.costing` the expected
wall-clock time, GPU-hours and cost to train ``--tokens`` (default 20 per parameter,
Hoffmann et al. 2022). A row is Pareto-optimal when no other row is no worse in wall time,
cost and GPU count and better in one (:func:`planner.studies.costing.pareto_front`).
"""

from __future__ import annotations

import io
import json as _json
import math
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli import goodput as G
from planner.cli import options as O
from planner.cli.app import app
from planner.errors import InputError, NoFeasiblePlan, SolverFailure

__all__ = ["parse_gpu_range", "sweep_rows", "write_sweep_chart", "sweep_cmd"]


def parse_gpu_range(text: str) -> list[int]:
    """'256..16384' -> [256, 512, ..., 16384] (powers of two in the range); '512' -> [512]."""
    mt = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", str(text))
    if not mt:
        raise InputError("--gpus", text, "N or LO..HI (GPU counts, e.g. 256..16384)")
    lo = int(mt.group(1))
    hi = int(mt.group(2) or lo)
    if lo < 1 or hi < lo or hi > 10_000_000:
        raise InputError("--gpus", text, "1 <= LO <= HI <= 10,000,000")
    out = [2**k for k in range(0, 24) if lo <= 2**k <= hi]
    if not out:
        raise InputError("--gpus", text, "a range containing a power of two")
    return out


def sweep_rows(setups, n_tokens: float | None, price: float | None, gp_kw: dict) -> list[dict]:
    """One row per (GPU count, Setup): best plan, goodput, wall time, GPU-hours, cost, Pareto flag."""
    from planner.studies.costing import PlanPoint, pareto_front, training_cost  # noqa: PLC0415
    from planner.cost.flops import param_count  # noqa: PLC0415
    rows = []
    for n, setup in setups:
        n_params = float(param_count(setup.model))
        tokens = n_tokens if n_tokens is not None else G.default_tokens(n_params)
        row = {"gpus": n, "n_tokens": tokens}
        try:
            best = setup.best()
        except (NoFeasiblePlan, InputError, SolverFailure) as exc:
            row["error"] = str(exc).splitlines()[0]
            rows.append(row)
            continue
        e, par = best.estimate, best.parallel
        g = G.goodput_for(n, n_params, **gp_kw)
        c = training_cost(tokens, e.tokens_per_s, n, price or 0.0, max(g.goodput_fraction, 1e-300))
        row.update(parallel=f"{par.tp}/{par.pp}/{par.dp}/{par.cp}", step_time_s=e.step_time_s, tokens_per_s=e.tokens_per_s,
                   mfu=e.mfu, goodput_fraction=g.goodput_fraction, daly_interval_s=g.daly_interval_s, mtbf_s=g.mtbf_s,
                   compute_time_s=c.compute_time_s, wall_time_s=c.wall_time_s, gpu_hours=c.gpu_hours,
                   cost=c.cost if price is not None else None, tokens_per_step=setup.job.tokens_per_step)
        rows.append(row)
    ok = [r for r in rows if "error" not in r]
    pts = [PlanPoint(r["gpus"], r["step_time_s"], r["tokens_per_step"], r["goodput_fraction"], str(r["gpus"])) for r in ok]
    front = {c.point.label for c in pareto_front(pts, 1.0, 1.0)} if pts else set()  # time and GPU-h order is price-independent
    for r in ok:
        r["pareto"] = str(r["gpus"]) in front
    return rows


def write_sweep_chart(rows: list[dict], path: str, title: str, force: bool = False) -> Path:
    """Wall time (x) against GPU-hours (y), one point per GPU count, Pareto set joined."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    from planner.report.timeline_svg import write_bytes_atomic  # noqa: PLC0415

    suffix = Path(path).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise InputError("--chart", path, "a file name ending in .svg or .png")
    ok = [r for r in rows if "error" not in r]
    if not ok:
        raise InputError("--chart", path, "at least one GPU count with a plan that fits")
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    days = [r["wall_time_s"] / 86400 for r in ok]
    gpu_h = [r["gpu_hours"] for r in ok]
    ax.scatter(days, gpu_h, color="#8c8c8c", label="dominated", zorder=2)
    front = sorted((r for r in ok if r["pareto"]), key=lambda r: r["wall_time_s"])
    ax.plot([r["wall_time_s"] / 86400 for r in front], [r["gpu_hours"] for r in front], marker="o", color="#d65f5f",
            label="Pareto-optimal", zorder=3)
    for r, x, y in zip(ok, days, gpu_h):
        ax.annotate(f"{r['gpus']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("expected wall-clock time (days)")
    ax.set_ylabel("GPU-hours" + ("" if ok[0]["cost"] is None else " (cost = GPU-h x price)"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(frameon=False)
    ax.set_title(title, fontsize=9)
    import matplotlib  # noqa: PLC0415

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "planner", "svg.fonttype": "none"}):
        fig.savefig(buf, format=suffix[1:], dpi=150, bbox_inches="tight", metadata={"Date": None} if suffix == ".svg" else None)
    return write_bytes_atomic(buf.getvalue(), path, force=force, flag="--chart")


@app.command("sweep")
def sweep_cmd(
    model: O.ModelOpt = None, gpu: O.GpuOpt = None,
    gpus: Annotated[str, typer.Option("--gpus", "-n", help="GPU counts: LO..HI (powers of two in the range) or N.")] = "256..16384",
    gpus_per_node: O.GpnOpt = None, nic_gbps: O.NicOpt = None, nics_per_node: O.NicsOpt = None, network: O.NetOpt = None,
    seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None,
    fp8_recipe: O.Fp8RecipeOpt = None, fp8_param_gather: O.Fp8GatherOpt = None, fp8_tp_gather: O.Fp8TpGatherOpt = None,
    cross_entropy: O.CrossEntropyOpt = None, tokens: G.TokensOpt = None, price: G.PriceOpt = None, profile: G.ProfileOpt = None,
    ckpt: G.CkptOpt = None, restart: G.RestartOpt = None, rate: G.FailOpt = None,
    chart: Annotated[Optional[str], typer.Option("--chart", help="Write the time/GPU-hours chart to FILE.svg or FILE.png.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the chart file.")] = False,
    json: O.JsonOpt = False,
) -> None:
    """Time, goodput, GPU-hours and cost to train N tokens at each power-of-two GPU count; Pareto rows marked '*'.

    Examples:
      planner sweep --model llama3.1-70b --gpu h100-sxm5-80gb --gpus 256..4096 --tokens 15T --price-per-gpu-hour 2
      planner sweep --model gpt3-175b --gpu a100-sxm4-80gb --gpus 512..8192 -s 2048 -b 1536 --chart sweep.svg
    """
    from planner.cli.common import setup_from_flags, with_job_flags  # noqa: PLC0415

    counts = parse_gpu_range(gpus)
    n_tokens = G.parse_count("--tokens", tokens)
    if price is not None and not (0 <= price < math.inf):
        raise InputError("--price-per-gpu-hour", price, "a finite number >= 0")
    if chart is not None and Path(chart).suffix.lower() not in (".svg", ".png"):
        raise InputError("--chart", chart, "a file name ending in .svg or .png")
    if chart is not None and Path(chart).exists() and not force:
        raise InputError("--chart", chart, "a file that does not exist yet (or --force)")
    if chart is not None and not Path(chart).resolve().parent.is_dir():  # before the sweep runs, not after
        raise InputError("--chart", chart, "a file path inside an existing directory")
    gp_kw = {"ckpt_write_gbs": ckpt, "restart_s": restart, "failure_rate_per_gpu_hour": rate}
    setups = [(n, setup_from_flags(model, gpu, n, gpus_per_node, None, nic_gbps, nics_per_node, network,
                                   seq_len, global_batch_size, precision, None, {}).with_profile(profile)) for n in counts]
    for _, st in setups:
        st.job = with_job_flags(st.job, fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather, fp8_tp_gather=fp8_tp_gather,
                                cross_entropy=cross_entropy)
    rows = sweep_rows(setups, n_tokens, price, gp_kw)
    s0 = setups[0][1]
    title = f"{s0.model.name} on {s0.cluster.gpu.id}, seq {s0.job.seq_len}, batch {s0.job.global_batch_size}"
    if chart is not None:
        write_sweep_chart(rows, chart, title, force=force)
    if json:
        typer.echo(_json.dumps({"schema": "planner-sweep/1", "title": title, "price_per_gpu_hour": price, "rows": rows,
                                "chart": chart}, indent=2))
        return
    from planner.units import fmt_time  # noqa: PLC0415

    def fmt_rate(x: float) -> str:
        return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"

    typer.echo(f"{title}; {rows[0]['n_tokens']:.3g} tokens" + (f", {price:g} (your currency) per GPU-hour" if price is not None else ""))
    head = f"{'':1} {'GPUs':>6} {'tp/pp/dp/cp':<12} {'step':>8} {'tok/s':>9} {'MFU':>6} {'goodput':>7} {'wall':>9} {'GPU-h':>11}"
    typer.echo(head + (f" {'cost':>12}" if price is not None else ""))
    for r in rows:
        if "error" in r:
            typer.echo(f"  {r['gpus']:>6} no plan: {r['error'][:70]}")
            continue
        line = (f"{'*' if r['pareto'] else ' '} {r['gpus']:>6} {r['parallel']:<12} {fmt_time(r['step_time_s']):>8} {fmt_rate(r['tokens_per_s']):>9} "
                f"{100 * r['mfu']:>5.1f}% {r['goodput_fraction']:>7.4f} {G.fmt_duration(r['wall_time_s']):>9} {r['gpu_hours']:>11,.0f}")
        typer.echo(line + (f" {G.money(r['cost']):>12}" if price is not None else ""))
    typer.echo("* Pareto-optimal in (wall time, cost, GPU count)")
    if chart is not None:
        typer.echo(f"chart written to {chart}")
