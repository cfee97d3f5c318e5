"""Communication of one training step, priced with :mod:`planner.cost.collectives` on the
levels each parallel group crosses.

Rank order is Megatron-core's ``tp-cp-ep-dp-pp`` (tp fastest; ``parallel_state.py``
``RankGenerator``): a tensor-parallel group is ``tp`` consecutive ranks, a context group has
stride ``tp``, the data-parallel group stride ``tp*cp``, the pipeline group stride
``tp*cp*dp``. A group's (ranks per scale-up domain, domains) follow from its size and stride
(:func:`planner.cost.collectives.group_shape`).

Volumes per micro-batch and layer (Narayanan et al. 2021 sec. 3.2 and Korthikanti et al. 2022
sec. 4.2.2): tensor parallelism all-reduces the b s h activation twice in forward and twice in
backward (with sequence parallelism: all-gather + reduce-scatter of the same total volume);
pipeline stages send b s h / t per micro-batch each way (Megatron's scatter/gather
optimisation, Narayanan sec. 4.1); data parallelism all-reduces (ZeRO >= 1: reduce-scatters and
all-gathers) the gradients once per step; ZeRO-3 also all-gathers each layer's weights in
forward, in backward, and in the recomputed forward (Rajbhandari et al. 2020 sec. 7.2.2:
1.5x the data-parallel volume, plus the recompute gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.cost.collectives import Level, cluster_levels, collective, group_shape
from planner.specs import ClusterSpec, ParallelConfig

__all__ = ["GroupLinks", "group_links", "tp_allreduce_time", "p2p_time", "dp_collective_time", "alltoall_time", "cp_ring_time"]


@dataclass(frozen=True)
class GroupLinks:
    """For one parallel group: ranks per domain (k), domains (m) and the two levels."""

    size: int
    k: int
    m: int
    intra: Level
    inter: Level

    @property
    def link(self) -> str:
        """The slowest level the group crosses (where its collectives are priced)."""
        if self.size <= 1:
            return "local"
        return self.inter.name if self.m > 1 else self.intra.name

    def time(self, op: str, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        return _collective_time(op, nbytes, self.k, self.m, self.intra, self.inter)


@lru_cache(maxsize=262144)
def _collective_time(op: str, nbytes: float, k: int, m: int, intra: Level, inter: Level) -> float:
    return collective(op, nbytes, k, m, intra, inter).time_s


def group_links(cluster: ClusterSpec, par: ParallelConfig) -> dict[str, GroupLinks]:
    return _group_links(cluster, par.tp, par.cp, par.dp, par.pp, par.ep)


@lru_cache(maxsize=65536)
def _group_links(cluster: ClusterSpec, tp: int, cp: int, dp: int, pp: int, ep: int) -> dict[str, GroupLinks]:
    intra, inter = cluster_levels(cluster)
    dom = cluster.nvlink_domain
    strides = {
        "tp": (tp, 1),
        "cp": (cp, tp),
        "ep": (ep, tp * cp),
        "dp": (dp, tp * cp),
        "dp_cp": (dp * cp, tp),
        "pp": (pp, tp * cp * dp),
    }
    out = {}
    for name, (size, stride) in strides.items():
        k, m = group_shape(size, stride, dom)
        out[name] = GroupLinks(size, k, m, intra, inter)
    return out


def tp_allreduce_time(links: GroupLinks, nbytes: float, sequence_parallel: bool) -> float:
    """One tensor-parallel exchange of an ``nbytes`` activation (all-reduce, or RS + AG with SP)."""
    if sequence_parallel:
        return links.time("reducescatter", nbytes) + links.time("allgather", nbytes)
    return links.time("allreduce", nbytes)


def p2p_time(links: GroupLinks, nbytes: float) -> float:
    """One pipeline send/recv between adjacent stages (on the inter level when the pipeline
    group leaves the domain)."""
    if links.size <= 1:
        return 0.0
    lvl = links.inter if links.m > 1 else links.intra
    return lvl.latency_s + nbytes / lvl.bandwidth_bytes_per_s


def dp_collective_time(links: GroupLinks, grad_bytes: float, param_bytes: float, zero: int) -> float:
    """Gradient synchronisation of one step: all-reduce (ZeRO 0) or reduce-scatter of the
    gradients plus all-gather of the updated 16-bit weights (ZeRO 1/2, Megatron distributed
    optimizer)."""
    if zero == 0:
        return links.time("allreduce", grad_bytes)
    return links.time("reducescatter", grad_bytes) + links.time("allgather", param_bytes)


def alltoall_time(links: GroupLinks, nbytes: float) -> float:
    return links.time("alltoall", nbytes)


def cp_ring_time(links: GroupLinks, kv_bytes: float) -> float:
    """Ring attention (Liu et al. 2023; Megatron context parallelism): cp - 1 rounds, each
    passing one rank's K/V chunk to the next rank."""
    if links.size <= 1:
        return 0.0
    lvl = links.inter if links.m > 1 else links.intra
    return (links.size - 1) * (lvl.latency_s + kv_bytes / lvl.bandwidth_bytes_per_s)
