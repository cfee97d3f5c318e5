"""When nothing fits: the nearest miss is priced as `planner estimate` prices it, and every hint
is a change that fits when estimated."""

from __future__ import annotations

import re

import pytest

from planner.cost.estimate import estimate
from planner.errors import NoFeasiblePlan
from planner.io.loaders import load_model, make_cluster
from planner.search.plan import plan
from planner.search.space import SearchOptions
from planner.specs import Job

GIB = 2**30


def _no_fit(model, gpus, job, **fixed):
    m, c = load_model(model), make_cluster("h100-sxm5-80gb", gpus)
    with pytest.raises(NoFeasiblePlan) as exc:
        plan(m, c, job, top_k=1, options=SearchOptions(fixed=fixed))
    return m, c, exc.value


def test_message_agrees_with_estimate_on_the_nearest_miss():
    m, c, exc = _no_fit("llama3.1-405b", 8, Job(8192, 64))
    need = float(re.search(r"needs ([0-9.]+) GiB", str(exc)).group(1))
    e = estimate(m, c, Job(8192, 64), exc.nearest)
    assert need == pytest.approx(e.memory_peak_bytes / GIB, abs=0.06)
    assert not e.fits


def test_no_hint_that_does_not_fit():
    # 405B on 8 GPUs without a pipeline: ZeRO-3 still needs ~800 GiB a GPU, so it is no hint.
    m, c, exc = _no_fit("llama3.1-405b", 8, Job(8192, 64), pp=1)
    assert not any("ZeRO" in h for h in exc.hints), exc.hints
    for h in exc.hints:
        gib = re.search(r": ([0-9.]+) GiB$", h)
        if gib:
            assert float(gib.group(1)) <= 79.6 * 0.95
    assert exc.hints[-1].startswith("GPUs with")


def test_a_hint_that_fits_is_offered():
    # 70B on 8 GPUs at 8K: recompute or ZeRO is not enough; a larger cluster is, and is named.
    m, c, exc = _no_fit("llama3.1-70b", 8, Job(8192, 64))
    assert any("more GPUs" in h for h in exc.hints) or any("recompute" in h for h in exc.hints), exc.hints


def test_moe_nearest_miss_and_hints_name_the_expert_degree():
    """A mixture-of-experts model's nearest miss and its more-GPUs hint name ep beside tp/pp/dp/cp
    (the degree that places its experts); a dense model's do not."""
    m, c, exc = _no_fit("mixtral-8x22b", 8, Job(4096, 64))
    assert re.search(r"nearest miss: tp=\d+ pp=\d+ dp=\d+ cp=\d+ ep=\d+ ", str(exc)), str(exc)
    more = [h for h in exc.hints if "more GPUs" in h]
    assert more and all(" ep=" in h for h in more), exc.hints
    _, _, dense = _no_fit("llama3.1-405b", 8, Job(8192, 64))
    assert " ep=" not in str(dense)


def test_the_more_gpus_hint_is_the_larger_clusters_best_plan():
    """The more-GPUs hint is the planner's own search on the larger cluster, bounded by a count of
    evaluations (not wall time, so the example is the same on any machine): where that search
    needs fewer, the example is its best plan."""
    import planner.search.plan as plan_mod

    job = Job(8192, 64)
    m, c, exc = _no_fit("llama3.1-405b", 16, job)
    hint = next(h for h in exc.hints if "more GPUs" in h)
    k = int(re.match(r"(\d+)x more GPUs", hint).group(1))
    best = plan(m, make_cluster("h100-sxm5-80gb", 16 * k), job, top_k=1)
    assert best.evaluated < plan_mod.HINT_EVALUATIONS
    p = best.plans[0].parallel
    assert f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} recompute={p.recompute} zero={p.zero}" in hint, (hint, p)
