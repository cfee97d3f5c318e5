"""Switch tiers with oversubscription reach the cost model: each parallel group is priced on
the slowest tier it crosses (issue 6, "cluster networks"), through plan and estimate."""

import planner
from planner.io.loaders import make_cluster
from planner.specs import Job

INTER = {"kind": "infiniband", "gbps_per_nic": 400, "nics_per_node": 8}
MODEL = planner.load_model("llama3.1-70b")
JOB = Job(8192, 1024, "bf16")
PAR = planner.ParallelConfig(tp=8, pp=4, dp=32, micro_batch_size=1, recompute="selective", sequence_parallel=True, zero=1)


def _cluster(spine: float, leaf_nodes: int = 16):
    tiers = [{"name": "leaf", "nodes": leaf_nodes, "oversubscription": 1.0}, {"name": "spine", "oversubscription": spine}]
    return make_cluster("h100-sxm5-80gb", 1024, inter_node={**INTER, "tiers": tiers})


def test_non_blocking_tiers_price_like_the_flat_network():
    flat = planner.estimate(MODEL, make_cluster("h100-sxm5-80gb", 1024, inter_node=INTER), JOB, PAR)
    tiered = planner.estimate(MODEL, _cluster(spine=1.0), JOB, PAR)
    assert tiered.step_time_s == flat.step_time_s or abs(tiered.step_time_s / flat.step_time_s - 1) < 1e-9


def test_an_oversubscribed_spine_slows_groups_that_cross_it():
    fast = planner.estimate(MODEL, _cluster(spine=1.0), JOB, PAR)
    slow = planner.estimate(MODEL, _cluster(spine=4.0), JOB, PAR)
    dp = {c["kind"]: c for c in slow.comm}["dp"]
    # the data-parallel group (32 ranks, stride 8 -> 32 nodes) spans two 16-node leaves
    assert dp["link"].endswith(":spine")
    assert dp["time_s"] > {c["kind"]: c for c in fast.comm}["dp"]["time_s"] * 3.5
    assert slow.step_time_s > fast.step_time_s


def test_a_group_inside_one_leaf_does_not_see_the_spine():
    # With 64-node leaves the 32-node data-parallel group stays under one leaf switch.
    slow_spine = planner.estimate(MODEL, _cluster(spine=4.0, leaf_nodes=64), JOB, PAR)
    dp = {c["kind"]: c for c in slow_spine.comm}["dp"]
    assert dp["link"].endswith(":leaf")


def test_the_search_sees_the_tiers_and_the_plan_document_keeps_them():
    from planner.cli.common import Setup, plan_document

    cluster = _cluster(spine=4.0)
    best = planner.plan(MODEL, cluster, JOB, top_k=1).plans[0]
    flat_best = planner.plan(MODEL, _cluster(spine=1.0), JOB, top_k=1).plans[0]
    assert best.estimate.step_time_s >= flat_best.estimate.step_time_s
    doc = plan_document(Setup(MODEL, cluster, JOB, {}, "llama3.1-70b", cluster.gpu.id), [best], None)
    assert [t["oversubscription"] for t in doc["hardware"]["inter_node"]["tiers"]] == [1.0, 4.0]
