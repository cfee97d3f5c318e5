"""The loss's cross-entropy kernels (Job.cross_entropy, Engine.loss_kernels): the bytes each
engine's implementation streams per logit element, counted from its code, reach the last
stage's time; an engine refuses an implementation it does not have."""

from __future__ import annotations

import dataclasses

import pytest

from planner.check import check_job, read_job
from planner.check.job import Overrides
from planner.cost.compute import MEGATRON_LOSS_BYTES, logits_times, stream_time
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.engines import get_engine, resolve_job
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig

MODEL = load_model("llama3.1-8b")
CLUSTER = make_cluster("h100-sxm5-80gb", 8)


def test_logits_time_streams_the_given_bytes_per_logit():
    gpu = CLUSTER.gpu
    base = logits_times(MODEL, gpu, "bf16", 2, 4096, 2, 1, C, (0.0, 0.0))
    f, b = logits_times(MODEL, gpu, "bf16", 2, 4096, 2, 1, C, (38.0, 14.0))
    elems = 2 * 4096 * MODEL.vocab / 2
    assert f - base[0] == pytest.approx(elems * 38 / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY))
    assert b - base[1] == pytest.approx(elems * 14 / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY))
    assert stream_time(0.0, gpu, 3, C) > 0  # the kernels' launch floor is in both


def test_each_engine_prices_its_own_cross_entropy():
    """Megatron's eager vocab-parallel one by default (38 / 14 B, the layer_costs default), the
    fused ones on request; PyTorch's F.cross_entropy on fp32 logits on torchtitan and DeepSpeed."""
    core = get_engine("megatron-core")
    assert core.loss_bytes() == MEGATRON_LOSS_BYTES == core.loss_bytes("unfused")
    assert core.loss_bytes("native") == (22.0, 10.0) and core.loss_bytes("te") == (6.0, 4.0)
    assert core.loss_bytes("auto", tp=8) == MEGATRON_LOSS_BYTES  # Megatron's loss is vocab-parallel at any tp
    # the fused backward casts its gradient to bf16 whatever the logits; fp16 logits get it cast back
    assert core.loss_bytes("native", precision="fp16") == (22.0, 14.0) and core.loss_bytes("unfused", precision="fp16") == MEGATRON_LOSS_BYTES
    for name in ("megatron-legacy", "megatron-deepspeed", "megatron-zb"):
        assert get_engine(name).loss_bytes() == MEGATRON_LOSS_BYTES
        with pytest.raises(InputError, match="job.cross_entropy"):
            get_engine(name).loss_bytes("native")  # the 2021-2023 code has no fused cross entropy
    for name in ("torchtitan", "deepspeed"):
        assert get_engine(name).loss_bytes() == (22.0, 26.0)
    # torchtitan with TP: torch's loss_parallel on vocabulary-sharded logits (more passes)
    assert get_engine("torchtitan").loss_bytes("auto", tp=2) == (38.0, 38.0)
    job = Job(4096, 64)
    assert resolve_job(job, core).cross_entropy == "unfused"
    assert resolve_job(job, get_engine("torchtitan")).cross_entropy == "torch"
    with pytest.raises(InputError, match="job.cross_entropy"):
        Job(4096, 64, cross_entropy="fused")


def test_the_fused_loss_is_cheaper_by_its_bytes_on_the_last_stage():
    par = ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, recompute="none")
    job = Job(8192, 64)
    e = {ce: estimate(MODEL, CLUSTER, dataclasses.replace(job, cross_entropy=ce), par) for ce in ("unfused", "native", "te")}
    assert e["unfused"].step_time_s > e["native"].step_time_s > e["te"].step_time_s
    assert e["unfused"].stage_times_s[0] == pytest.approx(e["native"].stage_times_s[0])  # the loss is on the last stage only
    gpu = CLUSTER.gpu
    elems = 8192 * MODEL.vocab
    saved = elems * (38 + 14 - 22 - 10) / (gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY)
    # per micro-batch; the host launch time hidden behind the longer kernels takes ~0.1% off
    assert e["unfused"].stage_times_s[-1] - e["native"].stage_times_s[-1] == pytest.approx(saved, rel=2e-3)


