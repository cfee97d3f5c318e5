"""MoE dispatch traffic as Megatron-core's all-to-all token dispatcher sends it, counted by hand:
each rank sends its own sequence-parallel share (s / tp tokens, top-k copies of h 16-bit values,
times the busiest rank's load) over the expert-parallel group, and with expert tensor
parallelism etp > 1 the received tokens are all-gathered over the etp group afterwards
(MoEAlltoAllTokenDispatcher.token_dispatch / dispatch_postprocess)."""

import pytest

from planner.cost.comm import degree_links
from planner.cost.compute import moe_load_factor
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.stages import layer_costs
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig


@pytest.mark.parametrize("tp,etp,ep,dp", [(2, 1, 64, 64), (2, 2, 64, 64), (4, 1, 8, 8), (4, 4, 8, 8), (1, 1, 16, 16)])
def test_dispatch_bytes_are_the_ranks_own_tokens(tp, etp, ep, dp):
    model = load_model("deepseek-v3")
    gpus = tp * dp * 8
    cluster = make_cluster("h100-sxm5-80gb", gpus)
    job = Job(4096, 8192, "bf16")
    par = ParallelConfig(tp=tp, pp=8, dp=dp, ep=ep, etp=etp, vpp=1, micro_batch_size=1, recompute="none", sequence_parallel=tp > 1,
                         zero=1, attention="flash", tp_comm_overlap=False, async_tp_allreduce=True)
    raw = layer_costs(model, cluster, job, par, C)[4]
    tokens = 4096 / tp  # the rank's sequence-parallel share
    send = tokens * model.moe.top_k * model.hidden * 2 * moe_load_factor(model, ep, C)
    links = degree_links(cluster, tp, 1, dp, 8, ep, etp)
    expected = links["ep"].time("alltoall", send) + (links["etp"].time("allgather", etp * send) if etp > 1 else 0.0)
    assert raw["t_a2a"] == pytest.approx(expected, rel=1e-12)
    assert links["etp"].size == etp and links["etp"].m == 1  # adjacent ranks: inside the node


def test_expert_tensor_parallelism_adds_only_the_gather():
    model = load_model("deepseek-v3")
    cluster = make_cluster("h100-sxm5-80gb", 1024)
    job = Job(4096, 8192, "bf16")
    base = dict(tp=2, pp=8, dp=64, ep=64, vpp=1, micro_batch_size=1, recompute="none", sequence_parallel=True, zero=1,
                attention="flash", tp_comm_overlap=False, async_tp_allreduce=True)
    t1 = layer_costs(model, cluster, job, ParallelConfig(**base, etp=1), C)[4]["t_a2a"]
    t2 = layer_costs(model, cluster, job, ParallelConfig(**base, etp=2), C)[4]["t_a2a"]
    assert t2 > t1 and t2 - t1 < 0.5 * t1  # the NVLink gather is a fraction of the IB all-to-all
