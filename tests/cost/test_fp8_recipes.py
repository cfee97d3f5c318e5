"""FP8 by scaling recipe (Job.fp8_recipe, Job.fp8_param_gather): which engine runs which recipe,
torchao's dynamic casts against Transformer Engine's fused ones (planner.cost.fp8), torchtitan's
Float8 tensor parallelism and FSDP FP8 weight all-gathers, and the launch files and check."""

from __future__ import annotations

import dataclasses

import pytest

from planner.check.job import Overrides
from planner.check.read import read_job
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.fp8 import fp8_quant_time
from planner.cost.stages import layer_costs
from planner.engines import fp8_casts, fp8_gathers, fp8_recipe, get_engine, resolve_job
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig

MODEL = load_model("llama3.1-8b")
CLUSTER = make_cluster("h100-sxm5-80gb", 64)
FP8 = Job(8192, 128, "fp8")
TT, MC = get_engine("torchtitan"), get_engine("megatron-core")


def _job(recipe: str, gather: bool | None = None) -> Job:
    return dataclasses.replace(FP8, fp8_recipe=recipe, fp8_param_gather=gather)


def test_the_fields_are_checked():
    with pytest.raises(InputError, match="job.fp8_recipe"):
        Job(8192, 8, "fp8", fp8_recipe="e4m3")
    with pytest.raises(InputError, match="job.fp8_recipe.*bf16"):
        Job(8192, 8, "bf16", fp8_recipe="rowwise")
    with pytest.raises(InputError, match="job.fp8_param_gather"):
        Job(8192, 8, "bf16", fp8_param_gather=True)


def test_each_engine_runs_its_own_recipes():
    assert fp8_recipe(MC, FP8) == "delayed" and fp8_recipe(TT, FP8) == "rowwise"  # "auto": the engine's default
    assert fp8_recipe(MC, Job(8192, 8)) == ""
    with pytest.raises(InputError, match="job.fp8_recipe.*megatron-core"):
        fp8_recipe(MC, _job("rowwise"))
    with pytest.raises(InputError, match="job.fp8_recipe.*torchtitan"):
        fp8_recipe(TT, _job("delayed"))
    with pytest.raises(InputError, match="job.fp8_param_gather"):
        resolve_job(_job("rowwise", True), TT)  # torchao gathers FP8 only tensor-wise
    assert resolve_job(FP8, TT).fp8_recipe == "rowwise"
    assert fp8_gathers(TT, _job("tensorwise")) and not fp8_gathers(TT, _job("tensorwise", False))
    assert fp8_casts(TT, _job("tensorwise"), 3) == "torchao-tensorwise+fsdp8" and fp8_casts(TT, _job("tensorwise"), 0) == "torchao-tensorwise"
    assert fp8_casts(MC, _job("mxfp8"), 1) == "te"


