"""``planner hetero CLUSTER.yaml``: pipeline stages placed on the GPU groups of a mixed cluster.

The placement and layer split are one integer program (:mod:`planner.search.hetero`); the table
compares each plan with the even split on the same placement.
"""

from __future__ import annotations

import json as _json
from typing import Annotated, Optional

import typer

from planner.cli import options as O
from planner.cli.app import app

__all__ = ["hetero_cmd"]


@app.command("hetero")
def hetero_cmd(
    cluster_file: Annotated[str, typer.Argument(help="YAML: groups: [{gpu, count}], network: {kind, gbps_per_nic, nics_per_node}.")],
    model: O.ModelOpt = None, seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None,
    tp: O.TpOpt = None, pp: O.PpOpt = None, dp: O.DpOpt = None, micro_batch_size: O.MbOpt = None, recompute: O.RecOpt = None,
    engine: O.EngineOpt = None, fp8_recipe: O.Fp8RecipeOpt = None, fp8_param_gather: O.Fp8GatherOpt = None,
    fp8_tp_gather: O.Fp8TpGatherOpt = None, cross_entropy: O.CrossEntropyOpt = None,
    top: Annotated[int, typer.Option("--top", "-k", help="How many plans to show.")] = 3,
    time_limit: Annotated[Optional[float], typer.Option("--search-limit", help="Seconds for the whole search (default: --time-limit, 30 s); hit, it exits 3 with the best plans so far.")] = None,
    json: O.JsonOpt = False,
) -> None:
    """Place pipeline stages on the GPU groups of a mixed cluster and split layers by group speed and memory.

    Example:
      planner hetero mixed.yaml --model llama3.1-70b -s 4096 -b 256
    """
    from planner.cli.common import DEFAULTS, _default, _flag, fixed_from_flags  # noqa: PLC0415
    from planner.errors import InputError  # noqa: PLC0415
    from planner.io.loaders import load_hetero, load_model  # noqa: PLC0415
    from planner.search.hetero import hetero_plan  # noqa: PLC0415
    from planner.specs import Job  # noqa: PLC0415

    if top < 1:
        raise InputError("--top", top, "a positive integer")
    if time_limit is None:
        from planner.search.plan import TIME_LIMIT_S  # noqa: PLC0415  (the global --time-limit, when given)

        time_limit = TIME_LIMIT_S.get()
    _flag("--seq-len", seq_len, "seq")
    _flag("--global-batch-size", global_batch_size, "gbs")
    hc = load_hetero(cluster_file)
    m = load_model(_default(model, "model"))
    job = Job(_default(seq_len, "seq_len"), _default(global_batch_size, "global_batch_size"), _default(precision, "precision"),
              fp8_recipe=fp8_recipe or "auto", fp8_param_gather=fp8_param_gather, fp8_tp_gather=fp8_tp_gather,
              cross_entropy=cross_entropy or "auto")
    fixed = fixed_from_flags(tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size, recompute=recompute)
    pairs, n_cand, stats, proven = hetero_plan(m, hc, job, fixed, top_k=top, engine=engine, time_limit_s=time_limit)
    solved = stats.programs
    names = [g.gpu.id for g in hc.groups]
    if json:
        rows = [{"parallel": b.parallel.as_dict(), "placement": [names[g] for g in b.placement],
                 "layers_per_stage": list(b.layers_per_stage), "stage_times_s": list(b.stage_times_s),
                 "stage_memory_bytes": list(b.stage_memory_bytes), "step_time_s": b.step_time_s, "tokens_per_s": b.tokens_per_s,
                 "gpus_used": b.gpus_used, "even_split": {"layers_per_stage": list(e.layers_per_stage), "step_time_s": e.step_time_s,
                                                          "fits": e.fits}} for b, e in pairs]
        typer.echo(_json.dumps({"schema": "planner-hetero/1", "cluster": hc.name, "groups": [{"gpu": g.gpu.id, "count": g.count} for g in hc.groups],
                                "model": m.name, "plans": rows, "candidates": n_cand, "programs_solved": solved, "proven": proven}, indent=2))
        if not proven:
            raise typer.Exit(3)
        return
    groups = " + ".join(f"{g.count} x {g.gpu.id}" for g in hc.groups)
    typer.echo(f"{m.name} on {hc.name} ({groups}), seq {job.seq_len}, batch {job.global_batch_size}, {job.precision}")
    for i, (b, e) in enumerate(pairs, 1):
        p = b.parallel
        typer.echo(f"{i}. tp={p.tp} pp={p.pp} dp={p.dp} mb={p.micro_batch_size} recompute={p.recompute}: "
                   f"step {b.step_time_s:.4g} s, {b.tokens_per_s:,.0f} tok/s on {b.gpus_used} GPU{'s' if b.gpus_used != 1 else ''} "
                   f"(even split: {e.step_time_s:.4g} s{'' if e.fits else ', does not fit'}; {100 * (e.step_time_s / b.step_time_s - 1):+.1f}%)")
        for s, (g, n, t, mem, cap) in enumerate(zip(b.placement, b.layers_per_stage, b.stage_times_s, b.stage_memory_bytes, b.stage_capacity_bytes)):
            typer.echo(f"   stage {s}: {names[g]:<16} {n:>3} layer{'s' if n != 1 else ' '}  {1e3 * t:8.1f} ms/micro-batch  {mem / 2**30:5.1f}/{cap / 2**30:.1f} GiB usable")
    typer.echo(f"{n_cand} candidates, {solved} placement programs solved" + ("" if proven else f" (search limit {time_limit:g} s hit: best so far)"))
    if not proven:
        raise typer.Exit(3)  # as plan: a time limit hit, the best plans so far on stdout
