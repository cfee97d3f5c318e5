"""Topology levels and the group -> level mapping (planner.cost.network)."""

from __future__ import annotations

import pytest

from planner.cost.collectives import cluster_levels
from planner.io.loaders import tiers_from_list
from planner.cost.network import Tier, Topology
from planner.errors import InputError
from planner.io.loaders import make_cluster

IB = {"kind": "infiniband", "gbps_per_nic": 400, "nics_per_node": 8}
NIC_PER_GPU = 400e9 / 8 * 0.92  # 400 Gb/s NIC per GPU at the InfiniBand efficiency 0.92
TIERS = [{"name": "leaf", "nodes": 4, "oversubscription": 1.0}, {"name": "spine", "oversubscription": 2.0}]


def dgx_h100(gpus=64, tiers=TIERS):
    return Topology.from_cluster(make_cluster("h100-sxm5-80gb", gpus, 8, IB), tiers_from_list(tiers))


def test_chapter_2_to_1_oversubscription():
    # Seed chapter sec. 3 item 9: two 10 Gb/s servers under a ToR with one 10 Gb/s uplink
    # to the spine: 2:1, each cross-rack flow gets 5 Gb/s. 4 servers, 1 GPU each, 2 per ToR.
    c = make_cluster("a100-sxm4-80gb", 4, 1, {"kind": "ethernet", "gbps_per_nic": 10, "nics_per_node": 1, "efficiency": 1.0, "latency_us": 0})
    topo = Topology.from_cluster(c, tiers_from_list([{"name": "tor", "nodes": 2}, {"name": "spine", "oversubscription": 2}]))
    same_rack, cross_rack = topo.group(2, 1), topo.group(2, 2)
    assert same_rack.inter.bandwidth_bytes_per_s * 8 == pytest.approx(10e9)
    assert cross_rack.inter.bandwidth_bytes_per_s * 8 == pytest.approx(5e9)
    # 1 GB send: 1e9 * 8 / 10e9 = 0.8 s inside the rack, 1.6 s across it (plus NCCL's fixed
    # per-call cost, negligible here).
    call = c.collective_latency_s
    assert topo.collective("sendrecv", 1e9, 2, 1).time_s == pytest.approx(0.8 + call)
    assert topo.collective("sendrecv", 1e9, 2, 2).time_s == pytest.approx(1.6 + call)


def test_levels_and_bandwidths():
    topo = dgx_h100()
    assert [lv.name for lv in topo.levels] == ["nvswitch", "infiniband:leaf", "infiniband:spine"]
    assert topo.levels[0].bandwidth_bytes_per_s == pytest.approx(450e9 * 0.77)
    assert topo.levels[1].bandwidth_bytes_per_s == pytest.approx(NIC_PER_GPU)
    assert topo.levels[2].bandwidth_bytes_per_s == pytest.approx(NIC_PER_GPU / 2)
    assert [d["gpus"] for d in topo.describe()] == [8, 32, 64]


@pytest.mark.parametrize(
    "size, stride, k, m, crossed",
    [
        (8, 1, 8, 1, ["nvswitch"]),  # TP inside a node
        (16, 1, 8, 2, ["nvswitch", "infiniband:leaf"]),  # 2 nodes under one leaf
        (4, 8, 1, 4, ["infiniband:leaf"]),  # DP over nodes 0-3: one leaf, one GPU per node
        (8, 8, 1, 8, ["infiniband:leaf", "infiniband:spine"]),  # DP over 8 nodes: two leaves
        (64, 1, 8, 8, ["nvswitch", "infiniband:leaf", "infiniband:spine"]),
        (2, 4, 2, 1, ["nvswitch"]),
    ],
)
def test_group_mapping(size, stride, k, m, crossed):
    g = dgx_h100().group(size, stride)
    assert (g.ranks_per_domain, g.domains) == (k, m)
    assert [lv.name for lv in g.crossed] == crossed
    assert g.bottleneck.name == crossed[-1] or g.bottleneck.bandwidth_bytes_per_s <= g.crossed[-1].bandwidth_bytes_per_s


def test_priced_on_slowest_level():
    topo = dgx_h100()
    in_leaf = topo.collective("allreduce", 2**30, 4, 8)  # nodes 0..3
    across = topo.collective("allreduce", 2**30, 8, 8)  # nodes 0..7
    # 1 GiB over 4 ranks at 46 GB/s: ring 2*3/4 n/B; over 8 at 23 GB/s: 2*7/8 n/B (the ring's
    # per-step latencies and the per-call cost are under 0.5% of these)
    assert in_leaf.time_s == pytest.approx(2 * 3 / 4 * 2**30 / NIC_PER_GPU, rel=5e-3)
    assert across.time_s == pytest.approx(2 * 7 / 8 * 2**30 / (NIC_PER_GPU / 2), rel=5e-3)


def test_default_single_tier_matches_cluster_levels():
    c = make_cluster("h100-sxm5-80gb", 32, 8, {**IB, "oversubscription": 2.0})
    topo = Topology.from_cluster(c)
    intra, inter = cluster_levels(c)
    g = topo.group(32, 1).inter
    assert (g.bandwidth_bytes_per_s, g.latency_s) == (pytest.approx(inter.bandwidth_bytes_per_s), inter.latency_s)
    assert topo.scale_up == intra


def test_nvl72_domain_spans_nodes():
    # GB200 NVL72-like: 4 GPUs per compute tray, NVLink domain of 72 (IntraNodeLink.domain_size).
    c = make_cluster("h100-sxm5-80gb", 144, 4, IB, {"domain_size": 72})
    topo = Topology.from_cluster(c)
    assert topo.group(64, 1).crossed == (topo.scale_up,)  # 16 trays, one NVLink domain
    g = topo.group(2, 72)  # the same GPU in the two racks
    assert g.inter is not None and g.ranks_per_domain == 1


def test_pcie_only_server():
    c = make_cluster("a100-sxm4-80gb", 8, 8, IB, {"kind": "pcie"})
    lv = Topology.from_cluster(c).scale_up
    assert lv.name == "pcie" and lv.bandwidth_bytes_per_s == pytest.approx(32e9 * 0.75)
    assert lv.nvls_efficiency == 0.0


@pytest.mark.parametrize(
    "tiers",
    [
        [{"name": "leaf", "nodes": 4, "oversubscription": 0.5}],
        [{"name": "leaf", "nodes": 4, "speed": 1}],
        [{"name": "leaf"}, {"name": "spine", "nodes": 8}],
        [{"name": "leaf", "nodes": 8}, {"name": "spine", "nodes": 4}],
        [{"name": "leaf", "nodes": 2}],  # top tier smaller than the cluster's 8 nodes
        "leaf",
        [],
    ],
)
def test_bad_tiers(tiers):
    with pytest.raises(InputError):
        dgx_h100(64, tiers)


def test_tiers_from_inter_node_mapping_and_bad_groups():
    assert tiers_from_list({"kind": "infiniband", "tiers": TIERS}) == (Tier("leaf", 4, 1.0), Tier("spine", None, 2.0))
    assert tiers_from_list(None) == ()
    with pytest.raises(InputError):
        dgx_h100().group(65, 1)
    with pytest.raises(InputError):
        dgx_h100().group(8, 0)
