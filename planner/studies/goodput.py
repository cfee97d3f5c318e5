"""Failures, checkpoint interval and goodput of a synchronous training job.

A synchronous data/tensor/pipeline-parallel job stops when any one of its GPUs fails
(Llama 3 paper, arXiv 2407.21783 sec. 3.3.4: "a single GPU failure may require a restart
of the entire job"). With independent, exponentially distributed failures the job's
failure rate is the sum of its GPUs' rates, so its MTBF is ``1 / (n_gpus * rate)``.
The job loses, per failure, the work since the last checkpoint plus the restart time,
and pays the checkpoint write time every interval. This module gives

* the default per-GPU failure rate, derived from the Llama 3 405B run (below);
* the optimum checkpoint interval, Young (1974) and Daly (2006);
* the expected goodput fraction (useful compute time / expected wall-clock time) under
  Daly's complete model (default) or the first-order waste model;
* :func:`plan_checkpointing`, which puts these together into a :class:`GoodputResult`.

All times in seconds, sizes in bytes, rates per second. See ``docs/goodput.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.errors import InputError

__all__ = [
    "DEFAULT_GPU_FAILURE_RATE_PER_S",
    "CHECKPOINT_BYTES_PER_PARAM",
    "GOODPUT_MODELS",
    "GoodputResult",
    "job_mtbf_s",
    "checkpoint_bytes",
    "checkpoint_write_time_s",
    "NODE_CHECKPOINT_WRITE_BYTES_PER_S",
    "FS_WRITE_CAP_BYTES_PER_S",
    "checkpoint_write_bandwidth",
    "young_interval_s",
    "daly_interval_s",
    "goodput_fraction",
    "expected_wall_time_s",
    "plan_checkpointing",
]

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

# --- Default per-GPU failure rate ---------------------------------------------------------
# Llama 3 paper (Grattafiori et al., "The Llama 3 Herd of Models", arXiv 2407.21783,
# sec. 3.3.4 and Table 5): during a 54-day snapshot of 405B pre-training on 16,384 H100
# GPUs there were 466 job interruptions, 47 planned and 419 unexpected. Planned
# maintenance is not a random failure, so only the 419 count:
#   GPU-hours observed = 16,384 GPU * 54 d * 24 h/d      = 21,233,664 GPU-h
#   rate               = 419 / 21,233,664 GPU-h          = 1.973e-5 per GPU-hour
#                      = 1.973e-5 / 3600 s               = 5.48e-9 per GPU-second
#   per-GPU MTBF       = 1 / 1.973e-5 h                  = 50,677 h (~5.8 years)
#   job MTBF at 16,384 = 54 * 24 h / 419                 = 3.09 h ("one failure every
#                                                          three hours")
# The rate counts every unexpected interruption (GPU, HBM, network, software, host), not
# only GPU hardware: it is the per-GPU share of the job's interruption rate.
# Cross-check: Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
# Research Clusters", arXiv 2410.21680 (HPCA 2025), report 6.50 (RSC-1) and 2.34 (RSC-2)
# failures per 1000 node-days on 8-GPU A100 nodes:
#   6.50 / (1000 * 8 GPU * 24 h) = 3.39e-5 per GPU-hour;  2.34 / 192,000 = 1.22e-5
# and a projected job MTTF of 1.8 h at 16k GPUs (1 / (1.8 * 16,384) = 3.39e-5 per GPU-h).
# The Llama 3 figure lies between the two clusters and is taken as the default.
_LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
_LLAMA3_GPUS = 16_384
_LLAMA3_WINDOW_S = 54 * SECONDS_PER_DAY
DEFAULT_GPU_FAILURE_RATE_PER_S = _LLAMA3_UNEXPECTED_INTERRUPTIONS / (_LLAMA3_GPUS * _LLAMA3_WINDOW_S)

# --- Checkpoint size -----------------------------------------------------------------------
# Mixed-precision Adam keeps, per parameter, 2 B of bf16/fp16 weights plus 12 B of fp32
# optimizer state (4 B master weights + 4 B first moment + 4 B second moment): ZeRO paper,
# Rajbhandari et al., arXiv 1910.02054 sec. 3.1 ("2Psi + 2Psi + 12Psi" = 16 B/param
# including 2 B of fp16 gradients). Gradients are not checkpointed, leaving 14 B/param.
CHECKPOINT_BYTES_PER_PARAM = 2.0 + 12.0

# --- Checkpoint write bandwidth, scaled with the job ---------------------------------------
# A checkpoint is written by every node of the job at once into a shared parallel file
# system, so its bandwidth grows with the nodes until the file system's aggregate caps it.
# * Per node: NVIDIA's DGX SuperPOD reference architecture (DGX H100, RA-11333-001 V11,
#   2023-09-22, "Storage Architecture", Table 6 "Guidelines for storage performance") asks
#   of the high-performance storage, at its "Best" level, 62 GB/s aggregate write for one
#   scalable unit (SU) of 32 DGX nodes and 250 GB/s for 4 SUs (127-128 nodes): 1.94 GB/s
#   per node when all nodes write together (62 / 32 = 1.94; 250 / 128 = 1.95). The same
#   table's single-node write, 20 GB/s, is what one node gets alone; a whole job shares.
#   (Its "Good" and "Better" levels are 7 and 20 GB/s per SU: 0.22 and 0.63 GB/s per node.)
# * Cap: Meta's Tectonic file system that held Llama 3's checkpoints sustains 2 TB/s
#   (7 TB/s peak) over 7,500 SSD servers (Llama 3 paper, arXiv 2407.21783 sec. 3.3.1), the
#   largest published training file system; at 1.94 GB/s per node it is reached at ~1,030
#   nodes (8,250 GPUs), so a 16K-GPU job gets Meta's figure.
# Pass your own figure (``--ckpt-write-gbs``) when you know it: asynchronous or
# local-NVMe checkpointing (DGX nodes carry 8 x 3.84 TB U.2 NVMe) stalls training far less.
NODE_CHECKPOINT_WRITE_BYTES_PER_S = 62e9 / 32
FS_WRITE_CAP_BYTES_PER_S = 2e12


def checkpoint_write_bandwidth(n_nodes: int) -> float:
    """Default aggregate checkpoint write bandwidth of a job on ``n_nodes`` nodes, bytes/s:
    ``min(n_nodes * 1.94 GB/s, 2 TB/s)`` (DGX SuperPOD storage guideline per node, Tectonic cap)."""
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise InputError("n_nodes", n_nodes, "an integer >= 1")
    return min(n_nodes * NODE_CHECKPOINT_WRITE_BYTES_PER_S, FS_WRITE_CAP_BYTES_PER_S)


GOODPUT_MODELS = ("daly", "first_order")
GoodputModel = Literal["daly", "first_order"]


def _finite(name: str, value: object, *, positive: bool = False) -> float:
    """Check a real, finite number (> 0 if ``positive`` else >= 0) and return it as float."""
    expected = "a finite number > 0" if positive else "a finite number >= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, value, expected)
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise InputError(name, value, expected)
    return x


def job_mtbf_s(n_gpus: int, gpu_failure_rate_per_s: float = DEFAULT_GPU_FAILURE_RATE_PER_S) -> float:
    """Mean time between failures of a job on ``n_gpus`` GPUs that fail independently.

    Exponential failures: the job's rate is the sum of the GPUs' rates, so
    ``M = 1 / (n_gpus * rate)`` (Daly 2006 sec. 2 assumes the same Poisson model).
    """
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise InputError("n_gpus", n_gpus, "an integer >= 1")
    rate = _finite("gpu_failure_rate_per_s", gpu_failure_rate_per_s, positive=True)
    return 1.0 / (n_gpus * rate)


def checkpoint_bytes(n_params: float, bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM) -> float:
    """Checkpoint size: parameters times bytes per parameter (default 14 B, see above)."""
    n = _finite("n_params", n_params, positive=True)
    b = _finite("bytes_per_param", bytes_per_param, positive=True)
    return n * b


def checkpoint_write_time_s(size_bytes: float, write_bandwidth_bytes_per_s: float) -> float:
    """Time to write one checkpoint, C = size / aggregate write bandwidth (blocking write)."""
    size = _finite("checkpoint_bytes", size_bytes)
    bw = _finite("write_bandwidth_bytes_per_s", write_bandwidth_bytes_per_s, positive=True)
    return size / bw


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, sqrt(2 C M).

    J. W. Young, "A first order approximation to the optimum checkpoint interval",
    CACM 17(9):530-531, 1974.
    """
    c = _finite("checkpoint_s", checkpoint_s)
    m = _finite("mtbf_s", mtbf_s, positive=True)
    return math.sqrt(2.0 * c * m)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints.

    J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
    dumps", Future Generation Computer Systems 22(3):303-312, 2006 (doi
    10.1016/j.future.2004.11.016), sec. 4 perturbation solution::

        tau_opt = sqrt(2 C M) * [1 + (1/3) sqrt(C / 2M) + (1/9) (C / 2M)] - C   for C < 2M
        tau_opt = M                                                           for C >= 2M

    Daly's Figs. 3-5 (R = 10 min, C = 5 min) give tau_opt = 117, 57 and 9.1 min for
    M = 24 h, 6 h and 15 min; the tests reproduce them.
    """
    c = _finite("checkpoint_s", checkpoint_s)
    m = _finite("mtbf_s", mtbf_s, positive=True)
    if c >= 2.0 * m:
        return m
    xi = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(xi) / 3.0 + xi / 9.0) - c


def goodput_fraction(
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    model: GoodputModel = "daly",
) -> float:
    """Expected useful compute time / expected wall-clock time, in [0, 1].

    ``interval_s`` is the compute time tau between checkpoints (excluding the write C).

    * ``"daly"`` (default): Daly 2006 sec. 3 complete model with Poisson failures that can
      also strike during checkpoints and restarts; expected wall time for solve time T_s is
      ``T_w = M exp(R/M) (exp((tau + C)/M) - 1) T_s / tau``, so the fraction is
      ``tau / (M exp(R/M) (exp((tau + C)/M) - 1))``.
    * ``"first_order"``: the first-order waste model (Young 1974; Daly 2006 sec. 2),
      ``waste = C/tau + (tau/2 + R)/M``, fraction ``max(0, 1 - waste)``. It ignores
      failures during checkpoint and restart and overstates goodput when tau + C + R is
      not small against M.
    """
    tau = _finite("interval_s", interval_s, positive=True)
    c = _finite("checkpoint_s", checkpoint_s)
    r = _finite("restart_s", restart_s)
    m = _finite("mtbf_s", mtbf_s, positive=True)
    if model == "daly":
        # log of the denominator, to stay finite when (tau + C + R) >> M
        log_den = math.log(m) + r / m + (tau + c) / m + math.log(-math.expm1(-(tau + c) / m))
        return min(1.0, math.exp(math.log(tau) - log_den))
    if model == "first_order":
        waste = c / tau + (tau / 2.0 + r) / m
        return max(0.0, 1.0 - waste)
    raise InputError("model", model, f"one of {GOODPUT_MODELS}", flag="--model-kind")


def expected_wall_time_s(n_tokens: float, tokens_per_s: float, goodput: float) -> float:
    """Expected wall-clock time to train ``n_tokens``: (n_tokens / tokens_per_s) / goodput.

    ``tokens_per_s`` is the failure-free throughput of the whole job; ``goodput`` the
    fraction from :func:`goodput_fraction` (for the Daly model this equals Daly's T_w).
    """
    n = _finite("n_tokens", n_tokens)
    rate = _finite("tokens_per_s", tokens_per_s, positive=True)
    g = _finite("goodput", goodput, positive=True)
    if g > 1.0:
        raise InputError("goodput", goodput, "a fraction in (0, 1]")
    return n / rate / g


@dataclass(frozen=True)
class GoodputResult:
    """Failure, checkpoint and goodput figures for one job (SI units)."""

    n_gpus: int
    gpu_failure_rate_per_s: float
    mtbf_s: float
    checkpoint_bytes: float
    checkpoint_s: float
    restart_s: float
    young_interval_s: float
    daly_interval_s: float
    interval_s: float  # the interval the goodput is evaluated at
    model: str
    goodput_fraction: float
    compute_time_s: float | None  # failure-free time to train n_tokens
    wall_time_s: float | None  # expected wall-clock time to train n_tokens
    write_bandwidth_bytes_per_s: float = 0.0  # the aggregate checkpoint write bandwidth used
    write_bandwidth_source: str = ""  # where that figure came from, in words


def plan_checkpointing(
    n_gpus: int,
    n_params: float,
    write_bandwidth_bytes_per_s: float,
    restart_s: float,
    *,
    n_tokens: float | None = None,
    tokens_per_s: float | None = None,
    gpu_failure_rate_per_s: float = DEFAULT_GPU_FAILURE_RATE_PER_S,
    bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM,
    interval_s: float | None = None,
    model: GoodputModel = "daly",
    write_bandwidth_source: str = "",
) -> GoodputResult:
    """MTBF, checkpoint cost, Young and Daly intervals and goodput for one job.

    The goodput is evaluated at ``interval_s`` if given, else at Daly's optimum. If both
    ``n_tokens`` and ``tokens_per_s`` are given the expected wall-clock time is filled in.
    """
    if model not in GOODPUT_MODELS:
        raise InputError("model", model, f"one of {GOODPUT_MODELS}", flag="--model-kind")
    m = job_mtbf_s(n_gpus, gpu_failure_rate_per_s)
    size = checkpoint_bytes(n_params, bytes_per_param)
    c = checkpoint_write_time_s(size, write_bandwidth_bytes_per_s)
    young = young_interval_s(c, m)
    daly = daly_interval_s(c, m)
    if interval_s is None:
        if daly <= 0.0:  # C == 0: checkpointing is free, checkpoint continuously
            raise InputError("write_bandwidth_bytes_per_s", write_bandwidth_bytes_per_s,
                             "a finite bandwidth giving a checkpoint time > 0, or interval_s")
        tau = daly
    else:
        tau = _finite("interval_s", interval_s, positive=True)
    g = goodput_fraction(tau, c, restart_s, m, model)
    compute_s = wall_s = None
    if (n_tokens is None) != (tokens_per_s is None):
        raise InputError("n_tokens/tokens_per_s", (n_tokens, tokens_per_s), "both given or both None")
    if n_tokens is not None:
        compute_s = _finite("n_tokens", n_tokens) / _finite("tokens_per_s", tokens_per_s, positive=True)
        wall_s = math.inf if g == 0.0 else expected_wall_time_s(n_tokens, tokens_per_s, g)
    return GoodputResult(
        n_gpus=n_gpus,
        gpu_failure_rate_per_s=float(gpu_failure_rate_per_s),
        mtbf_s=m,
        checkpoint_bytes=size,
        checkpoint_s=c,
        restart_s=float(restart_s),
        young_interval_s=young,
        daly_interval_s=daly,
        interval_s=tau,
        model=model,
        goodput_fraction=g,
        compute_time_s=compute_s,
        wall_time_s=wall_s,
        write_bandwidth_bytes_per_s=float(write_bandwidth_bytes_per_s),
        write_bandwidth_source=write_bandwidth_source,
    )
