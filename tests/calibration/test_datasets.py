"""The sidecars that say how the shipped runs are read (planner/calibration/*.yaml): every rule
covers rows that exist, cites its source, and sets only fields the rows leave out; the recipe
fields reach validate's fill."""

from __future__ import annotations

import re

import pytest

from planner.calibration.datasets import _recipes, _rules, dataset_path, run_engine, run_model_fields, run_recipe
from planner.calibration.validate import fill_and_predict, with_sidecars
from planner.io.loaders import load_runs
from planner import estimate
from planner.specs import ATTENTION_KINDS, CUDA_GRAPHS, MOE_DISPATCHERS, RECOMPUTE_KINDS

ALL = {name: load_runs(dataset_path(name)) for name in ("public", "vtrain-multi", "modern", "memory")}
IDS = [r.id for runs in ALL.values() for r in runs]


@pytest.mark.parametrize("rule", _recipes()["rules"], ids=lambda r: r["id_regex"])
def test_every_recipe_rule_covers_rows_cites_and_fills_only_unknowns(rule):
    hits = [i for i in IDS if re.search(rule["id_regex"], i)]
    assert hits, "a rule that covers no run"
    assert rule["source"] and rule["why"]
    for k, v in (rule.get("parallel") or {}).items():
        assert k in ("recompute", "etp", "moe_a2a_overlap", "moe_dispatcher", "cuda_graph", "tp_comm_overlap", "attention"), k
        if v is None:
            continue  # kept unknown: later rules do not set it
        if k == "recompute":
            assert v in RECOMPUTE_KINDS
        elif k == "attention":
            assert v in ATTENTION_KINDS
        elif k == "etp":
            assert isinstance(v, int) and v >= 1
        elif k == "moe_dispatcher":
            assert v in MOE_DISPATCHERS
        elif k == "cuda_graph":
            assert v in CUDA_GRAPHS
        else:
            assert isinstance(v, bool)
    by_id = {r.id: r for runs in ALL.values() for r in runs}
    for i in hits:
        fields, _ = run_recipe(i)
        assert all(by_id[i].parallel.get(k) is None for k in fields) or fields == {}, i


def test_engine_rules_cover_rows_and_model_fields_cite_the_notes():
    for rule in _rules()["rules"]:
        assert any(i.startswith(rule["id_prefix"]) for i in IDS), rule["id_prefix"]
        if "model" in rule:
            assert rule.get("model_why")
    assert run_engine("mtool-llama2-7b-dp8")[0] == "megatron-core" and run_model_fields("mtool-llama2-7b-dp8") == {"bias": True}


def test_model_rules_match_rows_cite_their_source_and_give_deepseek_its_mla():
    for rule in _rules()["model_rules"]:
        assert any(re.search(rule["id_regex"], i) for i in IDS), rule["id_regex"]
        assert rule.get("model_why")
    ds = [r for r in ALL["modern"] if "deepseek_v3" in r.id]
    assert ds
    for run in ds:
        fields = run_model_fields(run.id)
        assert fields["kv_lora_rank"] == 512 and fields["q_lora_rank"] == 1536
        read, _ = with_sidecars(run)
        assert read.model.kv_lora_rank == 512 and run.model.kv_lora_rank == 0  # the row alone has no MLA
    assert run_model_fields("mb2511-qwen3_30b_a3b-fp8cs-16h100") == {}


def test_every_matching_model_rule_applies_and_token_drop_rows_get_their_capacity():
    """DeepSeek-V3 25.09 token-drop rows take MLA from one rule and capacity 1.0 from another
    (Megatron-Bridge apply_moe_token_drop); dropless rows keep capacity None."""
    run = next(r for r in ALL["modern"] if r.id == "mb2509-deepseek_v3-tokendrop-fp8-256b200")
    read, _ = with_sidecars(run)
    assert read.model.kv_lora_rank == 512 and read.model.moe.capacity_factor == 1.0
    assert run.model.moe.capacity_factor is None  # the row alone is read as dropless
    dropless = next(r for r in ALL["modern"] if r.id == "mb2509-deepseek_v3-dropless-fp8-1024h100")
    assert with_sidecars(dropless)[0].model.moe.capacity_factor is None


def test_recipe_cuda_graphs_reach_the_prediction():
    """Qwen3-235B on 64 GB200 (25.09) captures per-layer CUDA graphs: validate prices them, and
    the host term is a small part of what the same row costs eager."""
    import dataclasses

    from planner.calibration.validate import validate_runs

    run = next(r for r in ALL["modern"] if r.id == "mb2509-qwen3_235b_a22b-tokendrop-fp8-64gb200")
    res, _ = validate_runs([run], median=False)
    assert res[0].parallel.cuda_graph == "layer" and res[0].from_recipe.get("cuda_graph") == "layer"
    read, _ = with_sidecars(run)
    graphed = res[0].estimate
    eager = estimate(read.model, read.cluster, read.job, dataclasses.replace(graphed.parallel, cuda_graph="none"))
    assert graphed.time_breakdown_s["host_exposed_s"] < 0.1 * eager.time_breakdown_s["host_exposed_s"]
    assert graphed.step_time_s < eager.step_time_s


