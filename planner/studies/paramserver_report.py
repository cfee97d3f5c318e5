"""Recommendation, crossover sweep, text tables and chart for :mod:`planner.studies.paramserver`.

The crossover compares layouts with the same consistency: synchronous AllReduce against
synchronous parameter-server training (``ps-sync``), so that only the communication differs.
Relaxed layouts (quorum, bounded staleness, async) trade statistical efficiency for
throughput (Ho et al., NIPS 2013; Chen et al. 2016) and are reported beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.errors import InputError
from planner.studies.paramserver import LAYOUTS, PSCluster, PSResult, RecModel, evaluate

__all__ = [
    "PICK_TOLERANCE", "SWEEP_ROWS", "SWEEP_ZIPF", "Sweep", "recommend", "sync_ratio", "crossover_rows",
    "sweep", "format_result", "format_sweep", "write_chart",
]

PICK_TOLERANCE = 0.10  # take the most consistent layout within 10% of the best throughput
SWEEP_ROWS = tuple(int(round(10 ** (e / 2))) for e in range(4, 19))  # 1e2 .. 1e9, half decades
SWEEP_ZIPF = (0.0, 0.6, 0.8, 1.0, 1.2, 1.5)


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB" if x >= 1e8 else f"{x / 1e6:.3g} MB"


def recommend(res: PSResult) -> tuple[str, list[str]]:
    """Pick the most consistent layout whose throughput is within PICK_TOLERANCE of the best one."""
    m, c = res.model, res.cluster
    fitting = [l for l in res.layouts if l.fits]
    ar, ps = res.layout("allreduce"), res.layout("ps-sync")
    reasons = [
        f"AllReduce sends {_gb(ar.worker_bytes_per_step)} per worker per step (dense gradients of "
        f"{m.tables} x {m.rows:,} x {m.dim} tables); PS workers move {_gb(ps.worker_bytes_per_step)} "
        f"({res.unique_rows_per_worker:,.0f} unique rows of {c.batch * m.lookups * m.tables:,} lookups, "
        f"Zipf s={m.zipf:g})."
    ]
    if not ar.fits:
        reasons.append(f"AllReduce replicates {_gb(ar.worker_memory_bytes)} per worker > {c.worker_memory_gb:g} GB.")
    if not fitting:
        return "nothing fits: add servers or memory", reasons
    best = max(l.samples_per_s for l in fitting)
    pick = next(l for name in LAYOUTS for l in fitting if l.name == name and l.samples_per_s >= (1 - PICK_TOLERANCE) * best)
    t_server = ps.server_bytes_per_step / (c.nic_gbps * 1e9 / 8)
    t_worker = ps.worker_bytes_per_step / (c.nic_gbps * 1e9 / 8)
    if pick.name != "allreduce" and t_server > t_worker > 0:
        msg = (f"Servers are the bottleneck ({_gb(ps.server_bytes_per_step)} on the busiest server vs "
               f"{_gb(ps.worker_bytes_per_step)} per worker); ")
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
    reasons.append(f"Stragglers: a barrier over {c.workers} workers costs {straggle * res.compute_s * 1e3:.2f} ms "
                   f"per step over the mean worker (exponential tail {c.tail:g} of compute).")
    if pick.name in ("ps-quorum", "ps-ssp", "ps-async"):
        sync_best = max((l.samples_per_s for l in fitting if l.name in ("allreduce", "ps-sync")), default=0.0)
        gain = pick.samples_per_s / sync_best - 1 if sync_best else math.inf
        reasons.append(f"{pick.name} is {gain:+.0%} over the best synchronous layout; stale or dropped gradients "
                       "can cost accuracy (SSP bounds the staleness).")
    if c.replicas:
        reasons.append(f"{c.replicas} failure replica(s): server memory and push traffic x{1 + c.replicas}.")
    else:
        reasons.append("No failure replicas: losing a server loses its shard's updates since the last checkpoint.")
    speed = pick.samples_per_s / ar.samples_per_s
    lay = "AllReduce data parallel" if pick.name == "allreduce" else (
        f"{pick.name} with {c.servers} servers" + (f", hot shard x{res.hot_replicas}" if res.hot_replicas > 1 else ""))
    return (f"{lay} on {c.workers} workers: {pick.samples_per_s:,.0f} samples/s "
            f"({speed:.2f}x synchronous AllReduce)"), reasons


def sync_ratio(model: RecModel, cluster: PSCluster) -> tuple[float, bool]:
    """(ps-sync / allreduce throughput, allreduce fits) for one configuration."""
    res = evaluate(model, cluster)
    ar = res.layout("allreduce")
    return res.layout("ps-sync").samples_per_s / ar.samples_per_s, ar.fits


def crossover_rows(model: RecModel, cluster: PSCluster, lo: int, hi: int, iters: int = 12) -> float | None:
    """Rows per table where ps-sync and AllReduce tie, by bisection on log(rows) in [lo, hi]
    (None when the winner does not change there)."""
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
    ratio: np.ndarray  # [zipf, rows]: ps-sync / allreduce throughput
    ar_fits: np.ndarray  # [zipf, rows]
    crossover: tuple[float | None, ...]  # rows per table at the tie, per zipf

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "zipf": list(self.zipf), "ratio_ps_over_allreduce": self.ratio.tolist(),
                "allreduce_fits": self.ar_fits.tolist(), "crossover_rows": list(self.crossover),
                "winner": [["ps-sync" if x > 1 else "allreduce" for x in row] for row in self.ratio]}


def sweep(model: RecModel, cluster: PSCluster, rows=SWEEP_ROWS, zipf=SWEEP_ZIPF) -> Sweep:
    """Throughput ratio over table size x skew, and the crossover table size per skew."""
    rows, zipf = tuple(int(r) for r in rows), tuple(float(s) for s in zipf)
    ratio = np.zeros((len(zipf), len(rows)))
    fits = np.zeros((len(zipf), len(rows)), dtype=bool)
    cross: list[float | None] = []
    for i, s in enumerate(zipf):
        for j, r in enumerate(rows):
            ratio[i, j], fits[i, j] = sync_ratio(replace(model, rows=r, zipf=s), cluster)
        flip = next((j for j in range(1, len(rows)) if ratio[i, j - 1] <= 1 < ratio[i, j]), None)
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
    head = (f"{m.name}: {m.tables} tables x {m.rows:,} rows x dim {m.dim}, {m.lookups} lookup(s)/sample/table, "
            f"Zipf s={m.zipf:g}, dense {m.dense_params:,} params\n"
            f"{c.workers} workers x batch {c.batch}, {c.servers} servers ({c.partition} partition), "
            f"{c.nic_gbps:g} Gb/s NICs, k={c.replicas} failure replicas, staleness {c.staleness}, "
            f"quorum {c.quorum:g}, straggler tail {c.tail:g}\n")
    cols = ("layout", "step ms", "samples/s", "traffic/step", "worker NIC/step", "busiest server/step",
            "server GB/s", "server mem", "worker mem", "fits")
    rows = [cols] + [(l.name, f"{l.step_s * 1e3:.2f}", f"{l.samples_per_s:,.0f}", _gb(l.traffic_bytes_per_step),
                      _gb(l.worker_bytes_per_step), _gb(l.server_bytes_per_step) if l.server_bytes_per_step else "-",
                      f"{l.server_bytes_per_s / 1e9:.2f}" if l.server_bytes_per_s else "-",
                      _gb(l.server_memory_bytes) if l.server_memory_bytes else "-", _gb(l.worker_memory_bytes),
                      "yes" if l.fits else "NO") for l in res.layouts]
    w = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    table = "\n".join("  ".join(v.rjust(w[i]) if i else v.ljust(w[i]) for i, v in enumerate(r)) for r in rows)
    out = head + table + f"\n\nrecommend: {res.recommendation}\n" + "".join(f"  - {r}\n" for r in res.reasons)
    return out


def format_sweep(sw: Sweep) -> str:
    cells = [["zipf \\ rows"] + [_fmt_rows(r) for r in sw.rows] + ["crossover rows"]]
    for i, s in enumerate(sw.zipf):
        row = [f"s={s:g}"]
        for j in range(len(sw.rows)):
            x = sw.ratio[i, j]
            row.append(("PS " if x > 1 else "AR ") + _fmt_x(max(x, 1 / x)) + ("" if sw.ar_fits[i, j] else "*"))
        cx = sw.crossover[i]
        row.append(_fmt_rows(cx) if cx else ("PS everywhere" if sw.ratio[i, 0] > 1 else "AR everywhere"))
        cells.append(row)
    w = [max(len(r[k]) for r in cells) for k in range(len(cells[0]))]
    lines = ["  ".join(v.rjust(w[k]) for k, v in enumerate(r)) for r in cells]
    return ("Synchronous AllReduce (AR) vs synchronous parameter server (PS): winner and its throughput "
            "advantage per rows-per-table x Zipf skew\n" + "\n".join(lines) +
            "\n  * AllReduce replicas exceed worker memory here\n")


def write_chart(sw: Sweep, path: str | Path) -> Path:
    """Heat map of log2(PS/AR throughput) over rows x skew with the crossover curve; SVG or PNG."""
    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise InputError("chart", str(path), "a file name ending in .svg or .png")
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 4.5))
    z = np.log2(sw.ratio)
    x = np.log10(np.array(sw.rows, dtype=float))
    mesh = ax.pcolormesh(x, np.array(sw.zipf), z, cmap="RdBu", vmin=-3, vmax=3, shading="nearest")
    fig.colorbar(mesh, ax=ax, label="log2(PS-sync / AllReduce throughput), clipped at 8x", extend="both")
    pts = [(math.log10(cx), s) for cx, s in zip(sw.crossover, sw.zipf) if cx]
    if pts:
        ax.plot(*zip(*pts), "k-o", label="crossover (tie)")
    oom = [j for j in range(len(sw.rows)) if not sw.ar_fits[:, j].any()]
    if oom:
        ax.axvline(x[oom[0]] - 0.25, color="k", ls="--", label="AllReduce out of worker memory beyond")
    if pts or oom:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("log10(rows per table)")
    ax.set_ylabel("Zipf exponent s")
    ax.set_title("Parameter server beats AllReduce to the right of the line (blue)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lower()[1:])
    plt.close(fig)
    return path
