"""Alpha-beta collectives: the seed chapter's worked numbers, hand-computed values per
algorithm and op, and published nccl-tests bus bandwidths for DGX A100 / DGX H100."""

from __future__ import annotations

import pytest

from planner.cost.collectives import (
    BUS_FACTOR,
    Level,
    algorithm_times,
    cluster_levels,
    collective,
    group_shape,
    simulate_ring_allreduce,
)
from planner.cost.network import Topology
from planner.errors import InputError
from planner.io.loaders import gpu_from_dict, make_cluster

GIB = 2**30
# One level: B = 1 GB/s, alpha = 1 us; n = 8 MB; p = 8 (f = 7/8, log2 p = 3).
L = Level("link", 1e9, 1e-6)
N = 8e6


def t(op, algo, p=8, n=N, level=L):
    return algorithm_times(op, n, p, 1, level)[algo]


# --- Seed chapter (openmlsys "Distributed Training", seed_chapter.md sec. 3) -----------------

def test_chapter_ring_allreduce_trace_3_devices():
    # Example 6: [2,4,6], [1,2,3], [4,8,12] -> [7,14,21] on every device, in 2(M-1) = 4 steps,
    # each device sending N/M = 1 element per step -> 4 elements in all.
    out, steps, sent = simulate_ring_allreduce([[2, 4, 6], [1, 2, 3], [4, 8, 12]])
    assert out == [[7, 14, 21]] * 3
    assert steps == 4
    assert sent == 4


def test_chapter_ring_step_count_and_volume():
    # Latency only (alpha = 1 s, B huge): time = 2(M-1) alpha = 4 steps for M = 3.
    steps = collective("allreduce", 12, 3, 1, Level("a", 1e30, 1.0), algorithm="ring").time_s
    assert steps == pytest.approx(4.0)
    # Bandwidth only (B = 1 B/s): 3 fp32 params = 12 B; each device sends 2(M-1) N/M
    # = 4 chunks x 4 B = 16 B, i.e. 2 (2/3) 12 = 16 s.
    vol = collective("allreduce", 12, 3, 1, Level("b", 1.0, 0.0), algorithm="ring").time_s
    assert vol == pytest.approx(16.0)
    # Cross-check (sec. 3 item 8): GPT-3 fp32 gradients 700 GB, ring over N = 3 sends
    # 2 (N-1)/N x 700 GB = 933.3 GB per device.
    gpt3 = collective("allreduce", 700e9, 3, 1, Level("b", 1.0, 0.0), algorithm="ring").time_s
    assert gpt3 == pytest.approx(2 * 2 / 3 * 700e9)
    assert gpt3 / 1e9 == pytest.approx(933.33, abs=0.01)


def test_chapter_1tb_over_200gbps_is_40s():
    # "1 TB over 200 Gb/s >= 40 s": 1e12 B * 8 / 200e9 b/s = 40 s (alpha = 0).
    nic = Level("ib", 200e9 / 8, 0.0)
    r = collective("sendrecv", 1e12, 1, 2, Level("nv", 1e12, 0.0), nic)
    assert r.time_s == pytest.approx(40.0)
    # The same through a cluster: 2 nodes x 1 GPU, one 200 Gb/s NIC at 100% efficiency.
    c = make_cluster("a100-sxm4-80gb", 2, 1, {"kind": "infiniband", "gbps_per_nic": 200, "nics_per_node": 1, "efficiency": 1.0, "latency_us": 0})
    assert Topology.from_cluster(c).collective("sendrecv", 1e12, 2).time_s == pytest.approx(40.0)


def test_chapter_bus_bandwidth_factors_and_tree_rounds():
    # Example 13: p = 8, allreduce busbw = algbw x 14/8; all-gather / reduce-scatter x 7/8.
    assert BUS_FACTOR("allreduce", 8) == pytest.approx(1.75)
    assert BUS_FACTOR("allgather", 8) == BUS_FACTOR("reducescatter", 8) == pytest.approx(7 / 8)
    assert BUS_FACTOR("broadcast", 8) == BUS_FACTOR("reduce", 8) == 1.0
    r = collective("allreduce", N, 8, 1, L, algorithm="ring")
    assert r.busbw_bytes_per_s == pytest.approx(r.algbw_bytes_per_s * 1.75)
    # Example 14: tree broadcast over 8 ranks takes log2 8 = 3 rounds, a chain 7.
    lat = Level("a", 1e30, 1.0)
    assert t("broadcast", "tree", level=lat) == pytest.approx(3.0)
    assert t("broadcast", "ring", level=lat) == pytest.approx(7.0)


