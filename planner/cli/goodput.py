"""``planner goodput``, and the failure/cost/profile options shared by ``plan`` and ``sweep``.

Formulas are in :mod:`planner.studies.goodput` (Young 1974, Daly 2006, failure rate from the Llama 3
405B run) and :mod:`planner.studies.costing`; docs/goodput.md and docs/beyond.md. Defaults:

* the job: the default cluster of every command (:data:`planner.cli.common.DEFAULTS`: Llama 3.1
  70B on 64 H100), so ``planner goodput`` alone runs, like ``planner plan``;
* checkpoint write bandwidth: scaled with the job, ``min(nodes x 1.94 GB/s, 2 TB/s)``
  (:func:`planner.studies.goodput.checkpoint_write_bandwidth`: NVIDIA's DGX SuperPOD storage
  guideline per node, capped by the 2 TB/s of Meta's Tectonic that held Llama 3's
  checkpoints); pass ``--ckpt-write-gbs`` for your storage;
* restart time 600 s: the R = 10 min of Daly 2006's worked figures (docs/goodput.md);
  measure yours (detection + rescheduling + checkpoint load);
* tokens to train (``sweep``, ``goodput`` without ``--tokens``): 20 per parameter, the
  compute-optimal ratio of Hoffmann et al. 2022 ("Chinchilla", arXiv 2203.15556, Table 3).
"""

from __future__ import annotations

import json as _json
import math
import re
from typing import Annotated, Optional

import typer

from planner.cli.app import app
from planner.errors import InputError
from planner.units import fmt_bytes, fmt_duration as _fmt_duration, fmt_gbs, sig, wrap

__all__ = [
    "DEFAULT_RESTART_S", "CHINCHILLA_TOKENS_PER_PARAM",
    "ObjectiveOpt", "PriceOpt", "TokensOpt", "ProfileOpt", "CkptOpt", "RestartOpt", "FailOpt",
    "parse_count", "goodput_for", "default_tokens", "money", "fmt_duration", "goodput_cmd",
]

DEFAULT_RESTART_S = 600.0
CHINCHILLA_TOKENS_PER_PARAM = 20.0

ObjectiveOpt = Annotated[str, typer.Option("--objective", help="Rank by: time (step time) | goodput (step time / goodput fraction).")]
PriceOpt = Annotated[Optional[float], typer.Option("--price-per-gpu-hour", help="Price of one GPU-hour (any currency) for the cost column.")]
TokensOpt = Annotated[Optional[str], typer.Option("--tokens", help="Tokens to train, e.g. 1e12, 300B, 15.6T.")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="Cluster profile YAML written by planner calibrate.")]
CkptOpt = Annotated[Optional[float], typer.Option("--ckpt-write-gbs", help="Aggregate checkpoint write bandwidth, GB/s (default: nodes x 1.94 GB/s, at most 2,000; docs/goodput.md).")]
RestartOpt = Annotated[Optional[float], typer.Option("--restart-s", help=f"Time to restart after a failure, s (default {DEFAULT_RESTART_S:g}).")]
FailOpt = Annotated[Optional[float], typer.Option("--failure-rate", help="Failures per GPU-hour (default 1.97e-5, Llama 3 405B run).")]

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(name: str, text: str | None) -> float | None:
    """'1e12', '300B', '15.6T', '2M' -> a positive float (None stays None)."""
    if text is None:
        return None
    mt = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*", str(text))
    if not mt:
        raise InputError(name, text, "a positive count such as 1e12, 300B or 15.6T")
    v = float(mt.group(1)) * _SUFFIX[mt.group(2).lower()]
    if not (0 < v < math.inf):
        raise InputError(name, text, "a positive finite count")
    return v


def _positive(name: str, v: float | None, default: float) -> float:
    if v is None:
        return default
    if not (isinstance(v, (int, float)) and 0 < v < math.inf):
        raise InputError(name, v, "a positive finite number")
    return float(v)


def ckpt_bandwidth(n_gpus: int, gpus_per_node: int, ckpt_write_gbs: float | None) -> tuple[float, str]:
    """The checkpoint write bandwidth (bytes/s) and where it comes from: ``--ckpt-write-gbs``,
    or the job's nodes times the per-node figure, capped (docs/goodput.md, section 2)."""
    from planner.studies.goodput import (  # noqa: PLC0415
        FS_WRITE_CAP_BYTES_PER_S, NODE_CHECKPOINT_WRITE_BYTES_PER_S, checkpoint_write_bandwidth)
    from planner.units import fmt_gbs, plural  # noqa: PLC0415

    if ckpt_write_gbs is not None:
        return _positive("--ckpt-write-gbs", ckpt_write_gbs, 0) * 1e9, "--ckpt-write-gbs"
    nodes = max(1, math.ceil(n_gpus / max(1, gpus_per_node)))
    bw = checkpoint_write_bandwidth(nodes)
    if bw >= FS_WRITE_CAP_BYTES_PER_S:
        return bw, f"default: {plural(nodes, 'node')} x {fmt_gbs(NODE_CHECKPOINT_WRITE_BYTES_PER_S)}, at most 2 TB/s"
    return bw, f"default: {plural(nodes, 'node')} x {fmt_gbs(NODE_CHECKPOINT_WRITE_BYTES_PER_S)}: DGX SuperPOD guideline"