def test_check_reads_megatrons_fusion_flag(tmp_path):
    base = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
            "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
            "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear --seq-length 4096 "
            "--max-position-embeddings 4096 --vocab-size 128256 --micro-batch-size 1 --global-batch-size 64 --bf16 "
            "--tensor-model-parallel-size 2 --use-distributed-optimizer")
    got = {}
    for name, extra in (("plain", ""), ("fused", " --cross-entropy-loss-fusion")):
        p = tmp_path / f"{name}.sh"
        p.write_text("#!/bin/bash\n" + base + extra + "\n")
        cj = read_job([str(p)], Overrides())
        got[name] = (cj.job.cross_entropy, estimate(cj.model, cj.cluster, cj.job, cj.parallel, cj.engine).step_time_s)
        found = [f for f in check_job(cj, top=1, time_limit_s=2).findings if f.evidence.get("option") == "cross_entropy_loss_fusion"]
        assert len(found) == (1 if name == "plain" else 0)
    assert got["plain"][0] == "unfused" and got["fused"][0] == "native"
    assert got["fused"][1] < got["plain"][1]
    p = tmp_path / "te.sh"
    p.write_text("#!/bin/bash\n" + base + " --cross-entropy-loss-fusion --cross-entropy-fusion-impl te\n")
    with pytest.raises(InputError, match="cross-entropy-fusion-impl"):
        read_job([str(p)], Overrides())


def test_one_launch_policy_refuses_what_megatron_refuses():
    """The emitter and the script reader share the profile's ``loss.launch_refuses``: TE's cross
    entropy is priced, but neither launched nor read, with the engine's reason and the field named."""
    core = get_engine("megatron-core")
    assert core.launch_loss("auto") == "unfused" and core.launch_loss("native") == "native"
    with pytest.raises(InputError, match=r"--cross-entropy-fusion-impl.*auto or unfused or native.*validate_args"):
        core.launch_loss("te", "--cross-entropy-fusion-impl")
    assert get_engine("torchtitan").launch_loss("auto") == "torch"  # nothing refused there


def test_profile_refusal_must_name_a_kernel_and_spare_the_default():
    from planner.engines.profile import _loss  # noqa: PLC0415

    ok = {"kernels": {"unfused": [38, 14], "te": [6, 4]}, "default": "unfused"}
    assert _loss({**ok, "launch_refuses": {"te": "why"}}, "p")["loss_launch_refused"] == (("te", "why"),)
    with pytest.raises(InputError, match="p.loss.launch_refuses"):
        _loss({**ok, "launch_refuses": {"native": "why"}}, "p")
    with pytest.raises(InputError, match="p.loss.default"):
        _loss({**ok, "launch_refuses": {"unfused": "why"}}, "p")


def test_torchtitans_compiled_loss(tmp_path):
    """torch.compile of the loss (compile.enable with "loss" among compile.components, the default
    components): one fused pass over the bf16 logits each way; under TP still loss_parallel's bytes.
    check reads it from the TOML; the Megatron engines have no such loss."""
    titan = get_engine("torchtitan")
    assert titan.loss_bytes("compiled") == (2.0, 4.0) and titan.loss_bytes("compiled", tp=2) == titan.loss_bytes("torch", tp=2)
    with pytest.raises(InputError, match="job.cross_entropy"):
        get_engine("megatron-core").loss_bytes("compiled")
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1, recompute="none", zero=3)
    eager, comp = (estimate(MODEL, CLUSTER, Job(8192, 64, cross_entropy=ce), par, "torchtitan").step_time_s for ce in ("torch", "compiled"))
    assert comp < eager
    base = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
            '[parallelism]\ndata_parallel_shard_degree = -1\n')
    got = {}
    for name, extra in (("off", ""), ("on", "[compile]\nenable = true\n"), ("model-only", '[compile]\nenable = true\ncomponents = ["model"]\n')):
        p = tmp_path / f"{name}.toml"
        p.write_text(base + extra)
        got[name] = read_job([str(p)], Overrides(gpus=8)).job.cross_entropy
    assert got == {"off": "torch", "on": "compiled", "model-only": "torch"}
