"""Collective communication under the latency-bandwidth (alpha-beta) model.

A message of ``n`` bytes over one link costs ``alpha + n / B`` (Hockney 1994; the seed
chapter's cost model ``a + b*l``, openmlsys v1 zh ``collective.md``). A collective over ``p``
ranks is a sequence of such steps; the classic counts (Thakur, Rabenseifner & Gropp, IJHPCA
2005, Table 1; Patarasuk & Yuan 2009 for the ring) are, with ``f = (p-1)/p``:

====================  ==========================  =================================
op / algorithm        latency term                bandwidth term (n = buffer bytes)
====================  ==========================  =================================
allreduce ring        2 (p-1) alpha               2 f n / B
allreduce tree (DBT)  2 log2(p) alpha             2 n / B   (pipelined double tree)
allreduce rec. h-d    2 log2(p) alpha             2 f n / B (Rabenseifner)
allreduce nvls        25 us (NCCL hwLat)          (1 + 1/p) n / (B * e_nvls)
reduce-scatter ring   (p-1) alpha                 f n / B
all-gather ring       (p-1) alpha                 f n / B
broadcast / reduce    (p-1) alpha (pipelined)     n / B
gather / scatter      (p-1) alpha                 f n / B   (root-bound)
all-to-all            (p-1) alpha                 f n / B   (pairwise exchange)
send/recv             alpha                       n / B
====================  ==========================  =================================

Rec. h-d on a non-power-of-two ``p`` pays one extra exchange of ``n/p`` before and after
(Thakur et al. 2005 sec. 4.1). The double binary tree's ``2 n / B`` is NCCL's own model:
``src/graph/tuning.cc`` converts tree bus bandwidth to algorithm bandwidth with a factor 0.5.

NVLS (NVLink SHARP, NVSwitch gen 3 with NVLink >= 4, NCCL >= 2.17): the switch reduces and
multicasts, so each GPU's link carries its buffer once each way plus one ``n/p`` chunk
(``multimem.ld_reduce`` of its chunk from every GPU, then ``multimem.st`` of the result):
``(1 + 1/p) n`` bytes per direction (NVIDIA/nccl issue #2140). NCCL's tuner discounts NVLS
bandwidth by ``nvlsEfficiency`` = 0.85 on Hopper, 0.74 on Blackwell (NVIDIA/nccl
``src/graph/tuning.cc``, snapshot 5067397, lines 139-144) and charges 25 us of latency
(``hwLatencies[NVLINK][NVLS][SIMPLE]``, same file). NCCL runs NVLS within one node only
(``nNodes > 1`` disables it without CollNet, same file).

Two levels: ``k`` ranks of the group share a scale-up domain (NVLink/NVSwitch), ``m``
domains are joined by the scale-out network. The hierarchical algorithm reduce-scatters
inside the domain, runs the op across domains on ``n/k`` bytes per rank (k such exchanges in
parallel, one per rail) and all-gathers back. The cheapest algorithm is chosen per size, as
NCCL's tuner does (``time = latency + nBytes / bandwidth``, minimum over algorithms).

Bus bandwidth uses NCCL's factors (nccl-tests ``doc/PERFORMANCE.md``; seed chapter sec. 2):
allreduce 2(p-1)/p, reduce-scatter, all-gather, all-to-all, gather, scatter (p-1)/p,
broadcast, reduce and send/recv 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import InputError

__all__ = [
    "Level",
    "CollectiveResult",
    "OPS",
    "ALGORITHMS",
    "BUS_FACTOR",
    "NVLS_EFFICIENCY",
    "NVLS_LATENCY_S",
    "nvls_efficiency",
    "collective",
    "collective_time",
    "algorithm_times",
    "call_latency",
    "pairwise_exchange_time",
    "group_shape",
    "cluster_levels",
    "simulate_ring_allreduce",
]

OPS = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall", "sendrecv")
ALGORITHMS = ("ring", "tree", "rhd", "hierarchical", "nvls", "pairwise", "p2p")

# NVLink SHARP efficiency by NVLink generation (NVIDIA/nccl src/graph/tuning.cc
# ``nvlsEfficiency``: Volta 0, Ampere 0, Hopper 0.85, Blackwell 0.74). Hopper = NVLink 4,
# Blackwell = NVLink 5; generations before 4 have no NVLS.
NVLS_EFFICIENCY: dict[int, float] = {4: 0.85, 5: 0.74}
# NCCL tuning.cc hwLatencies[NVLINK][NVLS][SIMPLE] = 25 us (NVLS runs the Simple protocol only).
NVLS_LATENCY_S = 25e-6
# What NCCL implements: ring, tree (double binary), NVLS, and the hierarchical ring; recursive
# halving-doubling (Thakur et al. 2005) is kept for the chapter's comparison (``algorithm="rhd"``)
# but NCCL has no such algorithm, so ``auto`` does not pick it.
NOT_IN_NCCL = frozenset({"rhd"})


def nvls_efficiency(intra_kind: str, nvlink_generation: int) -> float:
    """NVLS bandwidth fraction for a scale-up level; 0 where there is no NVLink SHARP."""
    if intra_kind != "nvswitch" or nvlink_generation < 4:
        return 0.0
    return NVLS_EFFICIENCY.get(nvlink_generation, NVLS_EFFICIENCY[max(NVLS_EFFICIENCY)])


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
    ``nvls_efficiency``: > 0 when the level is an NVSwitch that reduces in the switch (NVLS).
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    nvls_efficiency: float = 0.0
    call_latency_s: float = 0.0  # fixed cost of one collective call on this level (NCCL launch, set-up)


@dataclass(frozen=True)
class CollectiveResult:
    """One collective's time and the algorithm chosen; bandwidths in bytes/s (nccl-tests' algbw, busbw).

    >>> import planner
    >>> r = planner.collective("allgather", 2**28, planner.make_cluster("a100-sxm4-80gb", 8))
    >>> r.op, r.gpus, r.busbw_bytes_per_s < 300e9
    ('allgather', 8, True)
    """

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


def _flat(op: str, n: float, p: int, bw: float, alpha: float, nvls: float = 0.0) -> dict[str, float]:
    """Time of ``op`` over ``p`` ranks on one level, per algorithm (table in the module doc)."""
    if p <= 1 or n <= 0:
        return {"local": 0.0}
    f = (p - 1) / p
    lg = _log2(p)
    pow2 = p & (p - 1) == 0
    if op == "allreduce":
        out = {
            "ring": 2 * (p - 1) * alpha + 2 * f * n / bw,
            "tree": 2 * lg * alpha + 2 * n / bw,
            "rhd": 2 * lg * alpha + 2 * f * n / bw + (0 if pow2 else 2 * (alpha + n / p / bw)),
        }
        if nvls > 0:
            out["nvls"] = NVLS_LATENCY_S + (1 + 1 / p) * n / (bw * nvls)
        return out
    if op in ("reducescatter", "allgather"):
        return {
            "ring": (p - 1) * alpha + f * n / bw,
            "rhd": lg * alpha + f * n / bw + (0 if pow2 else alpha + n / p / bw),
        }
    if op in ("broadcast", "reduce"):
        return {"ring": (p - 1) * alpha + n / bw, "tree": lg * alpha + n / bw * (1 if p <= 2 else 2)}
    if op in ("gather", "scatter", "alltoall"):
        return {"ring": (p - 1) * alpha + f * n / bw}
    if op == "sendrecv":
        return {"p2p": alpha + n / bw}
    raise InputError("op", op, "one of " + ", ".join(OPS))


def _best(times: dict[str, float]) -> tuple[str, float]:
    """The fastest algorithm NCCL has (:data:`NOT_IN_NCCL` only when nothing else is there)."""
    pool = {a: t for a, t in times.items() if a not in NOT_IN_NCCL} or times
    name = min(pool, key=lambda a: (pool[a], a))
    return name, pool[name]


def _check(op: str, nbytes: float, k: int, m: int) -> None:
    if op not in OPS:
        raise InputError("op", op, "one of " + ", ".join(OPS))
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise InputError("size", nbytes, "a non-negative number of bytes")
    for name, v in (("ranks per domain", k), ("domains", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(name, v, "a positive integer")


def algorithm_times(
    op: str, nbytes: float, k: int, m: int, intra: Level, inter: Level | None = None
) -> dict[str, float]:
    """Time in seconds of every algorithm available for ``op`` on this group shape, each with
    the fixed cost of one call (``Level.call_latency_s``, the larger of the levels used)."""
    _check(op, nbytes, k, m)
    if k * m <= 1 or nbytes <= 0:
        return {"local": 0.0}
    if m <= 1 or inter is None:
        times = _flat(op, nbytes, k * m, intra.bandwidth_bytes_per_s, intra.latency_s, intra.nvls_efficiency)
    else:
        times = _two_level(op, nbytes, k, m, intra, inter)
    call = call_latency(intra, inter, m)
    return {a: t + call for a, t in times.items()}


def call_latency(intra: Level, inter: Level | None, m: int) -> float:
    """The fixed cost of one collective call: the scale-up level's, or the larger of the two
    levels' when the group spans ``m`` > 1 domains."""
    return intra.call_latency_s if m <= 1 or inter is None else max(intra.call_latency_s, inter.call_latency_s)


