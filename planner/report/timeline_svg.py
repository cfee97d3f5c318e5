"""Timeline of a simulated pipeline schedule: hand-written SVG, and a PNG via matplotlib.

One row per pipeline rank, time to scale in seconds with "nice" ticks (1-2-5 steps), one
colour per event kind, micro-batch numbers inside bars wide enough to hold them, a legend,
and the step time in the title. With interleaving (vpp > 1) each rank runs ``vpp`` model
chunks: chunk 0 is drawn in the full colour and later chunks progressively lighter, and the
legend says so ("virtual chunk 0 (dark) ... v-1 (light)").

Long schedules (more than :data:`planner.report.timeline_view.SUMMARY_MIN_MICROBATCHES`
micro-batches) are summarised instead of drawn as a barcode: warm-up, a few periods of the
steady state, a marked cut naming how many micro-batches and seconds it leaves out, the
last periods and the cool-down (:func:`planner.report.timeline_view.timeline_view`;
``summarise=False`` draws everything).

Every bar (idle gaps included) is a ``<rect>`` carrying ``data-kind``, ``data-stage``,
``data-start-s`` and ``data-dur-s`` (``repr`` of the float of the whole event, so sums are
exact to rounding); a stage's ``<g>`` carries ``data-omitted-s``, the time of the events left
out by a cut, so that drawn durations plus omitted time add up to the step time. Legend
swatches carry no ``data-kind``.

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
from planner.report.timeline_view import View, nice_ticks, timeline_view
from planner.units import fmt_time, plural

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
    "wgrad": "#b5e3a8",  # the zero-bubble schedules' weight-gradient pass, a lighter backward
    "recompute": "#956cb4",
    "p2p": "#8c8c8c",
    "idle": "#f4f4f4",
    "optimizer": "#d65f5f",
    "dp_comm": "#ee854a",
}

_LEFT_PX, _RIGHT_PX, _TOP_PX = 90, 20, 46
_ROW_PX, _ROW_GAP_PX = 26, 6
_CHAR_PX = 6.5  # approximate width of one 10 px sans-serif digit


def write_bytes_atomic(data: bytes, path: str | os.PathLike[str], *, force: bool = False, flag: str = "--out") -> Path:
    """Write ``data`` to ``path`` atomically; refuse to replace an existing file unless ``force``.
    ``flag``: the command-line option that named the path (the CLI's wording of the error)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise InputError("path", str(target), "a file path inside an existing directory", flag=flag)
    if target.exists() and not force:
        raise InputError("path", str(target), "a path that does not exist yet (or force=True)", flag=flag)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:  # a folder the user cannot write to: their path, not a bug
        raise InputError("path", str(target), f"a file path in a folder that can be written ({exc.strerror or exc})", flag=flag) from exc
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
                raise InputError("path", str(target), "a path that does not exist yet (or force=True)", flag=flag) from None
            except OSError:  # filesystem without hard links
                if target.exists():
                    raise InputError("path", str(target), "a path that does not exist yet (or force=True)", flag=flag) from None
                os.replace(tmp, target)
    except OSError as exc:  # a full disk, a quota: the user's folder, not a bug
        raise InputError("path", str(target), f"a file path in a folder that can be written ({exc.strerror or exc})", flag=flag) from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


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
            f"m={schedule.num_microbatches}: step time {fmt_time(makespan_s)} (bubble {bubble:.1%} of the bubble-free "
            "pipeline time, t_pb/t_id; explain gives it as a share of the step)")


def _kinds_present(schedule: Schedule) -> list[str]:
    present = {e.kind for stage in schedule.stages for e in stage}
    return [k for k in EVENT_KINDS if k in present]


def _bar_label(event: Event) -> str:
    return "" if event.microbatch is None or event.kind in ("idle", "p2p") else str(event.microbatch)


def _chunk_legend(vpp: int) -> str:
    return f"shade (fwd and bwd alike): virtual chunk 0 (dark) to {vpp - 1} (light)"


def _cut_label(view: View) -> str:
    return (f"cut: {plural(view.omitted_microbatches, 'micro-batch', 'micro-batches')} of steady state "
            f"({fmt_time(view.cut_end_s - view.cut_start_s)}) not drawn")


