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
    assert fp8_gathers(TT, _job("tensorwise"), 3) and not fp8_gathers(TT, _job("tensorwise", False), 3)
    assert not fp8_gathers(TT, _job("tensorwise"), 0)  # no sharding, no weight gathers
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
    rw_f, rw_b = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-rowwise")
    c = C.TORCHAO_CAST_BYTES_PER_ELEMENT
    assert rw_f == pytest.approx(c * (m * k + n * k) / bw + 2 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    assert rw_b == pytest.approx((c * (2 * m * n + m * k + n * k) + 4 * (m * k + n * k)) / bw + 4 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)
    tw_f, tw_b = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-tensorwise")
    assert te_f + te_b < tw_f + tw_b < rw_f + rw_b
    # FSDP FP8 weights arrive cast: only the input is cast in forward
    g_f, _ = fp8_quant_time([(m, n, k)], gpu, C, scheme="torchao-tensorwise+fsdp8")
    assert g_f == pytest.approx(c * m * k / bw + 2 * C.ELEMENTWISE_KERNEL_OVERHEAD_S)


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


def test_tensor_parallel_gathers_stay_16_bit():
    """torchtitan 0.2.2 turns torchao's Float8 TP plan on with '"float8" in model.converters'
    (models/llama3/infra/parallelize.py), which its registered name quantize.linear.float8 never
    matches; 0.3.0 has no such plan: the TP all-gathers move bf16 whatever the recipe."""
    par = ParallelConfig(tp=8, pp=1, dp=8, micro_batch_size=1, recompute="none", sequence_parallel=True, zero=3)
    tw = layer_costs(MODEL, CLUSTER, _job("tensorwise"), par, C, sac="op", fp8="torchao-tensorwise")
    rw = layer_costs(MODEL, CLUSTER, _job("rowwise"), par, C, sac="op", fp8="torchao-rowwise")
    assert tw[4]["tp_fwd_exposed_s"] == rw[4]["tp_fwd_exposed_s"] > 0


def test_float8_tensor_parallel_gathers_in_fp8_when_the_job_says_so():
    """Job.fp8_tp_gather (torchao's Float8 TP styles, which torchtitan before the converter rename
    ran): each layer all-gather at 1 B, the reduce-scatters 16-bit; refused off tensor-wise and
    on Transformer Engine; fp8_casts marks it "+tp8"."""
    from planner.cost.comm import group_links  # noqa: PLC0415

    par = ParallelConfig(tp=8, pp=1, dp=8, micro_batch_size=1, recompute="none", sequence_parallel=True, zero=3)
    tt = get_engine("torchtitan")
    job = dataclasses.replace(_job("tensorwise"), fp8_tp_gather=True)
    assert fp8_casts(tt, job, 3) == "torchao-tensorwise+fsdp8+tp8"
    on = layer_costs(MODEL, CLUSTER, job, par, C, sac="op", fp8="torchao-tensorwise+tp8")
    off = layer_costs(MODEL, CLUSTER, _job("tensorwise"), par, C, sac="op", fp8="torchao-tensorwise")
    tp = group_links(CLUSTER, par)["tp"]
    act = 1 * job.seq_len * MODEL.hidden * 2  # one b s h activation, 16-bit
    assert off[4]["t_tp"] == pytest.approx(tp.time("reducescatter", act) + tp.time("allgather", act))
    assert on[4]["t_tp"] == pytest.approx(tp.time("reducescatter", act) + tp.time("allgather", act / 2))
    with pytest.raises(InputError, match="job.fp8_tp_gather"):
        resolve_job(dataclasses.replace(_job("rowwise"), fp8_tp_gather=True), tt)
    with pytest.raises(InputError, match="job.fp8_tp_gather"):
        resolve_job(dataclasses.replace(_job("tensorwise"), fp8_tp_gather=True), get_engine("megatron-core"))


def test_transformer_engine_recipes_are_priced_alike():
    par = ParallelConfig(tp=2, pp=1, dp=32, micro_batch_size=1)
    b200 = make_cluster("b200-sxm-180gb", 64)  # MXFP8 needs Blackwell
    times = {r: estimate(MODEL, b200, _job(r), par).step_time_s for r in ("delayed", "tensorwise", "mxfp8", "blockwise")}
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


def test_megatron_fp8_param_gather_holds_and_gathers_fp8_weights():
    """--fp8-param-gather (TE fp8_model_init): 1-byte weights without the cached FP8 copy, and the
    distributed optimizer's all-gather in FP8; it needs ZeRO >= 1 (arguments.py)."""
    par = ParallelConfig(tp=1, pp=1, dp=64, micro_batch_size=1, zero=1)
    off, on = estimate(MODEL, CLUSTER, FP8, par), estimate(MODEL, CLUSTER, _job("delayed", True), par)
    w = lambda e: e.stages[0].weights_bytes  # noqa: E731
    assert w(on) == pytest.approx(w(off) / 4)  # 1 B against 2 B + the 2 B FP8 copy
    dp = lambda e: next(x for x in e.comm if x["kind"] == "dp")["time_s"]  # noqa: E731
    assert dp(on) < dp(off)
    with pytest.raises(InputError, match="parallel.zero"):
        estimate(MODEL, CLUSTER, _job("delayed", True), par.replace(zero=0))
    from planner.search.plan import plan  # noqa: PLC0415
    from planner.search.space import SearchOptions  # noqa: PLC0415

    best = plan(MODEL, make_cluster("h100-sxm5-80gb", 8), Job(8192, 64, "fp8", fp8_param_gather=True), top_k=3,
                options=SearchOptions(fixed={"tp": 1, "pp": 1})).plans
    assert all(p.parallel.zero >= 1 for p in best)


def test_check_reads_torchtitan_fp8_and_flags_what_torchtitan_rejects(tmp_path):
    import copy  # noqa: PLC0415
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from planner.check import check_job  # noqa: PLC0415
    from planner.emit import emit_files  # noqa: PLC0415

    toml = tmp_path / "both.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n\n[training]\nlocal_batch_size = 1\n'
                    'seq_len = 8192\n\n[parallelism]\ndata_parallel_shard_degree = -1\n\n[quantize.linear.float8]\n'
                    'recipe_name = "rowwise"\nenable_fsdp_float8_all_gather = true\n')
    r = check_job(read_job([str(toml)], Overrides(gpus=8)), top=1, time_limit_s=4)
    assert "torchtitan-rejects" in {f.id for f in r.findings}
    fixture = Path(__file__).resolve().parents[1] / "emit" / "fixtures" / "llama8b_fsdp_64gpu.json"
    doc = copy.deepcopy(json.loads(fixture.read_text()))
    doc["job"].update(precision="fp8", fp8_recipe="rowwise_with_gw_hp")
    module = tmp_path / "planner_torchtitan_config.py"
    module.write_text(emit_files(doc, "torchtitan", 1)["planner_torchtitan_config.py"])
    job = read_job([f"{module}:planner_config"], Overrides(gpus=64)).job
    assert job.fp8_recipe == "rowwise_with_gw_hp"


def test_mxfp8_needs_mx_tensor_cores():
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1)
    with pytest.raises(InputError, match="job.fp8_recipe.*Blackwell"):
        estimate(MODEL, make_cluster("h100-sxm5-80gb", 8), _job("mxfp8"), par)
    assert estimate(MODEL, make_cluster("b200-sxm-180gb", 8), _job("mxfp8"), par).fp8_recipe == "mxfp8"


def test_check_names_the_line_of_a_refused_recipe_and_runs_files_take_null(tmp_path):
    from planner.check import check_job  # noqa: PLC0415
    from planner.specs import job_options  # noqa: PLC0415

    flags = tmp_path / "flags.txt"
    flags.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 8192 --max-position-embeddings 8192 "
                     "--micro-batch-size 1 --global-batch-size 64 --bf16 --fp8-format hybrid --fp8-recipe mxfp8 --vocab-size 128256\n")
    with pytest.raises(InputError, match=r"flags\.txt.*--fp8-recipe \(job\.fp8_recipe\).*Blackwell"):
        check_job(read_job([str(flags)], Overrides(gpus=8)), top=0)
    assert job_options({"precision": "fp8", "fp8_recipe": None, "fp8_param_gather": None}) == {"precision": "fp8"}