def goodput_for(n_gpus: int, n_params: float, *, ckpt_write_gbs: float | None = None, restart_s: float | None = None,
                failure_rate_per_gpu_hour: float | None = None, n_tokens: float | None = None,
                tokens_per_s: float | None = None, interval_s: float | None = None, model: str = "daly",
                gpus_per_node: int = 8):
    """:func:`planner.studies.goodput.plan_checkpointing` with the CLI's units and defaults
    (``gpus_per_node`` turns GPUs into the nodes that write the checkpoint together)."""
    from planner.studies.goodput import DEFAULT_GPU_FAILURE_RATE_PER_S, plan_checkpointing  # noqa: PLC0415

    rate = DEFAULT_GPU_FAILURE_RATE_PER_S if failure_rate_per_gpu_hour is None else _positive("--failure-rate", failure_rate_per_gpu_hour, 0) / 3600.0
    bw, source = ckpt_bandwidth(n_gpus, gpus_per_node, ckpt_write_gbs)
    r = DEFAULT_RESTART_S if restart_s is None else restart_s
    if not (isinstance(r, (int, float)) and 0 <= r < math.inf):
        raise InputError("--restart-s", r, "a finite number of seconds >= 0")
    both = n_tokens is not None and tokens_per_s is not None
    return plan_checkpointing(n_gpus, n_params, bw, float(r), n_tokens=n_tokens if both else None,
                              tokens_per_s=tokens_per_s if both else None, gpu_failure_rate_per_s=rate,
                              interval_s=interval_s, model=model, write_bandwidth_source=source)


def default_tokens(n_params: float) -> float:
    """Compute-optimal training tokens, 20 per parameter (Hoffmann et al. 2022)."""
    return CHINCHILLA_TOKENS_PER_PARAM * n_params


fmt_duration = _fmt_duration  # the one duration format (planner.units), kept here for sweep


