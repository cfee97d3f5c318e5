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


# --- Megatron-core's expert all-to-all overlap (--overlap-moe-expert-parallel-comm) ------------

from planner.cost.stages import a2a_merged_fraction  # noqa: E402
from planner.engines import a2a_overlap_runs, get_engine  # noqa: E402
from planner.cost.estimate import estimate  # noqa: E402
from planner.errors import InputError  # noqa: E402


def test_merged_fraction_by_hand():
    # no pipeline: the first forward and the last backward run alone
    assert a2a_merged_fraction(ParallelConfig(tp=1, pp=1, dp=8, vpp=1), 8) == pytest.approx(7 / 8)
    # interleaved p 4, v 2, m 8: rank 0 runs 2 (4 - 1) + (2 - 1) 4 + 1 = 11 of 16 chunk forwards alone
    assert a2a_merged_fraction(ParallelConfig(tp=1, pp=4, dp=8, vpp=2, schedule="interleaved"), 8) == pytest.approx(5 / 16)


def test_overlap_hides_the_all_to_all_under_the_other_micro_batch():
    model = load_model("mixtral-8x7b")
    cluster = make_cluster("h100-sxm5-80gb", 64)
    job = Job(4096, 512, "bf16")
    base = dict(tp=1, pp=1, dp=64, ep=8, vpp=1, micro_batch_size=1, recompute="none", sequence_parallel=False, zero=1,
                attention="flash", tp_comm_overlap=False, async_tp_allreduce=True, etp=1)
    off = layer_costs(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=False), C)
    on = layer_costs(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=True), C)
    full = off[1]["ep_comm"]
    assert full == pytest.approx(4 * off[4]["t_a2a"])  # dispatch + combine, forward and backward
    compute = off[1]["compute"]
    m = 512 // 64
    hidden = min(full, C.COMM_COMPUTE_OVERLAP_EFFICIENCY * compute)
    assert on[1]["ep_comm"] == pytest.approx(full - (m - 1) / m * hidden, rel=1e-12)
    assert on[0] == off[0]  # dense layers have no all-to-all
    e_off = estimate(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=False))
    e_on = estimate(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=True))
    assert e_on.step_time_s < e_off.step_time_s


def test_overlap_keeps_the_memory_of_the_schedule():
    """Megatron's combined 1F1B releases each layer's state as the merged step goes
    (model_chunk_schedule_plan.py): the peak is the schedule's without the overlap."""
    model = load_model("mixtral-8x7b")
    cluster = make_cluster("h100-sxm5-80gb", 64)
    job = Job(4096, 512, "bf16")
    for extra in ({}, {"pp": 2, "dp": 32, "vpp": 2, "schedule": "interleaved"}):
        base = {**dict(tp=1, pp=1, dp=64, ep=8, vpp=1, micro_batch_size=1, recompute="none", zero=1, etp=1), **extra}
        off = estimate(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=False))
        on = estimate(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=True))
        assert on.memory_peak_bytes == off.memory_peak_bytes and on.step_time_s < off.step_time_s


def test_the_expert_tensor_gather_is_not_hidden():
    """The etp all-gather / reduce-scatter run on the compute stream (routed_experts_compute)."""
    model = load_model("deepseek-v3")
    cluster = make_cluster("h100-sxm5-80gb", 1024)
    job = Job(4096, 8192, "bf16")
    base = dict(tp=2, pp=8, dp=64, ep=64, vpp=4, schedule="interleaved", micro_batch_size=1, recompute="none",
                sequence_parallel=True, zero=1, attention="flash", tp_comm_overlap=False, async_tp_allreduce=True, etp=2)
    off = layer_costs(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=False), C)
    on = layer_costs(model, cluster, job, ParallelConfig(**base, moe_a2a_overlap=True), C)
    links = degree_links(cluster, 2, 1, 64, 8, 64, 2)
    send = 4096 / 2 * model.moe.top_k * model.hidden * 2 * moe_load_factor(model, 64, C)
    gather = links["etp"].time("allgather", 2 * send)
    assert on[1]["ep_comm"] >= 4 * gather - 1e-15  # what stays exposed at least
    merged = a2a_merged_fraction(ParallelConfig(**base), 8192 // 64)
    hidden = min(4 * links["ep"].time("alltoall", send), C.COMM_COMPUTE_OVERLAP_EFFICIENCY * off[1]["compute"])
    assert on[1]["ep_comm"] == pytest.approx(off[1]["ep_comm"] - merged * hidden, rel=1e-12)


@pytest.mark.parametrize("engine,change,why", [
    (None, {"recompute": "full"}, "no full recompute"),
    (None, {"pp": 2, "dp": 32, "vpp": 1}, "interleaved"),
    (None, {"ep": 1}, "expert parallelism"),
    ("torchtitan", {"zero": 3}, "no expert all-to-all overlap"),
])
def test_overlap_refused_where_the_engine_does_not_run_it(engine, change, why):
    model = load_model("mixtral-8x7b")
    par = ParallelConfig(**{**dict(tp=1, pp=1, dp=64, ep=8, micro_batch_size=1, recompute="none", zero=1), **change},
                         moe_a2a_overlap=True)
    assert why in (a2a_overlap_runs(get_engine(engine), model, par) or "")
    with pytest.raises(InputError) as info:
        estimate(model, make_cluster("h100-sxm5-80gb", 64), Job(4096, 512), par, engine)
    assert info.value.field == "parallel.moe_a2a_overlap"


def test_a_fixed_overlap_is_searched_only_where_it_runs():
    import planner
    from planner.search.space import SearchOptions

    model = load_model("mixtral-8x7b")
    cluster = make_cluster("h100-sxm5-80gb", 64)
    job = Job(4096, 512)
    res = planner.plan(model, cluster, job, top_k=8, options=SearchOptions(fixed={"moe_a2a_overlap": True}))
    for p in res.plans:
        assert p.parallel.moe_a2a_overlap and p.parallel.ep > 1 and p.parallel.recompute != "full"
        assert p.parallel.pp == 1 or p.parallel.schedule == "interleaved"
        assert estimate(model, cluster, job, p.parallel).step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-9)
    with pytest.raises(InputError):
        planner.plan(model, cluster, job, options=SearchOptions(fixed={"moe_a2a_overlap": True}, engine="torchtitan"))
