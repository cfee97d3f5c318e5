"""Memory per GPU against the closed forms of the papers the model cites.

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  sec. 4.1-4.3: activation bytes per layer and micro-batch for a GPT layer (16-bit
  activations, dropout, unfused attention that stores the s x s softmax):
      no parallelism        s b h (34 + 5 a s / h)
      tensor parallel t     s b h (10 + 24/t + 5 a s / (h t))
      + sequence parallel   s b h (34/t + 5 a s / (h t))
      selective recompute   s b h 34/t          (with sp; 10 + 24/t without)
      full recompute        2 s b h             (/t with sp)
* Rajbhandari et al. 2020 (ZeRO) sec. 3.1: 2 + 2 + 12 = 16 bytes per parameter for fp16 mixed
  precision Adam; Megatron's distributed optimizer with bf16 weights and fp32 main gradients:
  6 + 12/d.
* In-flight micro-batches: 1F1B stage i holds min(p - i, m) (Narayanan 2021 sec. 2.2.1);
  interleaved rank 0 holds p (1 + (p - 1)/(p v)) micro-batches' worth (Korthikanti 2022
  sec. 4.2.3).
* The estimate's memory is the sum of its parts, its peak the max over stages; the allocator's
  reserve and the memory outside the allocator are in it. (tests/cost/test_memory_terms.py:
  the engine-specific terms, schedules and moments.)
"""

from __future__ import annotations

import math

import pytest

from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost import memory as M
from planner.cost.memory import activation_bytes_per_layer, bytes_per_param, inflight_microbatches
from planner.engines import get_engine
from planner.io.loaders import make_cluster
from planner.specs import Job, ModelSpec, ParallelConfig


def gpt(layers: int = 24, hidden: int = 2048, heads: int = 16, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, mlp="gelu", tied_embeddings=True, bias=True, norm="layernorm")


SHAPES = [  # (layers, hidden, heads, seq, micro-batch)
    (24, 2048, 16, 2048, 1),
    (96, 12288, 96, 2048, 1),   # GPT-3 175B, Korthikanti Table 3
    (4, 1024, 8, 512, 4),
    (2, 768, 12, 1024, 2),
]


def act(model, b, s, t, sp, rec):
    return activation_bytes_per_layer(model, b, s, t, 1, sp, rec, flash_attention=False, C=C)


@pytest.mark.parametrize("L,h,a,s,b", SHAPES)
def test_korthikanti_no_parallelism(L, h, a, s, b):
    m = gpt(L, h, a)
    assert act(m, b, s, 1, False, "none") == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("L,h,a,s,b,t", [(*shape, t) for shape in SHAPES for t in (2, 4, 8) if shape[2] % t == 0])
def test_korthikanti_tensor_and_sequence_parallel(L, h, a, s, b, t):
    m = gpt(L, h, a)
    sbh = s * b * h
    assert act(m, b, s, t, False, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert act(m, b, s, t, True, "none") == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert act(m, b, s, t, True, "selective") == pytest.approx(sbh * 34 / t, rel=1e-12)
    assert act(m, b, s, t, False, "selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert act(m, b, s, t, True, "full") == pytest.approx(2 * sbh / t, rel=1e-12)
    assert act(m, b, s, t, False, "full") == pytest.approx(2 * sbh, rel=1e-12)


def test_korthikanti_table2_gpt3_175b_per_layer():
    # Korthikanti 2022 sec. 4: GPT-3 175B, s = 2048, b = 1, t = 8: sp + selective gives 34 s b h / t.
    m = gpt(96, 12288, 96)
    assert act(m, 1, 2048, 8, True, "selective") == 34 * 2048 * 12288 / 8


def test_flash_and_no_dropout_store_less():
    m = gpt(4, 1024, 8)
    unfused = act(m, 2, 1024, 2, True, "none")
    flash = activation_bytes_per_layer(m, 2, 1024, 2, 1, True, "none", flash_attention=True, C=C)
    assert flash < unfused
    nodrop = ModelSpec(**{**m.__dict__, "bias": False})
    assert act(nodrop, 2, 1024, 2, True, "none") < unfused


# --- model states -----------------------------------------------------------------------------

def test_zero_paper_16_bytes_per_param_fp16():
    bpp = bytes_per_param("fp16", 0, 64, "auto", C)
    assert bpp == {"weights": 2.0, "gradients": 2.0, "optimizer": 12.0}
    assert sum(bpp.values()) == 16.0


@pytest.mark.parametrize("d", [1, 2, 8, 64, 1000])
def test_distributed_optimizer_bf16_6_plus_12_over_d(d):
    assert sum(bytes_per_param("bf16", 1, d, "auto", C).values()) == pytest.approx(6 + 12 / d)
    # ZeRO 2 shards the fp32 gradients too; ZeRO 3 the weights (ZeRO paper sec. 5).
    assert sum(bytes_per_param("bf16", 2, d, "auto", C).values()) == pytest.approx(2 + 16 / d)
    assert sum(bytes_per_param("bf16", 3, d, "auto", C).values()) == pytest.approx(18 / d)
    assert sum(bytes_per_param("fp16", 3, d, "auto", C).values()) == pytest.approx(16 / d)


# --- in-flight micro-batches --------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(1, 8), (2, 8), (4, 8), (8, 4), (8, 64), (16, 3)])
def test_inflight_1f1b(p, m):
    for i in range(p):
        expect = 1.0 if p == 1 else float(min(p - i, m))
        assert inflight_microbatches(i, p, 1, m) == expect


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 4), (16, 2)])
def test_inflight_interleaved_first_stage(p, v):
    m = 8 * p  # enough micro-batches that warm-up is not capped
    assert inflight_microbatches(0, p, v, m) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    # Later ranks hold less; the last holds one chunk of each model chunk in flight minus the warm-up.
    vals = [inflight_microbatches(i, p, v, m) for i in range(p)]
    assert vals == sorted(vals, reverse=True)


