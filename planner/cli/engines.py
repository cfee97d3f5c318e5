"""``planner engines list|show NAME``: the training-engine profiles (planner/engines/profiles).

What each engine runs (features), how it runs each ZeRO stage (when gradients are reduced and
weights gathered, with and without a pipeline), its pipeline schedules and its sources, all read
from the profiles. :func:`features_markdown` is the README's "Engines" table (a test keeps the
two equal; ``planner engines list --markdown`` prints it).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from planner.cli.app import app
from planner.report.tables import compact_table, console

__all__ = ["engines_app", "feature_row", "FEATURE_COLUMNS", "features_markdown", "sharding_rows"]

engines_app = typer.Typer(help="Training engines: list them with their features, or show one (sharding modes, schedules, sources). "
                          "Examples: planner engines list; planner engines show torchtitan", no_args_is_help=True)
app.add_typer(engines_app, name="engines")

FEATURE_COLUMNS = ("engine", "TP", "SP", "CP", "EP", "flash attn", "recompute", "ZeRO (with PP)", "schedules", "uneven VPP",
                   "TP overlap", "DP overlap", "EP overlap", "DeepEP/HybridEP", "CUDA graphs")


def _yes(b: bool) -> str:
    return "yes" if b else "-"


def _flash(e) -> str:
    """Flash attention: by default, FlashAttention-2 (or 1) on a flag (--use-flash-attn-v2), or none."""
    if e.flash_attention:
        return {"flash": "yes", "fa2": "FA2 (SDPA)"}.get(e.flash_kernel, e.flash_kernel.upper())
    if "fa2" in e.attention_kernels:
        return "FA1/FA2 on a flag" if "fa1" in e.attention_kernels else "FA2 on a flag"
    return "-"


def feature_row(e) -> tuple[str, ...]:
    """One engine's cells, in :data:`FEATURE_COLUMNS` order."""
    sp = ("always" if not e.sequence_parallel_optional else "yes") if e.sequence_parallel else "-"
    zero = ",".join(map(str, e.zero_stages)) + f" (<= {e.max_zero_with_pp})"
    overlaps = [n for n, b in (("grad", e.overlap_grad_reduce), ("param", e.overlap_param_gather)) if b]
    return (e.name, _yes(e.tensor_parallel), sp, _yes(e.context_parallel), _yes(e.expert_parallel), _flash(e),
            "/".join(e.recompute), zero, ", ".join(e.schedules), _yes(e.uneven_interleaving),
            ("on request" if e.tp_comm_overlap_default is False else "yes") if e.tp_comm_overlap else "-",
            "+".join(overlaps) or "-", _yes(e.moe_a2a_overlap), _yes(e.moe_flex_dispatcher), _yes(e.cuda_graphs))


def _engines():
    from planner.engines import ENGINE_NAMES, get_engine  # noqa: PLC0415

    return [get_engine(n) for n in ENGINE_NAMES]


def features_markdown() -> str:
    """The engines x features table as Markdown (the README's "Engines" section)."""
    rows = [FEATURE_COLUMNS, tuple("---" for _ in FEATURE_COLUMNS)] + [feature_row(e) for e in _engines()]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"


def sharding_rows(e) -> list[tuple[str, ...]]:
    """(ZeRO stage, mode, gradient sync, weight gather, reshard after forward, with a pipeline) per stage."""
    out = []
    for s in e.sharding:
        if not s.with_pp:
            pp = "not run"
        elif s.pp is not None:
            pp = f"{s.pp.grad_sync} sync, {s.pp.param_gather} gather: {s.pp.name}"
        else:
            pp = "same"
        grad = s.grad_sync + (" (all-reduce)" if s.grad_collective == "allreduce" else "")
        reshard = "yes" if s.reshard_after_forward else "no"
        out.append((str(s.zero), s.name, grad, s.param_gather, reshard if s.param_gather == "layer" else "-", pp))
    return out


