"""``planner collective``: time one collective, or sweep sizes like nccl-tests.

GB/s here are 1e9 bytes per second, as nccl-tests prints them (``doc/PERFORMANCE.md``);
everything below this edge is in bytes and seconds.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer

from planner.cli.app import app
from planner.cost.collectives import ALGORITHMS, OPS, CollectiveResult, algorithm_times
from planner.cost.network import Topology
from planner.errors import InputError
from planner.units import fmt_bytes, plural, sig

__all__ = ["collective_command", "parse_size", "parse_sweep", "sweep_sizes"]

# nccl-tests' -b/-e take K, M, G as powers of 1024 (src/common.cu parsesize); KB/MB/GB are SI.
_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
FLOAT_BYTES = 4  # nccl-tests' default type, float


def parse_size(text: str, field: str = "--size") -> int:
    """``1073741824``, ``1GiB``, ``512MB``, ``64KiB``, ``8M`` -> bytes (a non-negative integer)."""
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(field, text, "a size in bytes such as 1073741824, 1GiB, 512MB or 64KiB")
    nbytes = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if nbytes != int(nbytes):
        raise InputError(field, text, "a whole number of bytes")
    return int(nbytes)


def parse_sweep(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (e.g. ``8:1GiB``) -> (min bytes, max bytes), 0 < MIN <= MAX."""
    parts = str(text).split(":")
    if len(parts) != 2:
        raise InputError("--sweep", text, "MIN:MAX, e.g. 8:1GiB")
    lo, hi = parse_size(parts[0], "--sweep"), parse_size(parts[1], "--sweep")
    if lo < 1 or hi < lo:
        raise InputError("--sweep", text, "0 < MIN <= MAX")
    return lo, hi


def sweep_sizes(lo: int, hi: int) -> list[int]:
    """MIN, 2 MIN, 4 MIN, ... up to MAX (nccl-tests ``-f 2``)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _topology(gpu, gpus, gpus_per_node, nic_gbps, nics_per_node, cluster) -> Topology:
    from planner.io.loaders import load_cluster, make_cluster  # noqa: PLC0415

    if gpus < 1:
        raise InputError("--gpus", gpus, "a positive integer")
    if cluster is not None:
        if nic_gbps is not None or nics_per_node is not None:
            raise InputError("--cluster", cluster, "either --cluster or --nic-gbps/--nics-per-node, not both")
        return Topology.from_cluster(load_cluster(cluster, num_gpus=gpus))  # its inter_node.tiers, if any
    if gpu is None:  # the default cluster every command shares (planner.cli.common.DEFAULTS)
        from planner.cli.common import DEFAULTS  # noqa: PLC0415

        gpu = DEFAULTS["gpu"]
    if nics_per_node is not None and nic_gbps is None:
        raise InputError("--nics-per-node", nics_per_node, "to come with --nic-gbps")
    inter = None
    if nic_gbps is not None:
        if not nic_gbps > 0:
            raise InputError("--nic-gbps", nic_gbps, "a positive number of Gb/s per NIC")
        inter = {"kind": "infiniband", "gbps_per_nic": nic_gbps, "nics_per_node": nics_per_node if nics_per_node is not None else 8}
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InputError("--gpus-per-node", gpus_per_node, "a positive integer")
    return Topology.from_cluster(make_cluster(gpu, gpus, gpus_per_node, inter))


def _t(seconds: float) -> str:
    """A collective's time, three significant figures: 3.00 us, 6.16 ms, 1.23 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{sig(seconds / scale)} {unit}"
    return f"{sig(seconds * 1e6)} us"


def _row(r: CollectiveResult) -> dict:
    return {
        "op": r.op,
        "bytes": int(r.bytes),
        "count": int(r.bytes) // FLOAT_BYTES,
        "type": "float",
        "gpus": r.gpus,
        "algorithm": r.algorithm,
        "time_s": r.time_s,
        "algbw_gbps": r.algbw_bytes_per_s / 1e9 if r.time_s > 0 else 0.0,
        "busbw_gbps": r.busbw_bytes_per_s / 1e9 if r.time_s > 0 else 0.0,
    }


_COLUMNS = ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm")


def _cells(d: dict) -> list[str]:
    return [str(d["bytes"]), str(d["count"]), d["type"], f"{d['time_s'] * 1e6:.2f}", f"{d['algbw_gbps']:.2f}", f"{d['busbw_gbps']:.2f}", d["algorithm"]]


def _print_table(rows: list[dict], title: str) -> None:
    if sys.stdout.isatty():
        from rich.console import Console  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415

        t = Table(title=title)
        for c in _COLUMNS:
            t.add_column(c, justify="left" if c in ("type", "algorithm") else "right")
        for d in rows:
            t.add_row(*_cells(d))
        Console().print(t)
        return
    widths = (12, 12, 6, 11, 13, 13, 12)
    typer.echo(f"# {title}")
    typer.echo("#" + "".join(f"{c:>{w}}" for c, w in zip(_COLUMNS[:6], widths)) + f"  {_COLUMNS[6]}")
    for d in rows:
        cells = _cells(d)
        typer.echo(" " + "".join(f"{c:>{w}}" for c, w in zip(cells[:6], widths)) + f"  {cells[6]}")


