"""Sharded embedding tables with all-to-all: what a recommendation-model user runs instead of
a parameter server, priced with :mod:`planner.cost.collectives`.

DLRM trains its embedding tables model-parallel and its MLPs data-parallel, exchanging the
pooled embeddings with an all-to-all ("butterfly shuffle", Naumov et al. 2019, arXiv
1906.00091 sec. 4); TorchRec (PyTorch's library for it) and Meta's production DLRM
(Mudigere et al. 2022, arXiv 2104.05158, "Software-hardware co-design for fast and scalable
training of deep learning recommendation models") shard each table one of these ways
(TorchRec ``torchrec.distributed.types.ShardingType``; comms in
``torchrec/distributed/sharding/{tw,rw,cw,twrw,dp}_sharding.py``):

============  ====================================  ==============================================
type          placement                              communication per step (fwd + bwd)
============  ====================================  ==============================================
data_parallel  every table on every worker           allreduce of the tables' dense gradients
table_wise    each table on one worker              ids all-to-all; pooled all-to-all, fwd and bwd
column_wise   each table split into ``c`` column     ids to every column shard; pooled all-to-all
              shards, placed table-wise              of ``D/c`` wide pieces, fwd and bwd
row_wise      each table's rows split over all W     ids all-to-all (bucketized); pooled partial sums
                                                     reduce-scattered fwd, all-gathered bwd
table_row_wise each table on one node, its rows      ids all-to-all; reduce-scatter inside the node
              split over the node's workers (2D)     (NVLink), all-to-all across nodes, and back
============  ====================================  ==============================================

With ``W`` workers of ``B`` samples (``N = W B``), ``T`` tables of ``R`` x ``D`` values of
``v`` bytes, ``L`` lookups per sample per table and ``k`` bytes per id, the buffers (bytes per
rank, as :func:`planner.cost.collectives.collective` takes them) are:

* table-wise: the busiest worker owns ``t = ceil(T / W)`` tables; it receives ``N t L k`` ids
  and sends ``N t D v`` pooled values, while every worker sends ``B T L k`` ids and receives
  ``B T D v``. An all-to-all runs at the pace of its busiest rank, so it is priced on the
  larger of the two. With ``T < W`` most workers own nothing and the owners are the bottleneck;
* column-wise: ``c`` = the largest divisor of ``D`` with ``c <= W / T`` (at least 1); the
  busiest worker owns ``ceil(T c / W)`` shards of ``D / c`` columns; ids go ``c`` times;
* row-wise: ids ``B T L k`` per rank; pooled partial sums of every sample, ``N T D v``,
  reduce-scattered forward and all-gathered backward (TorchRec ``PooledEmbeddingsReduceScatter``);
* table-row-wise (``g`` workers per node, ``n = W / g`` nodes): each node owns
  ``t = ceil(T / n)`` tables; reduce-scatter of ``N t D v`` inside the node, then an
  all-to-all across nodes of ``max(N t D v / g, B T D v)`` per rank (one rank per node on
  each rail), and back; it degenerates to table-wise when ``g = 1``;
* data-parallel: allreduce of ``T R D v`` over all workers.

Every layout also allreduces the dense MLP gradients (``P_dense v``) and waits for the
slowest worker (a synchronous step). Memory per worker: the shard's values and optimizer
state (``1 + o`` values per parameter), plus the dense part. No overlap of communication
with compute (TorchRec's ``TrainPipelineSparseDist`` overlaps the ids all-to-all with the
previous batch; so does none of the parameter-server layouts here), no lookup time (HBM
reads of ``N L D v / W`` bytes take microseconds), tables identical (TorchRec's planner picks
per table; with identical tables one type for all is its choice too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.collectives import Level, collective
from planner.units import plural

__all__ = ["SHARDING_TYPES", "Sharded", "shard_tables", "column_shards"]

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")


@dataclass(frozen=True)
class Sharded:
    """One sharding type's step for the embedding tables (SI units)."""

    name: str
    comm_s: float  # embedding communication per step: ids + forward + backward
    worker_bytes_per_step: float  # bytes one (busiest) worker sends per step for the tables
    memory_bytes: float  # busiest worker: table shard values + optimizer state
    detail: str


