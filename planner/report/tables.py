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

from planner.report.reasons import bound_label, recommendation  # noqa: F401  (re-exported for cli/)
from planner.units import GIB, MEMORY_LEGEND, fmt_time, fmt_tokens, gib, plural, wrap  # noqa: F401  (re-exported for report/ and cli/)

__all__ = [
    "busy",
    "console", "err_console", "plans_table", "plans_view", "plans_legend", "bound_label", "recommendation", "wrap", "search_line", "estimate_table", "validation_table",
    "gib", "fmt_time", "fmt_tokens", "short_link", "short_bound", "compact_table", "track",
]

T = TypeVar("T")


class StdoutClosed(SystemExit):
    """stdout was closed before the output ended (``planner ... | head``): the CLI exits 141."""

    def __init__(self) -> None:
        super().__init__(141)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """As rich does (the rest of the output goes to /dev/null), but exit 141 (128 + SIGPIPE),
        not rich's 1, which is the planner's "nothing fits"."""
        import os  # noqa: PLC0415

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())
        raise StdoutClosed()


def console() -> Console:
    """stdout console: rich picks the terminal width, or 80 columns (``$COLUMNS``) in a pipe."""
    return _Console(width=None, soft_wrap=True, highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


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


# Zero-bubble and V-shaped schedules beside the virtual-stage count (1F1B and interleaved 1F1B
# are the plain count).
SCHEDULE_TAGS = {"zb-h1": "h1", "zb-h2": "h2", "zb-v": "zbv", "dualpipe": "dpv", "gpipe": "gp"}
SCHEDULE_NAMES = {"h1": "ZB-H1", "h2": "ZB-H2", "zbv": "ZB-V", "dpv": "DualPipeV", "gp": "GPipe"}


def vpp_cell(par) -> str:
    """The virtual-stage count, tagged with the schedule when it is not (interleaved) 1F1B."""
    tag = SCHEDULE_TAGS.get(par.schedule) if par.pp > 1 else None
    return f"{par.vpp} {tag}" if tag else str(par.vpp)


ENGINE_TAGS = {"megatron-core": "mcore", "torchtitan": "titan", "deepspeed": "ds", "megatron-deepspeed": "mds",
               "megatron-legacy": "mleg", "megatron-zb": "mzb"}


def _mixed_engines(plans: list) -> bool:
    return len({p.estimate.engine for p in plans}) > 1


def plans_table(plans: list) -> Table:
    """Ranked plans: rank, degrees, micro-batch x count, virtual stages, recompute, ZeRO, step
    time, tokens/s, MFU, peak memory per GPU (GiB; the capacity is the same for every row and
    said once, in :func:`plans_legend`), and what bounds the step (the largest exposed term
    with its share, :func:`planner.report.reasons.bound_label`). Plans of several engines
    (``--engine auto``) show their engine in place of tokens/s (80 columns)."""
    t = compact_table()
    mixed = _mixed_engines(plans)
    cols = [("#", "right"), ("tp/pp/dp/cp", "left"), ("mb x n", "right"), ("v", "right"), ("rec", "left"),
            ("Z", "right"), ("step", "right"), ("engine", "left") if mixed else ("tok/s", "right"), ("MFU", "right"),
            ("GiB", "right"), ("bound", "left")]
    for col, just in cols:
        t.add_column(col, justify=just, no_wrap=True)
    for p in plans:
        par, e = p.parallel, p.estimate
        degrees = f"{par.tp}/{par.pp}/{par.dp}/{par.cp}" + (f" ep{par.ep}" if par.ep > 1 else "")
        style = "red" if not e.fits else ("yellow" if e.memory_peak_bytes > 0.9 * e.memory_capacity_bytes else "")
        t.add_row(
            str(p.rank), degrees, f"{par.micro_batch_size}x{e.num_microbatches}", vpp_cell(par),
            {"none": "-", "selective": "sel", "full": "full"}[par.recompute], str(par.zero),
            fmt_time(e.step_time_s), ENGINE_TAGS.get(e.engine, e.engine) if mixed else fmt_tokens(e.tokens_per_s),
            f"{100 * e.mfu:.1f}%", Text(gib(e.memory_peak_bytes), style=style), bound_label(e),
        )
    return t


def plans_legend(plans: list) -> str:
    """The column legend under the plans table, with the units said once (:data:`planner.units.LEGEND`)."""
    cap = f"{gib(plans[0].estimate.memory_capacity_bytes)} GiB" if plans else "the GPU's memory"
    tags = sorted({SCHEDULE_TAGS[p.parallel.schedule] for p in plans if p.parallel.pp > 1 and p.parallel.schedule in SCHEDULE_TAGS})
    sched = ("schedules: " + ", ".join(f"{t} {SCHEDULE_NAMES[t]}" for t in tags) + ";\n") if tags else ""
    if _mixed_engines(plans):
        names = sorted({p.estimate.engine for p in plans})
        sched += "engine: " + ", ".join(f"{ENGINE_TAGS.get(n, n)} {n}" for n in names) + ";\n"
    return ("mb x n: micro-batch x count; v: virtual stages per rank; rec: recompute;\n" + sched +
            f"Z: ZeRO stage; GiB: peak memory per GPU (capacity {cap});\n"
            "bound: the largest exposed term of the step and its share (compute,\n"
            f"bubble, or tp/pp/dp/cp/ep comm with its network); {MEMORY_LEGEND}")


def search_line(result) -> str:
    """How the search went, in words: candidates, how many were priced exactly, how the layer
    splits were chosen, and the wall time."""
    stats = getattr(result, "stats", None)
    solved = getattr(stats, "programs", 0)
    ruled = getattr(stats, "ruled_out", 0)
    solver = {"highs": "HiGHS", "pulp": "PuLP/CBC", "cbc": "CBC"}.get(str(result.solver).lower(), str(result.solver))
    if solved:
        split = f"{plural(solved, 'layer split')} solved exactly by {solver}"
        if ruled:
            split += f" ({ruled:,} more ruled out by memory before solving)"
    elif ruled:
        split = f"{plural(ruled, 'layer split')} ruled out by memory before solving; the rest split evenly"
    else:
        split = "no layer split to choose (even splits)"
    pruned = getattr(stats, "memory_pruned", 0)
    bound = f", {pruned:,} ruled out by a memory bound" if pruned else ""
    return wrap(f"{result.candidates:,} candidates{bound}, {result.evaluated:,} priced exactly; {split}; {result.seconds:.2f} s")


def plans_view(plans: list, title: str) -> Group:
    """The title as a line above the plans table (so that it wraps instead of truncating)."""
    return Group(Text(title, style="bold"), plans_table(plans))


def estimate_table(e, title: str | None = None) -> Table:
    """One estimate as a two-column table (the rendering ``Estimate`` shows in a rich console)."""
    return e.__rich__()


def break_at_hyphens(text: str, width: int) -> str:
    """``text`` on lines of at most ``width`` characters, broken after hyphens (a run id stays
    readable and whole; a piece longer than ``width`` is left for the table to fold).

    >>> print(break_at_hyphens("mb2606-llama31_405b-fp8-256gb200", 24))
    mb2606-llama31_405b-fp8-
    256gb200
    >>> break_at_hyphens("short-id", 24)
    'short-id'
    """
    if len(text) <= width:
        return text
    lines, line = [], ""
    for piece in text.replace("-", "-\0").split("\0"):
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    return "\n".join([*lines, line])


def validation_table(results: list, summary: dict, width: int | None = None) -> Table:
    """Predicted vs measured per run: step time (fastest fill) where runs have it, peak memory
    (in the counter the run measured) where they have that. ``width``: the terminal's columns;
    run ids too long for what the other columns leave are broken after hyphens."""
    has_step = any(r.measured_step_time_s for r in results)
    has_mem = any(r.memory_error_pct is not None for r in results)
    t = compact_table()
    cols = ["run", "tp/pp/dp/cp", "mb", "rec"] + (["pred", "meas", "err"] if has_step else []) + (["GiB", "meas", "err"] if has_mem else [])
    for i, col in enumerate(cols):
        # a run's id goes onto a second line when the terminal is narrow, never cut short
        t.add_column(col, justify="left" if col in ("run", "rec", "tp/pp/dp/cp") else "right", no_wrap=col != "run",
                     overflow="fold" if col == "run" else "ellipsis")

    def err_text(err: float | None, lo: float = -10, hi: float = 10) -> object:
        if err is None:
            return "-"
        style = "green" if lo <= err <= hi else ("yellow" if abs(err) <= 25 else "red")
        return Text(f"{err:+.1f}%", style=style)

    rows = []
    for r in results:
        p = r.parallel
        row = [r.id, f"{p.tp}/{p.pp}/{p.dp}/{p.cp}", str(p.micro_batch_size), "sel" if p.recompute == "selective" else p.recompute]
        if has_step:
            row += [fmt_time(r.estimate.step_time_s), fmt_time(r.measured_step_time_s) if r.measured_step_time_s else "-", err_text(r.error_pct)]
        if has_mem:
            meas = r.measured.get("memory_peak_bytes")
            row += [gib(r.predicted_memory_bytes()) if meas else "-", gib(meas) if meas else "-", err_text(r.memory_error_pct, -5, 15)]
        rows.append(row)
    if width is not None and rows:
        # what the other columns take: their widest cell or header and the gap after it
        others = sum(max(len(str(c)) for c in [col, *(row[i] for row in rows)]) + 2 for i, col in enumerate(cols) if i)
        budget = max(12, width - others - 1)
        for row in rows:
            row[0] = break_at_hyphens(row[0], budget)
    for row in rows:
        t.add_row(*row)
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