def pairwise_exchange_time(in_bytes: float, out_bytes: float, k: int, m: int, intra: Level, inter: Level) -> float:
    """Seconds of a pairwise exchange (no call cost) in which each rank sends ``in_bytes`` in all
    to the k - 1 other ranks of its domain and ``out_bytes`` to the m - 1 other domains through
    its own share of the NICs, one alpha per peer step on each level, both levels at once."""
    t_in = (k - 1) * intra.latency_s + in_bytes / intra.bandwidth_bytes_per_s
    t_out = (m - 1) * inter.latency_s + out_bytes / inter.bandwidth_bytes_per_s
    return max(t_in, t_out)



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
    ring, tree, rhd, hierarchical, nvls; ``auto`` picks the fastest.
    """
    times = algorithm_times(op, nbytes, k, m, intra, inter)
    p = k * m
    if "local" in times:
        return CollectiveResult(op, nbytes, p, "local", 0.0)
    if algorithm != "auto":
        if algorithm not in times:
            raise InputError("algorithm", algorithm, f"one available for {op} on this group ({', '.join(['auto', *sorted(times)])})")
        return CollectiveResult(op, nbytes, p, algorithm, times[algorithm])
    name, t = _best(times)
    return CollectiveResult(op, nbytes, p, name, t)


def _two_level(op: str, n: float, k: int, m: int, intra: Level, inter: Level) -> dict[str, float]:
    p = k * m
    bi, ai = intra.bandwidth_bytes_per_s, intra.latency_s
    bo, ao = inter.bandwidth_bytes_per_s, inter.latency_s
    if op == "alltoall":
        # Pairwise exchange: of each rank's n bytes, (k-1)/p stay in the domain, (p-k)/p leave
        # it through the rank's own share of the NICs; both levels move data at the same time.
        return {"pairwise": pairwise_exchange_time(n * (k - 1) / p, n * (p - k) / p, k, m, intra, inter)}
    if op == "sendrecv":
        return {"p2p": ao + n / bo}
    # The k ranks of one domain each drive their own share of the NICs (rails), so a flat
    # algorithm spanning domains sees k x the per-rank scale-out bandwidth at each domain
    # boundary, capped by the scale-up link; every step pays the network alpha.
    out = dict(_flat(op, n, p, min(bi, bo * k), ao))
    if k == 1:
        return out  # one rank per domain: the hierarchical shape degenerates to the flat one
    if op == "allreduce":
        # Reduce-scatter in the domain, allreduce of n/k across domains (k rails in parallel),
        # all-gather back (NCCL's tree/"hierarchical" shape; Horovod hierarchical allreduce).
        rs = _best(_flat("reducescatter", n, k, bi, ai))[1]
        ar = _best(_flat("allreduce", n / k, m, bo, ao))[1]
        out["hierarchical"] = 2 * rs + ar
    elif op in ("reducescatter", "allgather"):
        a = _best(_flat(op, n, k, bi, ai))[1]
        b = _best(_flat(op, n / k, m, bo, ao))[1]
        out["hierarchical"] = a + b
    elif op in ("broadcast", "reduce"):
        a = _best(_flat(op, n, k, bi, ai))[1]
        b = _best(_flat(op, n, m, bo * k, ao))[1]
        out["hierarchical"] = a + b
    return out


def collective_time(op: str, nbytes: float, k: int, m: int, intra: Level, inter: Level | None = None) -> float:
    return collective(op, nbytes, k, m, intra, inter).time_s


def group_shape(size: int, stride: int, domain: int) -> tuple[int, int]:
    """(ranks per scale-up domain, domains) of a group of ``size`` ranks spaced ``stride`` apart.

    Ranks are laid out domain by domain (rank r lives in domain r // domain); a group is
    {r0 + i * stride}. Assumes the usual power-of-two-friendly shapes.
    :meth:`planner.cost.network.Topology.group` does the exact count for any level.
    """
    if size <= 1:
        return 1, 1
    if stride >= domain:
        return 1, size
    per_domain = max(1, min(size, domain // stride))
    return per_domain, math.ceil(size / per_domain)


def cluster_levels(cluster) -> tuple[Level, Level]:
    """The scale-up and scale-out levels of a :class:`planner.specs.ClusterSpec`, per rank."""
    nvls = nvls_efficiency(cluster.intra.kind, getattr(cluster.gpu, "nvlink_generation", 0))
    call = cluster.collective_latency_s
    intra = Level(cluster.intra.kind, cluster.intra.usable_bytes_per_s, cluster.intra.latency_s, nvls, call)
    per_gpu = cluster.inter.node_bytes_per_s / cluster.gpus_per_node
    inter = Level(cluster.inter.kind, per_gpu, cluster.inter.latency_s, 0.0, call)
    return intra, inter


def simulate_ring_allreduce(buffers: list[list[float]]) -> tuple[list[list[float]], int, int]:
    """Run the ring AllReduce (reduce-scatter then all-gather) on ``p`` equal buffers.

    Returns (final buffers, steps, elements each rank sent). This is the seed chapter's
    "Reduce-Broadcast" figure (openmlsys ``collective.md``): M-1 reduce steps and M-1
    broadcast steps, each rank sending one chunk of N/M elements per step. Buffers of
    length N must split into p chunks (N % p == 0).
    """
    p = len(buffers)
    if p < 1 or any(len(b) != len(buffers[0]) for b in buffers) or len(buffers[0]) % p:
        raise InputError("buffers", [len(b) for b in buffers], "p buffers of one length divisible by p")
    c = len(buffers[0]) // p
    buf = [list(b) for b in buffers]
    sent = [0] * p
    steps = 0
    for phase in ("reduce", "broadcast"):
        for s in range(p - 1):
            # Rank r sends chunk (r - s) (reduce) or (r + 1 - s) (broadcast) to rank r + 1.
            msgs = []
            for r in range(p):
                j = ((r - s) if phase == "reduce" else (r + 1 - s)) % p
                msgs.append((r, (r + 1) % p, j, buf[r][j * c:(j + 1) * c]))
            for src, dst, j, chunk in msgs:
                for i, v in enumerate(chunk):
                    buf[dst][j * c + i] = buf[dst][j * c + i] + v if phase == "reduce" else v
                sent[src] += c
            steps += 1
    return buf, steps, max(sent)
