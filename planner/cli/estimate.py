"""``planner estimate`` (one configuration) and ``planner validate`` (published runs)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from planner.cli import options as O
from planner.cli.app import app
from planner.cli.common import emit_json, plan_document, setup_from_cli
from planner.errors import InputError, NoFeasiblePlan
from planner.report.tables import busy, console, estimate_table, track, validation_table

__all__ = ["estimate_cmd", "validate_cmd"]


@app.command("estimate")
def estimate_cmd(
    model: O.ModelOpt = None, gpu: O.GpuOpt = None, gpus: O.GpusOpt = None, gpus_per_node: O.GpnOpt = None,
    cluster: O.ClusterOpt = None, nic_gbps: O.NicOpt = None, nics_per_node: O.NicsOpt = None, network: O.NetOpt = None,
    seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None, attention: O.AttnOpt = None, generation: O.GenOpt = None, grad_reduce: O.GradOpt = None,
    tp: O.TpOpt = None, pp: O.PpOpt = None, dp: O.DpOpt = None, cp: O.CpOpt = None, ep: O.EpOpt = None, vpp: O.VppOpt = None,
    micro_batch_size: O.MbOpt = None, recompute: O.RecOpt = None, sequence_parallel: O.SpOpt = None, zero: O.ZeroOpt = None,
    scenario: O.ScenarioOpt = None, id: O.IdOpt = None, json: O.JsonOpt = False,
) -> None:
    """Predict one parallel configuration: step time, tokens/s, MFU, memory per stage.

    Fields you leave out are filled with the planner's best choice (the output says which).

    Examples:
      planner estimate --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --seq-len 2048 -b 1536 --tp 8 --pp 16 --mb 1 --recompute full
      planner estimate --scenario ../shared/validation/public_runs.json --id megatron-readme-gpt3-175b-1024a100 --json
    """
    from planner.search.plan import plan  # noqa: PLC0415
    from planner.search.space import SearchOptions  # noqa: PLC0415

    setup = setup_from_cli(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len,
                           global_batch_size, precision, attention, scenario, id, generation, grad_reduce, tp=tp, pp=pp, dp=dp, cp=cp,
                           ep=ep, vpp=vpp, micro_batch_size=micro_batch_size, recompute=recompute,
                           sequence_parallel=sequence_parallel, zero=zero)
    opts = SearchOptions(fixed=setup.fixed, allow_tp_across_nodes=True, flash_attention=setup.flash,
                         generation=setup.generation)
    from planner.cost.compute import supports_flash  # noqa: PLC0415
    from planner.engines import resolve_flash  # noqa: PLC0415

    flash = resolve_flash(setup.job, setup.generation, setup.flash) and supports_flash(setup.cluster.gpu)
    try:
        with busy(f"searching plans for {setup.cluster.num_gpus} GPUs"):
            result = plan(setup.model, setup.cluster, setup.job, top_k=1, options=opts)
        best = result.plans[0]
    except NoFeasiblePlan as exc:
        if exc.nearest is None:
            raise
        from planner.cost.estimate import estimate  # noqa: PLC0415
        from planner.search.plan import Plan  # noqa: PLC0415

        best = Plan(1, exc.nearest, estimate(setup.model, setup.cluster, setup.job, exc.nearest, flash_attention=flash))
    filled = sorted(k for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "recompute", "sequence_parallel", "zero") if k not in setup.fixed)
    if json:
        doc = plan_document(setup, [best], {"flash_attention": flash, "generation": setup.generation})
        doc["schema"] = "planner-estimate/1"
        doc["filled"] = filled
        doc["predicted"] = doc["plans"][0]["predicted"]
        doc["parallel"] = doc["plans"][0]["parallel"]
        emit_json(doc)
    else:
        con = console()
        p = best.parallel
        con.print(Text(f"{setup.model.name} on {setup.cluster.num_gpus} x {setup.cluster.gpu.id}: "
                       f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} mb={p.micro_batch_size} vpp={p.vpp} {p.recompute} zero={p.zero}", style="bold"))
        con.print(estimate_table(best.estimate))
        if filled:
            con.print(f"chosen by the planner: {', '.join(f'{k}={getattr(p, k)}' for k in filled)}")
    if not best.estimate.fits:
        raise typer.Exit(1)


@app.command("validate")
def validate_cmd(
    runs: Annotated[str, typer.Argument(help="A runs file (schema planner-runs/1).")],
    json: O.JsonOpt = False,
) -> None:
    """Predict every run of a runs file and compare with the measured step time.

    Unknown (null) parallel fields are filled with the best choice over the unknowns only.

    Example:
      planner validate ../shared/validation/public_runs.json
    """
    from planner.io.loaders import load_runs  # noqa: PLC0415
    from planner.calibration.validate import fill_and_predict, summary  # noqa: PLC0415

    loaded = load_runs(runs)
    results = [fill_and_predict(r) for r in track(loaded, "predicting runs", total=len(loaded))]
    s = summary(results)
    if s["n"] == 0:
        raise InputError(runs, "no run with measured.step_time_s", "at least one measured run")
    if json:
        emit_json({"schema": "planner-validate/1", "runs": [r.as_dict() for r in results], "summary": s})
    else:
        con = console()
        con.print(Text("predicted vs measured step time", style="bold"))
        con.print(validation_table(results, s))
        con.print(f"mean absolute error {s['mape_pct']:.1f}%  max {s['max_abs_error_pct']:.1f}%  n={s['n']}")
