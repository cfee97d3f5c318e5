"""Parameter server vs synchronous AllReduce for sparse, embedding-heavy models.

Model (docs/paramserver.md has the derivations and their limits):

* **Sharded embeddings** (what DLRM/TorchRec users run): the tables sharded table-, row-,
  column- or table-row-wise over the workers with all-to-all, or replicated (data-parallel),
  :mod:`planner.studies.sharding`, priced with the alpha-beta collectives of
  :mod:`planner.cost.collectives` on the workers' scale-up domain and network.
* **Parameter server** (Li et al., OSDI 2014; Dean et al., NIPS 2012 DistBelief): the tables
  are sharded over ``S`` servers; a worker pulls only the *unique* rows its batch looks up
  and pushes their gradients. With ``n = B * L`` Zipf(s) lookups per table, the expected
  number of distinct rows is the occupancy sum ``E[U] = sum_i 1 - (1 - p_i)^n``
  (Feller, *An Introduction to Probability Theory*, vol. 1, ch. II occupancy problems),
  ``p_i = i^-s / H_{R,s}`` (Zipf access skew in recommendation data: Adnan et al., VLDB 2022
  / arXiv 2021 "hot embeddings"; Kwon et al. "Tensor Casting"). Sums over large ``R`` use an
  exact head plus the Euler-Maclaurin midpoint integral for the tail (Abramowitz & Stegun
  23.1.30).
* Each server's NIC carries its shard's traffic; under range partitioning of popularity-ordered
  ids the first shard is a hot spot, relieved by replicating it on ``r`` servers (its load / r,
  its memory x r; replicas exchange aggregated updates, Li et al. 2014 sec. 4.3).
* ``k`` failure replicas multiply server memory and push traffic by ``1 + k`` (Li et al. 2014
  sec. 4.3: each server also stores and receives the pushes of ``k`` neighbours).
* Stragglers: worker compute time ``t_c (1 + X)``, ``X ~ Exp(mean=tail)``. Sync waits for the
  max, E = t_c (1 + tail H_W); waiting for the first ``k`` of ``W`` (partial aggregation /
  backup workers, Chen et al. 2016 "Revisiting distributed synchronous SGD"; the seed chapter's
  "wait for 90 % of workers") uses the exponential order statistic
  ``E[X_(k:W)] = tail * (H_W - H_{W-k})`` (Renyi 1953; David & Nagaraja, *Order Statistics*,
  2003, sec. 3.1). Async is limited by the mean worker time; bounded staleness ``s``
  (SSP, Ho et al., NIPS 2013) amortises the barrier over ``s + 1`` steps, whose per-step spread
  shrinks as 1/sqrt(s + 1) (central limit theorem): ``t_ssp = t_async + (t_sync - t_async)/sqrt(s+1)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from planner.cost.constants import LINK_DEFAULTS
from planner.cost.collectives import Level, collective
from planner.errors import InputError
from planner.studies.sharding import shard_tables

__all__ = [
    "RecModel", "PSCluster", "Layout", "PSResult", "PRESETS", "LAYOUTS", "preset",
    "HotSpot", "zipf_harmonic", "unique_rows", "shard_unique_rows", "order_stat_exp", "hot_spot",
    "evaluate", "SHARDED", "SYNC",
]

SHARDED = ("data-parallel", "table-wise", "column-wise", "row-wise", "table-row-wise")  # TorchRec's types
SYNC = (*SHARDED, "ps-sync")  # synchronous: the same model quality
LAYOUTS = (*SYNC, "ps-quorum", "ps-ssp", "ps-async")  # most to least consistent
_HEAD = 1 << 16  # rows summed exactly before the Euler-Maclaurin tail


@dataclass(frozen=True)
class RecModel:
    """A recommendation model: ``tables`` embedding tables of ``rows`` x ``dim`` (identical,
    for tractability), ``lookups`` per sample per table, ``zipf`` access skew (0 = uniform)
    and a dense part of ``dense_params`` (MLPs)."""

    name: str = "custom"
    tables: int = 26
    rows: int = 8_000_000
    dim: int = 128
    lookups: int = 1
    zipf: float = 1.05
    dense_params: int = 2_400_000
    bytes_per_value: int = 4  # fp32 master weights and gradients
    key_bytes: int = 8  # uint64 key per row in each pull request and push (Li et al. 2014)
    optimizer_values_per_param: float = 1.0  # Adagrad accumulator (DLRM, Naumov et al. 2019)


@dataclass(frozen=True)
class PSCluster:
    workers: int = 16
    servers: int = 4
    batch: int = 2048  # samples per worker per step
    nic_gbps: float = 100.0  # nominal per-direction NIC line rate of every host
    replicas: int = 0  # failure replicas k
    staleness: int = 3  # SSP bound s
    quorum: float = 0.9  # fraction of workers a quorum step waits for
    tail: float = 0.2  # straggler: mean extra compute time as a fraction of t_c
    hot_replicas: int | None = None  # r for the hottest shard; None = pick the best
    partition: str = "hash"  # "hash" (hashed ids, the usual case) or "range" over popularity-ordered ids
    worker_tflops: float = 20.0  # achieved dense FLOP/s of one worker (small MLPs run far below peak)
    worker_memory_gb: float = 80.0
    server_memory_gb: float = 1024.0
    # Where the workers sit. Defaults: the seed chapter's one host per worker on TCP; the CLI
    # puts them on the GPUs of a cluster preset (8 per node, NVSwitch, InfiniBand).
    link: str = "ethernet"  # the network every worker and server NIC is on (LINK_DEFAULTS kind)
    workers_per_node: int = 1  # workers sharing one scale-up domain
    scaleup_gbs: float = 0.0  # per-worker per-direction scale-up bandwidth in a node, GB/s (nominal)
    server_nic_gbps: float | None = None  # None: the same NIC as a worker
    gpu: str = ""  # the worker GPU preset, for the report


# Illustrative presets; tables are made identical (rows = total rows / tables).
PRESETS: dict[str, RecModel] = {
    # MLPerf DLRM on Criteo Terabyte: 26 sparse features, ~204M rows in total, dim 128,
    # bottom MLP 13-512-256-128, top 479-1024-1024-512-256-1 (~2.4M dense params).
    "dlrm-criteo": RecModel("dlrm-criteo", 26, 7_850_000, 128, 1, 1.05, 2_400_000),
    # Criteo Kaggle DLRM (Naumov et al. 2019 benchmark config): ~33.8M rows, dim 16.
    "dlrm-kaggle": RecModel("dlrm-kaggle", 26, 1_300_000, 16, 1, 1.05, 550_000),
    # Production-scale DLRM shape (Naumov et al. 2019 sec. 6; Mudigere et al. 2022): hundreds
    # of tables with pooled lookups; here 64 tables x 50M rows, dim 128, 20 lookups each.
    "dlrm-large": RecModel("dlrm-large", 64, 50_000_000, 128, 20, 1.1, 20_000_000),
}


def preset(name: str) -> RecModel:
    if name not in PRESETS:
        raise InputError("model", name, f"one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


# --- Zipf occupancy --------------------------------------------------------------------------


def _range_sum(f, a: int, b: int) -> float:
    """sum_{i=a}^{b} f(i) for a vectorised, smooth, monotone f: exact head, midpoint integral tail."""
    if b < a:
        return 0.0
    h = min(b, a + _HEAD - 1)
    total = float(np.sum(f(np.arange(a, h + 1, dtype=np.float64))))
    if h < b:  # Euler-Maclaurin: sum_{i=h+1}^{b} f(i) ~ int_{h+1/2}^{b+1/2} f(x) dx
        from scipy.integrate import simpson  # noqa: PLC0415

        t = np.linspace(math.log(h + 0.5), math.log(b + 0.5), 2049)
        x = np.exp(t)
        total += float(simpson(f(x) * x, x=t))
    return total


def zipf_harmonic(rows: int, s: float) -> float:
    """Generalised harmonic number H_{R,s} = sum_{i=1}^{R} i^-s (the Zipf normaliser)."""
    return _range_sum(lambda x: x**-s, 1, rows)


def _touch(n: float, s: float, h: float):
    """P(row i is hit at least once in n draws) = 1 - (1 - p_i)^n, vectorised over i."""

    def f(x):
        p = np.minimum(x**-s / h, 1.0)
        with np.errstate(divide="ignore"):
            return -np.expm1(n * np.log1p(-p))

    return f


def unique_rows(rows: int, s: float, lookups: float) -> float:
    """Expected distinct rows touched by ``lookups`` Zipf(s) draws over ``rows`` rows."""
    if lookups <= 0:
        return 0.0
    return _range_sum(_touch(lookups, s, zipf_harmonic(rows, s)), 1, rows)


def shard_unique_rows(rows: int, s: float, lookups: float, shards: int, partition: str = "range",
                      only: int | None = None) -> np.ndarray:
    """Expected distinct rows per shard (length ``shards``) for ``lookups`` draws of one worker.

    ``range``: shard j holds the j-th contiguous block of popularity-ordered ids (shard 0 = hottest).
    ``hash``: ids spread evenly; the single hottest row lands on shard 0 (expected-value model).
    ``only``: compute that shard alone (the others are returned as 0).
    """
    h = zipf_harmonic(rows, s)
    f = _touch(lookups, s, h)
    out = np.zeros(shards)
    if partition == "hash":
        u = _range_sum(f, 1, rows)
        u1 = float(f(np.array([1.0]))[0])
        out[:] = (u - u1) / shards
        out[0] += u1
        return out
    edges = np.floor(np.linspace(0, rows, shards + 1)).astype(np.int64)
    for j in range(shards) if only is None else (only,):
        out[j] = _range_sum(f, int(edges[j]) + 1, int(edges[j + 1]))
    return out


def order_stat_exp(k: int, w: int) -> float:
    """E[X_(k:w)] of w iid Exp(1): H_w - H_{w-k} (Renyi representation)."""
    return float(sum(1.0 / j for j in range(w - k + 1, w + 1)))


# --- Layout evaluation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    name: str
    step_s: float
    samples_per_s: float
    traffic_bytes_per_step: float  # bytes put on the network by all hosts in one step
    worker_bytes_per_step: float  # busiest direction of one worker NIC
    server_bytes_per_step: float  # busiest direction of the hottest server NIC (0 for allreduce)
    server_bytes_per_s: float
    server_memory_bytes: float  # largest server
    worker_memory_bytes: float
    fits: bool
    notes: str = ""


@dataclass(frozen=True)
class PSResult:
    model: RecModel
    cluster: PSCluster
    unique_rows_per_worker: float  # over all tables
    hot_replicas: int
    hot_load_reduction: float  # hottest server load before / after hot-spot replication
    hot_spot: HotSpot
    compute_s: float  # one worker's straggler-free compute time per step
    layouts: tuple[Layout, ...]
    recommendation: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def layout(self, name: str) -> Layout:
        return next(l for l in self.layouts if l.name == name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layouts"] = {l.name: asdict(l) for l in self.layouts}
        return d


def _validate(m: RecModel, c: PSCluster) -> None:
    for name, v in (("tables", m.tables), ("rows", m.rows), ("dim", m.dim), ("lookups", m.lookups),
                    ("workers", c.workers), ("servers", c.servers), ("batch", c.batch)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise InputError(name, v, "an integer >= 1")
    if m.rows > 10**12:
        raise InputError("rows", m.rows, "<= 1e12 rows per table")
    if c.servers > 4096 or c.workers > 100_000:
        raise InputError("servers" if c.servers > 4096 else "workers",
                         c.servers if c.servers > 4096 else c.workers, "a cluster size <= 4096 servers, 100000 workers")
    checks = (("zipf", m.zipf, 0.0 <= m.zipf <= 5.0, "a Zipf exponent in [0, 5]"),
              ("dense_params", m.dense_params, m.dense_params >= 0, ">= 0"),
              ("nic_gbps", c.nic_gbps, c.nic_gbps > 0 and math.isfinite(c.nic_gbps), "a positive finite Gb/s"),
              ("replicas", c.replicas, 0 <= c.replicas < c.servers, f"0 <= k < servers ({c.servers})"),
              ("staleness", c.staleness, c.staleness >= 0, "an integer >= 0"),
              ("quorum", c.quorum, 0.0 < c.quorum <= 1.0, "a fraction in (0, 1]"),
              ("tail", c.tail, 0.0 <= c.tail <= 100.0, "a straggler tail fraction in [0, 100]"),
              ("partition", c.partition, c.partition in ("range", "hash"), "range or hash"),
              ("worker_tflops", c.worker_tflops, c.worker_tflops > 0, "> 0"),
              ("hot_replicas", c.hot_replicas, c.hot_replicas is None or 1 <= c.hot_replicas <= c.servers,
               f"1 <= r <= servers ({c.servers})"),
              ("link", c.link, c.link in LINK_DEFAULTS, "a link kind: " + ", ".join(LINK_DEFAULTS)),
              ("workers_per_node", c.workers_per_node, isinstance(c.workers_per_node, int) and c.workers_per_node >= 1
               and (c.workers_per_node == 1 or c.scaleup_gbs > 0), "an integer >= 1 (with scaleup_gbs > 0 when > 1)"),
              ("workers", c.workers, c.workers_per_node <= 1 or c.workers < c.workers_per_node or c.workers % c.workers_per_node == 0,
               f"a multiple of the {c.workers_per_node} workers per node (or fewer than a node)"),
              ("server_nic_gbps", c.server_nic_gbps, c.server_nic_gbps is None or (c.server_nic_gbps > 0 and math.isfinite(c.server_nic_gbps)),
               "a positive finite Gb/s"))
    for name, v, ok, expected in checks:
        if not ok:
            raise InputError(name, v, expected)


@dataclass(frozen=True)
class HotSpot:
    """The busiest server NIC (bytes per step, busier direction) before and after replicating
    the hottest shard on ``replicas`` servers."""

    replicas: int
    hot_shard_bytes: float  # hottest shard's traffic without replication
    per_replica_bytes: float  # = hot_shard_bytes / replicas (router spreads reads and pushes)
    sync_bytes: float  # per replica: aggregated hot-row updates sent to the r-1 others
    busiest_server_bytes: float  # after replication, including a host's own shard
    busiest_server_memory_bytes: float


def hot_spot(m: RecModel, c: PSCluster, per_shard_rows: np.ndarray, participants: int, r: int,
             union_hot_rows: float) -> HotSpot:
    """Server loads for ``participants`` workers, each touching ``per_shard_rows`` rows per table."""
    row_b = m.dim * m.bytes_per_value
    rows = per_shard_rows * participants * m.tables  # rows served per step, per shard
    k1 = 1 + c.replicas
    b_in = rows * (m.key_bytes + (m.key_bytes + row_b) * k1)  # pull keys + pushes, x(1+k) with backups
    b_out = rows * row_b  # pulled values
    shard_mem = m.tables * m.rows / c.servers * row_b * (1 + m.optimizer_values_per_param)
    mem = np.full(c.servers, shard_mem * k1)
    hot = int(np.argmax(b_in))
    before = float(max(b_in[hot], b_out[hot]))
    sync_b = (r - 1) * union_hot_rows * m.tables * row_b
    if r > 1:  # replicas go to the r-1 least-loaded other servers
        hosts = [j for j in np.argsort(b_in, kind="stable") if j != hot][: r - 1]
        share_in, share_out = b_in[hot] / r + sync_b, b_out[hot] / r + sync_b
        b_in[hot], b_out[hot] = share_in, share_out
        for j in hosts:
            b_in[j] += share_in
            b_out[j] += share_out
            mem[j] += shard_mem * k1
    busiest = float(np.max(np.maximum(b_in, b_out)))
    return HotSpot(r, before, before / r, sync_b, busiest, float(np.max(mem)))


def evaluate(model: RecModel, cluster: PSCluster) -> PSResult:
    """Step time, throughput, traffic, server bandwidth and memory of every layout, and a pick."""
    m, c = model, cluster
    _validate(m, c)
    alpha, eff = LINK_DEFAULTS[c.link]
    bw = c.nic_gbps * 1e9 / 8 * eff  # one worker's NIC, usable bytes/s per direction
    bw_srv = (c.server_nic_gbps or c.nic_gbps) * 1e9 / 8 * eff
    level = Level(c.link, bw, alpha)
    W, B = int(c.workers), int(c.batch)
    g = min(int(c.workers_per_node), W)
    if g > 1:
        a_up, e_up = LINK_DEFAULTS["nvswitch"]
        intra = Level("nvswitch", c.scaleup_gbs * 1e9 * e_up, a_up)
    else:
        intra = level
    nodes = max(1, W // g)
    k_dom, m_dom = (g, nodes) if nodes > 1 else (W, 1)
    inter = level if nodes > 1 else None

    def allreduce(nbytes: float) -> float:
        return collective("allreduce", nbytes, k_dom, m_dom, intra, inter).time_s

    row_b = m.dim * m.bytes_per_value
    dense_b = m.dense_params * m.bytes_per_value
    # Compute: 6 FLOP per dense parameter per sample (fwd 2 + bwd 4; Kaplan et al. 2020).
    t_c = B * 6.0 * m.dense_params / (c.worker_tflops * 1e12)
    kq = max(1, math.ceil(c.quorum * W - 1e-9))
    c_max = t_c * (1 + c.tail * order_stat_exp(W, W))
    c_q = t_c * (1 + c.tail * order_stat_exp(kq, W))
    c_mean = t_c * (1 + c.tail)

    # Sharded embeddings (TorchRec's sharding types) + the dense MLP allreduced: synchronous.
    t_dense_ar = allreduce(dense_b)
    dense_wire = 2 * (W - 1) / W * dense_b if W > 1 else 0.0
    cap_w = c.worker_memory_gb * 1e9
    dense_mem = dense_b * (2 + m.optimizer_values_per_param)
    sharded = []
    for sh in shard_tables(m, W, B, g, intra, inter):
        step = c_max + sh.comm_s + t_dense_ar
        mem = sh.memory_bytes + dense_mem
        sharded.append(Layout(sh.name.replace("_", "-"), step, W * B / step, W * (sh.worker_bytes_per_step + dense_wire),
                              sh.worker_bytes_per_step + dense_wire, 0.0, 0.0, 0.0, mem, mem <= cap_w, sh.detail))

    n = B * m.lookups
    shard_rows = shard_unique_rows(m.rows, m.zipf, n, c.servers, c.partition)
    u = float(shard_rows.sum())  # per table per worker
    U = u * m.tables
    w_out = U * (2 * m.key_bytes + row_b)  # pull keys + push keys and gradients
    w_in = U * row_b
    t_w = 2 * alpha + max(w_in, w_out) / bw
    hot = int(np.argmax(shard_rows))

    def server(participants: int, r: int) -> HotSpot:
        union = 0.0
        if r > 1:  # each replica aggregates the pushes of participants / r workers
            lk = n * max(1, participants // r)
            union = float(shard_unique_rows(m.rows, m.zipf, lk, c.servers, c.partition, only=hot)[hot])
        return hot_spot(m, c, shard_rows, participants, r, union)

    if c.hot_replicas is not None:
        r = c.hot_replicas
    else:  # smallest r within 1% of the lowest busiest-server load
        cands = sorted({*range(1, min(c.servers, 16) + 1), *(2**i for i in range(13) if 2**i <= c.servers), c.servers})
        loads = {r_: server(W, r_).busiest_server_bytes for r_ in cands}
        best = min(loads.values())
        r = min(r_ for r_, v in loads.items() if v <= best * 1.01)
    hs = server(W, r)
    s_b, s_mem = hs.busiest_server_bytes, hs.busiest_server_memory_bytes
    s_b1 = server(W, 1).busiest_server_bytes
    ps_mem_worker = dense_mem + 2 * U * row_b
    srv_fit = s_mem <= c.server_memory_gb * 1e9
    wfit = ps_mem_worker <= cap_w
    traffic = W * (w_in + w_out) * 1.0

    # failure replicas: every push forwarded k times; hot replicas: r aggregated exchanges
    traffic += W * U * (row_b + m.key_bytes) * c.replicas + r * hs.sync_bytes

    def mk(name: str, step: float, samples: float, sb: float, extra_w: float, extra_total: float,
           note: str) -> Layout:
        return Layout(name, step, samples / step, traffic + extra_total, max(w_in, w_out) + extra_w, sb,
                      sb / step, s_mem, ps_mem_worker, srv_fit and wfit, note)

    # Sync: sparse via PS, dense MLP by AllReduce among workers (the chapter's hybrid).
    ps_sync = c_max + max(t_w, 2 * alpha + s_b / bw_srv) + t_dense_ar
    # Relaxed modes cannot allreduce (that is a barrier): the dense part is served by the PS too.
    dense_srv = W * dense_b / c.servers * (1 + c.replicas)
    t_w_d = t_w + dense_b / bw
    sq_b = server(kq, r).busiest_server_bytes + kq * dense_b / c.servers * (1 + c.replicas)
    sa_b = s_b + dense_srv
    q_step = c_q + max(t_w_d, 2 * alpha + sq_b / bw_srv)
    sync_all = c_max + max(t_w_d, 2 * alpha + sa_b / bw_srv)
    a_step = max(c_mean + t_w_d, 2 * alpha + sa_b / bw_srv)
    ssp_step = a_step + (sync_all - a_step) / math.sqrt(c.staleness + 1)
    layouts = (
        *sharded,
        mk("ps-sync", ps_sync, W * B, s_b, dense_wire, W * dense_wire,
           "sparse rows via PS, dense MLP allreduced among workers, waits for all"),
        mk("ps-quorum", q_step, kq * B, sq_b, dense_b, 2 * W * dense_b,
           f"waits for the first {kq}/{W} workers (dense MLP on the PS), drops the rest"),
        mk("ps-ssp", ssp_step, W * B, sa_b, dense_b, 2 * W * dense_b, f"bounded staleness s={c.staleness}"),
        mk("ps-async", a_step, W * B, sa_b, dense_b, 2 * W * dense_b, "no barrier; unbounded staleness"),
    )
    from planner.studies.paramserver_report import recommend  # noqa: PLC0415

    res = PSResult(m, c, U, r, s_b1 / s_b if s_b > 0 else 1.0, hs, t_c, layouts, "", ())
    rec, reasons = recommend(res)
    return replace(res, recommendation=rec, reasons=tuple(reasons))
