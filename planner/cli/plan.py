"""``planner plan``: search the plans and rank them."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli import goodput as G
from planner.cli import options as O
from planner.io.hf_import import import_notes
from planner.cli.app import app
from planner.cli.common import emit_json, plan_document, precision_text, setup_from_cli
from planner.report.tables import busy, console, plans_legend, plans_view, recommendation, search_line, wrap
from planner.specs import positions_note
from planner.units import plural

__all__ = ["plan_cmd"]


@app.command("plan")
def plan_cmd(
    model: O.ModelOpt = None, gpu: O.GpuOpt = None, gpus: O.GpusOpt = None, gpus_per_node: O.GpnOpt = None,
    cluster: O.ClusterOpt = None, nic_gbps: O.NicOpt = None, nics_per_node: O.NicsOpt = None, network: O.NetOpt = None,
    seq_len: O.SeqOpt = None, global_batch_size: O.GbsOpt = None, precision: O.PrecOpt = None, attention: O.AttnOpt = None, engine: O.EngineOpt = None, grad_reduce: O.GradOpt = None, fp8_recipe: O.Fp8RecipeOpt = None, fp8_param_gather: O.Fp8GatherOpt = None,
    fp8_tp_gather: O.Fp8TpGatherOpt = None, cross_entropy: O.CrossEntropyOpt = None, tp: O.TpOpt = None, pp: O.PpOpt = None, dp: O.DpOpt = None, cp: O.CpOpt = None, ep: O.EpOpt = None, vpp: O.VppOpt = None,
    micro_batch_size: O.MbOpt = None, recompute: O.RecOpt = None, schedule: O.SchedOpt = None, sequence_parallel: O.SpOpt = None, zero: O.ZeroOpt = None,
    overlap_grad_reduce: O.OgrOpt = None, overlap_param_gather: O.OpgOpt = None, tp_comm_overlap: O.TpOverlapOpt = None,
    async_tp_allreduce: O.AsyncTpOpt = None,
    scenario: O.ScenarioOpt = None, id: O.IdOpt = None, json: O.JsonOpt = False,
    top: Annotated[int, typer.Option("--top", "-k", help="How many plans to return.")] = 10,
    allow_tp_across_nodes: Annotated[bool, typer.Option("--allow-tp-across-nodes", help="Let tensor parallelism leave the NVLink domain.")] = False,
    emit: Annotated[Optional[str], typer.Option("--emit", help="Also write launch files: megatron | deepspeed | torchtitan | slurm | all.")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Folder for --emit files.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Explain the best plan: time and memory breakdown, changes that would help.")] = False,
    objective: G.ObjectiveOpt = "time", price: G.PriceOpt = None, tokens: G.TokensOpt = None, profile: G.ProfileOpt = None,
    ckpt_write_gbs: G.CkptOpt = None, restart_s: G.RestartOpt = None, failure_rate: G.FailOpt = None,
    memory_margin: O.MarginOpt = None, cuda_graph: O.GraphOpt = None, moe_dispatcher: O.DispatcherOpt = None,
) -> None:
    """Search parallel plans (tp, pp, dp, cp, micro-batch, interleaving, recompute, ZeRO, layer split) and rank them.

    With no arguments: Llama 3.1 70B on 64 H100, 8K sequence, 256 x 8K tokens per step.

    Examples:
      planner plan
      planner plan --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 -s 2048 -b 1536 --top 5
      planner plan --scenario runs.json --id my-run --json > plan.json
      planner plan --model llama3.1-8b --gpus 8 --emit all --out launch/
      planner plan --model path/to/config.json --cluster dgx-h100-superpod --gpus 256 --explain
      planner plan --objective goodput --tokens 1.4T --price-per-gpu-hour 2 --profile my-cluster.yaml
    """
    _plan(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len, global_batch_size,
          precision, attention, engine, tp, pp, dp, cp, ep, vpp, micro_batch_size, recompute, sequence_parallel, zero, scenario,
          id, json, top, allow_tp_across_nodes, emit, out, force, explain, objective, price, tokens, ckpt_write_gbs,
          restart_s, failure_rate, grad_reduce, profile, schedule, memory_margin, cuda_graph, moe_dispatcher, fp8_recipe, fp8_param_gather,
          fp8_tp_gather, cross_entropy, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, async_tp_allreduce)


def _plan(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len, global_batch_size,
          precision, attention, engine, tp, pp, dp, cp, ep, vpp, micro_batch_size, recompute, sequence_parallel, zero, scenario,
          id, json, top, allow_tp_across_nodes, emit, out, force, explain, objective, price, tokens, ckpt_write_gbs,
          restart_s, failure_rate, grad_reduce=None, profile=None, schedule=None, memory_margin=None, cuda_graph=None,
          moe_dispatcher=None, fp8_recipe=None, fp8_param_gather=None, fp8_tp_gather=None, cross_entropy=None,
          overlap_grad_reduce=None, overlap_param_gather=None, tp_comm_overlap=None, async_tp_allreduce=None) -> None:
    from planner.search.plan import plan  # noqa: PLC0415

    schedule, schedules = O.schedule_list(schedule)
    emit_engine = engine is None and emit in ("torchtitan", "deepspeed")
    if emit_engine:
        engine = emit  # plans for the engine the files are for (an explicit --engine wins)
    setup = setup_from_cli(model, gpu, gpus, gpus_per_node, cluster, nic_gbps, nics_per_node, network, seq_len,
                           global_batch_size, precision, attention, scenario, id, engine, grad_reduce, profile, tp=tp, pp=pp, dp=dp,
                           cp=cp, ep=ep, vpp=vpp, micro_batch_size=micro_batch_size, recompute=recompute,
                           sequence_parallel=sequence_parallel, zero=zero, schedule=schedule, overlap_grad_reduce=overlap_grad_reduce,
                           overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap, async_tp_allreduce=async_tp_allreduce, allow_auto=True,
                           cuda_graph=cuda_graph, moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe,
                           fp8_param_gather=fp8_param_gather, fp8_tp_gather=fp8_tp_gather,
                           cross_entropy=cross_entropy)
    if schedules or schedule:
        O.check_schedules(schedules or (schedule,), setup.engine)
    opts = setup.options(allow_tp_across_nodes=allow_tp_across_nodes, memory_margin=O.check_margin(memory_margin), schedules=schedules)
    from planner.cost.flops import param_count  # noqa: PLC0415

    n_tokens = G.parse_count("--tokens", tokens)
    gp = None
    if objective == "goodput" or n_tokens is not None or price is not None:
        gp = G.goodput_for(setup.cluster.num_gpus, float(param_count(setup.model)), ckpt_write_gbs=ckpt_write_gbs,
                           restart_s=restart_s, failure_rate_per_gpu_hour=failure_rate, gpus_per_node=setup.cluster.gpus_per_node)
    with busy(f"searching plans for {setup.cluster.num_gpus} GPUs"):
        result = plan(setup.model, setup.cluster, setup.job, top_k=top, options=opts, objective=objective, goodput=gp,
                      constants=setup.constants)
    doc = plan_document(setup, result.plans, result.search_dict())
    gp_text: list[str] = []
    if gp is not None:
        n_tok = n_tokens if n_tokens is not None else G.default_tokens(float(param_count(setup.model)))
        best_tps = result.plans[0].estimate.tokens_per_s
        doc["goodput"] = G.goodput_dict(gp, n_tok, best_tps, price)
        gp_text = [f"plan 1 with failures (objective {objective}):"] + ["  " + x for x in G.goodput_lines(gp, n_tok, best_tps, price)]
    if explain:
        from planner.report.explain import explain as explain_plan, render_explanation  # noqa: PLC0415

        best = result.plans[0]
        explanation = explain_plan(setup.model, setup.cluster, setup.job, best.parallel, setup.engine, setup.constants, best.estimate)
        if json:
            doc["explanation"] = explanation.as_dict()
    if emit:
        if not out:
            from planner.errors import InputError  # noqa: PLC0415

            raise InputError("--out", None, "a folder for the --emit files")
        from planner.emit import emit_bundle, write_files  # noqa: PLC0415

        files, skipped = emit_bundle(doc, emit, rank=1)
        written = write_files(files, out, force=force)
        for eng, why in skipped.items():  # --emit all: the engines that cannot run the plan, and why (as launch says)
            typer.echo(f"skipped {eng}: {why}", err=True)
        if not json:
            console().print("wrote " + ", ".join(str(w) for w in written))
            if emit in ("torchtitan", "all"):  # say which torchtitan version got no files, and why
                from planner.emit.common import load_plan_view  # noqa: PLC0415
                from planner.emit.torchtitan import titan_versions  # noqa: PLC0415
                from planner.errors import InputError  # noqa: PLC0415

                try:
                    for ver, why in titan_versions(load_plan_view(doc, 1))[1].items():
                        console().print(f"no torchtitan {ver} files: {why}", highlight=False, soft_wrap=True)
                except InputError:
                    pass  # no version runs it: emit_files said so
    if json:
        emit_json(doc)
        return
    c, j = setup.cluster, setup.job
    title = (f"{setup.model.name} on {c.num_gpus} x {c.gpu.id} ({plural(c.num_nodes, 'node')}), seq {j.seq_len}, "
             f"batch {j.global_batch_size}, {precision_text(j, setup.engine)}")
    con = console()
    if emit_engine:  # --emit torchtitan / deepspeed without --engine: the plans are that engine's
        con.print(f"engine {setup.engine} (the engine of the --emit {emit} files)", highlight=False)
    con.print(plans_view(result.plans, title))
    con.print(plans_legend(result.plans), style="dim")
    con.print(wrap(recommendation(result.plans)))
    con.print(search_line(result))
    for note in (result.notes if result.engine == "auto" else []):
        con.print(wrap(note), style="dim")
    if (notes := import_notes(setup.model)) is not None:
        con.print(wrap(notes), style="dim")
    if (note := positions_note(setup.model, j.seq_len)) is not None:
        con.print(wrap("note: " + note), style="dim")
    for note in setup.notes:
        con.print(wrap("note: " + note), style="dim")
    for line in gp_text:
        con.print(wrap(line), highlight=False, soft_wrap=True)
    if explain:
        con.print()
        con.print(render_explanation(explanation, "plan 1"))
