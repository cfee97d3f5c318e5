"""``planner check FILE... [--gpus N | --cluster C | --gpu G] [--engine E] [--json]``: a job in
its engine's own format, predicted, with findings and the best changes as edits in that format.
Exit 0 when it fits, 1 when it will not fit, 2 on bad input (one line)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli import options as O
from planner.cli.app import app
from planner.cli.common import emit_json

__all__ = ["check_cmd"]


@app.command("check")
def check_cmd(
    files: Annotated[list[str], typer.Argument(help="Launch script, flags file, torchtitan TOML or config module (FILE.py:FUNCTION), "
                                                    "DeepSpeed JSON, plan document (FILE.json:RANK), or a folder planner launch wrote.")],
    gpus: O.GpusOpt = None,
    gpus_per_node: O.GpnOpt = None,
    cluster: O.ClusterOpt = None,
    gpu: O.GpuOpt = None,
    engine: O.EngineOpt = None,
    model: O.ModelOpt = None,
    tp: O.TpOpt = None,
    pp: O.PpOpt = None,
    seq_len: O.SeqOpt = None,
    top: Annotated[int, typer.Option("--top", help="How many changes to propose (0: none).")] = 5,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List ignored and unpriced settings too.")] = False,
    json: O.JsonOpt = False,
) -> None:
    """Check a training job as written: prediction, findings, and the best changes as edits.

    Settings the files do not give come from the flags (--gpus, --cluster, --gpu, --model,
    --tp, --pp, --seq-len) or the engine's defaults; the output says which.

    Examples:
      planner check examples/llama/train_llama3_8b_h100_fp8.sh --gpus 64
      planner check llama3_70b.toml --gpus 64 --json
      planner check ds_config.json --model llama3.1-8b --gpus 16 --seq-len 4096
      planner check launch/ --engine megatron-core
    """
    from planner.check import check_job, read_job  # noqa: PLC0415
    from planner.check.job import Overrides  # noqa: PLC0415
    from planner.check.report import as_json, render_text  # noqa: PLC0415
    from planner.engines import get_engine  # noqa: PLC0415
    from planner.errors import InputError  # noqa: PLC0415

    if sum(x is not None for x in (gpu, cluster)) > 1:
        raise InputError("--gpu/--cluster", f"{gpu} and {cluster}", "one of the two (a cluster names its GPU)")
    if top < 0:
        raise InputError("--top", top, "a non-negative integer")
    eng = get_engine(engine).name if engine else None
    extra = {"parallel.tp": tp, "parallel.pp": pp, "job.seq_len": seq_len}
    o = Overrides(gpus=gpus, gpus_per_node=gpus_per_node, gpu=gpu, cluster=cluster, engine=eng, model=model, extra=extra)
    report = check_job(read_job(list(files), o), top=top)
    if json:
        emit_json(as_json(report))
    else:
        typer.echo(render_text(report, verbose), nl=False)
    if not report.fits:
        raise typer.Exit(1)