def render_svg(schedule: Schedule, *, width_px: int = 1200, summarise: bool | None = None) -> str:
    """Return the schedule as a standalone SVG document (pure). ``summarise``: None cuts the
    steady state of long schedules, True whenever possible, False never."""
    if isinstance(width_px, bool) or not isinstance(width_px, int) or width_px < 200:
        raise InputError("width_px", width_px, "an integer >= 200")
    makespan_s = schedule.makespan_s
    plot_w = width_px - _LEFT_PX - _RIGHT_PX
    view = timeline_view(schedule, _LEFT_PX, plot_w, summarise)
    rows_h = schedule.pp * (_ROW_PX + _ROW_GAP_PX)
    axis_y = _TOP_PX + rows_h
    legend_y = axis_y + 44
    height_px = legend_y + (50 if schedule.vpp > 1 or view.cut else 30)
    cut_attr = f' data-cut-start-s="{view.cut_start_s!r}" data-cut-end-s="{view.cut_end_s!r}"' if view.cut else ""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height_px}" '
        f'viewBox="0 0 {width_px} {height_px}" font-family="sans-serif" font-size="11"{cut_attr}>',
        f'<rect x="0" y="0" width="{width_px}" height="{height_px}" fill="#ffffff"/>',
        f'<text x="{width_px / 2:.1f}" y="22" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{escape(_title(schedule))}</text>',
    ]
    for rank, events in enumerate(schedule.stages):
        y = _TOP_PX + rank * (_ROW_PX + _ROW_GAP_PX)
        omitted = math.fsum(e.dur_s for e in events if not view.visible(e.start_s, e.end_s))
        out.append(f'<g class="stage" data-stage="{rank}" data-omitted-s="{omitted!r}">')
        out.append(f'<text x="{_LEFT_PX - 8}" y="{y + _ROW_PX / 2 + 4:.1f}" text-anchor="end">stage {rank}</text>')
        for ev in events:
            parts = view.visible(ev.start_s, ev.end_s)
            if not parts:
                continue
            fill = _shade(KIND_COLOURS[ev.kind], ev.chunk, schedule.vpp)
            tip = f"{ev.kind} stage {rank}"
            if ev.microbatch is not None:
                tip += f" mb {ev.microbatch} chunk {ev.chunk}"
            tip += f": {ev.start_s:.6g}-{ev.end_s:.6g} s"
            extra = "" if ev.microbatch is None else f' data-microbatch="{ev.microbatch}" data-chunk="{ev.chunk}"'
            for i, (a, b) in enumerate(parts):
                x, w = view.x(a), view.x(b) - view.x(a)
                data = (f' data-kind="{ev.kind}" data-stage="{rank}" data-start-s="{ev.start_s!r}" '
                        f'data-dur-s="{ev.dur_s!r}"{extra}') if i == 0 else ' class="continued"'
                out.append(
                    f'<rect x="{x:.3f}" y="{y}" width="{w:.3f}" height="{_ROW_PX}" fill="{fill}" '
                    f'stroke="#ffffff" stroke-width="0.5"{data}>'
                    f'<title>{escape(tip)}</title></rect>'
                )
                label = _bar_label(ev)
                if label and len(parts) == 1 and w >= _CHAR_PX * len(label) + 4:
                    out.append(f'<text x="{x + w / 2:.3f}" y="{y + _ROW_PX / 2 + 4:.1f}" text-anchor="middle" '
                               f'font-size="10" fill="#ffffff">{label}</text>')
        out.append("</g>")
    out.append(f'<line x1="{_LEFT_PX}" y1="{axis_y}" x2="{_LEFT_PX + plot_w}" y2="{axis_y}" stroke="#000000"/>')
    for t in view.ticks():
        x = view.x(t)
        out.append(f'<line x1="{x:.3f}" y1="{axis_y}" x2="{x:.3f}" y2="{axis_y + 5}" stroke="#000000"/>')
        out.append(f'<text x="{x:.3f}" y="{axis_y + 17}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{_LEFT_PX + plot_w / 2:.1f}" y="{axis_y + 34}" text-anchor="middle">time (s)</text>')
    if view.cut:
        cx = view.x(view.cut_start_s) + view.gap_px / 2
        zig = " ".join(f"{cx + (4 if i % 2 else -4):.1f},{_TOP_PX - 4 + i * 6}" for i in range(int((rows_h + 8) / 6) + 1))
        out.append(f'<g class="cut"><title>{escape(_cut_label(view))}</title>'
                   f'<rect x="{view.x(view.cut_start_s):.3f}" y="{_TOP_PX - 6}" width="{view.gap_px:.3f}" '
                   f'height="{rows_h + 12}" fill="#ffffff"/>'
                   f'<polyline points="{zig}" fill="none" stroke="#555555" stroke-width="1.5"/></g>')
    lx = _LEFT_PX
    for kind in _kinds_present(schedule):
        out.append(f'<rect class="legend" x="{lx}" y="{legend_y}" width="14" height="14" '
                   f'fill="{KIND_COLOURS[kind]}" stroke="#999999" stroke-width="0.5"/>')
        out.append(f'<text x="{lx + 19}" y="{legend_y + 11}">{escape(kind)}</text>')
        lx += 30 + int(_CHAR_PX * len(kind)) + 20
    line2 = legend_y + 22
    lx = _LEFT_PX
    if schedule.vpp > 1:
        for c in range(schedule.vpp):
            out.append(f'<rect class="legend" x="{lx + 12 * c}" y="{line2}" width="12" height="14" '
                       f'fill="{_shade(KIND_COLOURS["fwd"], c, schedule.vpp)}" stroke="#999999" stroke-width="0.5"/>')
        lx += 12 * schedule.vpp + 6
        text = _chunk_legend(schedule.vpp)
        out.append(f'<text x="{lx}" y="{line2 + 11}">{escape(text)}</text>')
        lx += int(_CHAR_PX * len(text)) + 30
    if view.cut:
        out.append(f'<text x="{lx}" y="{line2 + 11}">{escape("zig-zag = " + _cut_label(view))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(schedule: Schedule, path: str | os.PathLike[str], *, force: bool = False,
              width_px: int = 1200, summarise: bool | None = None) -> Path:
    """Write :func:`render_svg` output to ``path`` atomically."""
    return write_bytes_atomic(render_svg(schedule, width_px=width_px, summarise=summarise).encode("utf-8"), path, force=force)