# --- the estimate's memory ---------------------------------------------------------------------

def _cases():
    a100 = make_cluster("a100-sxm4-80gb", 16)
    m = gpt(24, 2048, 16)
    job16 = Job(seq_len=2048, global_batch_size=64, precision="fp16")
    job_bf = Job(seq_len=2048, global_batch_size=64, precision="bf16")
    return [
        (m, a100, job16, ParallelConfig(tp=2, pp=4, dp=2, micro_batch_size=2), False),
        (m, a100, job16, ParallelConfig(tp=4, pp=2, dp=2, micro_batch_size=1, sequence_parallel=True, recompute="selective", zero=1), False),
        (m, a100, job_bf, ParallelConfig(tp=2, pp=2, dp=4, vpp=3, micro_batch_size=1, recompute="full", zero=1), True),
        (m, a100, job_bf, ParallelConfig(tp=1, pp=1, dp=16, micro_batch_size=4, zero=3), True),
        (m, a100, job_bf, ParallelConfig(tp=2, pp=8, dp=1, micro_batch_size=1, layers_per_stage=(2, 3, 3, 3, 3, 3, 3, 4)), True),
    ]


@pytest.mark.parametrize("case", range(5))
def test_stage_memory_is_sum_of_parts_and_peak_is_max(case):
    model, cluster, job, par, flash = _cases()[case]
    est = estimate(model, cluster, job, par.replace(attention="flash" if flash else "unfused"))
    assert len(est.stages) == par.pp
    f = get_engine("megatron-core").memory.reserve_fraction
    for st in est.stages:
        allocated = st.weights_bytes + st.gradients_bytes + st.optimizer_bytes + st.activations_bytes + st.logits_bytes + st.buffers_bytes
        assert st.allocated_bytes == pytest.approx(allocated, rel=1e-12)
        assert st.reserved_bytes == pytest.approx(allocated + st.reserve_bytes, rel=1e-12)
        assert st.total_bytes == pytest.approx(st.reserved_bytes + st.framework_bytes, rel=1e-12)
        assert st.as_dict()["total_bytes"] == st.total_bytes and st.as_dict()["peak_moment"] == st.moment
        assert sum(dict(st.parts).values()) == pytest.approx(st.total_bytes, rel=1e-12)
        # Memory outside the allocator (CUDA context, NCCL) is always there; the allocator's
        # reserve is charged on what is allocated and freed within the step (activations,
        # logits, gathered layers), not on the model states (buffers allocated once).
        assert st.framework_bytes >= C.FRAMEWORK_BUFFER_BYTES
        if "optimizer step" not in st.moment:
            dynamic = st.activations_bytes + st.logits_bytes + st.buffers_bytes
            assert st.reserve_bytes == pytest.approx(f * dynamic, rel=1e-9)
            assert st.reserve_bytes > 0
    assert est.memory_peak_bytes == max(st.total_bytes for st in est.stages)
    assert est.memory_reserved_peak_bytes == max(st.reserved_bytes for st in est.stages)
    assert est.memory_allocated_peak_bytes == max(st.allocated_bytes for st in est.stages)
    assert est.fits == (est.memory_peak_bytes <= cluster.gpu.memory_bytes * (1 - C.MEMORY_MARGIN_FRACTION))
    assert est.memory_capacity_bytes == cluster.gpu.memory_bytes