def test_torchao_casts_every_operand():
    """Per GEMM (m tokens, n out, k in): TE casts the input in forward and the gradient in
    backward (4 B each); torchao casts input and weight, then the gradient twice, the weight and
    the input again (5 B each, an amax pass and the cast), and rowwise rescales two outputs."""
    m, n, k = 8192.0, 4096.0, 4096.0
    gpu = CLUSTER.gpu
    bw = gpu.hbm_bandwidth_bytes_per_s * C.HBM_STREAM_EFFICIENCY
    te_f, te_b = fp8_quant_time([(m, n, k)], gpu, C)
    assert te_f == pytest.approx(4 * m * k / bw + C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    rw_f, rw_b = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-rowwise", hidden=k)
    c = C.TORCHAO_CAST_BYTES_PER_ELEMENT
    assert rw_f == pytest.approx(c * (m * k + n * k) / bw + 2 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    assert rw_b == pytest.approx((c * (2 * m * n + m * k + n * k) + 4 * (m * k + n * k)) / bw + 4 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    tw_f, tw_b = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-tensorwise", hidden=k)
    assert te_f + te_b < tw_f + tw_b < rw_f + rw_b
    # Float8 TP: the all-gathered input is cast on its 1/tp shard; FSDP FP8 weights are not cast here
    tp_f, _ = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-tensorwise+fsdp8", hidden=k, tp=8)
    assert tp_f == pytest.approx(c * m * k / 8 / bw + 2 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)


def test_torchtitan_recipes_order_as_torchao_runs_them():
    """Row-wise: more casts, a slower forward kernel, the backward outputs rescaled; tensor-wise
    with FSDP FP8 gathers: half the weight all-gather bytes."""
    par = ParallelConfig(tp=1, pp=1, dp=64, micro_batch_size=1, recompute="selective", zero=3)
    t = {r: estimate(MODEL, CLUSTER, _job(r), par, "torchtitan") for r in ("tensorwise", "rowwise", "rowwise_with_gw_hp")}
    assert t["tensorwise"].step_time_s < t["rowwise"].step_time_s
    assert t["rowwise"].step_time_s < t["rowwise_with_gw_hp"].step_time_s  # the 16-bit weight-gradient GEMM
    nog = estimate(MODEL, CLUSTER, _job("tensorwise", False), par, "torchtitan")
    dp = lambda e: next(x for x in e.comm if x["kind"] == "dp")["time_s"]  # noqa: E731
    assert dp(t["tensorwise"]) < dp(nog) and dp(t["rowwise"]) == pytest.approx(dp(nog))
    assert t["tensorwise"].memory_peak_bytes < nog.memory_peak_bytes  # FP8 gathered layers (memory_peak lin_b)


def test_float8_tensor_parallel_gathers_fp8():
    par = ParallelConfig(tp=8, pp=1, dp=8, micro_batch_size=1, recompute="none", sequence_parallel=True, zero=3)
    tw = layer_costs(MODEL, CLUSTER, _job("tensorwise"), par, C, sac="op", fp8="torchao-tensorwise")
    rw = layer_costs(MODEL, CLUSTER, _job("rowwise"), par, C, sac="op", fp8="torchao-rowwise")
    assert tw[4]["tp_fwd_exposed_s"] < rw[4]["tp_fwd_exposed_s"]
    assert tw[4]["tp_bwd_exposed_s"] == pytest.approx(rw[4]["tp_bwd_exposed_s"])


def test_transformer_engine_recipes_are_priced_alike():
    par = ParallelConfig(tp=2, pp=1, dp=32, micro_batch_size=1)
    times = {r: estimate(MODEL, CLUSTER, _job(r), par).step_time_s for r in ("delayed", "tensorwise", "mxfp8", "blockwise")}
    assert len(set(times.values())) == 1


def test_launch_files_write_the_recipe_and_check_reads_it(tmp_path):
    import json  # noqa: PLC0415

    from planner.emit.common import load_plan_view  # noqa: PLC0415
    from planner.emit.megatron import _batch_precision_args  # noqa: PLC0415
    from conftest import run_cli  # noqa: PLC0415

    code, out, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpus", "8", "-s", "4096", "-b", "32", "--precision", "fp8",
                              "--fp8-recipe", "tensorwise", "--top", "1", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["job"]["fp8_recipe"] == "tensorwise"
    args = _batch_precision_args(load_plan_view(doc))
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    code, _, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpus", "8", "--precision", "fp8", "--fp8-recipe", "rowwise"])
    assert code == 2 and "job.fp8_recipe" in err and "megatron-core" in err
    flags = tmp_path / "flags.txt"
    flags.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 8192 --max-position-embeddings 8192 "
                     "--micro-batch-size 1 --global-batch-size 64 --bf16 --fp8-format hybrid --fp8-recipe mxfp8 --vocab-size 128256\n")
    assert read_job([str(flags)], Overrides(gpus=8)).job.fp8_recipe == "mxfp8"
    flags.write_text(flags.read_text().replace(" --fp8-recipe mxfp8", ""))
    assert read_job([str(flags)], Overrides(gpus=8)).job.fp8_recipe == "delayed"  # Megatron's default
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n\n[training]\nlocal_batch_size = 1\n'
                    'seq_len = 8192\n\n[parallelism]\ndata_parallel_shard_degree = -1\n\n[quantize.linear.float8]\n'
                    'enable_fsdp_float8_all_gather = true\n')
    job = read_job([str(toml)], Overrides(gpus=8)).job
    assert (job.fp8_recipe, job.fp8_param_gather) == ("tensorwise", True)  # 0.2.2: recipe_name None is tensor-wise
