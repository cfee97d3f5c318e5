"""Collective communication under the latency-bandwidth (alpha-beta) model.

A message of ``n`` bytes over one link costs ``alpha + n / B`` (Hockney 1994; the seed
chapter's cost model, openmlsys v1 zh ``collective.md``). A collective over ``p`` ranks is a
sequence of such steps; the classic counts (Thakur, Rabenseifner & Gropp, IJHPCA 2005,
Table 1; Patarasuk & Yuan 2009 for the ring) are:

====================  ==========================  =================================
op / algorithm        latency term                bandwidth term (n = buffer bytes)
====================  ==========================  =================================
allreduce ring        2 (p-1) alpha               2 (p-1)/p * n / B
allreduce tree (DBT)  2 log2(p) alpha             2 n / B   (pipelined double tree)
allreduce rec. h-d    2 log2(p) alpha             2 (p-1)/p * n / B (Rabenseifner)
reduce-scatter ring   (p-1) alpha                 (p-1)/p * n / B
all-gather ring       (p-1) alpha                 (p-1)/p * n / B
broadcast / reduce    (p-1) alpha (pipelined)     n / B
gather / scatter      (p-1) alpha                 (p-1)/p * n / B   (root-bound)
all-to-all            (p-1) alpha                 (p-1)/p * n / B   (pairwise exchange)
send/recv             alpha                       n / B
====================  ==========================  =================================

Two levels: ``k`` ranks of the group share a scale-up domain (NVLink/NVSwitch), ``m``
domains are joined by the scale-out network. The hierarchical algorithm reduce-scatters
inside the domain, runs the op across domains on ``n/k`` bytes per rank (k such exchanges in
parallel, one per rail) and all-gathers back. A collective is priced on every level it
crosses; the cheapest algorithm is chosen per size, as NCCL's tuner does.

Bus bandwidth uses NCCL's factors (nccl-tests ``doc/PERFORMANCE.md``): allreduce 2(p-1)/p,
reduce-scatter and all-gather (p-1)/p, broadcast and reduce 1, all-to-all (p-1)/p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Level",
    "CollectiveResult",
    "OPS",
    "BUS_FACTOR",
    "collective",
    "collective_time",
    "group_shape",
    "cluster_levels",
]

OPS = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall", "sendrecv")


def _bus_factor(op: str, p: int) -> float:
    if p <= 1:
        return 1.0
    return {
        "allreduce": 2 * (p - 1) / p,
        "reducescatter": (p - 1) / p,
        "allgather": (p - 1) / p,
        "alltoall": (p - 1) / p,
        "gather": (p - 1) / p,
        "scatter": (p - 1) / p,
    }.get(op, 1.0)


BUS_FACTOR = _bus_factor


@dataclass(frozen=True)
class Level:
    """One level of the network as one rank sees it.

    ``bandwidth_bytes_per_s``: usable bytes/s per rank per direction at this level.
    ``latency_s``: alpha, the fixed cost of one step.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    bytes: float
    gpus: int
    algorithm: str
    time_s: float

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * _bus_factor(self.op, self.gpus)


def _log2(p: int) -> float:
    return math.ceil(math.log2(p)) if p > 1 else 0.0


def _flat(op: str, n: float, p: int, bw: float, alpha: float) -> dict[str, float]:
    """Time of ``op`` over ``p`` ranks on one level, per algorithm."""
    if p <= 1 or n <= 0:
        return {"local": 0.0}
    f = (p - 1) / p
    lg = _log2(p)
    if op == "allreduce":
        return {
            "ring": 2 * (p - 1) * alpha + 2 * f * n / bw,
            "tree": 2 * lg * alpha + 2 * n / bw,
            "rhd": 2 * lg * alpha + 2 * f * n / bw + (0 if p & (p - 1) == 0 else 2 * (alpha + n / p / bw)),
        }
    if op in ("reducescatter", "allgather"):
        return {
            "ring": (p - 1) * alpha + f * n / bw,
            "rhd": lg * alpha + f * n / bw + (0 if p & (p - 1) == 0 else alpha + n / p / bw),
        }
    if op in ("broadcast", "reduce"):
        return {"ring": (p - 1) * alpha + n / bw, "tree": lg * alpha + n / bw * (1 if p <= 2 else 2)}
    if op in ("gather", "scatter", "alltoall"):
        return {"ring": (p - 1) * alpha + f * n / bw}
    if op == "sendrecv":
        return {"p2p": alpha + n / bw}
    raise ValueError(op)


def _best(times: dict[str, float]) -> tuple[str, float]:
    name = min(times, key=lambda a: (times[a], a))
    return name, times[name]