def _count(x: float) -> str:
    """15.6T, 1.41T, 300B: a token or parameter count with its SI letter."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{sig(x / scale)}{unit}"
    return f"{x:.0f}"


def money(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def goodput_lines(g, n_tokens: float | None, tokens_per_s: float | None, price: float | None) -> list[str]:
    """Human-readable summary of a GoodputResult (and cost when a price is given)."""
    out = [
        f"job MTBF {fmt_duration(g.mtbf_s)} ({g.n_gpus:,} GPUs x {g.gpu_failure_rate_per_s * 3600:.3g} failures per GPU-hour)",
        f"checkpoint {fmt_bytes(g.checkpoint_bytes)} (14 B per parameter) at {fmt_gbs(g.write_bandwidth_bytes_per_s)}: "
        f"C = {fmt_duration(g.checkpoint_s)}",
    ]
    if g.write_bandwidth_source.startswith("default"):
        out.append(f"  ({g.write_bandwidth_source.removeprefix('default: ')}; --ckpt-write-gbs sets yours)")
    out += [
        f"restart R = {fmt_duration(g.restart_s)}; checkpoint every {fmt_duration(g.interval_s)} "
        f"(Daly {fmt_duration(g.daly_interval_s)}, Young {fmt_duration(g.young_interval_s)})",
        f"goodput ({g.model}) {g.goodput_fraction:.4f}",
    ]
    if n_tokens is not None and tokens_per_s:
        from planner.studies.costing import training_cost  # noqa: PLC0415

        c = training_cost(n_tokens, tokens_per_s, g.n_gpus, price or 0.0, max(g.goodput_fraction, 1e-300))
        line = f"{_count(n_tokens)} tokens at {tokens_per_s:,.0f} tok/s: compute {fmt_duration(c.compute_time_s)}, "
        if not finishes(g):
            out.append(line + f"expected wall: never (goodput {g.goodput_fraction:.2g}: failures come faster than "
                              "checkpoints save progress)")
            return out
        line += f"expected wall {fmt_duration(c.wall_time_s)}, {c.gpu_hours:,.0f} GPU-h"
        if price is not None:
            line += f", cost {money(c.cost)}"
        out.append(line)
    return out


__all__.append("goodput_lines")


def goodput_dict(g, n_tokens: float | None, tokens_per_s: float | None, price: float | None) -> dict:
    d = {k: getattr(g, k) for k in ("n_gpus", "gpu_failure_rate_per_s", "mtbf_s", "checkpoint_bytes", "checkpoint_s",
                                    "restart_s", "young_interval_s", "daly_interval_s", "interval_s", "model", "goodput_fraction",
                                    "write_bandwidth_bytes_per_s", "write_bandwidth_source")}
    if n_tokens is not None and tokens_per_s:
        from planner.studies.costing import training_cost  # noqa: PLC0415

        c = training_cost(n_tokens, tokens_per_s, g.n_gpus, price or 0.0, max(g.goodput_fraction, 1e-300))
        done = finishes(g)  # JSON has no infinity: a job that never finishes has null wall time, GPU-hours and cost
        d.update(n_tokens=n_tokens, tokens_per_s=tokens_per_s, compute_time_s=c.compute_time_s, finishes=done,
                 wall_time_s=c.wall_time_s if done else None, gpu_hours=c.gpu_hours if done else None, price_per_gpu_hour=price,
                 cost=c.cost if price is not None and done else None)
    return d


def finishes(g) -> bool:
    """Whether the job makes progress worth a wall time: goodput above 1e-6 (below it the expected
    wall time is over a million times the compute time, and overflows at the extreme)."""
    import math  # noqa: PLC0415

    return g.goodput_fraction > 1e-6 and math.isfinite(g.goodput_fraction)


__all__.append("goodput_dict")


@app.command("goodput")
def goodput_cmd(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset or file (its parameter count sizes the checkpoint; default llama3.1-70b).")] = None,
    params: Annotated[Optional[str], typer.Option("--params", help="Parameter count instead of --model, e.g. 405B.")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", "-n", help="GPUs in the job (default 64).")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset (for the throughput search; default h100-sxm5-80gb).")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU preset's); nodes write checkpoints.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-s")] = None,
    global_batch_size: Annotated[Optional[int], typer.Option("--global-batch-size", "-b")] = None,
    tokens_per_s: Annotated[Optional[float], typer.Option("--tokens-per-s", help="Failure-free throughput; default: the best plan's.")] = None,
    tokens: TokensOpt = None, price: PriceOpt = None, ckpt: CkptOpt = None, restart: RestartOpt = None, rate: FailOpt = None,
    interval: Annotated[Optional[float], typer.Option("--interval-s", help="Evaluate at this checkpoint interval instead of Daly's.")] = None,
    gmodel: Annotated[str, typer.Option("--model-kind", help="daly (complete model) | first_order.")] = "daly",
    profile: ProfileOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable JSON.")] = False,
) -> None:
    """Failures, checkpoint interval (Young/Daly), goodput, and time and cost to train N tokens.

    With no arguments: the default cluster of `planner plan` (Llama 3.1 70B on 64 H100),
    its best plan's throughput, 20 tokens per parameter.

    Examples:
      planner goodput
      planner goodput --params 405B --gpus 16384 --tokens 15.6T --tokens-per-s 2.5e6 --restart-s 600
      planner goodput --model llama3.1-70b --gpus 1024 --tokens 1.4T --price-per-gpu-hour 2
    """
    from planner.cli.common import DEFAULTS  # noqa: PLC0415

    if model is not None and params is not None:
        raise InputError("--model/--params", (model, params), "one of --model or --params, not both")
    if model is None and params is None:
        model = DEFAULTS["model"]
    if gpus is None:
        gpus = DEFAULTS["gpus"]
    if gpus < 1:
        raise InputError("--gpus", gpus, "a positive integer")
    n_tokens = parse_count("--tokens", tokens)
    gpn = gpus_per_node
    if model is not None:
        from planner.cli.common import setup_from_flags  # noqa: PLC0415
        from planner.cost.flops import param_count  # noqa: PLC0415

        setup = setup_from_flags(model, gpu, gpus, gpus_per_node, None, None, None, None, seq_len, global_batch_size, None, None, {}).with_profile(profile)
        n_params = float(param_count(setup.model))
        gpn = setup.cluster.gpus_per_node
        if tokens_per_s is None:
            tokens_per_s = setup.best().estimate.tokens_per_s
    else:
        n_params = parse_count("--params", params)
        if gpn is None:
            from planner.io.loaders import make_cluster  # noqa: PLC0415

            gpn = make_cluster(gpu or DEFAULTS["gpu"], gpus).gpus_per_node
    if n_tokens is None:
        n_tokens = default_tokens(n_params)
    if tokens_per_s is not None and not (0 < tokens_per_s < math.inf):
        raise InputError("--tokens-per-s", tokens_per_s, "a positive number")
    g = goodput_for(gpus, n_params, ckpt_write_gbs=ckpt, restart_s=restart, failure_rate_per_gpu_hour=rate,
                    n_tokens=n_tokens, tokens_per_s=tokens_per_s, interval_s=interval, model=gmodel, gpus_per_node=gpn)
    if json:
        typer.echo(_json.dumps({"schema": "planner-goodput/1", "n_params": n_params, **goodput_dict(g, n_tokens, tokens_per_s, price)}, indent=2))
        return
    typer.echo(f"{_count(n_params)} parameters on {gpus:,} GPUs" + (f" ({setup.model.name})" if model is not None else ""))
    for line in goodput_lines(g, n_tokens, tokens_per_s, price):
        typer.echo(wrap(line))
