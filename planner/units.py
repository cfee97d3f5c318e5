"""Units at the edge: the one convention every printed figure follows.

Inside the package everything is SI (bytes, seconds, FLOP, bytes/s). At the edge:

* memory and data sizes are binary: GiB (2^30 bytes, what ``torch.cuda.max_memory_allocated()
  / 2**30`` and ``nvidia-smi`` MiB/1024 show), MiB, KiB (:func:`gib`, :func:`fmt_bytes`);
* network line rates are Gb/s (1e9 bit/s, what NIC vendors quote: "400 Gb/s NDR");
* bus and storage bandwidths are GB/s (1e9 bytes/s, nccl-tests' bus bandwidth, file-system
  throughput) (:func:`fmt_gbs`);
* compute is TFLOP/s (1e12 FLOP/s) (:func:`fmt_tflops`);
* durations are s / min / h / d with three significant figures and no exponent
  (:func:`fmt_time` for step-sized times down to microseconds, :func:`fmt_duration` for
  spans of training: checkpoint intervals, MTBF, time to train);
* counts take a plural only when they are not one (:func:`plural`).

These helpers are the only formatting of those units; report/, emit/, studies/ and cli/ use
them. :data:`LEGEND` is the sentence a table footer prints once.

>>> gib(80 * 2**30), fmt_time(0.0123), fmt_tokens(1234567)
('80.0', '12.3 ms', '1.23M')
>>> fmt_duration(97_632), fmt_duration(1130 * 86400), plural(1, "node"), fmt_bytes(61.6 * 2**20)
('27.1 h', '1,130 d', '1 node', '61.6 MiB')
"""

from __future__ import annotations

import math

__all__ = ["GIB", "MIB", "LEGEND", "MEMORY_LEGEND", "gib", "fmt_bytes", "fmt_gbs", "fmt_gbps", "fmt_tflops", "fmt_time", "fmt_duration",
           "fmt_tokens", "fmt_precision", "sig", "plural", "wrap"]

GIB = 2**30
MIB = 2**20
MEMORY_LEGEND = "memory in GiB (2^30 bytes)"
LEGEND = "memory in GiB (2^30 bytes), line rates in Gb/s, bandwidth in GB/s (1e9 bytes/s)"


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures without an exponent: 0.00123, 1.23, 123, 12,300."""
    if not math.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    x = round(x, digits - 1 - mag)  # 99.96 -> 100.0: the magnitude after rounding sets the decimals
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    if decimals == 0:
        return f"{x:,.0f}"
    return f"{x:.{decimals}f}"


def gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal (no unit)."""
    return f"{nbytes / GIB:.1f}"


def fmt_bytes(nbytes: float) -> str:
    """A size with a binary unit, three significant figures: 512 B, 1.50 KiB, 61.6 MiB, 314 GiB, 5.16 TiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{sig(nbytes / scale)} {unit}"
    return f"{nbytes:.0f} B"


def fmt_gbs(bytes_per_s: float) -> str:
    """Bandwidth in GB/s (1e9 bytes/s): 4.81 GB/s, 2,000 GB/s."""
    return f"{sig(bytes_per_s / 1e9)} GB/s"


def fmt_gbps(bits_per_s: float) -> str:
    """A line rate in Gb/s (1e9 bit/s): 400 Gb/s."""
    return f"{sig(bits_per_s / 1e9)} Gb/s"


def fmt_tflops(flop_per_s: float) -> str:
    """Compute rate in TFLOP/s (1e12 FLOP/s): 989 TFLOP/s."""
    return f"{sig(flop_per_s / 1e12)} TFLOP/s"


def fmt_time(seconds: float) -> str:
    """Seconds with a unit: 123 s, 1.23 s, 123 ms, 12.3 ms, 12 us; long spans in h and d."""
    if seconds >= 86400 * 2:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600 * 2:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"
    if seconds > 0:
        return f"{seconds * 1e6:.0f} us"
    return "0"


def fmt_duration(seconds: float) -> str:
    """A span of wall-clock time, three significant figures, in the largest unit it fills
    twice: 2.84 s, 31.2 min, 27.1 h, 78.0 d, 1,130 d (never an exponent); ``inf`` stays inf."""
    if not math.isfinite(seconds):
        return "inf"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{sig(seconds / size)} {unit}"
    return f"{sig(seconds)} s" if seconds >= 1e-3 else fmt_time(seconds)


def fmt_tokens(x: float) -> str:
    """Three significant digits with k/M/G: 71.8k, 1.23M."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            v = x / scale
            return f"{v:#.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{x:.0f}"


def wrap(text: str, width: int = 80) -> str:
    """A long line folded at ``width`` columns (continuation lines indented two spaces), so
    that piped output stays within 80 columns."""
    import re  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    if not text:
        return ""
    glued = re.sub(r"(\d) (s|ms|us|min|h|d|GiB|GB/s|Gb/s)\b", "\\1\x00\\2", text)  # a number stays with its unit
    return "\n".join(textwrap.wrap(glued, width, subsequent_indent="  ", break_on_hyphens=False)).replace("\x00", " ")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 node``, ``2 nodes``, ``1 stage``, ``0 stages``."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def fmt_precision(precision: str, fp8_recipe: str = "", fp8_weights: bool = False, fp8_tp: bool = False) -> str:
    """The precision as headers print it: "fp8 (rowwise)", "fp8 (delayed, FP8 weights)",
    "fp8 (tensorwise, FP8 TP gathers)" with a concrete FP8 recipe, else the precision alone.

    >>> fmt_precision("fp8", "delayed", True), fmt_precision("fp8", "tensorwise", False, True), fmt_precision("bf16")
    ('fp8 (delayed, FP8 weights)', 'fp8 (tensorwise, FP8 TP gathers)', 'bf16')
    """
    if precision != "fp8" or not fp8_recipe or fp8_recipe == "auto":
        return precision
    return f"fp8 ({fp8_recipe}{', FP8 weights' if fp8_weights else ''}{', FP8 TP gathers' if fp8_tp else ''})"
