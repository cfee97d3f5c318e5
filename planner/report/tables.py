"""Terminal tables (rich): plans, one estimate, validation results. Colour degrades to plain
text when stdout is not a terminal (rich's own detection); widths fit 80 columns."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

__all__ = ["console", "plans_table", "estimate_table", "validation_table", "gib", "fmt_time"]

GIB = 2**30


def console() -> Console:
    return Console(width=None, soft_wrap=False, highlight=False)


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f}"


def fmt_time(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.0f} ms"


def _tok(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def plans_table(plans: list, title: str) -> Table:
    t = Table(title=title, title_justify="left", pad_edge=False, header_style="bold")
    for col, just in (("#", "right"), ("tp/pp/dp/cp", "left"), ("mb x n", "right"), ("v", "right"), ("rec", "left"),
                      ("Z", "right"), ("step", "right"), ("tok/s", "right"), ("MFU", "right"), ("GiB", "right"), ("bound", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for p in plans:
        par, e = p.parallel, p.estimate
        degrees = f"{par.tp}/{par.pp}/{par.dp}/{par.cp}" + (f" ep{par.ep}" if par.ep > 1 else "")
        mem = f"{gib(e.memory_peak_bytes)}/{e.memory_capacity_bytes / GIB:.0f}"
        style = "red" if not e.fits else ("yellow" if e.memory_peak_bytes > 0.9 * e.memory_capacity_bytes else "")
        t.add_row(
            str(p.rank), degrees, f"{par.micro_batch_size}x{e.num_microbatches}", str(par.vpp),
            {"none": "-", "selective": "sel", "full": "full"}[par.recompute], str(par.zero),
            fmt_time(e.step_time_s), _tok(e.tokens_per_s), f"{100 * e.mfu:.1f}%", f"[{style}]{mem}[/]" if style else mem,
            e.bound[:18],
        )
    return t


def estimate_table(e, title: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, pad_edge=False)
    t.add_column("quantity", style="bold")
    t.add_column("value", justify="right")
    rows = [
        ("step time", fmt_time(e.step_time_s)),
        ("tokens/s", _tok(e.tokens_per_s)),
        ("TFLOP/s per GPU (model)", f"{e.tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{100 * e.mfu:.1f}% / {100 * e.hfu:.1f}%"),
        ("peak memory per GPU", f"{gib(e.memory_peak_bytes)} of {gib(e.memory_capacity_bytes)} GiB" + ("" if e.fits else "  (does NOT fit)")),
        ("micro-batches", str(e.num_microbatches)),
        ("layers per stage", ",".join(map(str, e.layers_per_stage)) if len(e.layers_per_stage) <= 12 else f"{e.layers_per_stage[0]}..{e.layers_per_stage[-1]} ({len(e.layers_per_stage)} stages)"),
        ("bound by", e.bound),
    ]
    for k, v in e.time_breakdown_s.items():
        if v > 0:
            rows.append(("  " + k.replace("_s", "").replace("_", " "), fmt_time(v)))
    for k, v in rows:
        t.add_row(k, v)
    return t


def validation_table(results: list, summary: dict) -> Table:
    t = Table(title=f"predicted vs measured step time: MAPE {summary['mape_pct']:.1f}%, max {summary['max_abs_error_pct']:.1f}%, n={summary['n']}",
              title_justify="left", pad_edge=False, header_style="bold")
    for col in ("run", "tp/pp/dp", "mb", "rec", "pred", "meas", "err"):
        t.add_column(col, justify="left" if col in ("run", "rec", "tp/pp/dp") else "right", no_wrap=True)
    for r in results:
        p = r.parallel
        err = r.error_pct
        style = "green" if err is not None and abs(err) <= 10 else ("yellow" if err is not None and abs(err) <= 25 else "red")
        t.add_row(r.id[:34], f"{p.tp}/{p.pp}/{p.dp}", str(p.micro_batch_size), p.recompute[:4], fmt_time(r.estimate.step_time_s),
                  fmt_time(r.measured_step_time_s) if r.measured_step_time_s else "-", f"[{style}]{err:+.1f}%[/]" if err is not None else "-")
    return t