def column_shards(dim: int, tables: int, workers: int) -> int:
    """Column shards per table: the largest divisor of ``dim`` that is at most ``workers // tables``."""
    cap = max(1, workers // max(1, tables))
    return max(c for c in range(1, min(cap, dim) + 1) if dim % c == 0)


def _a2a(n: float, g: int, nodes: int, intra: Level, inter: Level | None) -> float:
    return collective("alltoall", n, g, nodes, intra, inter).time_s


def shard_tables(m, workers: int, batch: int, g: int, intra: Level, inter: Level | None) -> list[Sharded]:
    """Every sharding type of ``m`` (a :class:`planner.studies.paramserver.RecModel`) on
    ``workers`` workers of ``batch`` samples, ``g`` per node (``intra`` inside a node,
    ``inter`` between nodes; ``inter`` None when all workers share one node)."""
    W, B, T, R, D, L = workers, batch, m.tables, m.rows, m.dim, m.lookups
    v, kb, o = m.bytes_per_value, m.key_bytes, m.optimizer_values_per_param
    N = W * B
    nodes = max(1, W // g)
    k, mm = (g, nodes) if nodes > 1 else (W, 1)
    table_b = R * D * v
    f = (W - 1) / W if W > 1 else 0.0
    out = []

    grad = T * table_b
    t_dp = collective("allreduce", grad, k, mm, intra, inter).time_s
    out.append(Sharded("data_parallel", t_dp, 2 * f * grad, T * table_b * (2 + o),
                       "every table on every worker, gradients allreduced"))

    t = math.ceil(T / W)
    ids, pooled = max(B * T * L * kb, N * t * L * kb), max(B * T * D * v, N * t * D * v)
    t_tw = _a2a(ids, k, mm, intra, inter) + 2 * _a2a(pooled, k, mm, intra, inter)
    out.append(Sharded("table_wise", t_tw, f * (ids + 2 * pooled), t * table_b * (1 + o),
                       f"{plural(t, 'table')} on the busiest worker" + (f"; {W - T} of {W} workers own none" if T < W else "")))

    c = column_shards(D, T, W)
    s = math.ceil(T * c / W)
    ids_c = max(B * T * L * kb * c, N * s * L * kb)
    pooled_c = max(B * T * D * v, N * s * (D // c) * v)
    t_cw = _a2a(ids_c, k, mm, intra, inter) + 2 * _a2a(pooled_c, k, mm, intra, inter)
    out.append(Sharded("column_wise", t_cw, f * (ids_c + 2 * pooled_c), s * R * (D // c) * v * (1 + o),
                       f"{plural(c, 'column shard')} of {D // c} per table, {s} on the busiest worker"))

    ids_r = B * T * L * kb
    partial = N * T * D * v
    t_rw = (_a2a(ids_r, k, mm, intra, inter) + collective("reducescatter", partial, k, mm, intra, inter).time_s
            + collective("allgather", partial, k, mm, intra, inter).time_s)
    out.append(Sharded("row_wise", t_rw, f * (ids_r + 2 * partial), T * table_b * (1 + o) / W,
                       "every table's rows over all workers; partial sums reduce-scattered"))

    if g > 1 and nodes > 1:
        tn = math.ceil(T / nodes)
        ids_2 = max(B * T * L * kb, N * tn * L * kb / g)
        node_partial = N * tn * D * v
        cross = max(node_partial / g, B * T * D * v)
        t_rs = collective("reducescatter", node_partial, g, 1, intra).time_s
        t_ag = collective("allgather", node_partial, g, 1, intra).time_s
        t_x = collective("alltoall", cross, 1, nodes, intra, inter).time_s
        t_2d = _a2a(ids_2, k, mm, intra, inter) + t_rs + t_ag + 2 * t_x
        sent = f * ids_2 + 2 * ((g - 1) / g * node_partial + (nodes - 1) / nodes * cross)
        out.append(Sharded("table_row_wise", t_2d, sent, tn * table_b * (1 + o) / g,
                           f"{plural(tn, 'table')} per node, rows over its {g} workers (NVLink), all-to-all across {nodes} nodes"))
    else:
        out.append(Sharded("table_row_wise", t_tw, f * (ids + 2 * pooled), t * table_b * (1 + o),
                           "one worker per node: the same as table-wise"))
    return out
