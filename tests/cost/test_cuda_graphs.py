"""CUDA graphs (ParallelConfig.cuda_graph): a whole-layer graph issues one graph per pass instead of
every kernel from Python, a full-iteration graph no per-layer host work at all
(stages.layer_host_s); the engine rule follows Megatron-core's TransformerConfig checks; the
Megatron emitter writes --cuda-graph-impl and the Megatron reader reads it back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.check.read import read_job
from planner.cost.compute import layer_kernels
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.cost.stages import layer_host_s
from planner.emit.megatron import _memory_args
from planner.engines import cuda_graph_why, get_engine, resolve
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.specs import Job, ParallelConfig

SMALL = load_model("gpt3-350m")  # small layers: the host side is a large share of each layer


def test_host_seconds_per_layer_fall_with_the_capture():
    kf, kb = layer_kernels(SMALL, 1, False, True, False, 1)
    eager = layer_host_s(SMALL, 1, False, True, False, 1, False, "none", C)
    assert eager == pytest.approx(C.HOST_SECONDS_PER_KERNEL * (kf + kb))
    assert layer_host_s(SMALL, 1, False, True, False, 1, False, "layer", C) == pytest.approx(2 * C.HOST_SECONDS_PER_KERNEL)
    assert layer_host_s(SMALL, 1, False, True, False, 1, False, "full_iteration", C) == 0.0
    assert kf + kb > 10  # so the whole-layer graph saves most of the host time


def test_graphs_shorten_a_host_bound_step_and_the_default_is_eager():
    cluster = make_cluster("a100-sxm4-80gb", 8)
    job = Job(1024, 16, "bf16")
    base = ParallelConfig(tp=8, micro_batch_size=1, recompute="none")
    steps = {g: estimate(SMALL, cluster, job, base.replace(cuda_graph=g)) for g in ("none", "layer", "full_iteration")}
    assert steps["none"].time_breakdown_s["host_exposed_s"] > 0.0
    assert steps["full_iteration"].time_breakdown_s["host_exposed_s"] == 0.0
    assert steps["full_iteration"].step_time_s < steps["layer"].step_time_s < steps["none"].step_time_s
    plain = estimate(SMALL, cluster, job, base)
    assert plain.parallel.cuda_graph == "none" and plain.step_time_s == steps["none"].step_time_s
    assert "cuda_graph" in plain.resolved
    # compute and communication do not change; only the host term does
    for k in ("compute_s", "tp_comm_exposed_s"):
        assert steps["layer"].time_breakdown_s[k] == pytest.approx(steps["none"].time_breakdown_s[k])


def padded_moe(model):
    return dataclasses.replace(model, moe=dataclasses.replace(model.moe, capacity_factor=1.0))


def test_engine_rules_follow_megatron_core_and_the_planners_host_sync_rule():
    mc, titan = get_engine("megatron-core"), get_engine("torchtitan")
    dense = load_model("llama3.1-8b")
    moe = load_model("mixtral-8x7b")
    assert cuda_graph_why(mc, dense, "layer", "selective") is None
    assert cuda_graph_why(mc, dense, "full_iteration", "full") is None
    assert "full recompute" in cuda_graph_why(mc, dense, "layer", "full")
    assert "dropless" in cuda_graph_why(mc, moe, "layer", "none")
    assert cuda_graph_why(mc, moe, "full_iteration", "none") is None  # priced; the launch files refuse it (below)
    gpt = load_model("gpt3-350m")  # trains with dropout on Megatron
    assert "dropout" in cuda_graph_why(mc, gpt, "layer", "selective")
    assert "dropout" in cuda_graph_why(mc, gpt, "full_iteration", "selective")
    assert cuda_graph_why(mc, gpt, "layer", "none") is None
    assert "Megatron-FSDP" in cuda_graph_why(mc, padded_moe(moe), "layer", "none", zero=3, a2a_overlap=True)
    assert cuda_graph_why(mc, padded_moe(moe), "layer", "none") is None
    assert "torchtitan" in cuda_graph_why(titan, dense, "layer")
    assert cuda_graph_why(titan, dense, "none") is None
    cluster = make_cluster("h100-sxm5-80gb", 8)
    with pytest.raises(InputError, match="parallel.cuda_graph"):
        estimate(dense, cluster, Job(8192, 64), ParallelConfig(tp=8, recompute="full", cuda_graph="layer"))
    with pytest.raises(InputError, match="parallel.cuda_graph"):
        estimate(dense, cluster, Job(8192, 64), ParallelConfig(tp=8, cuda_graph="layer"), engine="torchtitan")
    with pytest.raises(InputError, match="parallel.cuda_graph"):
        ParallelConfig(cuda_graph="partial")


def test_a_fixed_graph_keeps_the_search_off_full_recompute():
    from planner.search.plan import plan
    from planner.search.space import SearchOptions

    model = load_model("llama3.1-8b")
    cluster = make_cluster("h100-sxm5-80gb", 8)
    res = plan(model, cluster, Job(8192, 64), top_k=20, options=SearchOptions(fixed={"cuda_graph": "layer"}))
    assert res.plans and all(p.estimate.parallel.cuda_graph == "layer" and p.estimate.parallel.recompute != "full" for p in res.plans)


@pytest.mark.parametrize("graph,flags", [("none", []), ("layer", ["--cuda-graph-impl", "local"]),
                                         ("full_iteration", ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"])])
def test_megatron_emitter_writes_the_capture(graph, flags):
    model, cluster, job = load_model("llama3.1-8b"), make_cluster("h100-sxm5-80gb", 8), Job(8192, 64)
    par, _ = resolve(ParallelConfig(tp=8, dp=1, recompute="none", cuda_graph=graph), model, cluster, job, get_engine("megatron-core"))

    class View:  # the fields _memory_args reads
        parallel = par
        job = Job(8192, 64)
        model = load_model("llama3.1-8b")
    args = _memory_args(View())
    got = args[args.index("--cuda-graph-impl"):args.index("--cuda-graph-impl") + len(flags)] if flags else \
        [a for a in args if "cuda-graph" in a]
    assert got == flags


def _read(tmp_path, extra: str):
    from planner.check.job import Overrides

    p = tmp_path / "flags.txt"
    p.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
                 f"--micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 32000 --tensor-model-parallel-size 8 {extra}\n")
    return read_job([str(p)], Overrides(gpus=8))


@pytest.mark.parametrize("flags,want,kind", [
    ("", "none", "default"),
    ("--cuda-graph-impl local", "layer", "file"),
    ("--enable-cuda-graph", "layer", "file"),  # deprecated spelling of local (ARGS:611-629)
    ("--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad", "full_iteration", "file"),
    ("--cuda-graph-impl transformer_engine --cuda-graph-modules attn", "none", "file"),  # part of a layer: priced eager
    ("--cuda-graph-impl local --cuda-graph-scope attn", "none", "file"),  # the deprecated alias of the modules
    ("--cuda-graph-impl local --cuda-graph-modules full_iteration", "full_iteration", "file"),  # migrated (cuda_graph_config.py)
    ("--cuda-graph-scope full_iteration --no-check-for-nan-in-loss-and-grad", "full_iteration", "file"),
    ("--cuda-graph-impl local --cuda-graph-modules full_iteration_inference", "layer", "file"),  # whole layers in training
])
def test_megatron_reader_reads_the_capture(tmp_path, flags, want, kind):
    cj = _read(tmp_path, flags)
    assert cj.parallel.cuda_graph == want
    assert cj.sources["parallel.cuda_graph"][1].kind == kind
    if want == "none" and flags:
        assert any("graphed modules" in u for u in cj.unmodelled)


def test_megatron_emitter_refuses_a_full_iteration_graph_of_dropless_moe_and_pads_capacity():
    from planner.emit.megatron import _moe_args

    moe = load_model("mixtral-8x7b")

    class View:
        parallel = ParallelConfig(tp=1, dp=8, ep=8, zero=1, recompute="none", cuda_graph="full_iteration")
        job = Job(4096, 64)
        model = moe
        model_id = "mixtral-8x7b"
    with pytest.raises(InputError, match="parallel.cuda_graph"):
        _memory_args(View())
    View.model = padded_moe(moe)
    assert "--cuda-graph-impl" in _memory_args(View())
    args = _moe_args(View())
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.0" and "--moe-pad-expert-input-to-capacity" in args


def test_the_overlap_default_steps_aside_for_a_layer_graph_under_megatron_fsdp():
    """Megatron-FSDP refuses layer graphs beside the expert all-to-all overlap: with both left to
    the engine, the overlap defaults off there (resolve and the search agree)."""
    from planner.search.plan import plan
    from planner.search.space import SearchOptions

    moe = padded_moe(load_model("mixtral-8x7b"))
    cluster, job = make_cluster("h100-sxm5-80gb", 16), Job(4096, 64)
    par = ParallelConfig(tp=1, dp=16, ep=8, zero=3, recompute="selective", cuda_graph="layer")
    assert estimate(moe, cluster, job, par).parallel.moe_a2a_overlap is False
    assert estimate(moe, cluster, job, par.replace(cuda_graph="none")).parallel.moe_a2a_overlap is True
    res = plan(moe, cluster, job, top_k=5, options=SearchOptions(fixed={"cuda_graph": "layer", "zero": 3, "ep": 8}))
    assert res.plans and all(not p.estimate.parallel.moe_a2a_overlap for p in res.plans)


def test_the_one_line_form_shows_a_graph_and_a_flex_dispatcher_and_hides_the_defaults():
    base = ParallelConfig(tp=2, dp=4, vpp=1, recompute="none", zero=1)
    assert "graph" not in base.replace(cuda_graph="none").short() and "alltoall" not in base.replace(moe_dispatcher="alltoall").short()
    assert base.replace(cuda_graph="layer", moe_dispatcher="hybridep").short().endswith("z1 hybridep graph=layer")


def test_a_plan_document_keeps_the_capacity_factor_and_the_launch_pads_to_it(tmp_path):
    """plan --json carries moe.capacity_factor, so launch writes --moe-expert-capacity-factor with
    the padding, and a layer graph of the padded MoE is launchable."""
    import json

    from conftest import run_cli
    from planner.emit import emit_files

    src = (Path(__file__).resolve().parents[2] / "models" / "mixtral-8x7b.yaml").read_text()
    (tmp_path / "mix.yaml").write_text(src.replace("  dense_layers: 0", "  dense_layers: 0\n  capacity_factor: 1.0"))
    code, out, err = run_cli(["plan", "--model", str(tmp_path / "mix.yaml"), "--gpus", "64", "--cuda-graph", "layer", "--top", "1", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["moe"]["capacity_factor"] == 1.0
    script = emit_files(doc, "megatron", 1)["megatron_launch.sh"]
    assert "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity" in script and "--cuda-graph-impl local" in script
