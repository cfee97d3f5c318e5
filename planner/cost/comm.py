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

from planner.cost.collectives import Level, call_latency, cluster_levels, collective, group_shape, pairwise_exchange_time
from planner.cost.network import Topology
from planner.specs import ClusterSpec, ParallelConfig

__all__ = [
    "GroupLinks", "group_links", "tp_allreduce_time", "p2p_time", "dp_collective_time", "dp_collective_parts", "alltoall_time",
    "cp_ring_time", "cp_ring_exposed", "cp_hiding_local_len", "moe_dispatch_bytes", "distinct_hit_fraction",
    "flex_dispatch_time",
]


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
    return _group_links(cluster, par.tp, par.cp, par.dp, par.pp, par.ep, par.etp or par.tp)


def degree_links(cluster: ClusterSpec, tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int | None = None) -> dict[str, GroupLinks]:
    """:func:`group_links` from the degrees alone."""
    return _group_links(cluster, tp, cp, dp, pp, ep, etp or tp)


@lru_cache(maxsize=65536)
def _group_links(cluster: ClusterSpec, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int) -> dict[str, GroupLinks]:
    intra, inter = cluster_levels(cluster)
    dom = cluster.nvlink_domain
    strides = {
        "tp": (tp, 1),
        "cp": (cp, tp),
        # Megatron-core's expert grid (parallel_state, order etp-ep-edp-pp): the expert-parallel
        # group strides by the expert tensor degree, the expert data-parallel group by etp x ep.
        "ep": (ep, etp),
        "etp": (etp, 1),
        "edp": (max(1, tp * cp * dp // (ep * etp)), etp * ep),
        "dp": (dp, tp * cp),
        "dp_cp": (dp * cp, tp),
        "pp": (pp, tp * cp * dp),
    }
    out = {}
    if cluster.tiers:
        # Switch tiers with oversubscription: each group is priced on the slowest tier it
        # crosses (planner.cost.network.Topology, the same placement `planner collective` uses).
        topo = Topology(cluster, cluster.tiers)
        for name, (size, stride) in strides.items():
            g = topo.group(size, stride)
            out[name] = GroupLinks(size, g.ranks_per_domain, g.domains, g.intra, g.inter or inter)
        return out
    for name, (size, stride) in strides.items():
        k, m = group_shape(size, stride, dom)
        out[name] = GroupLinks(size, k, m, intra, inter)
    return out


def tp_allreduce_time(links: GroupLinks, nbytes: float, sequence_parallel: bool) -> float:
    """One tensor-parallel exchange of an ``nbytes`` activation (all-reduce, or RS + AG with SP)."""
    if sequence_parallel:
        return links.time("reducescatter", nbytes) + links.time("allgather", nbytes)
    return links.time("allreduce", nbytes)


def mtp_tp_time(links: GroupLinks, nbytes: float, sequence_parallel: bool) -> float:
    """Tensor-parallel traffic of one multi-token prediction module per micro-batch beyond its
    transformer layer and output head, ``nbytes`` one b*s*h activation (Megatron-core
    multi_token_prediction.py _concat_embeddings and its embedding). With SP: the embedding's
    reduce-scatter (all-gather in backward), eh_proj's all-gather of its 2h input (reduce-scatter
    of the gradient in backward), and the gather of its h/tp output over the hidden dimension
    followed by the scatter to the sequence shards (one all-gather each way). Without SP: the
    embedding's all-reduce, the output gather, and the all-reduce of eh_proj's 2h input gradient."""
    if sequence_parallel:
        return (links.time("allgather", 2 * nbytes) + links.time("reducescatter", 2 * nbytes)
                + 3 * links.time("allgather", nbytes) + links.time("reducescatter", nbytes))
    return links.time("allreduce", nbytes) + links.time("allgather", nbytes) + links.time("allreduce", 2 * nbytes)


def p2p_time(links: GroupLinks, nbytes: float) -> float:
    """One pipeline send/recv between adjacent stages (on the inter level when the pipeline
    group leaves the domain)."""
    return links.time("sendrecv", nbytes)  # alpha + n / B on the level the group crosses


def dp_collective_parts(links: GroupLinks, grad_bytes: float, param_bytes: float, zero: int) -> tuple[float, float]:
    """Gradient synchronisation of one step as (gradient reduction, weight gather): all-reduce
    and nothing (ZeRO 0), or reduce-scatter of the gradients and all-gather of the updated
    16-bit weights (ZeRO 1/2, Megatron distributed optimizer; Rajbhandari et al. 2020 sec. 5)."""
    if zero == 0:
        return links.time("allreduce", grad_bytes), 0.0
    return links.time("reducescatter", grad_bytes), links.time("allgather", param_bytes)


def dp_collective_time(links: GroupLinks, grad_bytes: float, param_bytes: float, zero: int) -> float:
    """Gradient synchronisation of one step: the sum of :func:`dp_collective_parts`."""
    return sum(dp_collective_parts(links, grad_bytes, param_bytes, zero))


def alltoall_time(links: GroupLinks, nbytes: float) -> float:
    """One all-to-all of an ``nbytes`` per-rank send buffer over the expert-parallel group,
    priced on the levels it crosses (pairwise exchange: the (p - k)/p share that leaves the
    scale-up domain goes through the rank's NIC share; collectives._two_level)."""
    return links.time("alltoall", nbytes)


def moe_dispatch_bytes(tokens: float, hidden: int, top_k: int, load: float, bytes_per_elem: float = 2.0) -> float:
    """Per-rank send buffer of one MoE all-to-all (dispatch, or combine, which returns the
    same volume): every token goes to its top-k experts, ``tokens * top_k * h`` 16-bit
    elements (GShard, Lepikhin et al. 2020 sec. 3.2; Megatron-core alltoall token dispatcher),
    times the busiest rank's load factor (capacity padding or dropless imbalance). Each MoE
    layer runs two per forward (dispatch + combine) and two per backward."""
    return tokens * top_k * hidden * bytes_per_elem * load


def distinct_hit_fraction(experts: int, top_k: int, parts: int) -> float:
    """Chance that a token's ``top_k`` distinct experts (uniform over ``experts``, as under
    Megatron's force-balanced routing, ``moe_router_force_load_balancing``: random logits) fall at
    least once in one given part of ``parts`` equal parts (a rank's or a node's experts):
    1 - C(E - E/parts, k) / C(E, k), the hypergeometric miss."""
    if parts <= 1:
        return 1.0
    per = experts / parts
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, (experts - per - i)) / (experts - i)
    return 1.0 - miss


def flex_dispatch_time(links: GroupLinks, tokens: float, hidden: int, experts: int, top_k: int, load: float,
                       bytes_per_elem: float = 2.0) -> float:
    """One dispatch (or combine) of Megatron-core's flex token dispatcher with the DeepEP or
    HybridEP backend (``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend``;
    token_dispatcher.py ``_DeepepManager`` / ``_HybridEPManager``) over the expert group.

    Unlike the all-to-all dispatcher (one copy per routed expert, :func:`moe_dispatch_bytes`),
    these kernels send a token once per destination rank, and across scale-up domains once per
    destination domain, forwarding it inside that domain over NVLink (DeepEP README, "normal
    kernels": NVLink-to-RDMA asymmetric-domain forwarding; Zhao et al. 2025, DeepSeek-V3
    technical report sec. 3.2.2). Per rank and pass:
    scale-out bytes = T h B (m - 1) P(a given remote domain is hit),
    scale-up bytes = T h B R P(a given rank is hit) (k - 1) / k (the domain-local share of the
    distinct destination ranks; the forwarded copies count here too),
    with T tokens, R = ep ranks in m domains of k ranks (:func:`distinct_hit_fraction`), times
    the busiest rank's load factor; both levels move data at once, as in the pairwise all-to-all.
    """
    p, k, m = links.size, links.k, links.m
    if p <= 1 or tokens <= 0:
        return 0.0
    row = tokens * hidden * bytes_per_elem * load
    in_bytes = row * p * distinct_hit_fraction(experts, top_k, p) * (k - 1) / k
    out_bytes = row * (m - 1) * distinct_hit_fraction(experts, top_k, m)
    return pairwise_exchange_time(in_bytes, out_bytes, k, m, links.intra, links.inter) + call_latency(links.intra, links.inter, m)


def cp_ring_time(links: GroupLinks, kv_bytes: float) -> float:
    """Ring attention (Liu et al. 2023, arXiv 2310.01889; Megatron context parallelism): cp - 1
    rounds, each passing one rank's K/V chunk (``kv_bytes``) to the next rank. Backward passes
    K/V and their gradients: twice this."""
    return (links.size - 1) * links.time("sendrecv", kv_bytes)


def cp_ring_exposed(links: GroupLinks, kv_bytes: float, attn_fwd_s: float, attn_bwd_s: float) -> tuple[float, float]:
    """(forward, backward) exposed seconds of the ring exchange.

    TE's context-parallel attention (used by Megatron-core) posts step i+1's send/recv before
    computing step i's block, so the cp attention steps and the cp - 1 transfers pipeline:
    a pass takes a + (cp - 1) max(c, a) with a = attention per step (attn / cp) and c = one
    block's transfer, i.e. exposed = max(0, t_ring - (cp - 1)/cp * attn). The P2P kernels use
    one or two NCCL channels, so the SM contention of the bulk collectives
    (COMM_COMPUTE_OVERLAP_EFFICIENCY) is not charged here.

    Attention per ring step grows as (s/cp)^2 while one block grows as s/cp, so the exchange is
    hidden only above a local length (:func:`cp_hiding_local_len`).
    """
    cp = links.size
    if cp <= 1:
        return 0.0, 0.0
    t = cp_ring_time(links, kv_bytes)
    hide = (cp - 1) / cp
    return max(0.0, t - hide * attn_fwd_s), max(0.0, 2 * t - hide * attn_bwd_s)


def cp_hiding_local_len(kv_width: float, heads_local: float, core_head_dims: float, attn_flops_per_s: float, link_bytes_per_s: float) -> float:
    """Local sequence length s/cp above which the forward ring exchange hides behind attention.

    Per ring step (load-balanced causal chunks, b = 1): attention b (s/cp)^2 a_loc (d_qk + d_v)
    FLOPs, one K/V block 2 B (s/cp) kv_width bytes. Equal at
    s/cp = 2 kv_width attn_flops_per_s / (link_bytes_per_s a_loc (d_qk + d_v)) (latency ignored).
    Llama 3.1 405B, tp 8, H100 over 400 Gb/s IB: 2 * 256 * 445e12 / (46e9 * 16 * 256) = 1.2K tokens.
    """
    return 2.0 * kv_width * attn_flops_per_s / (link_bytes_per_s * heads_local * core_head_dims)