@engines_app.command("list")
def engines_list(markdown: bool = typer.Option(False, "--markdown", help="Print the table as Markdown (the README's).")) -> None:
    """List the engines with what each runs (use the name with --engine).

    Examples:
      planner engines list
      planner engines list --markdown
    """
    if markdown:
        typer.echo(features_markdown(), nl=False)
        return
    keep = ("engine", "TP", "SP", "CP", "EP", "recompute", "ZeRO (with PP)", "schedules")
    t = compact_table()
    for col in keep:
        t.add_column(col, no_wrap=col != "schedules")
    short = {"none/selective/full": "sel, full", "none/full": "full", "none": "-"}
    for e in _engines():
        cells = dict(zip(FEATURE_COLUMNS, feature_row(e)))
        cells["recompute"] = short.get(cells["recompute"], cells["recompute"])
        t.add_row(*(cells[c] for c in keep))
    con = console()
    con.print(Text("Training engines (--engine NAME; every feature: planner engines show NAME or list --markdown)", style="bold"))
    con.print(t)


@engines_app.command("show")
def engines_show(name: Annotated[str, typer.Argument(help="An engine name (planner engines list).")]) -> None:
    """Show one engine: features, sharding modes per ZeRO stage, schedules, defaults and sources.

    Examples:
      planner engines show megatron-core
      planner engines show torchtitan
    """
    from planner.engines import ENGINE_NAMES, get_engine  # noqa: PLC0415
    from planner.errors import InputError, suggest  # noqa: PLC0415

    if name.lower() not in ENGINE_NAMES:
        hint = suggest(name.lower(), ENGINE_NAMES)
        raise InputError("NAME", name, f"one of {', '.join(ENGINE_NAMES)}" + (f" ({hint})" if hint else ""))
    e = get_engine(name)
    con = console()
    con.print(Text(f"{e.name}: {e.title}", style="bold"))
    con.print(f"Describes {e.describes}.")
    t = compact_table(show_header=False)
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value")
    for col, cell in zip(FEATURE_COLUMNS[1:], feature_row(e)[1:]):
        t.add_row(col, cell)
    t.add_row("async TP all-reduce", _yes(e.async_tp_allreduce))
    t.add_row("embedding/loss in the split", _yes(e.embedding_in_split))
    t.add_row("multi-token prediction", _yes(e.mtp))
    t.add_row("FP8 recipes", f"{', '.join(e.fp8_recipes)} (auto: {e.fp8_default}; {'Transformer Engine' if e.fp8_casts == 'te' else 'torchao'} casts)")
    t.add_row("FP8 weight gathers", (", ".join(e.fp8_gather_recipes) + (" (on unless --no-fp8-param-gather)" if e.fp8_gather_default
                                      else " (with --fp8-param-gather)")) if e.fp8_gather_recipes else "-")
    tp_b = dict((n, (f, b)) for n, f, b in e.loss_tp_kernels)
    f16 = dict((n, (f, b)) for n, f, b in e.loss_fp16_kernels)
    t.add_row("cross entropy", "; ".join(f"{n} {f:g} + {b:g} B/logit" + (f" ({tp_b[n][0]:g} + {tp_b[n][1]:g} with tp > 1)" if n in tp_b else "")
                                         + (f" ({f16[n][0]:g} + {f16[n][1]:g} on fp16)" if n in f16 else "")
                                         for n, f, b in e.loss_kernels) + f" (auto: {e.loss_default}; --cross-entropy)")
    t.add_row("defaults", f"ZeRO {e.default_zero}, recompute {e.default_recompute}, schedule {e.default_schedule}")
    con.print(t)
    con.print(Text("Sharding modes (gradient sync / weight gather: step = once per step, microbatch = every micro-batch, "
                   "layer = per layer in forward and backward)", style="bold"))
    s = compact_table()
    for col in ("ZeRO", "mode", "gradients", "weights", "reshard", "with a pipeline"):
        s.add_column(col)
    for row in sharding_rows(e):
        s.add_row(*row)
    con.print(s)
    sources = [f"ZeRO {sh.zero}: {sh.source}" for sh in e.sharding if sh.source]
    con.print(Text("Sources", style="bold"))
    for line in list(e.sources) + sources:
        if isinstance(line, dict):  # a YAML source line with ": " inside reads as a mapping
            line = "; ".join(f"{k}: {v}" for k, v in line.items())
        con.print(f"  {line}")
    for line in e.notes:
        con.print(f"Note: {line}")
