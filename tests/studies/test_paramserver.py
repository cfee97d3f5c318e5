"""Parameter server vs sharded embeddings (TorchRec's types): closed-form traffic, occupancy vs
Monte Carlo, hot spots, stragglers, failure replicas, the sharding types and the crossover."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import replace

import numpy as np
import pytest

from planner.cost.constants import LINK_DEFAULTS
from planner.errors import InputError
from planner.studies.paramserver import (
    PRESETS,
    PSCluster,
    RecModel,
    evaluate,
    order_stat_exp,
    shard_unique_rows,
    unique_rows,
    zipf_harmonic,
)
from planner.studies.paramserver import SHARDED
from planner.studies.paramserver_report import best_sharded, crossover_rows, format_result, format_sweep, sweep, write_chart

ALPHA_S, EFF = LINK_DEFAULTS["ethernet"]
BW = 100e9 / 8 * EFF  # 100 Gb/s NIC, usable bytes/s


def _mc_unique(rows: int, s: float, n: int, trials: int, seed: int = 1234) -> float:
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=float) ** -s
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    return float(np.mean([np.unique(np.searchsorted(cdf, rng.random(n))).size for _ in range(trials)]))


# --- occupancy -----------------------------------------------------------------------------


def test_unique_rows_uniform_closed_form():
    # 4 rows, 2 draws: 4 * (1 - (3/4)^2) = 1.75
    assert unique_rows(4, 0.0, 2) == pytest.approx(1.75)
    # 1000 rows, 10 draws: 1000 * (1 - 0.999^10) = 9.955119790...
    assert unique_rows(1000, 0.0, 10) == pytest.approx(9.955119790251764, rel=1e-12)
    assert unique_rows(10, 1.0, 10**9) == pytest.approx(10.0)  # every row touched
    assert unique_rows(10, 1.0, 0) == 0.0


@pytest.mark.parametrize("rows,s,n,trials", [(100_000, 1.0, 4096, 200), (50_000, 0.6, 2048, 200),
                                             (2_000_000, 0.8, 20_000, 30), (2_000_000, 1.2, 50_000, 30)])
def test_unique_rows_matches_monte_carlo(rows, s, n, trials):
    assert unique_rows(rows, s, n) == pytest.approx(_mc_unique(rows, s, n, trials), rel=0.03)


def test_tail_integral_matches_exact_sum():
    rows, s, n = 3_000_000, 1.05, 30_000
    i = np.arange(1, rows + 1, dtype=float)
    p = i**-s / np.sum(i**-s)
    exact = float(np.sum(-np.expm1(n * np.log1p(-p))))
    assert zipf_harmonic(rows, s) == pytest.approx(float(np.sum(i**-s)), rel=1e-6)
    assert unique_rows(rows, s, n) == pytest.approx(exact, rel=1e-4)


def test_shards_sum_to_total_and_range_is_hot():
    tot = unique_rows(1_000_000, 1.1, 8192)
    for part in ("range", "hash"):
        assert shard_unique_rows(1_000_000, 1.1, 8192, 8, part).sum() == pytest.approx(tot, rel=1e-4)
    rng_ = shard_unique_rows(1_000_000, 1.1, 8192, 8, "range")
    assert rng_[0] == rng_.max() and rng_[0] > 3 * rng_[1:].sum() / 7


def test_more_skew_fewer_unique_rows():
    u = [unique_rows(10_000_000, s, 65_536) for s in (0.0, 0.5, 0.8, 1.0, 1.2, 1.5)]
    assert all(a > b for a, b in zip(u, u[1:]))


# --- traffic, hand-computed ------------------------------------------------------------------


def test_traffic_hand_computed_uniform_one_table():
    # 1 table x 1000 rows x dim 16 fp32 (64 B rows), 8 B keys, uniform, batch 10, 1 lookup,
    # no dense part, 2 workers, 1 server.
    m = RecModel("hand", tables=1, rows=1000, dim=16, lookups=1, zipf=0.0, dense_params=0)
    c = PSCluster(workers=2, servers=1, batch=10, nic_gbps=100.0)
    res = evaluate(m, c)
    U = 9.955119790251764  # 1000 * (1 - 0.999^10)
    assert res.unique_rows_per_worker == pytest.approx(U)
    ps = res.layout("ps-sync")
    # worker sends keys (pull) + keys and gradients (push): U * (8 + 8 + 64) = 80 U; receives 64 U
    assert ps.worker_bytes_per_step == pytest.approx(80 * U)
    # server receives 2 workers x U x (8 pull key + 8 push key + 64 gradient) = 160 U; sends 128 U
    assert ps.server_bytes_per_step == pytest.approx(160 * U)
    assert ps.traffic_bytes_per_step == pytest.approx(2 * (80 + 64) * U)
    assert ps.step_s == pytest.approx(2 * ALPHA_S + 160 * U / BW)  # no compute, server-bound
    assert ps.server_memory_bytes == pytest.approx(1000 * 64 * 2)  # weights + Adagrad state
    ar = res.layout("data-parallel")
    # dense gradient of the table: 1000 * 16 * 4 = 64000 B; ring over 2: 2 * (1/2) * 64000 per worker
    assert ar.worker_bytes_per_step == pytest.approx(64_000)
    assert ar.traffic_bytes_per_step == pytest.approx(128_000)
    assert ar.step_s == pytest.approx(2 * ALPHA_S + 64_000 / BW)  # ring: 2(p-1) alpha + 2(p-1)/p n/B
    # table-wise: worker 0 owns the table. ids: it receives N L k = 20 x 8 = 160 B; pooled: it sends
    # N D v = 20 x 64 = 1280 B forward and backward. A pairwise all-to-all over 2 moves half of a
    # rank's buffer: alpha + n / 2 / B each.
    tw = res.layout("table-wise")
    assert tw.step_s == pytest.approx(3 * ALPHA_S + (160 + 2 * 1280) / 2 / BW)
    # row-wise: ids B L k = 80 B all-to-all; partial sums N D v = 1280 B reduce-scattered, then all-gathered
    rw = res.layout("row-wise")
    assert rw.step_s == pytest.approx(3 * ALPHA_S + (80 / 2 + 1280 / 2 + 1280 / 2) / BW)
    assert rw.worker_memory_bytes == pytest.approx(1000 * 64 * 2 / 2)  # half the rows, values + Adagrad
    assert tw.worker_memory_bytes == pytest.approx(1000 * 64 * 2)


def test_failure_replicas_multiply_memory_and_push_traffic():
    m = RecModel("r", tables=2, rows=100_000, dim=32, lookups=4, zipf=0.9, dense_params=0)
    base = evaluate(m, PSCluster(workers=8, servers=4, batch=512, hot_replicas=1))
    k2 = evaluate(m, PSCluster(workers=8, servers=4, batch=512, hot_replicas=1, replicas=2))
    b, r = base.layout("ps-sync"), k2.layout("ps-sync")
    assert r.server_memory_bytes == pytest.approx(3 * b.server_memory_bytes)
    U, row = base.unique_rows_per_worker, 32 * 4
    push = 8 * U * (8 + row)  # all pushes of one step (8 workers)
    assert r.traffic_bytes_per_step - b.traffic_bytes_per_step == pytest.approx(2 * push)
    # hottest server receives pull keys + (1 + k) pushes
    share = b.server_bytes_per_step / (8 + 8 + row)
    assert r.server_bytes_per_step == pytest.approx(share * (8 + 3 * (8 + row)))


# --- hot spots -------------------------------------------------------------------------------


def test_hot_spot_replication_divides_hottest_shard_by_r():
    m = RecModel("hot", tables=1, rows=1_000_000, dim=64, lookups=1, zipf=3.0, dense_params=0)
    for r in (2, 4, 8):
        res = evaluate(m, PSCluster(workers=4096, servers=8, batch=4096, partition="range", hot_replicas=r))
        hs = res.hot_spot
        assert hs.per_replica_bytes == pytest.approx(hs.hot_shard_bytes / r)
        # busiest server = its replica share + the replica exchange + (tiny) own shard
        assert hs.busiest_server_bytes >= hs.per_replica_bytes + hs.sync_bytes
        # hot rows are touched by every worker, so the exchange is small: reduction ~ r
        assert res.hot_load_reduction == pytest.approx(r, rel=0.1)
        assert hs.busiest_server_memory_bytes == pytest.approx(2 * 1_000_000 / 8 * 64 * 4 * 2)


def test_auto_hot_replication_only_when_it_helps():
    m = RecModel("hot", tables=4, rows=1_000_000, dim=64, lookups=1, zipf=1.5, dense_params=0)
    rng_ = evaluate(m, PSCluster(workers=64, servers=8, batch=4096, partition="range"))
    assert rng_.hot_replicas > 1 and rng_.hot_load_reduction > 1.5
    hashed = evaluate(m, PSCluster(workers=64, servers=8, batch=4096, partition="hash"))
    assert hashed.hot_replicas == 1 and hashed.hot_load_reduction == pytest.approx(1.0)


# --- stragglers and consistency ----------------------------------------------------------------


def test_exponential_order_statistic_matches_simulation():
    rng = np.random.default_rng(7)
    x = np.sort(rng.exponential(size=(20_000, 32)), axis=1)
    for k in (16, 29, 32):
        assert order_stat_exp(k, 32) == pytest.approx(x[:, k - 1].mean(), rel=0.03)
    assert order_stat_exp(32, 32) == pytest.approx(sum(1 / j for j in range(1, 33)))


@pytest.mark.parametrize("tail", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("name", ["dlrm-kaggle", "dlrm-criteo"])
def test_sync_at_least_async(name, tail):
    m = PRESETS[name]
    c = PSCluster(tail=tail)
    bsp = evaluate(m, replace(c, staleness=0)).layout("ps-ssp").step_s  # SSP with s=0 is BSP
    steps = [evaluate(m, replace(c, staleness=s)).layout("ps-ssp").step_s for s in (0, 1, 3, 10)]
    res = evaluate(m, c)
    asyn = res.layout("ps-async").step_s
    assert all(a >= b - 1e-15 for a, b in zip(steps, steps[1:]))
    assert bsp >= asyn and steps[-1] >= asyn
    assert res.layout("ps-quorum").step_s <= bsp + 1e-15
    if tail > 0:
        assert bsp > asyn


def test_stragglers_cost_synchronous_sharding_the_max():
    m = RecModel("s", tables=1, rows=1000, dim=16, lookups=1, zipf=0.0, dense_params=10_000_000)
    calm = evaluate(m, PSCluster(workers=32, tail=0.0)).layout("table-wise").step_s
    tail = evaluate(m, PSCluster(workers=32, tail=0.5)).layout("table-wise").step_s
    t_c = 2048 * 6 * 10_000_000 / 20e12
    assert tail - calm == pytest.approx(t_c * 0.5 * order_stat_exp(32, 32))


# --- crossover -------------------------------------------------------------------------------


GPU = dict(workers=64, servers=8, nic_gbps=400.0, link="infiniband", workers_per_node=8, scaleup_gbs=450.0,
           worker_memory_gb=85.5, gpu="h100-sxm5-80gb")  # the CLI's default: 8 DGX H100 nodes


def test_skew_helps_the_parameter_server_against_sharding():
    """Sharded embeddings move pooled vectors (B T D per worker, whatever the skew); a PS moves
    the unique rows, fewer as the skew grows, so its ratio to the best sharding rises with s."""
    c = PSCluster(**GPU)
    sw = sweep(PRESETS["dlrm-criteo"], c, rows=(100_000, 10_000_000), zipf=(0.0, 0.8, 1.2, 1.5))
    for j in range(2):
        col = sw.ratio[:, j]
        assert all(a < b for a, b in zip(col, col[1:]))
    assert sw.ratio[0, 1] < 1 < sw.ratio[-1, 1]  # sharding wins uniform access, the PS wins s = 1.5
    assert sw.sharded_fits.all()


def test_tables_beyond_the_workers_memory_leave_only_the_parameter_server():
    m, c = PRESETS["dlrm-large"], PSCluster()  # 3.3 TB of tables on 16 hosts of 80 GB
    res = evaluate(m, c)
    assert not any(res.layout(n).fits for n in SHARDED) and res.layout("ps-sync").fits
    assert res.recommendation.startswith("ps-") and "no sharding fits" in res.recommendation
    sw = sweep(PRESETS["dlrm-criteo"], c, rows=(10**6, 10**8, 10**9), zipf=(1.0,))
    assert sw.winner(0, 1) == "ps-sync" and not sw.sharded_fits[0, 1]  # 1e8 rows: only the PS holds them
    assert sw.winner(0, 2) == "none"
    assert "PS only" in format_sweep(sw)


def test_crossover_bisection_is_a_tie():
    m, c = PRESETS["dlrm-criteo"], PSCluster(**GPU)
    sw = sweep(m, c, rows=(1_000, 3_162, 10_000, 31_623), zipf=(1.5,))
    x = sw.crossover[0]
    assert x is not None and 3_162 < x < 10_000
    x = crossover_rows(replace(m, zipf=1.5), c, 3_162, 10_000, iters=30)
    res = evaluate(replace(m, zipf=1.5, rows=int(round(x))), c)
    assert res.layout("ps-sync").samples_per_s == pytest.approx(best_sharded(res).samples_per_s, rel=0.01)


def test_default_gpu_cluster_recommends_sharding_and_says_when_a_ps_wins():
    res = evaluate(PRESETS["dlrm-criteo"], PSCluster(**GPU))
    assert res.recommendation.startswith("sharded embeddings (")
    text = "\n".join(res.reasons)
    for phrase in ("fastest sharding that fits", "still wins", "Persia", "stragglers", "elastic", "ps-async runs at"):
        assert phrase in text, phrase
    out = format_result(res)
    for name in (*SHARDED, "ps-sync", "ps-async"):
        assert name in out
    # against the best sharding, not the replicated straw man: the ratio is order one
    ps = res.layout("ps-sync")
    assert 0.3 < ps.samples_per_s / best_sharded(res).samples_per_s < 3
    assert not res.layout("data-parallel").fits  # 26 x 7.85M x 128 replicated is 292 GiB


def test_sharding_types_follow_torchrec_placements():
    c = PSCluster(**GPU)
    m = replace(PRESETS["dlrm-criteo"], tables=8)  # fewer tables than workers: table-wise is unbalanced
    res = evaluate(m, c)
    tw, cw, rw, twrw = (res.layout(n) for n in ("table-wise", "column-wise", "row-wise", "table-row-wise"))
    assert "56 of 64 workers own none" in tw.notes
    assert cw.worker_memory_bytes < tw.worker_memory_bytes and "8 column shards of 16" in cw.notes
    assert rw.worker_memory_bytes <= twrw.worker_memory_bytes < tw.worker_memory_bytes
    assert twrw.step_s < tw.step_s  # 2D: the busiest owner's traffic spread over its node's NVLink
    from planner.studies.sharding import column_shards

    assert column_shards(128, 26, 64) == 2 and column_shards(128, 8, 64) == 8 and column_shards(96, 26, 16) == 1
    hosts = evaluate(m, PSCluster())
    assert hosts.layout("table-row-wise").step_s == pytest.approx(hosts.layout("table-wise").step_s)  # one worker per node


def test_chart_and_table(tmp_path):
    sw = sweep(PRESETS["dlrm-kaggle"], PSCluster(), rows=(100, 10_000, 1_000_000), zipf=(0.0, 1.2))
    assert "crossover rows" in format_sweep(sw)
    ET.parse(write_chart(sw, tmp_path / "c.svg"))
    assert (write_chart(sw, tmp_path / "c.png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError):
        write_chart(sw, tmp_path / "c.pdf")


@pytest.mark.parametrize("field,model,cluster", [
    ("rows", {"rows": 0}, {}), ("zipf", {"zipf": -0.5}, {}), ("workers", {}, {"workers": 0}),
    ("replicas", {}, {"replicas": 4}), ("quorum", {}, {"quorum": 0.0}), ("partition", {}, {"partition": "x"}),
    ("hot_replicas", {}, {"hot_replicas": 9}), ("nic_gbps", {}, {"nic_gbps": math.inf}),
])
def test_bad_input_raises(field, model, cluster):
    with pytest.raises(InputError) as e:
        evaluate(replace(PRESETS["dlrm-kaggle"], **model), PSCluster(**cluster))
    assert e.value.field == field


def test_cli_preset_names_match_the_presets():
    """planner.cli.ps lists the preset names without importing numpy; they must not drift."""
    import planner.cli.ps as ps_cli
    from planner.studies.paramserver import PRESETS

    assert sorted(PRESETS) == sorted(ps_cli._PRESET_NAMES)
