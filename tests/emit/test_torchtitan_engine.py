"""torchtitan's own code accepts the emitted configs and builds the named model.

torchtitan 0.2.2 reads the TOML, 0.3.0 imports the config module (--module/--config); each
version runs in one subprocess (torchtitan_worker.py) with that version first on PYTHONPATH
(engine_env.torchtitan_path: site-packages when it is that version, else the folder .ci/run
installs into). Per plan: strict parse, ParallelDims for the plan's world, schedule, the
pipeline split torchtitan builds (layers per rank == the plan's, every module name real),
accumulation and pipeline microbatches, and the model built on the meta device.

Parameter counts. torchtitan's count of the built model must equal planner.param_count plus
the norm weights the planner does not model, exactly (tolerance 0): the planner counts every
other weight torchtitan has (embeddings, untied or tied as the flavor is, every RMSNorm, the
router, shared and routed experts). Not modelled: Qwen3's QK-norm (2 x head_dim per layer:
12,288 for 30B-A3B, 1.5e-6 of 8B's total at most) and MLA's latent norms (q_lora_rank +
kv_lora_rank per layer: 124,928 for DeepSeek-V3 671B, 1.9e-7). Dense llama3 counts are equal.
"""

from __future__ import annotations

import copy

import pytest

from emit_helpers import load
from engine_env import TT_INSTALL, run_worker, torchtitan_path
from planner.cost.flops import param_count
from planner.emit import emit_files
from planner.emit.common import for_engine, load_plan_view
from planner.engines import get_engine
from planner.emit.titan_flavors import FLAVORS
from planner.specs import ModelSpec, MoESpec
from test_torchtitan import TT_PLANS



def _unmodelled(family: str, m: ModelSpec) -> int:
    """Norm weights torchtitan has and planner.param_count does not model (see the docstring)."""
    if family == "qwen3":
        return 2 * m.head_dim * m.layers  # q_norm, k_norm (models/qwen3/model/model.py)
    if m.is_mla:
        return m.layers * (m.q_lora_rank + m.kv_lora_rank)  # q_norm (with q-LoRA), kv_norm (deepseek_v3/model/model.py)
    return 0
STYLE_V = ("zb-v", "dualpipe")


def _flavor_model(f) -> ModelSpec:
    moe = None if f.moe is None else MoESpec(*f.moe)
    mla = dict(zip(("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim"), f.mla)) if f.mla else {}
    return ModelSpec(name=f.flavor, layers=f.layers, hidden=f.hidden, heads=f.heads, kv_heads=f.kv_heads, head_dim=f.head_dim,
                     ffn_hidden=f.ffn_hidden or f.hidden, vocab=f.vocab, mlp="swiglu", tied_embeddings=f.tied_embeddings,
                     moe=moe, bias=False, norm="rmsnorm", rope_theta=f.rope_theta, **mla)


def _v_schedule(schedule: str) -> dict:
    doc = copy.deepcopy(load("torchtitan_llama8b_16gpu"))  # pp 2, [17, 15]: two parts per rank in a V
    doc["plans"][0]["parallel"].update(vpp=2, schedule=schedule)
    return doc


def _fp8(recipe: str) -> dict:
    doc = copy.deepcopy(load("llama8b_fsdp_64gpu"))  # FSDP: the tensor-wise recipe gathers FP8 weights
    doc["job"].update(precision="fp8", fp8_recipe=recipe)
    return doc


def _async_tp() -> dict:
    doc = copy.deepcopy(load("torchtitan_llama70b_64gpu"))  # tp 2 with sequence parallelism
    doc["plans"][0]["parallel"].update(tp_comm_overlap=True)
    return doc


def _compiled_loss(async_tp: bool) -> dict:
    doc = copy.deepcopy(load("torchtitan_llama70b_64gpu") if async_tp else load("llama8b_fsdp_64gpu"))
    doc["job"]["cross_entropy"] = "compiled"
    if async_tp:
        doc["plans"][0]["parallel"].update(tp_comm_overlap=True)
    return doc


VARIANTS = {"zbv": _v_schedule("zb-v"), "dualpipev": _v_schedule("dualpipe"), "asynctp": _async_tp(),
            "compiled-loss": _compiled_loss(False), "compiled-loss-asynctp": _compiled_loss(True),
            **{f"fp8-{r}": _fp8(r) for r in ("rowwise", "rowwise_with_gw_hp", "tensorwise", "auto")}}
PLANS = {f"{fx}-{rank}": (load(fx), rank) for fx, rank in TT_PLANS} | {name: (doc, 1) for name, doc in VARIANTS.items()}


def _cases(version: str, tmp) -> list[dict]:
    cases = []
    for name, (doc, rank) in PLANS.items():
        v = load_plan_view(doc, rank)
        files = emit_files(doc, "torchtitan", rank)
        if version == "0.2.2" and "torchtitan_job.toml" in files:
            path = tmp / f"{name}.toml"
            path.write_text(files["torchtitan_job.toml"])
            cases.append({"name": name, "kind": "toml", "path": str(path), "world": v.world})
        if version == "0.3.0" and "planner_torchtitan_config.py" in files:  # the emitter says why when not (test_torchtitan.py)
            module = "tt030_" + name.replace("-", "_")
            (tmp / f"{module}.py").write_text(files["planner_torchtitan_config.py"])
            cases.append({"name": name, "kind": "module", "dir": str(tmp), "module": module, "config": "planner_config", "world": v.world})
    cases += [{"name": f"flavor-{f.name}-{f.flavor}", "kind": "flavor", "model": f.name, "flavor": f.flavor}
              for f in FLAVORS if version in f.versions]
    # Controls (the same code must reject them): an unknown schedule; 0.3.0 with a pipeline but
    # CUDA graphs left on (Trainer.Config.__post_init__).
    src = emit_files(load("torchtitan_llama8b_16gpu"), "torchtitan", 1)
    if version == "0.2.2":
        path = tmp / "control.toml"
        path.write_text(src["torchtitan_job.toml"].replace('"Interleaved1F1B"', '"NoSuchSchedule"'))
        cases.append({"name": "control", "kind": "toml", "path": str(path), "world": 16})
    else:
        (tmp / "tt030_control.py").write_text(src["planner_torchtitan_config.py"].replace("disable_cuda_graphs=True", "disable_cuda_graphs=False"))
        cases.append({"name": "control", "kind": "module", "dir": str(tmp), "module": "tt030_control", "config": "planner_config", "world": 16})
    return cases


