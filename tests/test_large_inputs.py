"""Large inputs stay fast and bounded: 1,000,000 GPUs or 10,000 layers either plan or fail with
a clear message within a few seconds (the search's time limit bounds the wall clock; the
candidate cap and the plausibility caps bound memory)."""

from __future__ import annotations

import contextlib
import io
import time
import tracemalloc

import pulp  # noqa: F401  (imported here so the solver's import is not timed below)
import pytest

import planner
import planner.search.plan as P
from planner.cli.app import main
from planner.errors import InputError, SolverFailure
from planner.io.loaders import make_cluster
from planner.specs import Job, ModelSpec

LIMIT_S = 3.0
SLACK_S = 12.0  # one uninterruptible step (an estimate, a layer-split program) on a loaded CI machine

DEEP = ModelSpec(name="deep", layers=10_000, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=32000)


def _plan_bounded(model, cluster, job):
    t0 = time.perf_counter()
    try:
        result = planner.plan(model, cluster, job, top_k=3, time_limit_s=LIMIT_S)
    except SolverFailure as exc:
        assert "time limit of 3 s" in str(exc)
        result = exc.best
        assert result is not None and "not proven best" in result.notes[0]
    elapsed = time.perf_counter() - t0
    assert elapsed < LIMIT_S + SLACK_S, elapsed
    for p in result.plans:
        assert sum(p.estimate.layers_per_stage) == model.layers
        assert p.parallel.world == cluster.num_gpus
        assert p.estimate.memory_peak_bytes <= cluster.gpu.memory_bytes
    return result


def test_million_gpus_small_batch_is_a_clear_input_error_fast():
    t0 = time.perf_counter()
    with pytest.raises(InputError) as info:
        planner.plan(planner.load_model("llama3.1-70b"), make_cluster("h100-sxm5-80gb", 1_000_000), Job(8192, 256))
    assert time.perf_counter() - t0 < 5
    assert info.value.field == "job.global_batch_size"
    assert "smallest dp on 1000000 GPUs" in info.value.expected


def test_million_gpus_plan_or_time_limit():
    _plan_bounded(planner.load_model("llama3.1-70b"), make_cluster("h100-sxm5-80gb", 1_048_576), Job(8192, 4_194_304))


def test_ten_thousand_layers_plan_or_time_limit_bounded_memory():
    tracemalloc.start()
    try:
        _plan_bounded(DEEP, make_cluster("h100-sxm5-80gb", 64), Job(2048, 256))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 2**20, peak


def test_ten_thousand_layers_estimate_is_fast():
    cluster = make_cluster("h100-sxm5-80gb", 64)
    t0 = time.perf_counter()
    est = planner.estimate(DEEP, cluster, Job(2048, 256), planner.ParallelConfig(tp=8, pp=8, dp=1, micro_batch_size=1, recompute="full"))
    assert time.perf_counter() - t0 < 5
    assert sum(est.layers_per_stage) == 10_000 and est.step_time_s > 0


def test_cli_million_gpus_exits_0_or_3_quickly():
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--gpus", "1000000", "-b", "4000000", "--time-limit", str(LIMIT_S), "--top", "1", "--json"])
    assert time.perf_counter() - t0 < LIMIT_S + SLACK_S + 5
    assert code in (0, 3), err.getvalue()
    if code == 3:
        assert err.getvalue().startswith("solver: time limit of 3 s")


def test_candidate_cap_is_a_clear_input_error(monkeypatch):
    monkeypatch.setattr(P, "MAX_CANDIDATES", 2_000)
    with pytest.raises(InputError) as info:
        planner.plan(planner.load_model("llama3.1-70b"), make_cluster("h100-sxm5-80gb", 1_048_576), Job(8192, 4_194_304))
    assert info.value.field == "parallel" and "candidate configurations" in str(info.value.value)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: make_cluster("h100-sxm5-80gb", 20_000_000), "hardware.num_gpus"),
        (lambda: ModelSpec(name="x", layers=200_000, hidden=64, heads=1, kv_heads=1, ffn_hidden=64, vocab=10), "model"),
        (lambda: Job(2048, 2**25), "job.global_batch_size"),
        (lambda: Job(2**25, 8), "job.seq_len"),
    ],
)
def test_absurd_sizes_rejected(make, field):
    with pytest.raises(InputError) as info:
        make()
    assert info.value.field == field
