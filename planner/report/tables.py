"""Terminal tables (rich): plans, one estimate, validation results, and the progress bar.

Colour degrades to plain text when stdout is not a terminal (rich's own detection: no ANSI
escapes in a pipe). Every table fits an 80-column terminal without truncating a value: short
headers, no vertical rules, one space between columns, the title printed as a line above
the table (where it may wrap) rather than inside it. GiB appear here, at the edge only.
"""

from __future__ import annotations

from contextlib import contextmanager

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

__all__ = [
    "busy",
    "console", "err_console", "plans_table", "plans_view", "estimate_table", "validation_table",
    "gib", "fmt_time", "fmt_tokens", "short_link", "short_bound", "compact_table", "track",
]

GIB = 2**30
T = TypeVar("T")


def console() -> Console:
    """stdout console: rich picks the terminal width, or 80 columns (``$COLUMNS``) in a pipe."""
    return Console(width=None, soft_wrap=True, highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f}"


def fmt_time(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"
    if seconds > 0:
        return f"{seconds * 1e6:.0f} us"
    return "0"


def fmt_tokens(x: float) -> str:
    """Three significant digits with k/M/G: 71.8k, 1.23M."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            v = x / scale
            return f"{v:#.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{x:.0f}"


_KIND_SHORT = {"infiniband": "ib", "ethernet": "eth", "omnipath": "opa", "roce": "roce"}


def short_link(link: str) -> str:
    """``infiniband:network`` -> ``ib``; ``infiniband:spine`` -> ``ib:spine``; NVLink names kept."""
    kind, _, tier = link.partition(":")
    kind = _KIND_SHORT.get(kind, kind)
    return kind if tier in ("", "network") else f"{kind}:{tier}"


def short_bound(bound: str) -> str:
    """The Estimate's ``bound`` in at most ~12 characters: compute, bubble, memory, 'dp ib'."""
    if bound.startswith("memory"):
        return "memory" if bound == "memory" else "memory!"
    if bound == "pipeline bubble":
        return "bubble"
    if " comm (" in bound:
        kind, _, rest = bound.partition(" comm (")
        return f"{kind} {short_link(rest.rstrip(')'))}"
    return bound


def compact_table(**kw) -> Table:
    """A table with a rule under the header, no vertical rules and one space between columns."""
    kw.setdefault("header_style", "bold")
    return Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, collapse_padding=True, **kw)


def plans_table(plans: list) -> Table:
    """Ranked plans: rank, degrees, micro-batch x count, virtual stages, recompute, ZeRO, step
    time, tokens/s, MFU, peak memory / capacity (GiB), what bounds the step."""
    t = compact_table()
    for col, just in (("#", "right"), ("tp/pp/dp/cp", "left"), ("mb x n", "right"), ("v", "right"), ("rec", "left"),
                      ("Z", "right"), ("step", "right"), ("tok/s", "right"), ("MFU", "right"), ("GiB/cap", "right"),
                      ("bound", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for p in plans:
        par, e = p.parallel, p.estimate
        degrees = f"{par.tp}/{par.pp}/{par.dp}/{par.cp}" + (f" ep{par.ep}" if par.ep > 1 else "")
        mem = f"{gib(e.memory_peak_bytes)}/{e.memory_capacity_bytes / GIB:.3g}"
        style = "red" if not e.fits else ("yellow" if e.memory_peak_bytes > 0.9 * e.memory_capacity_bytes else "")
        t.add_row(
            str(p.rank), degrees, f"{par.micro_batch_size}x{e.num_microbatches}", str(par.vpp),
            {"none": "-", "selective": "sel", "full": "full"}[par.recompute], str(par.zero),
            fmt_time(e.step_time_s), fmt_tokens(e.tokens_per_s), f"{100 * e.mfu:.1f}%",
            Text(mem, style=style), short_bound(e.bound),
        )
    return t


def plans_view(plans: list, title: str) -> Group:
    """The title as a line above the plans table (so that it wraps instead of truncating)."""
    return Group(Text(title, style="bold"), plans_table(plans))


def estimate_table(e, title: str | None = None) -> Table:
    t = compact_table(show_header=False)
    t.add_column("quantity", style="bold")
    t.add_column("value", justify="right")
    lps = e.layers_per_stage
    rows = [
        ("step time", fmt_time(e.step_time_s)),
        ("tokens/s", fmt_tokens(e.tokens_per_s)),
        ("TFLOP/s per GPU (model)", f"{e.tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{100 * e.mfu:.1f}% / {100 * e.hfu:.1f}%"),
        ("peak memory per GPU", f"{gib(e.memory_peak_bytes)} of {gib(e.memory_capacity_bytes)} GiB" + ("" if e.fits else "  (does NOT fit)")),
        ("micro-batches", str(e.num_microbatches)),
        ("layers per stage", ",".join(map(str, lps)) if len(lps) <= 12 else f"{lps[0]}..{lps[-1]} ({len(lps)} stages)"),
        ("bound by", e.bound),
    ]
    for k, v in e.time_breakdown_s.items():
        if v > 0:
            rows.append(("  " + k.removesuffix("_s").replace("_", " "), fmt_time(v)))
    for k, v in rows:
        t.add_row(k, v)
    return t


def validation_table(results: list, summary: dict) -> Table:
    t = compact_table()
    for col in ("run", "tp/pp/dp", "mb", "rec", "pred", "meas", "err"):
        t.add_column(col, justify="left" if col in ("run", "rec", "tp/pp/dp") else "right", no_wrap=col != "run")
    for r in results:
        p = r.parallel
        err = r.error_pct
        style = "green" if err is not None and abs(err) <= 10 else ("yellow" if err is not None and abs(err) <= 25 else "red")
        t.add_row(r.id, f"{p.tp}/{p.pp}/{p.dp}", str(p.micro_batch_size), p.recompute[:4], fmt_time(r.estimate.step_time_s),
                  fmt_time(r.measured_step_time_s) if r.measured_step_time_s else "-",
                  Text(f"{err:+.1f}%", style=style) if err is not None else "-")
    return t


@contextmanager
def busy(description: str) -> Iterator[None]:
    """A spinner with elapsed time on stderr while a search runs, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with err_console().status(description, spinner="dots"):
        yield


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate ``items`` with a rich progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console(), transient=True) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
