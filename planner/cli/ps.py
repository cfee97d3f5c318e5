"""``planner ps``: parameter server vs sharded embeddings for embedding-heavy models.

Thin edge over :mod:`planner.studies.paramserver` (model), :mod:`planner.studies.sharding`
(TorchRec's sharding types) and :mod:`planner.studies.paramserver_report` (recommendation,
sweep, chart). The workers are the GPUs of the default cluster every command shares
(:data:`planner.cli.common.DEFAULTS`: H100, 8 per node over NVSwitch, 400 Gb/s InfiniBand per
GPU); ``--gpu none`` gives the seed chapter's CPU hosts, one 100 Gb/s Ethernet NIC each.
Gb/s here are nominal NIC line rates (1e9 bit/s); the library works in bytes and seconds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import typer

from planner.cli.app import app

# Preset names for the help text, without importing numpy at CLI start-up.
_PRESET_NAMES = ("dlrm-criteo", "dlrm-kaggle", "dlrm-large")

__all__ = ["ps_command", "ps_cluster"]


def ps_cluster(gpu: str | None, workers: int | None, nic_gbps: float | None):
    """Worker placement for ``--gpu``: (PSCluster fields, default workers). ``none``: the
    chapter's hosts (16 by default, 100 Gb/s Ethernet); a GPU preset: its nodes, NVLink and
    network (workers default to the default cluster's GPU count)."""
    from planner.cli.common import DEFAULTS  # noqa: PLC0415

    if gpu is not None and gpu.lower() in ("none", "cpu", "hosts"):
        return {"nic_gbps": 100.0 if nic_gbps is None else nic_gbps}, 16 if workers is None else workers
    from planner.io.loaders import make_cluster  # noqa: PLC0415

    n = DEFAULTS["gpus"] if workers is None else workers
    cl = make_cluster(gpu or DEFAULTS["gpu"], max(1, n))
    per_gpu = cl.inter.gbps_per_nic * cl.inter.nics_per_node / cl.gpus_per_node
    return {"nic_gbps": per_gpu if nic_gbps is None else nic_gbps, "link": cl.inter.kind,
            "workers_per_node": cl.gpus_per_node, "scaleup_gbs": cl.intra.bandwidth_bytes_per_s / 1e9,
            "worker_memory_gb": cl.gpu.memory_bytes / 1e9, "gpu": cl.gpu.id}, n


@app.command("ps")
def ps_command(
    model: str = typer.Option("dlrm-criteo", "--model", help=f"Preset: {', '.join(_PRESET_NAMES)}."),
    rows: int | None = typer.Option(None, "--rows", help="Rows per embedding table."),
    dim: int | None = typer.Option(None, "--dim", help="Embedding dimension."),
    tables: int | None = typer.Option(None, "--tables", help="Number of embedding tables."),
    lookups: int | None = typer.Option(None, "--lookups", help="Lookups per sample per table (pooling factor)."),
    zipf: float | None = typer.Option(None, "--zipf", help="Zipf exponent of row access (0 = uniform)."),
    dense_params: int | None = typer.Option(None, "--dense-params", help="Parameters of the dense MLPs."),
    gpu: str | None = typer.Option(None, "--gpu", help="Worker GPU preset (default h100-sxm5-80gb: 8 per node, NVLink, InfiniBand); none = CPU hosts on Ethernet."),
    workers: int | None = typer.Option(None, "--workers", help="Workers (GPUs; default 64, the default cluster's; 16 hosts with --gpu none)."),
    servers: int = typer.Option(8, "--servers", help="Parameter-server hosts."),
    batch: int = typer.Option(2048, "--batch", help="Samples per worker per step."),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", help="NIC line rate per worker, Gb/s per direction (default: the GPU preset's per GPU)."),
    server_nic_gbps: float | None = typer.Option(None, "--server-nic-gbps", help="NIC line rate of each PS server, Gb/s (default: a worker's)."),
    replicas: int = typer.Option(0, "--replicas", help="Failure replicas k of every server shard."),
    staleness: int = typer.Option(3, "--staleness", help="Bounded-staleness (SSP) bound s in steps."),
    quorum: float = typer.Option(0.9, "--quorum", help="Fraction of workers a quorum step waits for."),
    tail: float = typer.Option(0.2, "--tail", help="Straggler tail: mean extra compute time / compute time."),
    hot_replicas: int | None = typer.Option(None, "--hot-replicas", help="Replicas of the hottest shard (default: best)."),
    partition: str = typer.Option("hash", "--partition", help="hash (hashed ids) or range (popularity-ordered ids)."),
    do_sweep: bool = typer.Option(False, "--sweep", help="Crossover table over rows per table x Zipf skew."),
    chart: str | None = typer.Option(None, "--chart", help="Write the crossover chart to FILE.svg or FILE.png."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Compare sharded embeddings (TorchRec's table-, row-, column-, table-row-wise and
    data-parallel placements, all-to-all) with parameter-server training (sync, quorum, SSP,
    async), and say when a parameter server still wins.

    Examples:
      planner ps
      planner ps --rows 10000000 --zipf 1.1 --workers 32 --servers 8 --replicas 1 --json
      planner ps --gpu none --workers 16 --servers 4
      planner ps --sweep --chart crossover.svg
    """
    from planner.studies.paramserver import PSCluster, evaluate, preset  # noqa: PLC0415 (numpy: load lazily)
    from planner.studies.paramserver_report import format_result, format_sweep, sweep, write_chart  # noqa: PLC0415

    m = preset(model)
    overrides = {k: v for k, v in dict(rows=rows, dim=dim, tables=tables, lookups=lookups, zipf=zipf,
                                        dense_params=dense_params).items() if v is not None}
    if overrides:
        m = replace(m, name=f"{m.name}*", **overrides)
    place, n_workers = ps_cluster(gpu, workers, nic_gbps)
    c = PSCluster(workers=n_workers, servers=servers, batch=batch, replicas=replicas, server_nic_gbps=server_nic_gbps,
                  staleness=staleness, quorum=quorum, tail=tail, hot_replicas=hot_replicas, partition=partition, **place)
    if chart is not None:  # fail on a bad name before the sweep runs
        from pathlib import Path  # noqa: PLC0415

        from planner.errors import InputError  # noqa: PLC0415

        if Path(chart).suffix.lower() not in (".svg", ".png"):
            raise InputError("--chart", chart, "a file name ending in .svg or .png")
    res = evaluate(m, c)
    sw = sweep(m, c) if (do_sweep or chart) else None
    if chart is not None:
        write_chart(sw, chart)
    if as_json:
        out = {"result": res.to_dict()}
        if sw is not None:
            out["sweep"] = sw.to_dict()
        if chart is not None:
            out["chart"] = chart
        typer.echo(json.dumps(out, indent=2, default=float))
        return
    typer.echo(format_result(res))
    if sw is not None:
        typer.echo(format_sweep(sw))
    if chart is not None:
        typer.echo(f"chart written to {chart}")
