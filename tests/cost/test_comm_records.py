"""The estimate's per-link records: what is exposed of a link's traffic is part of its total, on
every engine and recompute policy (torchtitan's per-op selective policy re-runs the sequence-
parallel all-gathers in the backward: they count in the total as in the exposed time)."""

from __future__ import annotations

import itertools

import pytest

from planner import Job, ParallelConfig, estimate, load_model, make_cluster
from planner.errors import InputError


@pytest.mark.parametrize("model,engine", [("llama3.1-8b", "torchtitan"), ("llama3.1-8b", "megatron-core"),
                                          ("mixtral-8x7b", "megatron-core"), ("gpt3-1.3b", "deepspeed")])
def test_exposed_never_exceeds_the_links_time(model, engine):
    m, c = load_model(model), make_cluster("h100-sxm5-80gb", 32)
    seen = 0
    for tp, pp, rc, sp, tpo in itertools.product((1, 2, 8), (1, 2), ("none", "selective", "full"), (True, False), (True, False)):
        par = ParallelConfig(tp=tp, pp=pp, dp=32 // (tp * pp), micro_batch_size=1, recompute=rc, sequence_parallel=sp,
                             tp_comm_overlap=tpo, zero=3 if engine == "torchtitan" else 1)
        try:
            e = estimate(m, c, Job(4096, 128), par, engine)
        except InputError:
            continue
        seen += 1
        for x in e.comm:
            assert x["exposed_s"] <= x["time_s"] * (1 + 1e-9) + 1e-12, (par, x)
    assert seen >= 6
