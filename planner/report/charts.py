"""Charts of a plan: memory breakdown per pipeline stage, and throughput/MFU scaling.

Both are drawn with matplotlib (imported lazily) and written as SVG or PNG, chosen by the
file suffix, atomically and without overwriting an existing file unless ``force=True``.
The data preparation (:func:`memory_breakdown_gib`, :func:`scaling_series`) is pure and
validates its input, raising :class:`planner.errors.InputError`.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.errors import InputError
from planner.report.timeline_svg import write_bytes_atomic

__all__ = [
    "BYTES_PER_GIB",
    "MEMORY_CATEGORIES",
    "memory_breakdown_gib",
    "scaling_series",
    "scaling_efficiency",
    "write_memory_chart",
    "write_scaling_chart",
]

BYTES_PER_GIB = 2**30
# Canonical stacking order (bottom to top); other keys follow in first-seen order.
MEMORY_CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer_states", "activations", "buffers", "reserve",
                                      "outside the allocator")
_COLOURS = ("#4878d0", "#6acc64", "#d65f5f", "#956cb4", "#8c8c8c", "#ee854a", "#dc7ec0", "#82c6e2")
_SUFFIX_FORMATS = {".svg": "svg", ".png": "png"}


def _finite_nonneg(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(field, value, "a finite number >= 0")
    return float(value)


def memory_breakdown_gib(
    stages: Sequence[Mapping[str, float]], capacity_bytes: float
) -> tuple[list[str], list[list[float]], float]:
    """Return ``(categories, gib[category][stage], capacity_gib)`` for stacked bars.

    ``stages`` holds one ``{category -> bytes}`` dict per pipeline stage; a category missing
    from a stage counts as 0.
    """
    if isinstance(stages, (str, bytes, Mapping)) or not isinstance(stages, Sequence) or not stages:
        raise InputError("stages", stages, "a non-empty list of {category: bytes} dicts, one per stage")
    cap = _finite_nonneg("capacity_bytes", capacity_bytes)
    if cap == 0:
        raise InputError("capacity_bytes", capacity_bytes, "a number of bytes > 0")
    seen: list[str] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Mapping):
            raise InputError(f"stages[{i}]", stage, "a {category: bytes} dict")
        for key, value in stage.items():
            if not isinstance(key, str) or not key:
                raise InputError(f"stages[{i}]", key, "non-empty string category names")
            _finite_nonneg(f"stages[{i}][{key!r}]", value)
            if key not in seen:
                seen.append(key)
    categories = [c for c in MEMORY_CATEGORIES if c in seen] + [c for c in seen if c not in MEMORY_CATEGORIES]
    gib = [[float(stage.get(c, 0.0)) / BYTES_PER_GIB for stage in stages] for c in categories]
    return categories, gib, cap / BYTES_PER_GIB


def scaling_series(points: Sequence[Sequence[float]]) -> tuple[list[int], list[float], list[float]]:
    """Validate ``(gpus, tokens_per_s, mfu)`` points and return them sorted by GPU count.

    ``mfu`` is a fraction in [0, 1]; GPU counts must be distinct positive integers.
    """
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
        raise InputError("points", points, "a non-empty list of (gpus, tokens_per_s, mfu)")
    rows = []
    for i, point in enumerate(points):
        if isinstance(point, (str, bytes)) or not isinstance(point, Sequence) or len(point) != 3:
            raise InputError(f"points[{i}]", point, "a (gpus, tokens_per_s, mfu) triple")
        gpus, tps, mfu = point
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise InputError(f"points[{i}].gpus", gpus, "an integer >= 1")
        tps = _finite_nonneg(f"points[{i}].tokens_per_s", tps)
        mfu = _finite_nonneg(f"points[{i}].mfu", mfu)
        if mfu > 1:
            raise InputError(f"points[{i}].mfu", mfu, "a fraction in [0, 1]")
        rows.append((gpus, tps, mfu))
    rows.sort()
    gpus_list = [r[0] for r in rows]
    if len(set(gpus_list)) != len(gpus_list):
        raise InputError("points", points, "distinct GPU counts")
    return gpus_list, [r[1] for r in rows], [r[2] for r in rows]


def _format_for(path: str | os.PathLike[str]) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIX_FORMATS:
        raise InputError("path", str(path), "a file name ending in .svg or .png")
    return _SUFFIX_FORMATS[suffix]


def _save(fig: object, path: str | os.PathLike[str], fmt: str, force: bool, dpi: int) -> Path:
    import matplotlib

    buf = io.BytesIO()
    # Fixed hash salt and no date: the same chart gives the same SVG bytes.
    with matplotlib.rc_context({"svg.hashsalt": "planner", "svg.fonttype": "none"}):
        metadata = {"Date": None} if fmt == "svg" else None
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)
    return write_bytes_atomic(buf.getvalue(), path, force=force)


def write_memory_chart(
    stages: Sequence[Mapping[str, float]],
    capacity_bytes: float,
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    title: str = "Memory per GPU by pipeline stage",
    dpi: int = 150,
) -> Path:
    """Stacked bars of memory per stage in GiB with a line at the GPU capacity; SVG or PNG by suffix."""
    fmt = _format_for(path)
    categories, gib, cap_gib = memory_breakdown_gib(stages, capacity_bytes)
    from matplotlib.figure import Figure

    n = len(stages)
    fig = Figure(figsize=(max(5.0, 1.2 + 0.7 * n), 4.2))
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(n))
    bottom = [0.0] * n
    for k, (category, values) in enumerate(zip(categories, gib)):
        ax.bar(xs, values, bottom=bottom, width=0.7, color=_COLOURS[k % len(_COLOURS)],
               label=category.replace("_", " "), edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(cap_gib, color="black", linestyle="--", linewidth=1.2, label=f"capacity {cap_gib:.4g} GiB")
    ax.set_xticks(xs, [f"stage {i}" for i in xs], rotation=45 if n > 8 else 0)
    ax.set_ylabel("memory per GPU (GiB, 2^30 bytes)")
    ax.set_xlabel("pipeline stage")
    ax.set_ylim(0, max(max(bottom), cap_gib) * 1.12)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return _save(fig, path, fmt, force, dpi)


def scaling_efficiency(gpus: Sequence[int], tokens_per_s: Sequence[float]) -> tuple[list[float], list[float]]:
    """Ideal throughput and scaling efficiency against the smallest GPU count.

    Ideal (linear, strong-scaling at a fixed global batch) throughput at ``n`` GPUs is
    ``tps_0 * n / n_0``; efficiency = measured / ideal = ``(tps / n) / (tps_0 / n_0)``, 1 at
    the first point (the usual definition of parallel efficiency, e.g. Narayanan et al. 2021
    Fig. 15 "weak-scaling throughput" relative to linear)."""
    g, t, _ = scaling_series([(n, x, 0.0) for n, x in zip(gpus, tokens_per_s)])
    if t[0] <= 0:
        raise InputError("points[0].tokens_per_s", t[0], "a throughput > 0 at the smallest GPU count")
    per = t[0] / g[0]
    ideal = [per * n for n in g]
    return ideal, [x / i for x, i in zip(t, ideal)]


def write_scaling_chart(
    points: Sequence[Sequence[float]],
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    title: str = "Scaling: throughput and MFU vs GPU count",
    dpi: int = 150,
) -> Path:
    """Two panels over the GPU count (log2 axis): tokens/s of the best plan against ideal
    linear scaling from the smallest count (log y, so ideal is a straight line), and below
    it the scaling efficiency and MFU in %. Every axis names its quantity and unit."""
    fmt = _format_for(path)
    gpus, tokens_per_s, mfu = scaling_series(points)
    ideal, eff = scaling_efficiency(gpus, tokens_per_s)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig = Figure(figsize=(6.5, 6.0))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.xaxis.set_major_locator(FixedLocator(gpus))
        a.xaxis.set_minor_locator(NullLocator())
        a.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
        a.grid(True, which="major", alpha=0.3)
    ax.set_yscale("log")
    from planner.units import fmt_tokens  # noqa: PLC0415

    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: fmt_tokens(y)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _pos: fmt_tokens(y) if f"{y:.0e}"[0] in "25" else ""))
    ax.plot(gpus, ideal, linestyle="--", color="#8c8c8c", label=f"ideal (linear from {gpus[0]} GPUs)")
    ax.plot(gpus, tokens_per_s, marker="o", color="#4878d0", label="best plan")
    ax.set_ylabel("throughput (tokens/s, log scale)")
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax2.plot(gpus, [100.0 * e for e in eff], marker="o", color="#4878d0", label="scaling efficiency vs ideal")
    ax2.plot(gpus, [100.0 * u for u in mfu], marker="s", color="#d65f5f", label="MFU")
    for n, e in zip(gpus, eff):
        ax2.annotate(f"{100 * e:.0f}%", (n, 100 * e), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
    ax2.set_ylim(0, max(110.0, 100.0 * max(eff) * 1.1))
    ax2.set_ylabel("percent (%)")
    ax2.set_xlabel("GPUs (log2 scale)")
    ax2.legend(loc="lower left", frameon=False, fontsize=8)
    return _save(fig, path, fmt, force, dpi)
