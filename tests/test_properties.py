"""Properties that hold for every model, cluster and job (hypothesis; small and fast).

* Only InputError / NoFeasiblePlan escape planner.plan and planner.estimate; the CLI exits
  with 0, 1, 2 or 3 only.
* Every returned plan satisfies every engine rule and fits in memory; times and memory are
  finite and positive.
* Monotonicity: more NIC bandwidth or more GPU memory never makes the best plan slower.
* Round trip: a plan fed back to planner.estimate gives the same prediction.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import planner
from planner.cli.app import main
from planner.errors import InputError, NoFeasiblePlan
from planner.io.loaders import make_cluster
from planner.specs import Job, ModelSpec, MoESpec, ParallelConfig

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
PAIRS = settings(SETTINGS, max_examples=30)  # two searches per example
GPUS = ("a100-sxm4-80gb", "h100-sxm5-80gb", "a100-sxm4-40gb", "v100-sxm2-32gb")


@st.composite
def models(draw, moe: bool = True) -> ModelSpec:
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16]))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if heads % d == 0]))
    mlp = draw(st.sampled_from(["gelu", "swiglu", "relu2"]))
    layers = draw(st.integers(1, 12))
    spec = None
    if moe and draw(st.booleans()) and draw(st.booleans()):
        experts = draw(st.sampled_from([2, 4, 8]))
        spec = MoESpec(experts=experts, top_k=draw(st.integers(1, experts)), expert_ffn_hidden=draw(st.sampled_from([64, 256, 1024])),
                       dense_layers=draw(st.integers(0, layers)))
    return ModelSpec(
        name="random", layers=layers, hidden=heads * head_dim, heads=heads, kv_heads=kv,
        ffn_hidden=draw(st.sampled_from([2, 4])) * heads * head_dim, vocab=draw(st.integers(100, 60000)), mlp=mlp,
        tied_embeddings=draw(st.booleans()), moe=spec, bias=mlp == "gelu", norm="layernorm" if mlp == "gelu" else "rmsnorm",
    )


@st.composite
def clusters(draw):
    gpu = draw(st.sampled_from(GPUS))
    n = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    inter = {"kind": draw(st.sampled_from(["infiniband", "roce", "ethernet"])),
             "gbps_per_nic": draw(st.sampled_from([25, 100, 200, 400])), "nics_per_node": draw(st.sampled_from([1, 2, 4, 8]))}
    return make_cluster(gpu, n, 8, inter)


@st.composite
def jobs(draw) -> Job:
    return Job(seq_len=draw(st.sampled_from([128, 256, 1000, 1024, 2048, 4096])),
               global_batch_size=draw(st.sampled_from([1, 2, 3, 8, 16, 32, 48, 64, 128, 256])),
               precision=draw(st.sampled_from(["bf16", "fp16", "fp8"])))


# A narrower search for the properties that compare two searches (keeps the suite fast; the
# properties must hold for any fixed search space).
NARROW = planner.SearchOptions(max_micro_batch=2, zero_stages=(0, 1), recompute=("none", "full"), max_vpp=2)


def _plan(model, cluster, job, top_k=3, options=None):
    """plan() with only the allowed exceptions; None when nothing fits or input is invalid."""
    try:
        return planner.plan(model, cluster, job, top_k=top_k, options=options)
    except (InputError, NoFeasiblePlan):
        return None


def _check_plan(model, cluster, job, p) -> None:
    par, est = p.parallel, p.estimate
    assert par.tp * par.pp * par.dp * par.cp == cluster.num_gpus
    assert model.heads % par.tp == 0
    assert job.global_batch_size % (par.micro_batch_size * par.dp) == 0
    if par.cp > 1:
        assert job.seq_len % (2 * par.cp) == 0
    m = est.num_microbatches
    assert m == job.global_batch_size // (par.micro_batch_size * par.dp)
    if par.vpp > 1:
        assert m % par.pp == 0
        assert min(est.layers_per_stage) >= par.vpp
    assert len(est.layers_per_stage) == par.pp
    assert sum(est.layers_per_stage) == model.layers
    if par.ep > 1:
        assert model.moe is not None and model.moe.experts % par.ep == 0 and (par.tp * par.dp * par.cp) % (par.ep * par.etp) == 0
    assert est.memory_peak_bytes <= cluster.gpu.memory_bytes
    for value in (est.step_time_s, est.tokens_per_s, est.memory_peak_bytes, est.mfu, est.tflops_per_gpu):
        assert math.isfinite(value) and value > 0
    for t in est.stage_times_s:
        assert math.isfinite(t) and t > 0
    for k, v in est.time_breakdown_s.items():
        assert math.isfinite(v) and v >= 0, k
    for s in est.stages:
        assert math.isfinite(s.total_bytes) and s.total_bytes > 0


@SETTINGS
@given(models(), clusters(), jobs())
def test_plans_satisfy_every_rule_and_round_trip(model, cluster, job):
    result = _plan(model, cluster, job)
    if result is None:
        return
    assert 1 <= len(result.plans) <= 3
    times = [p.estimate.step_time_s for p in result.plans]
    assert times == sorted(times)
    for p in result.plans:
        _check_plan(model, cluster, job, p)
        # Round trip: the plan's configuration, with its layer split, fed back to estimate.
        par = replace(p.parallel, layers_per_stage=tuple(p.estimate.layers_per_stage))
        again = planner.estimate(model, cluster, job, par, result.engine)
        assert again.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-12)
        assert again.memory_peak_bytes == pytest.approx(p.estimate.memory_peak_bytes, rel=1e-12)
        assert again.layers_per_stage == p.estimate.layers_per_stage


@st.composite
def parallels(draw) -> ParallelConfig:
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 1, 2]))
    lps = None
    if draw(st.booleans()):
        lps = tuple(draw(st.lists(st.integers(0, 6), min_size=pp, max_size=pp)))
    return ParallelConfig(
        tp=draw(st.sampled_from([1, 2, 4, 8])), pp=pp, dp=draw(st.sampled_from([1, 2, 4, 8])), cp=draw(st.sampled_from([1, 2])),
        ep=draw(st.sampled_from([1, 1, 2])), vpp=vpp, micro_batch_size=draw(st.sampled_from([1, 2, 4])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])), sequence_parallel=draw(st.booleans()),
        zero=draw(st.sampled_from([0, 1, 2, 3])), layers_per_stage=lps,
    )


@SETTINGS
@given(models(), clusters(), jobs(), parallels(), st.sampled_from(["megatron-core", "torchtitan", "deepspeed"]))
def test_estimate_raises_only_input_error_and_is_finite(model, cluster, job, par, engine):
    try:
        est = planner.estimate(model, cluster, job, par, engine)
    except InputError:
        return
    for x in est.comm:  # what is exposed of a link's traffic is part of it
        assert x["exposed_s"] <= x["time_s"] * (1 + 1e-9) + 1e-12, x
    for value in (est.step_time_s, est.tokens_per_s, est.memory_peak_bytes, est.mfu, est.hfu):
        assert math.isfinite(value) and value > 0
    assert all(math.isfinite(t) and t > 0 for t in est.stage_times_s)
    assert sum(est.layers_per_stage) == model.layers


def _faster_network(cluster, factor: float):
    return replace(cluster, inter=replace(cluster.inter, gbps_per_nic=cluster.inter.gbps_per_nic * factor))


@PAIRS
@given(models(moe=False), clusters(), jobs(), st.sampled_from([1.5, 2.0, 4.0, 16.0]))
def test_more_nic_bandwidth_never_slower(model, cluster, job, factor):
    assume(cluster.num_gpus > cluster.gpus_per_node)  # the NIC matters only across nodes
    slow = _plan(model, cluster, job, top_k=1, options=NARROW)
    if slow is None:
        return
    fast = _plan(model, _faster_network(cluster, factor), job, top_k=1, options=NARROW)
    assert fast is not None
    assert fast.plans[0].estimate.step_time_s <= slow.plans[0].estimate.step_time_s * (1 + 1e-9)
    # The same configuration is never slower either (per-configuration physics).
    par = replace(slow.plans[0].parallel, layers_per_stage=tuple(slow.plans[0].estimate.layers_per_stage))
    same = planner.estimate(model, _faster_network(cluster, factor), job, par, slow.engine)
    assert same.step_time_s <= slow.plans[0].estimate.step_time_s * (1 + 1e-9)


@PAIRS
@given(models(moe=False), clusters(), jobs(), st.sampled_from([1.25, 2.0, 8.0]))
def test_more_gpu_memory_never_slower(model, cluster, job, factor):
    small = _plan(model, cluster, job, top_k=1, options=NARROW)
    big_cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=cluster.gpu.memory_bytes * factor))
    big = _plan(model, big_cluster, job, top_k=1, options=NARROW)
    if small is None:
        return
    assert big is not None
    assert big.plans[0].estimate.step_time_s <= small.plans[0].estimate.step_time_s * (1 + 1e-9)


# --- the CLI: exit codes only 0/1/2/3 ------------------------------------------------------------

_FLAGS = {
    "--model": st.sampled_from(["gpt3-125m", "gpt3-350m", "llama3.1-8b", "mixtral-8x7b", "nope", ""]),
    "--gpu": st.sampled_from(["a100-sxm4-80gb", "h100-sxm5-80gb", "v100-sxm2-32gb", "x"]),
    "--gpus": st.sampled_from(["1", "2", "8", "16", "12", "0", "-1", "abc", "1000000"]),
    "--gpus-per-node": st.sampled_from(["1", "4", "8", "0", "3"]),
    "--nic-gbps": st.sampled_from(["100", "400", "0", "nan", "-1", "inf", "1e30"]),
    "--seq-len": st.sampled_from(["128", "1024", "2048", "0", "7", "99999999999"]),
    "-b": st.sampled_from(["1", "8", "16", "64", "0", "3"]),
    "--precision": st.sampled_from(["bf16", "fp16", "fp8", "fp4"]),
    "--tp": st.sampled_from(["1", "2", "3", "8", "0"]),
    "--pp": st.sampled_from(["1", "2", "5", "1000"]),
    "--dp": st.sampled_from(["1", "2", "8"]),
    "--cp": st.sampled_from(["1", "2", "3"]),
    "--vpp": st.sampled_from(["1", "2"]),
    "--mb": st.sampled_from(["1", "2", "3"]),
    "--zero": st.sampled_from(["0", "1", "3", "7"]),
    "--recompute": st.sampled_from(["none", "full", "all"]),
    "--top": st.sampled_from(["1", "3", "0"]),
    "--time-limit": st.sampled_from(["10", "0", "x"]),
}


@st.composite
def cli_args(draw):
    argv = [draw(st.sampled_from(["plan", "estimate"]))]
    argv += ["--model", draw(st.sampled_from(["gpt3-125m", "gpt3-350m"]))] if draw(st.booleans()) else []
    argv += ["--gpus", "8"]
    for flag in draw(st.lists(st.sampled_from(sorted(_FLAGS)), max_size=4, unique=True)):
        if flag == "--top" and argv[0] != "plan":
            continue
        argv += [flag, draw(_FLAGS[flag])]
    return argv


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cli_args())
def test_cli_exit_codes(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv + ["--json"])
    text = err.getvalue()
    assert code in (0, 1, 2, 3), (argv, text)
    assert "Traceback" not in text and "internal error" not in text
    if code == 2:
        assert len(text.splitlines()) == 1, text