@pytest.fixture(scope="module", params=["0.2.2", "0.3.0"])
def titan(request, tmp_path_factory):
    version = request.param
    path, where = torchtitan_path(version)
    if path is None:
        pytest.skip(f"torchtitan {version} not found in {where}; install it: {TT_INSTALL[version]}")
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp(f"tt{version.replace('.', '')}")
    return version, run_worker("torchtitan_worker.py", {"version": version, "cases": _cases(version, tmp)}, path)


@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_accepts_and_builds(titan, name):
    version, results = titan
    doc, rank = PLANS[name]
    files = emit_files(doc, "torchtitan", rank)
    if ("torchtitan_job.toml" if version == "0.2.2" else "planner_torchtitan_config.py") not in files:
        assert name not in results  # the emitter said why (test_torchtitan.py)
        return
    r = results[name]
    if not r["ok"] and r.get("error", "").startswith("ImportError: torchao is not installed"):
        pytest.skip("torchtitan 0.3.0 builds its Float8 converter config with torchao, which this machine lacks")
    assert r["ok"], r.get("error", "") + "\n" + r.get("trace", "")
    v = load_plan_view(doc, rank)
    p = v.parallel
    assert (r["tp"], r["pp"], r["cp"], r["ep"], r["dp_replicate"] * r["dp_shard"]) == (p.tp, p.pp, p.cp, p.ep, p.dp)
    assert r["global_batch_size"] == v.job.global_batch_size and r["seq_len"] == v.job.seq_len
    assert r["params"] == param_count(v.model) + _unmodelled(r["model"], v.model), (r["params"], param_count(v.model))
    if p.pp > 1:
        per_rank = [sum(r["parts"][k] for k in ids) for ids in r["stage_ids"]]
        assert per_rank == list(v.stage_layers)
        assert r["embedding_part"] == 0 and r["output_part"] == len(r["parts"]) - 1
        assert r["schedule"] == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-v": "ZBVZeroBubble",
                                 "dualpipe": "DualPipeV"}[p.schedule]
        if p.schedule in STYLE_V:  # rank 0 holds the first and the last part
            assert r["stage_ids"][0] == [0, len(r["parts"]) - 1]
        assert r["accumulation"] * r["microbatches"] == v.num_microbatches
    else:
        assert r["accumulation"] == v.num_microbatches
    # async TP exactly when the plan overlaps the TP collectives, with the compile torchtitan requires for it
    # (a plan priced on another engine does not carry its overlap: emit/common.py for_engine)
    assert r["async_tp"] == bool(p.tp_comm_overlap and p.tp > 1 and (v.engine is None or v.engine.name == "torchtitan"))
    # torch.compile exactly for async TP (the model) and a plan priced with the compiled loss (the loss)
    compiled_loss = get_engine("torchtitan").loss_name(for_engine(v, "torchtitan")[0].job.cross_entropy) == "compiled"
    assert r["compile"][0] == (r["async_tp"] or compiled_loss)
    if r["compile"][0]:
        assert ("model" in r["compile"][1]) == r["async_tp"] and ("loss" in r["compile"][1]) == compiled_loss
    if version == "0.3.0":
        assert r["ac"] == {"none": None, "full": "FullAC.Config", "selective": "SelectiveAC.Config"}[p.recompute]
    else:
        assert r["ac"] == p.recompute
        if v.job.precision == "fp8":
            # torchtitan's own converter accepts the file and runs the recipe priced (auto: rowwise,
            # the planner's default), gathering FP8 weights exactly when the plan does, the output kept bf16
            want = "rowwise" if v.job.fp8_recipe == "auto" else v.job.fp8_recipe
            gather = want == "tensorwise" and v.parallel.zero >= 2
            assert r["float8_converter"] == {"recipe": want, "fsdp_float8_all_gather": gather, "precompute_scale": gather}
            assert r["float8"]["filter_fqns"] == ["output"]


@pytest.mark.parametrize("flavor", FLAVORS, ids=lambda f: f"{f.name}-{f.flavor}")
def test_flavor_table_matches_torchtitan(titan, flavor):
    """Every row of planner.emit.titan_flavors is a registry entry of that version, with the
    parameters planner.param_count gives the row's dimensions."""
    version, results = titan
    if version not in flavor.versions:
        return
    r = results[f"flavor-{flavor.name}-{flavor.flavor}"]
    assert r["ok"], r.get("error", "")
    m = _flavor_model(flavor)
    assert r["params"] == param_count(m) + _unmodelled(flavor.name, m), (r["params"], param_count(m))


def test_the_check_is_live(titan):
    version, results = titan
    r = results["control"]
    assert not r["ok"]
    assert ("NoSuchSchedule" if version == "0.2.2" else "CUDA graphs") in r["error"], r["error"]