def collective(
    op: str,
    nbytes: float,
    k: int,
    m: int,
    intra: Level,
    inter: Level | None = None,
    algorithm: str = "auto",
) -> CollectiveResult:
    """Time of ``op`` on ``nbytes`` over a group of ``k`` ranks in each of ``m`` domains.

    ``nbytes`` is the full buffer (allreduce/reduce-scatter input, all-gather output,
    all-to-all per-rank send buffer, send/recv message). ``algorithm`` forces one of
    ring, tree, rhd, hierarchical; ``auto`` picks the fastest.
    """
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}")
    p = k * m
    if p <= 1 or nbytes <= 0:
        return CollectiveResult(op, nbytes, p, "local", 0.0)
    if m <= 1 or inter is None:
        times = _flat(op, nbytes, k, intra.bandwidth_bytes_per_s, intra.latency_s)
    else:
        times = _two_level(op, nbytes, k, m, intra, inter)
    if algorithm != "auto":
        if algorithm not in times:
            raise ValueError(f"algorithm {algorithm!r} not available for {op} here (have {sorted(times)})")
        return CollectiveResult(op, nbytes, p, algorithm, times[algorithm])
    name, t = _best(times)
    return CollectiveResult(op, nbytes, p, name, t)


def _two_level(op: str, n: float, k: int, m: int, intra: Level, inter: Level) -> dict[str, float]:
    p = k * m
    # The k ranks of one domain each drive their own share of the NICs (rails), so a flat
    # algorithm spanning domains sees k x the per-rank scale-out bandwidth at each domain
    # boundary, capped by the scale-up link.
    bw_flat = min(intra.bandwidth_bytes_per_s, inter.bandwidth_bytes_per_s * k)
    alpha = inter.latency_s
    out: dict[str, float] = {}
    flat = _flat(op, n, p, bw_flat, alpha)
    if op == "alltoall":
        # Pairwise exchange: of each rank's n bytes, (k-1)/p stay in the domain, (p-k)/p leave
        # it through the rank's own share of the NICs.
        t_in = (k - 1) * intra.latency_s + n * (k - 1) / p / intra.bandwidth_bytes_per_s
        t_out = (m - 1) * alpha + n * (p - k) / p / inter.bandwidth_bytes_per_s
        return {"pairwise": max(t_in, t_out)}  # both levels move data at the same time
    if op == "sendrecv":
        return {"p2p": alpha + n / inter.bandwidth_bytes_per_s}
    for name, t in flat.items():
        out[name] = t
    if op == "allreduce":
        rs = _best(_flat("reducescatter", n, k, intra.bandwidth_bytes_per_s, intra.latency_s))[1]
        ar = _best(_flat("allreduce", n / k, m, inter.bandwidth_bytes_per_s, inter.latency_s))[1]
        out["hierarchical"] = 2 * rs + ar
    elif op in ("reducescatter", "allgather"):
        a = _best(_flat(op, n, k, intra.bandwidth_bytes_per_s, intra.latency_s))[1]
        b = _best(_flat(op, n / k, m, inter.bandwidth_bytes_per_s, inter.latency_s))[1]
        out["hierarchical"] = a + b
    elif op in ("broadcast", "reduce"):
        a = _best(_flat(op, n, k, intra.bandwidth_bytes_per_s, intra.latency_s))[1]
        b = _best(_flat(op, n, m, inter.bandwidth_bytes_per_s * k, inter.latency_s))[1]
        out["hierarchical"] = a + b
    return out


def collective_time(op: str, nbytes: float, k: int, m: int, intra: Level, inter: Level | None = None) -> float:
    return collective(op, nbytes, k, m, intra, inter).time_s


def group_shape(size: int, stride: int, domain: int) -> tuple[int, int]:
    """(ranks per scale-up domain, domains) of a group of ``size`` ranks spaced ``stride`` apart.

    Ranks are laid out domain by domain (rank r lives in domain r // domain); a group is
    {r0 + i * stride}. Assumes the usual power-of-two-friendly shapes.
    """
    if size <= 1:
        return 1, 1
    if stride >= domain:
        return 1, size
    per_domain = max(1, min(size, domain // stride))
    return per_domain, math.ceil(size / per_domain)


def cluster_levels(cluster) -> tuple[Level, Level]:
    """The scale-up and scale-out levels of a :class:`planner.specs.ClusterSpec`, per rank."""
    intra = Level(cluster.intra.kind, cluster.intra.usable_bytes_per_s, cluster.intra.latency_s)
    per_gpu = cluster.inter.node_bytes_per_s / cluster.gpus_per_node
    inter = Level(cluster.inter.kind, per_gpu, cluster.inter.latency_s)
    return intra, inter