# --- Hand-computed alpha-beta values, one level (B = 1e9 B/s, alpha = 1e-6 s, n = 8e6 B) ----

@pytest.mark.parametrize(
    "op, algo, p, expected",
    [
        # allreduce ring: 2(p-1) a + 2 (p-1)/p n/B = 14e-6 + 2 * 7/8 * 8e-3 = 14e-6 + 0.014
        ("allreduce", "ring", 8, 14e-6 + 0.014),
        # tree: 2 log2(p) a + 2 n/B = 6e-6 + 0.016
        ("allreduce", "tree", 8, 6e-6 + 0.016),
        # rhd, p = 8: 2*3 a + 2*7/8 n/B = 6e-6 + 0.014
        ("allreduce", "rhd", 8, 6e-6 + 0.014),
        # rhd, p = 6: 2*ceil(log2 6)=6 a + 2*5/6*8e-3 + 2(a + n/6/B) = 6e-6 + 0.013333 + 2e-6 + 0.0026667
        ("allreduce", "rhd", 6, 8e-6 + 2 * 5 / 6 * 8e-3 + 2 * 8e-3 / 6),
        # reduce-scatter / all-gather ring: 7 a + 7/8 n/B = 7e-6 + 0.007; rhd: 3 a + 0.007
        ("reducescatter", "ring", 8, 7e-6 + 0.007),
        ("reducescatter", "rhd", 8, 3e-6 + 0.007),
        ("allgather", "ring", 8, 7e-6 + 0.007),
        ("allgather", "rhd", 8, 3e-6 + 0.007),
        # broadcast / reduce, pipelined chain: 7 a + n/B = 7e-6 + 0.008; binary tree 3 a + 2 n/B
        ("broadcast", "ring", 8, 7e-6 + 0.008),
        ("broadcast", "tree", 8, 3e-6 + 0.016),
        ("reduce", "ring", 8, 7e-6 + 0.008),
        ("reduce", "tree", 8, 3e-6 + 0.016),
        # gather / scatter / all-to-all: 7 a + 7/8 n/B
        ("gather", "ring", 8, 7e-6 + 0.007),
        ("scatter", "ring", 8, 7e-6 + 0.007),
        ("alltoall", "ring", 8, 7e-6 + 0.007),
        # send/recv between 2 ranks: a + n/B = 1e-6 + 0.008
        ("sendrecv", "p2p", 2, 1e-6 + 0.008),
    ],
)
def test_flat_alpha_beta_by_hand(op, algo, p, expected):
    assert t(op, algo, p) == pytest.approx(expected, rel=1e-12)


def test_nvls_by_hand():
    # NVLS: 25 us + (1 + 1/p) n / (B e) = 25e-6 + 1.125 * 8e6 / (0.85 * 1e9) = 25e-6 + 0.0105882
    nv = Level("nvswitch", 1e9, 1e-6, nvls_efficiency=0.85)
    assert t("allreduce", "nvls", level=nv) == pytest.approx(25e-6 + 9e6 / 0.85e9)
    assert "nvls" not in algorithm_times("allreduce", N, 8, 1, L)  # no NVLS without an NVSwitch
    assert "nvls" not in algorithm_times("allreduce", N, 4, 2, nv, L)  # NCCL: NVLS within one node


# Two levels: k = 4 ranks per domain at 100 GB/s, alpha 1 us; m = 2 domains at 10 GB/s per
# rank, alpha 5 us; n = 8e6 B. A flat algorithm sees min(100e9, 4 * 10e9) = 40e9 B/s, alpha 5 us.
IN, OUT = Level("nv", 100e9, 1e-6), Level("ib", 10e9, 5e-6)