def test_a_recipe_field_is_fixed_in_the_fill_and_reported():
    run = next(r for r in ALL["modern"] if r.id == "mb2606-llama31_405b-fp8-1024h100")
    res = fill_and_predict(run, median=False)
    assert res.from_recipe == {"recompute": "none", "cuda_graph": "none"} and "recompute" not in res.filled
    assert res.parallel.recompute == "none"


def test_torchtitan_rows_before_cudnn_came_first_run_flashattention_2():
    """torchtitan's benchmark rows of Dec 2024 and June 2025 ran SDPA's flash backend
    (FlashAttention-2): validate prices attention "fa2" from the recipe rule; on H100 that is
    slower than the engine's default (cuDNN, torchtitan 0.2.x), on A100 the same."""
    import dataclasses

    for rid, slower in (("tt-asynctp-llama3_8b-64h100-bf16-vanilla", True), ("tt2024-llama3_8b-64-selectiveop-none", False)):
        run = next(r for r in ALL["modern"] if r.id == rid)
        res = fill_and_predict(run, median=False)
        assert res.from_recipe.get("attention") == "fa2" and res.parallel.attention == "fa2"
        read, _ = with_sidecars(run)
        flash = estimate(read.model, read.cluster, read.job, dataclasses.replace(res.parallel, attention="flash"), res.engine)
        assert (res.estimate.step_time_s > 1.02 * flash.step_time_s) if slower else res.estimate.step_time_s == pytest.approx(flash.step_time_s)


def test_recipe_expert_tensor_degree_reaches_the_prediction():
    """The DeepSeek-V3 recipes set expert_tensor_parallel_size 1: validate prices etp 1 (the
    engine's default would be tp)."""
    from planner.calibration.validate import validate_runs

    run = next(r for r in ALL["modern"] if r.id == "mb2509-deepseek_v3-dropless-fp8-1024h100")
    res, _ = validate_runs([run], median=False)
    assert res[0].parallel.tp == 2 and res[0].parallel.etp == 1 and res[0].from_recipe.get("etp") == 1


def test_data_dir_finds_the_wheels_package_data(monkeypatch, tmp_path):
    """An installed wheel holds the runs files in planner/_validation, a folder without
    __init__.py: importlib gives a MultiplexedPath there, whose str() is not a path."""
    from importlib import resources
    from importlib.resources.readers import MultiplexedPath

    import planner.calibration.datasets as D

    (tmp_path / "public_runs.json").write_text("{}")
    monkeypatch.setattr(resources, "files", lambda name: MultiplexedPath(tmp_path) if name == "planner._validation" else None)
    assert D.data_dir() == tmp_path


def test_a_null_recipe_field_stays_unknown():
    """Llama 3 8B FP8 on 8 H100 (25.11) runs block recompute (5 of 32 layers), which the planner
    has no setting for: the row's rule names recompute null, so the generic Llama rule (none)
    does not apply and the fill searches recompute."""
    fields, _ = run_recipe("mb2511-llama3_8b-fp8cs-8h100")
    assert "recompute" not in fields
    res = fill_and_predict(next(r for r in ALL["modern"] if r.id == "mb2511-llama3_8b-fp8cs-8h100"), median=False)
    assert "recompute" in res.filled and "recompute" not in res.from_recipe


def test_scenario_and_validate_read_a_row_the_same_way():
    """estimate --scenario on a modern row prices what validate prices (the recipe's recompute,
    expert tensor degree and all-to-all overlap included)."""
    import contextlib
    import io
    import json

    from planner.calibration.validate import validate_runs
    from planner.cli.app import main

    for rid in ("mb2511-qwen3_30b_a3b-fp8mx-8gb200", "mb2606-gpt_oss_120b-mxfp8-64gb200"):
        run = next(r for r in ALL["modern"] if r.id == rid)
        res, _ = validate_runs([run], median=False)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["estimate", "--scenario", "modern", "--id", rid, "--json"])
        assert code in (0, 1)
        d = json.loads(out.getvalue())
        assert d["parallel"]["moe_a2a_overlap"] == res[0].parallel.moe_a2a_overlap, rid
        assert d["predicted"]["step_time_s"] == pytest.approx(res[0].estimate.step_time_s, rel=1e-9), rid


def test_a_users_runs_file_may_state_etp_and_the_overlap(tmp_path):
    import json

    from planner.calibration.validate import validate_runs
    from planner.io.loaders import load_runs

    row = {"id": "my-moe", "model": {"name": "m", "layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096,
                                      "vocab": 32000, "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1024}},
           "job": {"seq_len": 2048, "global_batch_size": 64, "precision": "bf16"},
           "hardware": {"gpu": "h100-sxm5-80gb", "num_gpus": 16, "gpus_per_node": 8},
           "parallel": {"tp": 2, "pp": 1, "dp": 8, "cp": 1, "ep": 8, "vpp": 1, "micro_batch_size": 1, "recompute": "none",
                        "zero": 1, "etp": 1, "moe_a2a_overlap": False, "attention": "fa2", "tp_comm_overlap": False},
           "measured": {"step_time_s": 1.0, "basis": "synthetic"}}
    f = tmp_path / "runs.json"
    f.write_text(json.dumps({"schema": "planner-runs/1", "runs": [row]}))
    res, refused = validate_runs(load_runs(f), median=False)
    assert not refused and res[0].parallel.etp == 1 and res[0].parallel.moe_a2a_overlap is False
    assert res[0].parallel.attention == "fa2" and res[0].parallel.tp_comm_overlap is False