@app.command("collective")
def collective_command(
    op: str = typer.Argument(..., help="allreduce, reducescatter, allgather, broadcast, reduce, gather, scatter, alltoall, sendrecv"),
    size: str = typer.Option(None, "--size", help="Buffer bytes: 1073741824, 1GiB, 512MB, 64KiB (K/M/G = 1024^n as in nccl-tests)."),
    gpu: str = typer.Option(None, "--gpu", help="GPU preset id (default h100-sxm5-80gb, the default cluster of every command)."),
    gpus: int = typer.Option(None, "--gpus", help="GPUs in the group (all ranks, stride 1; default 64, the default cluster's)."),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the GPU preset's)."),
    nic_gbps: float = typer.Option(None, "--nic-gbps", help="Gb/s per NIC (InfiniBand)."),
    nics_per_node: int = typer.Option(None, "--nics-per-node", help="NICs per node (default 8)."),
    cluster: str = typer.Option(None, "--cluster", help="Cluster YAML/JSON file or preset id (may carry inter_node.tiers)."),
    algorithm: str = typer.Option("auto", "--algorithm", help="auto, ring, tree, rhd, hierarchical or nvls."),
    sweep: str = typer.Option(None, "--sweep", help="MIN:MAX, doubling (e.g. 8:1GiB): print an nccl-tests-style table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (GB/s = 1e9 B/s)."),
) -> None:
    """Predict the time, algorithm bandwidth and bus bandwidth of one collective.

    With only OP and --size: the default cluster (64 H100, 8 nodes of 8, 8 x 400 Gb/s InfiniBand each).

    Examples:
      planner collective allreduce --size 1GiB
      planner collective allreduce --size 1GiB --gpu h100-sxm5-80gb --gpus 8
      planner collective allgather --size 256MB --gpu a100-sxm4-80gb --gpus 64 --nic-gbps 200 --nics-per-node 8 --json
      planner collective allreduce --sweep 8:1GiB --gpu a100-sxm4-80gb --gpus 16
    """
    if op not in OPS:
        raise InputError("OP", op, "one of " + ", ".join(OPS))
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise InputError("--algorithm", algorithm, "one of auto, ring, tree, rhd, hierarchical, nvls")
    if (size is None) == (sweep is None):
        raise InputError("--size", size, "exactly one of --size BYTES or --sweep MIN:MAX")
    if gpus is None:
        from planner.cli.common import DEFAULTS  # noqa: PLC0415

        gpus = DEFAULTS["gpus"]
    topo = _topology(gpu, gpus, gpus_per_node, nic_gbps, nics_per_node, cluster)
    sizes = sweep_sizes(*parse_sweep(sweep)) if sweep is not None else [parse_size(size)]
    rows = [_row(topo.collective(op, n, gpus, 1, algorithm)) for n in sizes]
    g = topo.group(gpus, 1)
    where = {
        "gpu": topo.cluster.gpu.id,
        "gpus_per_node": topo.gpus_per_node,
        "nodes": topo.cluster.num_nodes,
        "levels": [lv.name for lv in g.crossed],
    }
    if sweep is None:
        times = algorithm_times(op, sizes[0], g.ranks_per_domain, g.domains, g.intra, g.inter)
        out = {**rows[0], **where, "algorithms_time_s": times}
        if as_json:
            typer.echo(json.dumps(out, indent=2))
            return
        d = rows[0]
        typer.echo(
            f"{op} of {fmt_bytes(d['bytes'])} over {gpus} x {where['gpu']} ({plural(where['nodes'], 'node')}; levels {', '.join(where['levels'])}): "
            f"{d['algorithm']}, {_t(d['time_s'])}, algbw {sig(d['algbw_gbps'])} GB/s, busbw {sig(d['busbw_gbps'])} GB/s"
        )
        from planner.cost.collectives import NOT_IN_NCCL  # noqa: PLC0415

        others = ", ".join(f"{a} {_t(t)}" + (" (not in NCCL)" if a in NOT_IN_NCCL else "")
                           for a, t in sorted(times.items(), key=lambda kv: kv[1]))
        typer.echo(f"  algorithms: {others}; the headline is the fastest NCCL runs")
        return
    if as_json:
        typer.echo(json.dumps({"op": op, "gpus": gpus, **where, "rows": rows}, indent=2))
        return
    _print_table(rows, f"{op} over {gpus} x {where['gpu']}, {plural(where['nodes'], 'node')}, levels {', '.join(where['levels'])} (model)")
