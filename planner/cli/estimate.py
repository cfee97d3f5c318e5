"""``planner estimate`` (one configuration) and ``planner validate`` (published runs)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.text import Text

from planner.cli import options as O
from planner.io.hf_import import import_notes
from planner.cli.app import app
from planner.cli.common import Setup, emit_json, plan_document, setup_from_cli
from planner.units import fmt_precision
from planner.errors import InputError
from planner.report.tables import console, estimate_table, track, validation_table, wrap

__all__ = ["estimate_cmd", "validate_cmd", "parallel_from_setup"]

ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="Cluster profile YAML written by planner calibrate.")]


def parallel_from_setup(setup: Setup):
    """The ParallelConfig of the fixed fields; everything unset is the engine's default (dp: the
    rest of the GPUs), exactly as ``planner.estimate`` resolves it."""
    from planner.specs import ParallelConfig  # noqa: PLC0415

    kw = {k: v for k, v in setup.fixed.items() if k in ParallelConfig.__dataclass_fields__}
    if "layers_per_stage" in kw:
        kw["layers_per_stage"] = tuple(kw["layers_per_stage"])
    return ParallelConfig(**kw)


@app.command("estimate")
def estimate_cmd(
    model: O.ModelOpt = None, gpu: O.GpuOpt = None, gpus: O.GpusOpt = None, gpus_per_node: O.GpnOpt = None,
    cluster: O.ClusterOpt = None, nic_gbps: O.NicOpt = None, nics_per_node: O.NicsOpt = None, network: O.NetOpt = None,
    seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None, attention: O.AttnOpt = None,
    engine: O.EngineOpt = None, grad_reduce: O.GradOpt = None, fp8_recipe: O.Fp8RecipeOpt = None, fp8_param_gather: O.Fp8GatherOpt = None,
    fp8_tp_gather: O.Fp8TpGatherOpt = None, cross_entropy: O.CrossEntropyOpt = None, tp: O.TpOpt = None, pp: O.PpOpt = None, dp: O.DpOpt = None, cp: O.CpOpt = None, ep: O.EpOpt = None, vpp: O.VppOpt = None,
    micro_batch_size: O.MbOpt = None, recompute: O.RecOpt = None, schedule: O.SchedOpt = None, sequence_parallel: O.SpOpt = None, zero: O.ZeroOpt = None,
    overlap_grad_reduce: O.OgrOpt = None, overlap_param_gather: O.OpgOpt = None, tp_comm_overlap: O.TpOverlapOpt = None,
    async_tp_allreduce: O.AsyncTpOpt = None,
    scenario: O.ScenarioOpt = None, id: O.IdOpt = None, profile: ProfileOpt = None, json: O.JsonOpt = False,
    memory_margin: O.MarginOpt = None, cuda_graph: O.GraphOpt = None, moe_dispatcher: O.DispatcherOpt = None,
    layers_per_stage: O.LpsOpt = None, etp: O.EtpOpt = None,
) -> None:
    """Predict one parallel configuration: step time, tokens/s, MFU, memory per stage.

    The same function as `planner.estimate`: degrees you leave out are 1 (dp: the rest of the
    GPUs), every other field you leave out is the engine's default (the output says which).
    `planner plan` searches instead.

    Examples:
      planner estimate --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --seq-len 2048 -b 1536 --tp 8 --pp 16 --mb 1 --recompute full
      planner estimate --model llama3.1-70b --gpus 64 --tp 8 --pp 4 --engine torchtitan --zero 3
      planner estimate --scenario public --id megatron-readme-gpt3-175b-1024a100 --json
    """
    from planner.cost.estimate import estimate  # noqa: PLC0415
    from planner.search.plan import Plan  # noqa: PLC0415

    setup = setup_from_cli(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len,
                           global_batch_size, precision, attention, scenario, id, engine, grad_reduce, profile, tp=tp, pp=pp, dp=dp,
                           cp=cp, ep=ep, vpp=vpp, micro_batch_size=micro_batch_size, recompute=recompute,
                           sequence_parallel=sequence_parallel, zero=zero, schedule=schedule, overlap_grad_reduce=overlap_grad_reduce,
                           overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap, async_tp_allreduce=async_tp_allreduce, cuda_graph=cuda_graph,
                           moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather,
                           fp8_tp_gather=fp8_tp_gather, cross_entropy=cross_entropy, etp=etp,
                           layers_per_stage=O.parse_layers(layers_per_stage))
    C = setup.constants if memory_margin is None else setup.constants.replace(MEMORY_MARGIN_FRACTION=O.check_margin(memory_margin))
    est = estimate(setup.model, setup.cluster, setup.job, parallel_from_setup(setup), setup.engine, C)
    best = Plan(1, est.parallel, est)
    if json:
        doc = plan_document(setup, [best], {"engine": setup.engine})
        doc["schema"] = "planner-estimate/1"
        doc["resolved_by_engine"] = list(est.resolved)
        doc["predicted"] = doc["plans"][0]["predicted"]
        doc["parallel"] = doc["plans"][0]["parallel"]
        emit_json(doc)
    else:
        con = console()
        prec = fmt_precision(setup.job.precision, est.fp8_recipe, est.fp8_param_gather, est.fp8_tp_gather)
        con.print(Text(f"{setup.model.name} on {setup.cluster.num_gpus} x {setup.cluster.gpu.id} ({setup.engine}, {prec}): {est.parallel.short()}",
                       style="bold"))
        con.print(estimate_table(est))
        unset = [f"{k}={getattr(est.parallel, k)}" for k in est.resolved]
        if setup.job.cross_entropy == "auto":
            unset.append(f"cross_entropy={est.cross_entropy}")
        if unset:
            con.print(f"unset, as the planner's {setup.engine} launch files run it: " + ", ".join(unset))
        for note in [*est.notes, *setup.notes]:  # causal MFU, FP8 MFU over the FP8 peak, a TP group across domains, ...
            con.print("note: " + note, style="dim", highlight=False)
        if (notes := import_notes(setup.model)) is not None:
            con.print(notes, style="dim")
    if not est.fits:
        import sys  # noqa: PLC0415

        cap = setup.cluster.gpu.memory_bytes * (1 - C.MEMORY_MARGIN_FRACTION)
        print(f"does not fit: stage {est.memory_peak_stage} needs {est.memory_peak_bytes / 2**30:.1f} GiB per GPU, "
              f"{cap / 2**30:.1f} GiB usable ({setup.cluster.gpu.memory_bytes / 2**30:.1f} GiB less the "
              f"{100 * C.MEMORY_MARGIN_FRACTION:.0f}% margin); `planner plan` with the same fixed flags searches the rest "
              "(and names the nearest miss when nothing fits)",
              file=sys.stderr)
        raise typer.Exit(1)


SetOpt = Annotated[Optional[str], typer.Option("--set", help="A shipped set of published runs: public | vtrain-multi | vtrain-single | modern | memory.")]


@app.command("validate")
def validate_cmd(
    runs: Annotated[Optional[str], typer.Argument(help="A runs file (schema planner-runs/1); or --set NAME.")] = None,
    dataset: SetOpt = None,
    engine: O.EngineOpt = None,
    median: Annotated[bool, typer.Option("--median/--no-median", help="Also fill unknown fields with the median feasible choice.")] = True,
    json: O.JsonOpt = False,
) -> None:
    """Predict every run of a runs file and compare with the measured step time and memory.

    Unknown (null) parallel fields are filled twice: with the planner's fastest feasible
    choice over the unknowns, and with the median one. Each run is priced on the engine it was
    measured on (or --engine). Runs the planner cannot express are listed with the reason.

    Examples:
      planner validate --set public
      planner validate --set memory --json
      planner validate my_runs.json --engine torchtitan
    """
    from planner.calibration.datasets import dataset_path  # noqa: PLC0415
    from planner.calibration.validate import summary, validate_runs  # noqa: PLC0415
    from planner.io.loaders import load_runs  # noqa: PLC0415
    from planner.search.space import SearchOptions  # noqa: PLC0415

    if (runs is None) == (dataset is None):
        raise InputError("runs", runs if runs is not None else dataset, "a runs file or --set NAME (one of the two)")
    path = str(dataset_path(dataset)) if dataset else runs
    loaded = load_runs(path)
    opts = SearchOptions(engine=engine) if engine else None
    results, refused = [], []
    for r in track(loaded, "predicting runs", total=len(loaded)):
        ok, bad = validate_runs([r], opts, median)
        results += ok
        refused += bad
    s = summary(results, refused)
    if s["n"] == 0 and s["memory"]["n"] == 0:
        first = f" (first: {refused[0].id}: {refused[0].reason})" if refused else ""
        raise InputError(path, f"{len(refused)} run(s) refused, none scored{first}", "at least one run the planner can express")
    if json:
        emit_json({"schema": "planner-validate/1", "file": path, "runs": [r.as_dict() for r in results],
                   "refused": [x.as_dict() for x in refused], "summary": s})
        return
    con = console()
    con.print(Text("predicted vs measured", style="bold"))
    con.print(validation_table(results, s, con.width))
    for x in refused:
        con.print(f"refused {x.id} ({x.engine}): {x.reason}", highlight=False, soft_wrap=True)
    if s["n"]:
        med = s["median_fill"]
        con.print(wrap(f"step time: mean absolute error {s['mape_pct']:.1f}%  max {s['max_abs_error_pct']:.1f}%  n={s['n']} "
                       f"(fastest fill); median fill {med['mape_pct']:.1f}% max {med['max_abs_error_pct']:.1f}%"))
    if s["memory"]["n"]:
        mm = s["memory"]
        con.print(wrap(f"memory: mean absolute error {mm['mape_pct']:.1f}%  max {mm['max_abs_error_pct']:.1f}%  n={mm['n']}; "
                       f"{mm['within_-5_+15_pct']} within -5..+15%, {mm['under_by_more_than_5_pct']} under by more than 5%"))
    con.print(f"refused {s['refused']} of {len(loaded)} runs")
