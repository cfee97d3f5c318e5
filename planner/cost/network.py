"""Cluster network topology: levels, tiers, and which levels a parallel group crosses.

Levels, bottom to top (seed chapter, "Cluster architecture": server -> rack/ToR -> spine, a
multi-level tree whose uplinks are a bottleneck; keep traffic low in the tree):

* ``scale-up``: the NVLink/NVSwitch domain (8 GPUs in a DGX/HGX node, 72 in an NVL72 rack:
  ``IntraNodeLink.domain_size``) or the PCIe complex of a PCIe-only server. Per-rank
  bandwidth = ``IntraNodeLink.usable_bytes_per_s``.
* one level per switch tier of the scale-out fabric (InfiniBand, RoCE, Ethernet), from
  ``tiers``: ``[{"name": "leaf", "nodes": 32, "oversubscription": 1.0}, {"name": "spine",
  "oversubscription": 2.0}]``. ``nodes`` is the number of nodes under one switch of the tier
  (for a rail-optimised fabric, the nodes of one rail group: GPU i of every node there
  shares rail switch i, and NCCL's PXN keeps traffic on its rail); the last tier may omit
  it (the whole cluster). ``oversubscription`` is the tier's downlink:uplink ratio (the
  chapter's example: two 10 Gb/s servers into one 10 Gb/s uplink is 2:1, each flow 5 Gb/s).

Traffic that climbs to tier t passes every tier below it, so its per-rank bandwidth is
``NIC bytes/s per GPU / prod(oversubscription of tiers 0..t)``: a group inside one leaf sees
the full NIC bandwidth (times the leaf's own ratio, 1 when non-blocking), one spanning
leaves sees it divided by the spine ratio. Without ``tiers`` there is one tier,
``network``, carrying ``InterNodeNetwork.oversubscription`` for all cross-node traffic
(the same numbers as :func:`planner.cost.collectives.cluster_levels`).

Ranks are laid out domain by domain, node by node (rank r is on node r // gpus_per_node),
the Megatron order with TP innermost. A group is ``{r0 + i * stride : i < size}``, taken at
``r0 = 0``. A collective is priced on two levels: the scale-up domain and the slowest (the
highest) network tier the group crosses (:func:`planner.cost.collectives.collective`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.collectives import CollectiveResult, Level, collective, nvls_efficiency
from planner.errors import InputError
from planner.specs import Tier

__all__ = ["Tier", "GroupPlacement", "Topology"]

@dataclass(frozen=True)
class GroupPlacement:
    """Where a group of ``size`` ranks, ``stride`` apart, lands in the topology.

    ``ranks_per_domain`` (k) and ``domains`` (m) feed the two-level collective model;
    ``crossed`` lists the levels its traffic uses, bottom up; ``inter`` is the slowest
    network level it crosses (None inside one scale-up domain).
    """

    size: int
    stride: int
    ranks_per_domain: int
    domains: int
    intra: Level
    inter: Level | None
    crossed: tuple[Level, ...]

    @property
    def bottleneck(self) -> Level:
        return min(self.crossed, key=lambda lv: lv.bandwidth_bytes_per_s) if self.crossed else self.intra


def _blocks(size: int, stride: int, block: int) -> tuple[int, int]:
    """(max members in one block of ``block`` ranks, blocks touched) for {i * stride}."""
    if size <= 1:
        return 1, 1
    if stride >= block:
        return 1, size  # consecutive members differ by >= block: all in distinct blocks
    touched = ((size - 1) * stride) // block + 1  # stride < block: every block in the span is hit
    return min(size, math.ceil(block / stride)), touched


class Topology:
    """The network of a :class:`planner.specs.ClusterSpec`, level by level."""

    def __init__(self, cluster, tiers: tuple[Tier, ...] | None = None):
        self.cluster = cluster
        self.gpus = cluster.num_gpus
        self.gpus_per_node = cluster.gpus_per_node
        self.domain_gpus = cluster.nvlink_domain
        nvls = nvls_efficiency(cluster.intra.kind, getattr(cluster.gpu, "nvlink_generation", 0))
        call = cluster.collective_latency_s
        self.scale_up = Level(cluster.intra.kind, cluster.intra.usable_bytes_per_s, cluster.intra.latency_s, nvls, call)
        inter = cluster.inter
        parsed = tuple(cluster.tiers if tiers is None else tiers)
        if parsed:
            nodes = cluster.num_nodes
            top = parsed[-1]
            if top.nodes is not None and top.nodes < nodes:
                raise InputError(f"inter_node.tiers[{top.name}].nodes", top.nodes, f"at least the cluster's {nodes} nodes, or omitted")
        else:
            parsed = (Tier("network", None, inter.oversubscription),)
        # node_bytes_per_s already divides by the flat InterNodeNetwork.oversubscription; undo
        # it here so that the tiers (the flat ratio itself when there are none) apply it once.
        nic = inter.node_bytes_per_s * inter.oversubscription / self.gpus_per_node
        self.tiers = parsed
        levels, ratio = [], 1.0
        for t in parsed:
            ratio *= t.oversubscription
            levels.append(Level(f"{inter.kind}:{t.name}", nic / ratio, inter.latency_s, 0.0, call))
        self.network = tuple(levels)
        self.nic_bytes_per_s_per_gpu = nic

    @classmethod
    def from_cluster(cls, cluster, tiers: tuple[Tier, ...] | None = None) -> "Topology":
        return cls(cluster, tiers)

    @property
    def levels(self) -> tuple[Level, ...]:
        return (self.scale_up, *self.network)

    def _tier_gpus(self, i: int) -> int:
        t = self.tiers[i]
        return self.gpus if t.nodes is None else t.nodes * self.gpus_per_node

    def group(self, size: int, stride: int = 1) -> GroupPlacement:
        """Placement of the group {i * stride : i < size} (ranks in Megatron order)."""
        for name, v in (("group size", size), ("group stride", stride)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, v, "a positive integer")
        if (size - 1) * stride + 1 > self.gpus:
            raise InputError("group size", size, f"a group that fits in {self.gpus} GPUs at stride {stride}")
        k, m = _blocks(size, stride, self.domain_gpus)
        if m <= 1:
            return GroupPlacement(size, stride, size, 1, self.scale_up, None, (self.scale_up,))
        crossed = [self.scale_up] if k > 1 else []
        top = len(self.tiers) - 1
        for i in range(len(self.tiers)):
            if _blocks(size, stride, self._tier_gpus(i))[1] <= 1:
                top = i
                break
        crossed += list(self.network[: top + 1])
        return GroupPlacement(size, stride, k, m, self.scale_up, self.network[top], tuple(crossed))

    def collective(self, op: str, nbytes: float, size: int, stride: int = 1, algorithm: str = "auto") -> CollectiveResult:
        """Price ``op`` for the group (size, stride) on the scale-up level and its slowest tier."""
        g = self.group(size, stride)
        return collective(op, nbytes, g.ranks_per_domain, g.domains, g.intra, g.inter, algorithm)

    def describe(self) -> list[dict]:
        """Levels as plain dicts (SI units) for reports and ``--json``."""
        out = [{"name": self.scale_up.name, "gpus": self.domain_gpus, "bandwidth_bytes_per_s": self.scale_up.bandwidth_bytes_per_s,
                "latency_s": self.scale_up.latency_s, "nvls": self.scale_up.nvls_efficiency > 0}]
        for i, lv in enumerate(self.network):
            out.append({"name": lv.name, "gpus": self._tier_gpus(i), "bandwidth_bytes_per_s": lv.bandwidth_bytes_per_s,
                        "latency_s": lv.latency_s, "oversubscription": self.tiers[i].oversubscription})
        return out


def group_collective(op: str, nbytes: float, cluster, gpus: int | None = None, stride: int = 1, algorithm: str = "auto") -> CollectiveResult:
    """Time one collective on a cluster: ``op`` on ``nbytes`` (the full buffer) over a group of
    ``gpus`` ranks (default: the whole cluster) spaced ``stride`` apart in Megatron's rank order,
    priced on the scale-up domain and the slowest network tier the group crosses.

    This is ``planner.collective``: every argument is a public type (a ClusterSpec from
    :func:`planner.make_cluster`), the result a :class:`CollectiveResult` (time, algorithm,
    algorithm and bus bandwidth).

    >>> import planner
    >>> r = planner.collective("allreduce", 2**30, planner.make_cluster("h100-sxm5-80gb", 8))
    >>> r.algorithm, round(r.time_s * 1e3, 2) > 0
    ('nvls', True)
    """
    topo = Topology.from_cluster(cluster)
    return topo.collective(op, nbytes, cluster.num_gpus if gpus is None else gpus, stride, algorithm)


__all__.append("group_collective")
