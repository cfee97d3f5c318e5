"""Every plan the search returns obeys every rule the engines enforce; results are
deterministic and sorted.

Rules checked independently of the package's own ``check_parallel`` (which is also called):
degrees multiply to the GPU count; heads % tp; KV heads divisible by tp or tp by KV heads;
tp inside the NVLink domain unless allowed across nodes; global batch % (mb * dp); seq %
2 cp; interleaving needs m % pp and every stage's layers % vpp; ZeRO >= 2 only without a
pipeline; experts % ep and (dp * cp) % ep; memory within capacity; layers per stage positive
and summing to the layer count; fixed fields kept.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.engines import get_engine, least_layers
from planner.io.loaders import load_gpu, load_model, make_cluster
from planner.search.plan import plan
from planner.search.space import SearchOptions
from planner.specs import Job, ModelSpec

GIB = 2**30


def _tiny_gpu(gib_free: float):
    return dataclasses.replace(load_gpu("a100-sxm4-80gb"), memory_bytes=C.FRAMEWORK_BUFFER_BYTES + gib_free * GIB)


SCENARIOS = {
    "llama8b-16xh100-gqa": (lambda: load_model("llama3.1-8b"), lambda: make_cluster("h100-sxm5-80gb", 16), Job(8192, 64, "bf16"), SearchOptions()),
    "gpt18b-64xa100-fp16": (lambda: load_model("gpt-18.4b"), lambda: make_cluster("a100-sxm4-80gb", 64), Job(2048, 256, "fp16"), SearchOptions()),
    "mixtral-32xh100-moe": (lambda: load_model("mixtral-8x7b"), lambda: make_cluster("h100-sxm5-80gb", 32), Job(4096, 64, "bf16"), SearchOptions(max_micro_batch=2)),
    "small-gpt-tight-memory": (
        lambda: ModelSpec(name="g", layers=12, hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096, vocab=51200),
        lambda: make_cluster(_tiny_gpu(0.6), 16, 4), Job(2048, 32, "bf16"), SearchOptions()),
    "4-per-node-tp-across": (
        lambda: ModelSpec(name="g", layers=8, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=32000),
        lambda: make_cluster("a100-sxm4-80gb", 16, 4), Job(1024, 32, "fp16"), SearchOptions(allow_tp_across_nodes=True)),
    "fixed-fields": (lambda: load_model("llama2-7b"), lambda: make_cluster("a100-sxm4-80gb", 32), Job(4096, 64, "bf16"),
                     SearchOptions(fixed={"tp": 4, "recompute": "full"})),
}


_CACHE: dict = {}


def _run(name: str):
    if name not in _CACHE:
        mk_model, mk_cluster, job, opts = SCENARIOS[name]
        model, cluster = mk_model(), mk_cluster()
        _CACHE[name] = (model, cluster, job, opts, plan(model, cluster, job, top_k=10, options=opts))
    return _CACHE[name]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_plan_satisfies_every_constraint(name):
    model, cluster, job, opts, result = _run(name)
    assert 1 <= len(result.plans) <= 10
    for p in result.plans:
        par, est = p.parallel, p.estimate
        n = cluster.num_gpus
        assert par.tp * par.pp * par.dp * par.cp == n
        assert model.heads % par.tp == 0
        assert model.kv_heads % par.tp == 0 or par.tp % model.kv_heads == 0
        if not opts.allow_tp_across_nodes:
            assert par.tp <= cluster.nvlink_domain
        assert job.global_batch_size % (par.micro_batch_size * par.dp) == 0
        m = job.global_batch_size // (par.micro_batch_size * par.dp)
        assert est.num_microbatches == m
        assert par.cp == 1 or job.seq_len % (2 * par.cp) == 0
        lps = est.layers_per_stage
        assert len(lps) == par.pp and sum(lps) == model.layers and all(x >= 1 for x in lps)
        if par.layers_per_stage is not None:
            assert tuple(par.layers_per_stage) == tuple(lps)
        eng = get_engine(opts.engine)
        if par.vpp > 1:
            assert par.pp > 1 and m % par.pp == 0
            assert all(x >= least_layers(i, par.pp, par.vpp, eng) for i, x in enumerate(lps))
            assert eng.uneven_interleaving or all(x % par.vpp == 0 for x in lps)
            assert par.schedule == "interleaved"
        if par.pp > 1:
            assert eng.mode(par.zero).with_pp
        if par.ep > 1:
            assert model.moe is not None and model.moe.experts % par.ep == 0 and (par.tp * par.dp * par.cp) % (par.ep * par.etp) == 0
            assert par.etp == (par.tp if (par.dp * par.cp) % par.ep == 0 else 1)
        assert par.micro_batch_size <= opts.max_micro_batch and par.vpp <= opts.max_vpp and par.cp <= opts.max_cp
        assert par.zero in opts.zero_stages and par.recompute in opts.recompute
        assert est.fits and est.memory_peak_bytes <= cluster.gpu.memory_bytes
        assert est.memory_peak_bytes == max(st.total_bytes for st in est.stages)
        for k, v in opts.fixed.items():
            assert getattr(par, k) == v
        again = estimate(model, cluster, job, par, opts.engine)  # the package's own rule check agrees (validate=True)
        assert again.step_time_s == est.step_time_s  # the reported estimate is the plan's own


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sorted_ranked_unique(name):
    _, _, _, _, result = _run(name)
    times = [p.estimate.step_time_s for p in result.plans]
    assert times == sorted(times)
    assert [p.rank for p in result.plans] == list(range(1, len(result.plans) + 1))
    keys = [tuple(sorted(p.as_dict()["parallel"].items(), key=lambda kv: kv[0])) for p in result.plans]
    assert len({repr(k) for k in keys}) == len(keys)
    assert all(math.isfinite(t) and t > 0 for t in times)
    assert result.evaluated <= result.candidates


@pytest.mark.parametrize("name", ["small-gpt-tight-memory", "4-per-node-tp-across", "llama8b-16xh100-gqa"])
def test_deterministic(name):
    model, cluster, job, opts, first = _run(name)
    second = plan(model, cluster, job, top_k=10, options=opts)
    assert [p.as_dict() for p in first.plans] == [p.as_dict() for p in second.plans]
    assert (first.candidates, first.evaluated) == (second.candidates, second.evaluated)


def test_tp_stays_in_domain_by_default():
    model = ModelSpec(name="g", layers=8, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=32000)
    cluster = make_cluster("a100-sxm4-80gb", 16, 4)
    job = Job(1024, 32, "fp16")
    result = plan(model, cluster, job, top_k=10)
    assert all(p.parallel.tp <= 4 for p in result.plans)


@pytest.mark.parametrize("engine,expect", [
    # Megatron-core overlaps the reduction with the backward (--overlap-grad-reduce) and the
    # distributed optimizer's once-per-step weight gather with the next forward
    # (--overlap-param-gather); Megatron-FSDP's ZeRO-2 also gathers once per step.
    ("megatron-core", {(0, False, True), (1, True, True), (2, True, True), (3, False, True)}),
    # 2021 Megatron-LM: DDP only, reduced after the last backward.
    ("megatron-legacy", {(0, False, False)}),
    # DeepSpeed overlaps the bucketed ZeRO reduction (overlap_comm) but gathers right after
    # step(); without ZeRO it all-reduces after the backward (engine.py allreduce_gradients).
    ("deepspeed", {(0, False, False), (1, False, True), (2, False, True), (3, False, True)}),
    # torchtitan: DDP, and FSDP2's per-layer gathers (no once-per-step gather to overlap);
    # under pipelining FSDP2 gathers each stage once per step, which the first forward hides.
    ("torchtitan", {(0, False, True), (2, False, True), (3, False, True), (2, True, True), (3, True, True)}),
])
def test_data_parallel_overlaps_follow_the_engine(engine, expect):
    from planner.search.space import candidates  # noqa: PLC0415

    model = ModelSpec(name="g", layers=8, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=32000,
                      mlp="gelu", tied_embeddings=True, bias=True, norm="layernorm")
    job = Job(seq_len=1024, global_batch_size=16, precision="bf16")
    seen = {(p.zero, p.overlap_param_gather, p.overlap_grad_reduce)
            for p in candidates(model, make_cluster("a100-sxm4-80gb", 8), job, SearchOptions(engine=engine))}
    assert seen == expect


def test_megatron_core_runs_context_parallelism_only_on_flash_attention():
    """TE disables its unfused attention under context parallelism and Megatron's local attention
    asserts cp == 1: on V100 (no flash kernel) or with attention fixed unfused, megatron-core
    plans keep cp = 1 and a fixed cp > 1 is refused naming the rule; torchtitan is not bound by it."""
    from planner.errors import InputError  # noqa: PLC0415

    model = load_model("llama3.1-8b")
    v100 = make_cluster("v100-sxm2-32gb", 16)
    job = Job(seq_len=32768, global_batch_size=16, precision="fp16")
    res = plan(model, v100, job, top_k=20, options=SearchOptions(engine="megatron-core"))
    assert res.plans and {p.parallel.cp for p in res.plans} == {1}
    for fixed, cluster in (({"cp": 2}, v100), ({"cp": 2, "attention": "unfused"}, make_cluster("a100-sxm4-80gb", 16))):
        with pytest.raises(InputError, match="parallel.cp.*unfused attention"):
            plan(model, cluster, job, top_k=1, options=SearchOptions(engine="megatron-core", fixed=fixed))
    a100 = make_cluster("a100-sxm4-80gb", 16)
    assert plan(model, a100, job, top_k=1, options=SearchOptions(engine="megatron-core", fixed={"cp": 2})).plans[0].parallel.cp == 2
    with pytest.raises(InputError, match="parallel.cp.*unfused attention"):
        from planner.specs import ParallelConfig  # noqa: PLC0415

        estimate(model, v100, job, ParallelConfig(tp=8, cp=2), engine="megatron-core")


def test_torchtitan_refuses_fp16_in_estimate_and_plan_as_its_launch_files_do():
    """torchtitan's mixed_precision_param is bfloat16 or float32 (no loss scaling): fp16 is refused
    by estimate and plan on torchtitan, and the automatic engine choice leaves torchtitan out."""
    from planner.errors import InputError  # noqa: PLC0415
    from planner.specs import ParallelConfig  # noqa: PLC0415

    model, cluster = load_model("llama3.1-8b"), make_cluster("v100-sxm2-32gb", 16)
    job = Job(seq_len=4096, global_batch_size=32, precision="fp16")
    with pytest.raises(InputError, match="job.precision.*bf16 or fp8 on torchtitan"):
        estimate(model, cluster, job, ParallelConfig(tp=2), engine="torchtitan")
    with pytest.raises(InputError, match="job.precision.*bf16 or fp8 on torchtitan"):
        plan(model, cluster, job, top_k=1, options=SearchOptions(engine="torchtitan"))
    res = plan(model, cluster, job, top_k=10, options=SearchOptions(engine="auto"))
    assert res.plans and all(p.estimate.engine != "torchtitan" for p in res.plans)
    assert get_engine("torchtitan").precisions == ("bf16", "fp8") and "fp16" in get_engine("megatron-core").precisions


def test_each_engine_runs_the_attention_kernels_its_flags_select():
    """FlashAttention-2's kernels (attention="fa2") run where a flag selects them: Megatron-DeepSpeed
    (--use-flash-attn-v2, the flash-attn 2.x package) but not its default-less flash; the 2021
    Megatron-LM only unfused; the engines with flash attention every kind. The search never picks
    fa2 (it is never faster); fixed, the plan keeps it."""
    from planner.errors import InputError  # noqa: PLC0415
    from planner.specs import ParallelConfig  # noqa: PLC0415

    model, cluster, job = load_model("gpt3-1.3b"), make_cluster("h100-sxm5-80gb", 8), Job(2048, 64)
    assert get_engine("megatron-deepspeed").attention_kernels == ("unfused", "fa2", "fa1")
    assert get_engine("megatron-legacy").attention_kernels == ("unfused",)
    assert get_engine("megatron-core").attention_kernels == ("flash", "fa2", "unfused")
    assert estimate(model, cluster, job, ParallelConfig(tp=1, attention="fa2"), engine="megatron-deepspeed").parallel.attention == "fa2"
    # flash-attn 1.x (Megatron-DeepSpeed --use-flash-attn-v1) runs at FA1_TO_FA2_RATIO of FA2: slower, never faster
    t = {k: estimate(model, cluster, job, ParallelConfig(tp=1, attention=k), engine="megatron-deepspeed").step_time_s
         for k in ("fa2", "fa1")}
    assert t["fa1"] > t["fa2"]
    for engine, kind in (("megatron-deepspeed", "flash"), ("megatron-legacy", "fa2"), ("megatron-core", "fa1"), ("torchtitan", "fa1")):
        with pytest.raises(InputError, match=f"parallel.attention: got '{kind}'.* on {engine}"):
            estimate(model, cluster, job, ParallelConfig(tp=1, attention=kind), engine=engine)
        with pytest.raises(InputError, match=f"parallel.attention: got '{kind}'.* on {engine}"):  # the search refuses it alike
            plan(model, cluster, job, top_k=1, options=SearchOptions(engine=engine, fixed={"attention": kind}))
    free = plan(model, cluster, job, top_k=10, options=SearchOptions(engine="megatron-core"))
    assert {p.parallel.attention for p in free.plans} == {"flash"}
    fixed = plan(model, cluster, job, top_k=3, options=SearchOptions(engine="megatron-core", fixed={"attention": "fa2"}))
    assert {p.parallel.attention for p in fixed.plans} == {"fa2"}
    assert fixed.plans[0].estimate.step_time_s > free.plans[0].estimate.step_time_s


def test_attention_kernels_the_gpu_lacks_are_refused_by_estimate_and_plan_alike():
    """FlashAttention 1 builds for sm75-sm90 only (no Blackwell, no AMD); no flash kernel at all
    before Ampere. A fixed kernel the GPU cannot run is one InputError naming the GPU, from the
    estimate and the search alike (the search used to price it as if it ran)."""
    from planner.errors import InputError  # noqa: PLC0415
    from planner.specs import ParallelConfig  # noqa: PLC0415

    model, job = load_model("gpt3-1.3b"), Job(2048, 64)
    refused = [("mi300x", "fa1", "bf16", "FlashAttention 1 builds for Turing to Hopper only"),
               ("b200-sxm-180gb", "fa1", "bf16", "FlashAttention 1 builds for Turing to Hopper only"),
               ("v100-sxm2-32gb", "fa2", "fp16", "unfused on v100-sxm2-32gb"),
               ("v100-sxm2-32gb", "fa1", "fp16", "unfused on v100-sxm2-32gb")]
    for gpu, kind, prec, why in refused:
        cluster, j = make_cluster(gpu, 8), Job(2048, 64, prec)
        with pytest.raises(InputError, match=f"parallel.attention: got '{kind}', expected .*{why}"):
            estimate(model, cluster, j, ParallelConfig(tp=1, attention=kind), engine="megatron-deepspeed")
        with pytest.raises(InputError, match=f"parallel.attention: got '{kind}', expected .*{why}"):
            plan(model, cluster, j, top_k=1, options=SearchOptions(engine="megatron-deepspeed", fixed={"attention": kind}))
    for gpu in ("a100-sxm4-80gb", "h100-sxm5-80gb"):  # sm80, sm90: FlashAttention 1 runs
        got = plan(model, make_cluster(gpu, 8), job, top_k=1, options=SearchOptions(engine="megatron-deepspeed", fixed={"attention": "fa1"}))
        assert got.plans[0].parallel.attention == "fa1"
    got = plan(model, make_cluster("mi300x", 8), job, top_k=1, options=SearchOptions(engine="megatron-deepspeed", fixed={"attention": "fa2"}))
    assert got.plans[0].parallel.attention == "fa2"  # ROCm's flash-attention is FlashAttention-2


def test_tp_communication_overlap_stays_inside_one_nvlink_domain():
    """Transformer Engine's userbuffers (and torch symmetric memory for torchtitan's async TP)
    exchange through NVLink peer memory: a tensor-parallel group wider than the NVLink domain
    resolves without the overlap (its collectives priced exposed over the network), with a note;
    inside the domain the engine's default stays on; set explicitly across domains, it is refused."""
    from planner.specs import ParallelConfig  # noqa: PLC0415

    model, job = load_model("llama3.1-70b"), Job(8192, 64)
    cluster = make_cluster("h100-sxm5-80gb", 64)
    inside = estimate(model, cluster, job, ParallelConfig(tp=8, pp=1, micro_batch_size=1))
    across = estimate(model, cluster, job, ParallelConfig(tp=16, pp=1, micro_batch_size=1))
    assert inside.parallel.tp_comm_overlap is True and across.parallel.tp_comm_overlap is False
    assert any("spans 2 NVLink domains" in n and "overlap" in n for n in across.notes)
    assert not any("NVLink domains" in n for n in inside.notes)
    from planner.errors import InputError  # noqa: PLC0415

    with pytest.raises(InputError, match="parallel.tp_comm_overlap: got True, expected false: tensor parallelism 16 is wider than the NVLink domain"):
        estimate(model, cluster, job, ParallelConfig(tp=16, pp=1, micro_batch_size=1, tp_comm_overlap=True))
    gb200 = make_cluster("gb200", 64)  # a 72-GPU NVLink domain: tp 16 is inside it
    assert estimate(model, gb200, job, ParallelConfig(tp=16, pp=1, micro_batch_size=1)).parallel.tp_comm_overlap is True
