"""Megatron-core's flex token dispatcher with the DeepEP / HybridEP kernels: a token goes once to
each destination rank, and across scale-up domains once to each destination domain
(comm.flex_dispatch_time), against the all-to-all dispatcher's copy per routed expert."""

from itertools import combinations
from math import comb

import pytest

from planner.cost.comm import degree_links, distinct_hit_fraction, flex_dispatch_time, moe_dispatch_bytes
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.stages import layer_costs
from planner.engines import get_engine, resolve
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig


@pytest.mark.parametrize("experts,top_k,parts", [(8, 2, 4), (8, 3, 2), (12, 4, 3), (6, 1, 6)])
def test_hit_fraction_is_the_exact_count_over_top_k_sets(experts, top_k, parts):
    per = experts // parts
    sets = list(combinations(range(experts), top_k))
    hit = sum(any(e < per for e in s) for s in sets)  # part 0 holds experts 0..per-1
    assert distinct_hit_fraction(experts, top_k, parts) == pytest.approx(hit / len(sets), rel=1e-12)
    assert distinct_hit_fraction(experts, top_k, parts) == pytest.approx(1 - comb(experts - per, top_k) / comb(experts, top_k))
    assert distinct_hit_fraction(experts, top_k, 1) == 1.0


@pytest.mark.parametrize("gpus,ep", [(16, 8), (16, 16), (64, 32), (64, 64)])
def test_one_expert_per_token_takes_the_all_to_all_time_where_the_network_bounds_it(gpus, ep):
    """With top-1 routing there is nothing to deduplicate: the two dispatchers send the same bytes
    over the network (and, in one domain, over NVLink); the flex kernels' forwarded NVLink
    copies stay under the InfiniBand time on H100 nodes."""
    cluster = make_cluster("h100-sxm5-80gb", gpus)
    links = degree_links(cluster, 1, 1, gpus, 1, ep, 1)["ep"]
    tokens, h = 4096.0, 2048
    a2a = links.time("alltoall", moe_dispatch_bytes(tokens, h, 1, 1.0))
    assert flex_dispatch_time(links, tokens, h, 128, 1, 1.0) == pytest.approx(a2a, rel=1e-9)


def test_top_8_over_two_nodes_crosses_the_network_about_once_per_token():
    """Qwen3-30B-A3B (128 experts, top-8) over ep 16 on two H100 nodes: the all-to-all sends
    8 x 8/16 = 4 copies of a token over InfiniBand, the flex dispatcher ~1 (the other node is
    almost always hit), so its time is ~4x less while the network bounds both."""
    cluster = make_cluster("h100-sxm5-80gb", 16)
    links = degree_links(cluster, 1, 1, 16, 1, 16, 1)["ep"]
    assert (links.k, links.m) == (8, 2)
    tokens, h = 4096.0, 2048
    remote = distinct_hit_fraction(128, 8, 2)
    assert 0.99 < remote < 1.0
    a2a = links.time("alltoall", moe_dispatch_bytes(tokens, h, 8, 1.0))
    flex = flex_dispatch_time(links, tokens, h, 128, 8, 1.0)
    assert 3.5 < a2a / flex < 4.2


def test_the_estimate_prices_the_plan_dispatcher_and_the_default_is_the_all_to_all():
    model = load_model("qwen3-30b-a3b")
    cluster = make_cluster("h100-sxm5-80gb", 16)
    job = Job(4096, 1024, "fp8")
    base = dict(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none", zero=1, moe_a2a_overlap=False)
    plain = estimate(model, cluster, job, ParallelConfig(**base))
    a2a = estimate(model, cluster, job, ParallelConfig(**base, moe_dispatcher="alltoall"))
    deep = estimate(model, cluster, job, ParallelConfig(**base, moe_dispatcher="deepep"))
    hyb = estimate(model, cluster, job, ParallelConfig(**base, moe_dispatcher="hybridep"))
    assert plain.parallel.moe_dispatcher == "alltoall" and plain.step_time_s == a2a.step_time_s
    assert deep.step_time_s == hyb.step_time_s < a2a.step_time_s
    assert deep.time_breakdown_s["ep_comm_exposed_s"] < 0.5 * a2a.time_breakdown_s["ep_comm_exposed_s"]
    assert deep.memory_peak_bytes == a2a.memory_peak_bytes
    par, filled = resolve(ParallelConfig(**{**base, "dp": None}), model, cluster, job, get_engine("megatron-core"))
    assert par.moe_dispatcher == "alltoall" and "moe_dispatcher" in filled
    raw_a = layer_costs(model, cluster, job, par, C)[4]
    raw_d = layer_costs(model, cluster, job, par.replace(moe_dispatcher="deepep"), C)[4]
    assert raw_d["t_a2a"] < raw_a["t_a2a"] / 3  # the cache keys on the dispatcher


def test_a_fixed_dispatcher_is_searched_only_where_it_runs():
    from planner.search.plan import plan
    from planner.search.space import SearchOptions

    model, cluster, job = load_model("qwen3-30b-a3b"), make_cluster("h100-sxm5-80gb", 16), Job(4096, 1024, "fp8")
    res = plan(model, cluster, job, top_k=3, options=SearchOptions(fixed={"moe_dispatcher": "deepep"}))
    for p in res.plans:
        assert p.parallel.moe_dispatcher == "deepep" and p.parallel.ep * p.parallel.etp > 1
        assert p.estimate.step_time_s == pytest.approx(estimate(model, cluster, job, p.parallel).step_time_s, rel=1e-9)
    for engine, mid, why in (("torchtitan", "qwen3-30b-a3b", "alltoall on torchtitan"), ("megatron-core", "llama3.1-8b", "without MoE")):
        with pytest.raises(InputError, match="parallel.moe_dispatcher") as e:
            plan(load_model(mid), cluster, job, top_k=1, options=SearchOptions(fixed={"moe_dispatcher": "deepep"}, engine=engine))
        assert why in str(e.value)


@pytest.mark.parametrize("engine,model_id,ep,why", [
    ("torchtitan", "qwen3-30b-a3b", 8, "alltoall on torchtitan"),
    ("megatron-core", "llama3.1-8b", 1, "without MoE layers"),
])
def test_the_flex_dispatcher_is_refused_where_it_does_not_run(engine, model_id, ep, why):
    model = load_model(model_id)
    cluster = make_cluster("h100-sxm5-80gb", 8)
    with pytest.raises(InputError, match="moe_dispatcher") as e:
        estimate(model, cluster, Job(4096, 64, "bf16"), ParallelConfig(dp=8, ep=ep, moe_dispatcher="deepep"), engine)
    assert why in str(e.value)


def test_a_bad_dispatcher_name_is_a_field_error():
    with pytest.raises(InputError, match="parallel.moe_dispatcher"):
        ParallelConfig(moe_dispatcher="nccl")
