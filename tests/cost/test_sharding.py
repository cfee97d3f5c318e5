"""Data-parallel traffic per sharding mode, counted by hand (Rajbhandari et al. 2020; each
engine's mode in planner/engines/profiles): with m micro-batches a step holds

* DDP (ZeRO 0): one all-reduce of the gradients;
* Megatron's distributed optimizer (ZeRO 1): one reduce-scatter of the gradients and one
  all-gather of the updated 16-bit weights, whatever m;
* DeepSpeed ZeRO-2: m gradient reductions (every backward; each bucket all-reduced,
  use_multi_rank_bucket_allreduce) and one all-gather of the updated weights;
* FSDP FULL_SHARD (torchtitan ZeRO-3, no pipeline): per micro-batch and layer two all-gathers of
  the layer's 16-bit weights (forward, and again in backward: reshard_after_forward) and one
  reduce-scatter of its gradients; a full recompute gathers a third time;
* FSDP under pipelining (reshard_after_forward off, gradients reduced once): one gather and one
  reduce-scatter of the stage per step.

Each expected total is built from one collective of the right size on the right group
(:meth:`planner.cost.comm.GroupLinks.time`) times the count above, and compared with
:func:`planner.cost.stages.stage_sync`'s total.
"""

from __future__ import annotations

import pytest

from planner import Job, ParallelConfig, get_engine, load_model, make_cluster, resolve
from planner.cost.comm import group_links
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.memory import grad_bytes, stage_params
from planner.cost.stages import _per_rank_links, stage_sync

MODEL = load_model("llama3.1-8b")
CLUSTER = make_cluster("h100-sxm5-80gb", 32)
JOB = Job(seq_len=4096, global_batch_size=256, precision="bf16")
G = grad_bytes("bf16", "auto")  # fp32 gradient reduction for bf16 (4 B)


def _sync(engine: str, m: int, **kw):
    eng = get_engine(engine)
    dp = kw.pop("dp", 32 // (kw.get("tp", 1) * kw.get("pp", 1)))
    mb = JOB.global_batch_size // (dp * m)
    par, _ = resolve(ParallelConfig(dp=dp, micro_batch_size=mb, **kw), MODEL, CLUSTER, JOB, eng)
    assert par.num_microbatches(JOB.global_batch_size) == m
    n = MODEL.layers // par.pp
    params = stage_params(MODEL, n, 0, par.pp, par.tp, par.ep, n_dense=n, etp=par.etp)
    s = stage_sync(CLUSTER, JOB, par, params, n, 1.0, m, 0.01, 0.005, C, eng)
    p = params["layers"] + params["embedding"] + params["output"] + params["experts"]
    return s, par, group_links(CLUSTER, par), p, n


@pytest.mark.parametrize("m", [1, 4, 8])
def test_ddp_is_one_allreduce(m):
    s, par, links, p, _ = _sync("megatron-core", m, tp=1, zero=0)
    assert s["total_s"] == pytest.approx(links["dp_cp"].time("allreduce", p * G), rel=1e-12)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_distributed_optimizer_reduces_and_gathers_once(m):
    s, par, links, p, _ = _sync("megatron-core", m, tp=2, zero=1)
    once = links["dp_cp"].time("reducescatter", p * G) + links["dp_cp"].time("allgather", p * 2)
    assert s["total_s"] == pytest.approx(once, rel=1e-12)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_deepspeed_zero2_reduces_every_micro_batch(m):
    s, par, links, p, _ = _sync("deepspeed", m, zero=2)
    expect = m * links["dp_cp"].time("allreduce", p * G) + links["dp_cp"].time("allgather", p * 2)
    assert s["total_s"] == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("recompute,gathers", [("none", 2), ("selective", 2), ("full", 3)])
def test_fsdp_full_shard_gathers_each_layer_twice_per_micro_batch(m, recompute, gathers):
    s, par, links, p, n = _sync("torchtitan", m, zero=3, recompute=recompute)
    assert get_engine("torchtitan").mode(3, 1).reshard_after_forward
    z3 = _per_rank_links(links["dp_cp"], CLUSTER)  # per-module collectives: each rank its own NIC share
    layer = p / n
    expect = m * n * (gathers * z3.time("allgather", layer * 2) + z3.time("reducescatter", layer * G))
    assert s["total_s"] == pytest.approx(expect + z3.time("allgather", layer * 2), rel=1e-12)  # + the first, unhidden gather


@pytest.mark.parametrize("m", [4, 16])
def test_fsdp_under_pipelining_syncs_once_per_step(m):
    """torchtitan with pp > 1: reshard_after_forward off and one gradient reduction per step
    (torch pipelining turns gradient sync off until the last micro-batch)."""
    s, par, links, p, n = _sync("torchtitan", m, zero=3, pp=2)
    mode = get_engine("torchtitan").mode(3, 2)
    assert not mode.reshard_after_forward and mode.grad_sync == "step"
    once = s["total_s"]
    s1, *_ = _sync("torchtitan", 4 if m == 16 else 16, zero=3, pp=2)
    assert once == pytest.approx(s1["total_s"], rel=1e-12)  # independent of m
