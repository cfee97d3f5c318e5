"""Timeline of a simulated pipeline schedule: hand-written SVG, and a PNG via matplotlib.

One row per pipeline rank, time to scale in seconds with "nice" ticks (1-2-5 steps), one
colour per event kind (lighter shades for later interleaved chunks), micro-batch numbers
inside bars wide enough to hold them, a legend, and the step time in the title.
Every bar (idle gaps included) is a ``<rect>`` carrying ``data-kind``, ``data-stage``,
``data-start-s`` and ``data-dur-s`` (``repr`` of the float, so sums are exact to rounding);
legend swatches carry no ``data-kind``.

``render_svg`` is pure; ``write_svg``/``write_png`` write atomically (temp file in the target
directory, then link/replace) and refuse to overwrite an existing file unless ``force=True``.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape

from planner.errors import InputError
from planner.report.schedule import EVENT_KINDS, Event, Schedule, makespan_and_bubble

__all__ = [
    "KIND_COLOURS",
    "render_svg",
    "write_svg",
    "write_png",
    "write_bytes_atomic",
    "nice_ticks",
]

KIND_COLOURS: dict[str, str] = {
    "fwd": "#4878d0",
    "bwd": "#6acc64",
    "recompute": "#956cb4",
    "p2p": "#8c8c8c",
    "idle": "#f4f4f4",
    "optimizer": "#d65f5f",
    "dp_comm": "#ee854a",
}

_LEFT_PX, _RIGHT_PX, _TOP_PX = 90, 20, 46
_ROW_PX, _ROW_GAP_PX = 26, 6
_CHAR_PX = 6.5  # approximate width of one 10 px sans-serif digit


def write_bytes_atomic(data: bytes, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; refuse to replace an existing file unless ``force``."""
    target = Path(path)
    if not target.parent.is_dir():
        raise InputError("path", str(target), "a file path inside an existing directory")
    if target.exists() and not force:
        raise InputError("path", str(target), "a path that does not exist yet (or force=True)")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        if force:
            os.replace(tmp, target)
        else:
            try:  # link() fails if the target appeared meanwhile: no silent overwrite
                os.link(tmp, target)
            except FileExistsError:
                raise InputError("path", str(target), "a path that does not exist yet (or force=True)") from None
            except OSError:  # filesystem without hard links
                if target.exists():
                    raise InputError("path", str(target), "a path that does not exist yet (or force=True)") from None
                os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def nice_ticks(span_s: float, target_count: int = 8) -> list[float]:
    """Tick positions 0, step, 2*step, ... <= span_s with step in {1, 2, 5} x 10^k."""
    if not (span_s > 0 and math.isfinite(span_s)):
        return [0.0]
    raw = span_s / max(1, target_count)
    base = 10.0 ** math.floor(math.log10(raw))
    step = next(base * k for k in (1, 2, 5, 10) if base * k >= raw)
    count = int(math.floor(span_s / step * (1 + 1e-12))) + 1
    return [round(i * step, 12) for i in range(count)]


def _shade(hex_colour: str, chunk: int | None, vpp: int) -> str:
    """Mix a colour with white: chunk 0 full colour, later chunks progressively lighter."""
    if not chunk or vpp <= 1:
        return hex_colour
    t = 0.5 * chunk / (vpp - 1)
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * t):02x}" for c in rgb)


def _title(schedule: Schedule) -> str:
    makespan_s, bubble = makespan_and_bubble(schedule)
    return (f"{schedule.kind} schedule, pp={schedule.pp}, vpp={schedule.vpp}, "
            f"m={schedule.num_microbatches}: step time {makespan_s:.6g} s (bubble {bubble:.1%})")


def _kinds_present(schedule: Schedule) -> list[str]:
    present = {e.kind for stage in schedule.stages for e in stage}
    return [k for k in EVENT_KINDS if k in present]


def _bar_label(event: Event) -> str:
    return "" if event.microbatch is None or event.kind in ("idle", "p2p") else str(event.microbatch)


