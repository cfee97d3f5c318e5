"""``planner explain PLAN.json [--rank N]``: why one plan takes the time and memory it does."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.app import app
from planner.report.tables import console, fmt_time

__all__ = ["explain_cmd"]

PlanArg = Annotated[str, typer.Argument(help="A plan document written by `planner plan --json` (or `estimate --json`).", metavar="PLAN.json")]
RankOpt = Annotated[int, typer.Option("--rank", "-r", help="Which ranked plan of the document.")]


@app.command("explain")
def explain_cmd(plan: PlanArg, rank: RankOpt = 1) -> None:
    """Explain one plan: step-time breakdown (compute, each communication and its link, exposed
    vs hidden, bubble, optimizer), memory per pipeline stage, and the changes that would help most.

    Examples:
      planner plan --json > plan.json && planner explain plan.json
      planner explain plan.json --rank 3
      planner plan --explain
    """
    from planner.report.explain import explain, render_explanation  # noqa: PLC0415
    from planner.report.timeline_plan import plan_context, read_plan_document  # noqa: PLC0415

    ctx = plan_context(read_plan_document(plan), rank)
    con = console()
    m, c, j = ctx.model, ctx.cluster, ctx.job
    con.print(f"{m.name} on {c.num_gpus} x {c.gpu.id}, seq {j.seq_len}, batch {j.global_batch_size}, {j.precision}")
    stored = ctx.stored_step_time_s
    if stored and abs(ctx.estimate.step_time_s - stored) > 1e-3 * stored:
        con.print(f"note: re-predicted step {fmt_time(ctx.estimate.step_time_s)} differs from the document's {fmt_time(stored)} "
                  "(a planner version or a cluster field the document does not carry)")
    con.print(render_explanation(explain(m, c, j, ctx.parallel, ctx.engine, ctx.constants, ctx.estimate), f"plan {rank}"))