def test_middle_stage_activations_are_korthikanti_times_inflight():
    # A middle stage (no embedding, no logits) of a 1F1B pipeline with unfused attention holds
    # n layers x min(p - i, m) micro-batches x s b h (10 + 24/t + 5 a s/(h t)).
    L, h, a, s, b, t, p = 24, 2048, 16, 2048, 2, 2, 4
    model = gpt(L, h, a)
    cluster = make_cluster("a100-sxm4-80gb", 16)
    job = Job(seq_len=s, global_batch_size=64, precision="fp16")
    par = ParallelConfig(tp=t, pp=p, dp=2, micro_batch_size=b, sequence_parallel=False, zero=0)
    est = estimate(model, cluster, job, par.replace(attention="unfused"))
    m = est.num_microbatches
    assert m == 64 // (b * 2)
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    for i in (1, 2):
        st = est.stages[i]
        assert st.logits_bytes == 0
        assert st.activations_bytes == pytest.approx(per_layer * (L // p) * min(p - i, m), rel=1e-12)
    # fp16 mixed precision, no ZeRO: 16 bytes per parameter on a stage; weights are 2 of them.
    st = est.stages[1]
    assert st.gradients_bytes == pytest.approx(st.weights_bytes, rel=1e-12)
    assert st.optimizer_bytes == pytest.approx(6 * st.weights_bytes, rel=1e-12)


def test_peak_is_states_plus_the_moment_plus_reserve_and_context():
    # No pipeline, full recompute, TP 8: the peak is the loss of the micro-batch (Megatron-Core:
    # its fp32 softmax beside the 16-bit logits, 6 B per logit) or its first layer's backward,
    # plus the allocator's reserve on those bytes and the memory outside the allocator.
    model = gpt(24, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 8)
    job = Job(seq_len=2048, global_batch_size=8, precision="bf16")
    est = estimate(model, cluster, job, ParallelConfig(tp=8, micro_batch_size=1, recompute="full"))
    st = est.stages[0]
    lower = st.model_states_bytes + st.activations_bytes + st.logits_bytes
    f = get_engine("megatron-core").memory.reserve_fraction
    assert est.memory_peak_bytes == pytest.approx(lower + f * (st.activations_bytes + st.logits_bytes) + st.framework_bytes, rel=1e-12)
    assert "the loss" in st.moment
    assert st.logits_bytes == pytest.approx(6.0 * 2048 * model.vocab / 8, rel=1e-12)
    assert math.isfinite(est.memory_peak_bytes)


@pytest.mark.parametrize("precision,grad_reduce,want", [
    ("bf16", "auto", 4.0), ("fp8", "auto", 4.0), ("fp16", "auto", 2.0),
    ("bf16", "bf16", 2.0), ("fp8", "bf16", 2.0), ("fp16", "fp32", 4.0), ("bf16", "fp32", 4.0),
])
def test_gradient_bytes_follow_the_reduction_dtype(precision, grad_reduce, want):
    assert M.grad_bytes(precision, grad_reduce) == want
    assert M.bytes_per_param(precision, 0, 1, grad_reduce, C)["gradients"] == want


def test_bf16_gradients_halve_gradient_memory_and_traffic():
    model = gpt(24, 2048, 16)
    cluster = make_cluster("a100-sxm4-80gb", 16)
    par = ParallelConfig(tp=2, dp=8, micro_batch_size=1, zero=1, overlap_grad_reduce=False)
    e32 = estimate(model, cluster, Job(2048, 16, "bf16"), par)
    e16 = estimate(model, cluster, Job(2048, 16, "bf16", grad_reduce="bf16"), par)
    assert e16.stages[0].gradients_bytes == pytest.approx(e32.stages[0].gradients_bytes / 2, rel=1e-12)
    rs = lambda e: next(c["time_s"] for c in e.comm if c["kind"] == "dp")  # noqa: E731
    assert rs(e16) < rs(e32)


def test_bf16_gradients_need_a_bf16_or_fp8_run():
    from planner.errors import InputError  # noqa: PLC0415

    with pytest.raises(InputError, match="job.grad_reduce"):
        Job(2048, 16, "fp16", grad_reduce="bf16")
    with pytest.raises(InputError, match="job.grad_reduce"):
        Job(2048, 16, "bf16", grad_reduce="fp8")
