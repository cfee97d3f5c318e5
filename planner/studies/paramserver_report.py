"""Recommendation, crossover sweep, text tables and chart for :mod:`planner.studies.paramserver`.

The comparison a recommendation-model user needs is synchronous parameter-server training
(``ps-sync``) against what they would run instead: the embedding tables sharded over the
workers with all-to-all (TorchRec's sharding types, :mod:`planner.studies.sharding`), or
replicated when they are small. Both are synchronous, so only the communication and memory
differ; the best sharding type that fits is the baseline. Relaxed layouts (quorum, bounded
staleness, async) trade statistical efficiency for throughput (Ho et al., NIPS 2013; Chen
et al. 2016) and are reported beside it, with when a parameter server still wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.errors import InputError
from planner.studies.paramserver import LAYOUTS, SHARDED, SYNC, PSCluster, PSResult, RecModel, evaluate
from planner.units import fmt_bytes, fmt_gbs, sig

__all__ = [
    "PICK_TOLERANCE", "SWEEP_ROWS", "SWEEP_ZIPF", "Sweep", "recommend", "best_sharded", "sync_ratio", "crossover_rows",
    "sweep", "format_result", "format_sweep", "write_chart", "PS_STILL_WINS",
]

# When a parameter server still wins over sharded embeddings, with sources (docs/paramserver.md).
PS_STILL_WINS = (
    "tables larger than the workers' memory together: servers hold them in CPU DRAM (Persia, Lian et al. "
    "KDD 2022, arXiv 2111.05897: 100-trillion-parameter tables on PS; Monolith, Liu et al. 2022, arXiv 2209.07663)",
    "stragglers or a mixed fleet: an all-to-all waits for every worker each step, async/SSP training does not "
    "(Ho et al. NIPS 2013; Persia trains the embeddings asynchronously for this reason)",
    "elastic or preemptible workers: the servers keep the model while workers come and go; a sharded table "
    "lives on the workers, so losing one stops the collective until its shard is restored (Li et al. OSDI 2014 sec. 4)",
)

PICK_TOLERANCE = 0.10  # take the most consistent layout within 10% of the best throughput
SWEEP_ROWS = tuple(int(round(10 ** (e / 2))) for e in range(4, 19))  # 1e2 .. 1e9, half decades
SWEEP_ZIPF = (0.0, 0.6, 0.8, 1.0, 1.2, 1.5)


def best_sharded(res: PSResult):
    """The fastest sharding type that fits, or None."""
    fit = [l for l in res.layouts if l.name in SHARDED and l.fits]
    return max(fit, key=lambda l: l.samples_per_s) if fit else None


def recommend(res: PSResult) -> tuple[str, list[str]]:
    """The best synchronous layout that fits (sharded or ps-sync); a relaxed PS layout only
    when it is more than PICK_TOLERANCE faster than it (its accuracy risk stated)."""
    m, c = res.model, res.cluster
    fitting = [l for l in res.layouts if l.fits]
    ps = res.layout("ps-sync")
    sh = best_sharded(res)
    dp = res.layout("data-parallel")
    reasons = []
    if sh is not None:
        reasons.append(f"Sharded embeddings: {sh.name} is the fastest sharding that fits ({sh.notes}); "
                       f"{fmt_bytes(sh.worker_bytes_per_step)} per worker per step, "
                       f"{fmt_bytes(sh.worker_memory_bytes)} per worker.")
    else:
        reasons.append(f"No sharding of the {m.tables} x {m.rows:,} x {m.dim} tables fits {fmt_bytes(c.worker_memory_gb * 1e9)} "
                       f"workers (row-wise needs {fmt_bytes(res.layout('row-wise').worker_memory_bytes)} each).")
    if not dp.fits:
        reasons.append(f"Replicating the tables (data-parallel) needs {fmt_bytes(dp.worker_memory_bytes)} per worker.")
    reasons.append(f"Parameter server: workers move {fmt_bytes(ps.worker_bytes_per_step)} per step "
                   f"({res.unique_rows_per_worker:,.0f} unique rows of {c.batch * m.lookups * m.tables:,} lookups, "
                   f"Zipf s={m.zipf:g}); the busiest server {fmt_bytes(ps.server_bytes_per_step)}.")
    if not fitting:
        return "nothing fits: add workers, servers or memory", reasons
    sync = [l for l in fitting if l.name in SYNC]
    relaxed = [l for l in fitting if l.name not in SYNC]
    best_sync = max(sync, key=lambda l: l.samples_per_s) if sync else None
    best_rel = next((l for name in LAYOUTS for l in relaxed if l.name == name
                     and l.samples_per_s >= (1 - PICK_TOLERANCE) * max(r.samples_per_s for r in relaxed)), None)
    pick = best_sync
    if best_rel is not None and (best_sync is None or best_rel.samples_per_s > (1 + PICK_TOLERANCE) * best_sync.samples_per_s):
        pick = best_rel
    bw_srv = (c.server_nic_gbps or c.nic_gbps) * 1e9 / 8
    t_server = ps.server_bytes_per_step / bw_srv
    t_worker = ps.worker_bytes_per_step / (c.nic_gbps * 1e9 / 8)
    if t_server > t_worker > 0:
        msg = (f"PS servers are the bottleneck ({fmt_bytes(ps.server_bytes_per_step)} on the busiest vs "
               f"{fmt_bytes(ps.worker_bytes_per_step)} per worker); ")
        if c.partition == "hash":  # balanced shards: server load ~ 1/S
            msg += f"about {math.ceil(c.servers * t_server / t_worker)} servers would balance them."
        else:
            msg += "a range-partition hot spot does not shrink with more servers; hash the ids to spread it."
        reasons.append(msg)
    if res.hot_replicas > 1:
        reasons.append(f"The hottest shard is replicated on {res.hot_replicas} servers: busiest-server traffic "
                       f"/{res.hot_load_reduction:.2f}, at one more shard of memory on {res.hot_replicas - 1} servers.")
    elif c.partition == "range" and c.servers > 1:
        reasons.append("No hot-spot replication needed at this skew (it would not lower the busiest server).")
    straggle = c.tail * (sum(1 / j for j in range(1, c.workers + 1)) - 1)
    reasons.append(f"Stragglers: a barrier over {c.workers} workers costs {sig(straggle * res.compute_s * 1e3)} ms "
                   f"per step over the mean worker (exponential tail {c.tail:g} of compute).")
    if pick.name in ("ps-quorum", "ps-ssp", "ps-async"):
        gain = pick.samples_per_s / best_sync.samples_per_s - 1 if best_sync else math.inf
        reasons.append(f"{pick.name} is {gain:+.0%} over the best synchronous layout; stale or dropped gradients "
                       "can cost accuracy (SSP bounds the staleness).")
    if c.replicas:
        reasons.append(f"{c.replicas} failure replica(s): server memory and push traffic x{1 + c.replicas}.")
    else:
        reasons.append("No PS failure replicas: losing a server loses its shard's updates since the last checkpoint.")
    if pick.name in SHARDED:
        asy = res.layout("ps-async")
        reasons.append("A parameter server still wins with (docs/paramserver.md):")
        reasons += [f"  {w}" for w in PS_STILL_WINS]
        if asy.fits:
            reasons.append(f"  here ps-async runs at {asy.samples_per_s / pick.samples_per_s:.2f}x {pick.name}, "
                           f"without a barrier over the {c.workers} workers")
    base = sh if sh is not None else ps
    speed = pick.samples_per_s / base.samples_per_s
    where = f"{c.workers} {c.gpu} workers" if c.gpu else f"{c.workers} workers"
    if pick.name in SHARDED:
        lay = f"sharded embeddings ({pick.name})"
        vs = f"{pick.samples_per_s / ps.samples_per_s:.2f}x ps-sync" if ps.fits else "ps-sync does not fit"
    else:
        lay = f"{pick.name} with {c.servers} servers" + (f", hot shard x{res.hot_replicas}" if res.hot_replicas > 1 else "")
        vs = f"{speed:.2f}x the best sharding ({sh.name})" if sh is not None else "no sharding fits"
    return f"{lay} on {where}: {pick.samples_per_s:,.0f} samples/s ({vs})", reasons


def sync_ratio(model: RecModel, cluster: PSCluster) -> tuple[float, bool]:
    """(ps-sync / best fitting sharding throughput, some sharding fits) for one configuration;
    inf when no sharding fits and ps-sync does, 0 when neither does."""
    res = evaluate(model, cluster)
    sh, ps = best_sharded(res), res.layout("ps-sync")
    if sh is None:
        return (math.inf if ps.fits else 0.0), False
    return (ps.samples_per_s / sh.samples_per_s if ps.fits else 0.0), True


def crossover_rows(model: RecModel, cluster: PSCluster, lo: int, hi: int, iters: int = 12) -> float | None:
    """Rows per table where ps-sync and the best sharding tie, by bisection on log(rows) in
    [lo, hi] (None when the winner does not change there)."""
    f = lambda r: sync_ratio(replace(model, rows=int(round(r))), cluster)[0] - 1.0  # noqa: E731
    a, b = math.log(lo), math.log(hi)
    fa, fb = f(lo), f(hi)
    if fa > 0 or fb < 0:
        return None
    for _ in range(iters):
        mid = (a + b) / 2
        if f(math.exp(mid)) < 0:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)


@dataclass(frozen=True)
class Sweep:
    rows: tuple[int, ...]
    zipf: tuple[float, ...]
    ratio: np.ndarray  # [zipf, rows]: ps-sync / best sharding throughput (inf: only PS fits; 0: PS does not fit)
    sharded_fits: np.ndarray  # [zipf, rows]
    crossover: tuple[float | None, ...]  # rows per table at the tie, per zipf

    def winner(self, i: int, j: int) -> str:
        x = self.ratio[i, j]
        if x == 0 and not self.sharded_fits[i, j]:
            return "none"
        return "ps-sync" if x > 1 else "sharded"

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "zipf": list(self.zipf),
                "ratio_ps_over_sharded": [[None if not math.isfinite(x) else float(x) for x in row] for row in self.ratio],
                "sharded_fits": self.sharded_fits.tolist(), "crossover_rows": list(self.crossover),
                "winner": [[self.winner(i, j) for j in range(len(self.rows))] for i in range(len(self.zipf))]}


def sweep(model: RecModel, cluster: PSCluster, rows=SWEEP_ROWS, zipf=SWEEP_ZIPF) -> Sweep:
    """Throughput ratio over table size x skew, and the crossover table size per skew."""
    rows, zipf = tuple(int(r) for r in rows), tuple(float(s) for s in zipf)
    ratio = np.zeros((len(zipf), len(rows)))
    fits = np.zeros((len(zipf), len(rows)), dtype=bool)
    cross: list[float | None] = []
    for i, s in enumerate(zipf):
        for j, r in enumerate(rows):
            ratio[i, j], fits[i, j] = sync_ratio(replace(model, rows=r, zipf=s), cluster)
        flip = next((j for j in range(1, len(rows)) if fits[i, j] and fits[i, j - 1] and 0 < ratio[i, j - 1] <= 1 < ratio[i, j]), None)
        if flip is None:
            cross.append(None)
        else:
            cross.append(crossover_rows(replace(model, zipf=s), cluster, rows[flip - 1], rows[flip]))
    return Sweep(rows, zipf, ratio, fits, tuple(cross))


def _fmt_rows(r: float) -> str:
    e = math.floor(math.log10(r))
    return f"{r / 10**e:.1f}e{e}" if r >= 1e4 else f"{r:,.0f}"


def _fmt_x(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x" if x < 1000 else f"{x:.0e}x".replace("e+0", "e")


def format_result(res: PSResult) -> str:
    m, c = res.model, res.cluster
    nodes = f", {min(c.workers_per_node, c.workers)} per node ({sig(c.scaleup_gbs)} GB/s NVLink)" if c.workers_per_node > 1 else ""
    srv = f"{c.server_nic_gbps:g}" if c.server_nic_gbps else f"{c.nic_gbps:g}"
    head = (f"{m.name}: {m.tables} tables x {m.rows:,} rows x dim {m.dim}, {m.lookups} lookup(s)/sample/table, "
            f"Zipf s={m.zipf:g}, dense {m.dense_params:,} params\n"
            f"{c.workers} {c.gpu + ' ' if c.gpu else ''}workers x batch {c.batch}{nodes}, {c.nic_gbps:g} Gb/s {c.link} "
            f"per worker; {c.servers} PS servers ({srv} Gb/s, {c.partition} partition, k={c.replicas} failure replicas); "
            f"staleness {c.staleness}, quorum {c.quorum:g}, straggler tail {c.tail:g}\n")
    cols = ("layout", "step", "samples/s", "worker sends/step", "busiest server/step", "server", "server mem", "worker mem", "fits")
    rows = [cols] + [(l.name, _ms(l.step_s), f"{l.samples_per_s:,.0f}", fmt_bytes(l.worker_bytes_per_step),
                      fmt_bytes(l.server_bytes_per_step) if l.server_bytes_per_step else "-",
                      fmt_gbs(l.server_bytes_per_s) if l.server_bytes_per_s else "-",
                      fmt_bytes(l.server_memory_bytes) if l.server_memory_bytes else "-", fmt_bytes(l.worker_memory_bytes),
                      "yes" if l.fits else "NO") for l in res.layouts]
    w = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    table = "\n".join("  ".join(v.rjust(w[i]) if i else v.ljust(w[i]) for i, v in enumerate(r)) for r in rows)
    legend = ("sharded: TorchRec's sharding types (data-parallel = tables replicated); ps-*: parameter server; "
              "sizes in GiB/MiB (2^30, 2^20 bytes), rates in GB/s (1e9 bytes/s)")
    return head + table + f"\n{legend}\n\nrecommend: {res.recommendation}\n" + "".join(f"      * {r.strip()}\n" if r.startswith("  ") else f"  - {r}\n" for r in res.reasons)


def _ms(seconds: float) -> str:
    return f"{sig(seconds * 1e3)} ms" if seconds < 10 else f"{sig(seconds)} s"


def _fmt_rows(r: float) -> str:
    e = math.floor(math.log10(r))
    return f"{r / 10**e:.1f}e{e}" if r >= 1e4 else f"{r:,.0f}"


def _fmt_x(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x" if x < 1000 else f"{x:.0e}x".replace("e+0", "e")


def format_sweep(sw: Sweep) -> str:
    cells = [["zipf \\ rows"] + [_fmt_rows(r) for r in sw.rows] + ["crossover rows"]]
    for i, s in enumerate(sw.zipf):
        row = [f"s={s:g}"]
        for j in range(len(sw.rows)):
            x, win = sw.ratio[i, j], sw.winner(i, j)
            if win == "none":
                row.append("-")
            elif not sw.sharded_fits[i, j]:
                row.append("PS only")
            else:
                row.append(("PS " if x > 1 else "SH ") + (_fmt_x(max(x, 1 / x)) if x > 0 else "only"))
        cx = sw.crossover[i]
        row.append(_fmt_rows(cx) if cx else "-")
        cells.append(row)
    w = [max(len(r[k]) for r in cells) for k in range(len(cells[0]))]
    lines = ["  ".join(v.rjust(w[k]) for k, v in enumerate(r)) for r in cells]
    return ("Synchronous parameter server (PS) vs the best sharding of the tables (SH, TorchRec's types): winner and "
            "its throughput advantage per rows-per-table x Zipf skew\n" + "\n".join(lines) +
            "\n  PS only: no sharding fits the workers' memory, the PS servers hold the tables; -: neither fits\n")


def write_chart(sw: Sweep, path: str | Path) -> Path:
    """Heat map of log2(PS / best sharding throughput) over rows x skew with the crossover curve; SVG or PNG."""
    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise InputError("chart", str(path), "a file name ending in .svg or .png")
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 4.5))
    with np.errstate(divide="ignore"):
        z = np.clip(np.log2(np.where(sw.ratio > 0, sw.ratio, np.nan)), -3, 3)
    x = np.log10(np.array(sw.rows, dtype=float))
    mesh = ax.pcolormesh(x, np.array(sw.zipf), z, cmap="RdBu", vmin=-3, vmax=3, shading="nearest")
    fig.colorbar(mesh, ax=ax, label="log2(PS-sync / best sharding throughput), clipped at 8x", extend="both")
    pts = [(math.log10(cx), s) for cx, s in zip(sw.crossover, sw.zipf) if cx]
    if pts:
        ax.plot(*zip(*pts), "k-o", label="crossover (tie)")
    oom = [j for j in range(len(sw.rows)) if not sw.sharded_fits[:, j].any()]
    if oom:
        ax.axvline(x[oom[0]] - 0.25, color="k", ls="--", label="no sharding fits the workers' memory beyond")
    if pts or oom:
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("rows per table (log10)")
    ax.set_ylabel("Zipf exponent s of row access (1)")
    ax.set_title("Blue: the parameter server is faster; red: sharded embeddings are")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lower()[1:])
    plt.close(fig)
    return path
