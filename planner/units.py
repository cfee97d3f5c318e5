"""Units at the edge: the one convention every printed figure follows.

Inside the package everything is SI (bytes, seconds, FLOP, bytes/s). Printed memory is GiB
(2^30 bytes, what ``torch.cuda.max_memory_allocated() / 2**30`` and ``nvidia-smi`` MiB/1024
show); network rates are Gb/s (1e9 bit/s, NIC line rates) and GB/s (1e9 bytes/s, nccl-tests'
bus bandwidth); compute is TFLOP/s (1e12 FLOP/s). These helpers are the only formatting of
those units; report/, emit/ and cli/ use them.

>>> gib(80 * 2**30), fmt_time(0.0123), fmt_tokens(1234567)
('80.0', '12.3 ms', '1.23M')
"""

from __future__ import annotations

__all__ = ["GIB", "gib", "fmt_time", "fmt_tokens", "plural"]

GIB = 2**30


def gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal (no unit)."""
    return f"{nbytes / GIB:.1f}"


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


def fmt_tokens(x: float) -> str:
    """Three significant digits with k/M/G: 71.8k, 1.23M."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            v = x / scale
            return f"{v:#.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{x:.0f}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 node``, ``2 nodes``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