def write_png(schedule: Schedule, path: str | os.PathLike[str], *, force: bool = False, dpi: int = 150,
              summarise: bool | None = None) -> Path:
    """Draw the same timeline (same cut, same legend) with matplotlib and write it as PNG atomically."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(12, 1.7 + 0.45 * schedule.pp))
    ax = fig.add_subplot(1, 1, 1)
    width_in = fig.get_figwidth() * 0.8
    span = schedule.makespan_s
    view = timeline_view(schedule, 0.0, span, summarise, gap_px=0.02 * span)  # "pixels" in data units
    for rank, events in enumerate(schedule.stages):
        lefts, widths, colours = [], [], []
        for ev in events:
            for a, b in view.visible(ev.start_s, ev.end_s):
                lefts.append(view.x(a))
                widths.append(view.x(b) - view.x(a))
                colours.append(_shade(KIND_COLOURS[ev.kind], ev.chunk, schedule.vpp))
            label = _bar_label(ev)
            parts = view.visible(ev.start_s, ev.end_s)
            if label and len(parts) == 1:
                a, b = parts[0]
                bar_in = (view.x(b) - view.x(a)) / span * width_in if span > 0 else 0.0
                if bar_in >= 0.09 * len(label) + 0.03:
                    ax.text((view.x(a) + view.x(b)) / 2, rank, label, ha="center", va="center", fontsize=7, color="white")
        ax.barh([rank] * len(lefts), widths, left=lefts, height=0.8, color=colours, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(schedule.pp), [f"stage {r}" for r in range(schedule.pp)])
    ax.set_ylim(schedule.pp - 0.5, -0.5)
    ax.set_xlim(0, view.x(span))
    ticks = view.ticks()
    ax.set_xticks([view.x(t) for t in ticks], [f"{t:g}" for t in ticks])
    ax.set_xlabel("time (s)")
    ax.set_title(_title(schedule), fontsize=10)
    handles = [Patch(facecolor=KIND_COLOURS[k], edgecolor="#999999", label=k) for k in _kinds_present(schedule)]
    if schedule.vpp > 1:
        handles += [Patch(facecolor=_shade(KIND_COLOURS["fwd"], c, schedule.vpp), edgecolor="#999999",
                          label=(f"virtual chunk {c}" + (" (dark)" if c == 0 else " (light)" if c == schedule.vpp - 1 else "")
                                 + (", fwd and bwd alike" if c == 0 else "")))
                    for c in range(schedule.vpp)]
    if view.cut:
        x0 = view.x(view.cut_start_s)
        ax.axvspan(x0, x0 + view.gap_px, color="white", zorder=3)
        ax.axvline(x0 + view.gap_px / 2, color="#555555", linestyle=(0, (2, 2)), linewidth=1.2, zorder=4)
        handles.append(Patch(facecolor="white", edgecolor="#555555", linestyle="--", label=_cut_label(view)))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return write_bytes_atomic(buf.getvalue(), path, force=force)
