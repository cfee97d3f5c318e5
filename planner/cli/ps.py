"""``planner ps``: parameter server vs synchronous AllReduce for embedding-heavy models.

Thin edge over :mod:`planner.studies.paramserver` (model) and :mod:`planner.studies.paramserver_report`
(recommendation, sweep, chart). Gb/s here are nominal NIC line rates (1e9 bit/s); the
library works in bytes and seconds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import typer

from planner.cli.app import app

# Preset names for the help text, without importing numpy at CLI start-up.
_PRESET_NAMES = ("dlrm-criteo", "dlrm-kaggle", "dlrm-large")

__all__ = ["ps_command"]


@app.command("ps")
def ps_command(
    model: str = typer.Option("dlrm-criteo", "--model", help=f"Preset: {', '.join(_PRESET_NAMES)}."),
    rows: int | None = typer.Option(None, "--rows", help="Rows per embedding table."),
    dim: int | None = typer.Option(None, "--dim", help="Embedding dimension."),
    tables: int | None = typer.Option(None, "--tables", help="Number of embedding tables."),
    lookups: int | None = typer.Option(None, "--lookups", help="Lookups per sample per table (pooling factor)."),
    zipf: float | None = typer.Option(None, "--zipf", help="Zipf exponent of row access (0 = uniform)."),
    dense_params: int | None = typer.Option(None, "--dense-params", help="Parameters of the dense MLPs."),
    workers: int = typer.Option(16, "--workers", help="Worker hosts."),
    servers: int = typer.Option(4, "--servers", help="Parameter-server hosts."),
    batch: int = typer.Option(2048, "--batch", help="Samples per worker per step."),
    nic_gbps: float = typer.Option(100.0, "--nic-gbps", help="NIC line rate of every host, Gb/s per direction."),
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
    """Compare synchronous AllReduce with parameter-server training (sync, quorum, SSP, async).

    Examples:
      planner ps
      planner ps --rows 10000000 --zipf 1.1 --workers 32 --servers 8 --replicas 1 --json
      planner ps --sweep --chart crossover.svg
    """
    from planner.studies.paramserver import PSCluster, evaluate, preset  # noqa: PLC0415 (numpy: load lazily)
    from planner.studies.paramserver_report import format_result, format_sweep, sweep, write_chart  # noqa: PLC0415

    m = preset(model)
    overrides = {k: v for k, v in dict(rows=rows, dim=dim, tables=tables, lookups=lookups, zipf=zipf,
                                        dense_params=dense_params).items() if v is not None}
    if overrides:
        m = replace(m, name=f"{m.name}*", **overrides)
    c = PSCluster(workers=workers, servers=servers, batch=batch, nic_gbps=nic_gbps, replicas=replicas,
                  staleness=staleness, quorum=quorum, tail=tail, hot_replicas=hot_replicas, partition=partition)
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