def render_svg(schedule: Schedule, *, width_px: int = 1200) -> str:
    """Return the schedule as a standalone SVG document (pure)."""
    if isinstance(width_px, bool) or not isinstance(width_px, int) or width_px < 200:
        raise InputError("width_px", width_px, "an integer >= 200")
    makespan_s = schedule.makespan_s
    plot_w = width_px - _LEFT_PX - _RIGHT_PX
    scale = plot_w / makespan_s if makespan_s > 0 else 0.0
    rows_h = schedule.pp * (_ROW_PX + _ROW_GAP_PX)
    axis_y = _TOP_PX + rows_h
    legend_y = axis_y + 44
    height_px = legend_y + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height_px}" '
        f'viewBox="0 0 {width_px} {height_px}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width_px}" height="{height_px}" fill="#ffffff"/>',
        f'<text x="{width_px / 2:.1f}" y="22" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{escape(_title(schedule))}</text>',
    ]
    for rank, events in enumerate(schedule.stages):
        y = _TOP_PX + rank * (_ROW_PX + _ROW_GAP_PX)
        out.append(f'<g class="stage" data-stage="{rank}">')
        out.append(f'<text x="{_LEFT_PX - 8}" y="{y + _ROW_PX / 2 + 4:.1f}" text-anchor="end">stage {rank}</text>')
        for ev in events:
            x = _LEFT_PX + ev.start_s * scale
            w = ev.dur_s * scale
            fill = _shade(KIND_COLOURS[ev.kind], ev.chunk, schedule.vpp)
            tip = f"{ev.kind} stage {rank}"
            if ev.microbatch is not None:
                tip += f" mb {ev.microbatch} chunk {ev.chunk}"
            tip += f": {ev.start_s:.6g}-{ev.end_s:.6g} s"
            extra = "" if ev.microbatch is None else f' data-microbatch="{ev.microbatch}" data-chunk="{ev.chunk}"'
            out.append(
                f'<rect x="{x:.3f}" y="{y}" width="{w:.3f}" height="{_ROW_PX}" fill="{fill}" '
                f'stroke="#ffffff" stroke-width="0.5" data-kind="{ev.kind}" data-stage="{rank}" '
                f'data-start-s="{ev.start_s!r}" data-dur-s="{ev.dur_s!r}"{extra}>'
                f'<title>{escape(tip)}</title></rect>'
            )
            label = _bar_label(ev)
            if label and w >= _CHAR_PX * len(label) + 4:
                out.append(f'<text x="{x + w / 2:.3f}" y="{y + _ROW_PX / 2 + 4:.1f}" text-anchor="middle" '
                           f'font-size="10" fill="#ffffff">{label}</text>')
        out.append("</g>")
    out.append(f'<line x1="{_LEFT_PX}" y1="{axis_y}" x2="{_LEFT_PX + plot_w}" y2="{axis_y}" stroke="#000000"/>')
    for t in nice_ticks(makespan_s):
        x = _LEFT_PX + t * scale
        out.append(f'<line x1="{x:.3f}" y1="{axis_y}" x2="{x:.3f}" y2="{axis_y + 5}" stroke="#000000"/>')
        out.append(f'<text x="{x:.3f}" y="{axis_y + 17}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{_LEFT_PX + plot_w / 2:.1f}" y="{axis_y + 34}" text-anchor="middle">time (s)</text>')
    lx = _LEFT_PX
    for kind in _kinds_present(schedule):
        out.append(f'<rect class="legend" x="{lx}" y="{legend_y}" width="14" height="14" '
                   f'fill="{KIND_COLOURS[kind]}" stroke="#999999" stroke-width="0.5"/>')
        out.append(f'<text x="{lx + 19}" y="{legend_y + 11}">{escape(kind)}</text>')
        lx += 30 + int(_CHAR_PX * len(kind)) + 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(schedule: Schedule, path: str | os.PathLike[str], *, force: bool = False,
              width_px: int = 1200) -> Path:
    """Write :func:`render_svg` output to ``path`` atomically."""
    return write_bytes_atomic(render_svg(schedule, width_px=width_px).encode("utf-8"), path, force=force)


def write_png(schedule: Schedule, path: str | os.PathLike[str], *, force: bool = False, dpi: int = 150) -> Path:
    """Draw the same timeline with matplotlib and write it as PNG atomically."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(12, 1.5 + 0.45 * schedule.pp))
    ax = fig.add_subplot(1, 1, 1)
    width_in = fig.get_figwidth() * 0.8
    for rank, events in enumerate(schedule.stages):
        ax.barh(
            [rank] * len(events),
            [e.dur_s for e in events],
            left=[e.start_s for e in events],
            height=0.8,
            color=[_shade(KIND_COLOURS[e.kind], e.chunk, schedule.vpp) for e in events],
            edgecolor="white",
            linewidth=0.3,
        )
        for ev in events:
            label = _bar_label(ev)
            bar_in = ev.dur_s / schedule.makespan_s * width_in if schedule.makespan_s > 0 else 0.0
            if label and bar_in >= 0.09 * len(label) + 0.03:
                ax.text(ev.start_s + ev.dur_s / 2, rank, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(schedule.pp), [f"stage {r}" for r in range(schedule.pp)])
    ax.set_ylim(schedule.pp - 0.5, -0.5)
    ax.set_xlim(0, schedule.makespan_s)
    ax.set_xticks(nice_ticks(schedule.makespan_s))
    ax.set_xlabel("time (s)")
    ax.set_title(_title(schedule), fontsize=10)
    handles = [Patch(facecolor=KIND_COLOURS[k], edgecolor="#999999", label=k) for k in _kinds_present(schedule)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return write_bytes_atomic(buf.getvalue(), path, force=force)