def test_two_level_allreduce_by_hand():
    times = algorithm_times("allreduce", N, 4, 2, IN, OUT)
    assert times["ring"] == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * 8e6 / 40e9)  # 70 + 350 us
    assert times["tree"] == pytest.approx(2 * 3 * 5e-6 + 2 * 8e6 / 40e9)  # 30 + 400 us
    assert times["rhd"] == pytest.approx(2 * 3 * 5e-6 + 2 * 7 / 8 * 8e6 / 40e9)  # 30 + 350 us
    # hierarchical: 2 x RS in the domain (ring, NCCL has no rhd: 3 us + 3/4 * 8e6/100e9 = 63 us)
    # + AR of n/k = 2e6 B over 2 domains (ring: 2*5 us + 2*1/2*2e6/10e9 = 210 us) = 336 us
    assert times["hierarchical"] == pytest.approx(2 * 63e-6 + 210e-6)
    r = collective("allreduce", N, 4, 2, IN, OUT)
    assert (r.algorithm, r.time_s) == ("hierarchical", pytest.approx(336e-6))


def test_two_level_other_ops_by_hand():
    ag = algorithm_times("allgather", N, 4, 2, IN, OUT)
    assert ag["ring"] == pytest.approx(7 * 5e-6 + 7 / 8 * 8e6 / 40e9)  # 35 + 175 us
    # AG in domain (ring 3 us + 60 us) + AG of 2e6 B over 2 domains (5 us + 1/2 * 2e6/10e9 = 105 us)
    assert ag["hierarchical"] == pytest.approx(63e-6 + 105e-6)
    bc = algorithm_times("broadcast", N, 4, 2, IN, OUT)
    # chain in domain: 3 us + 8e6/100e9 = 83 us; across 2 domains at 4 x 10e9: 5 us + 200 us
    assert bc["hierarchical"] == pytest.approx(83e-6 + 205e-6)
    # all-to-all: max(in-domain 3 us + 8e6*3/8/100e9 = 33 us, out 5 us + 8e6*4/8/10e9 = 405 us)
    assert algorithm_times("alltoall", N, 4, 2, IN, OUT) == {"pairwise": pytest.approx(405e-6)}
    # send/recv crosses the network: 5 us + 8e6/10e9 = 805 us
    assert algorithm_times("sendrecv", N, 1, 2, IN, OUT) == {"p2p": pytest.approx(805e-6)}
    # one rank per domain: no hierarchical variant
    assert "hierarchical" not in algorithm_times("allreduce", N, 1, 8, IN, OUT)


def test_auto_picks_fastest_per_size():
    small = collective("allreduce", 1024, 8, 1, L)
    big = collective("allreduce", 1e9, 8, 1, Level("nv", 1e9, 1e-6, 0.85))
    # a tiny message: the double binary tree (2 log2 p steps); recursive halving-doubling has as
    # few steps but NCCL does not implement it, so auto never picks it (it stays available by name)
    assert small.algorithm == "tree"
    assert collective("allreduce", 1024, 8, 1, L, algorithm="rhd").time_s <= small.time_s
    assert big.algorithm == "nvls"  # (1+1/p)/e = 1.32 < 2(p-1)/p = 1.75 bytes per byte


def test_each_call_pays_the_fixed_collective_latency():
    base = Level("nv", 100e9, 1e-6)
    with_call = Level("nv", 100e9, 1e-6, 0.0, 38e-6)
    for op in ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"):
        a, b = collective(op, N, 8, 1, base), collective(op, N, 8, 1, with_call)
        assert b.time_s == pytest.approx(a.time_s + 38e-6) and a.algorithm == b.algorithm, op


def test_errors_and_local():
    with pytest.raises(InputError):
        collective("allreducex", N, 8, 1, L)
    with pytest.raises(InputError):
        collective("allreduce", -1, 8, 1, L)
    with pytest.raises(InputError):
        collective("allreduce", N, 8, 1, L, algorithm="nvls")
    assert collective("allreduce", N, 1, 1, L).time_s == 0.0
    assert collective("allreduce", 0, 8, 1, L).algorithm == "local"


def test_group_shape_and_cluster_levels_unchanged():
    assert group_shape(8, 1, 8) == (8, 1)
    assert group_shape(16, 1, 8) == (8, 2)
    assert group_shape(4, 8, 8) == (1, 4)
    c = make_cluster("h100-sxm5-80gb", 16)
    intra, inter = cluster_levels(c)
    assert intra.bandwidth_bytes_per_s == pytest.approx(450e9 * 0.77)
    assert intra.nvls_efficiency == 0.85
    assert inter.bandwidth_bytes_per_s == pytest.approx(400e9 / 8 * 8 * 0.92 / 8)


# --- Published nccl-tests all_reduce_perf bus bandwidth, 8 GPUs in one node, 1 GiB ---------
# DGX A100 (NVLink 3, 300 GB/s per direction), NCCL Ring: ~230 GB/s (S. Jeaugey, NVIDIA,
# NVIDIA/nccl-tests#149; 232.5 GB/s measured in NVIDIA/nccl-tests#175; 229 GB/s at 1 GiB in
# vTrain's A100 tables, shared/validation/VTRAIN.md).
# DGX H100 (NVLink 4, 450 GB/s): Ring ~370 GB/s ("NCCL_ALGO=RING", S. Jeaugey,
# NVIDIA/nccl-tests#212; 365-370 GB/s for 2-8 GPUs in NVIDIA/nccl#1455); NVLS (the default
# for allreduce) ~480 GB/s, algbw ~275 GB/s (nccl-tests#212; nccl#1455; nccl#2140;
# GTC 2024 S62129 quoted in nccl#1374).

def _node(gpu: str, algorithm: str = "auto"):
    return Topology.from_cluster(make_cluster(gpu, 8)).collective("allreduce", GIB, 8, 1, algorithm)


@pytest.mark.parametrize(
    "gpu, algorithm, published_gbps, expect_algo",
    [
        ("a100-sxm4-80gb", "auto", 230.0, None),
        ("a100-sxm4-80gb", "ring", 230.0, "ring"),
        ("h100-sxm5-80gb", "ring", 370.0, "ring"),
        ("h100-sxm5-80gb", "auto", 480.0, "nvls"),
    ],
)
def test_nccl_tests_busbw_within_15_percent(gpu, algorithm, published_gbps, expect_algo):
    r = _node(gpu, algorithm)
    model = r.busbw_bytes_per_s / 1e9
    assert abs(model - published_gbps) / published_gbps < 0.15, (gpu, algorithm, model)
    if expect_algo:
        assert r.algorithm == expect_algo


def test_a100_has_no_nvls_and_h100_picks_it_at_1gib():
    assert "nvls" not in algorithm_times("allreduce", GIB, 8, 1, cluster_levels(make_cluster("a100-sxm4-80gb", 8))[0])
    assert _node("h100-sxm5-80gb").algorithm == "nvls"
    # NVLS pays 25 us of latency, so NCCL-like choice keeps ring/rhd for small messages.
    small = Topology.from_cluster(make_cluster("h100-sxm5-80gb", 8)).collective("allreduce", 64 * 1024, 8)
    assert small.algorithm != "nvls"


def test_blackwell_nvls_cross_check():
    # 8 x B300 (NVLink 5, 900 GB/s per direction), NVIDIA/nccl#2140: busbw 695 (NVLS off) and
    # 845 GB/s (NVLS on). Model: ring 0.77 x 900 = 693; NVLS 693 x 0.74 / 1.125 x 1.75 = 798 asymptotically (796 at 4 GiB).
    gpu = gpu_from_dict({"id": "b300-like", "memory_gib": 288, "hbm_bandwidth_gbs": 8000, "peak_tflops": {"fp16": 2250, "bf16": 2250},
                         "nvlink_gbs_per_direction": 900, "nvlink_generation": 5, "sm_count": 148})
    topo = Topology.from_cluster(make_cluster(gpu, 8))
    ring = topo.collective("allreduce", 4 * GIB, 8, 1, "ring").busbw_bytes_per_s / 1e9
    nvls = topo.collective("allreduce", 4 * GIB, 8, 1, "nvls").busbw_bytes_per_s / 1e9
    assert abs(ring - 695) / 695 < 0.15
    assert abs(nvls - 845) / 845 < 0.15
