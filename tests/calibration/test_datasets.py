"""The sidecars that say how the shipped runs are read (planner/calibration/*.yaml): every rule
covers rows that exist, cites its source, and sets only fields the rows leave out; the recipe
fields reach validate's fill."""

from __future__ import annotations

import re

import pytest

from planner.calibration.datasets import _recipes, _rules, dataset_path, run_engine, run_model_fields, run_recipe
from planner.calibration.validate import fill_and_predict
from planner.io.loaders import load_runs
from planner.specs import RECOMPUTE_KINDS

ALL = {name: load_runs(dataset_path(name)) for name in ("public", "vtrain-multi", "modern", "memory")}
IDS = [r.id for runs in ALL.values() for r in runs]


@pytest.mark.parametrize("rule", _recipes()["rules"], ids=lambda r: r["id_regex"])
def test_every_recipe_rule_covers_rows_cites_and_fills_only_unknowns(rule):
    hits = [i for i in IDS if re.search(rule["id_regex"], i)]
    assert hits, "a rule that covers no run"
    assert rule["source"] and rule["why"]
    for k, v in (rule.get("parallel") or {}).items():
        assert k in ("recompute", "etp", "moe_a2a_overlap"), k
        if k == "recompute":
            assert v in RECOMPUTE_KINDS
        elif k == "etp":
            assert isinstance(v, int) and v >= 1
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


def test_a_recipe_field_is_fixed_in_the_fill_and_reported():
    run = next(r for r in ALL["modern"] if r.id == "mb2606-llama31_405b-fp8-1024h100")
    res = fill_and_predict(run, median=False)
    assert res.from_recipe == {"recompute": "none"} and "recompute" not in res.filled
    assert res.parallel.recompute == "none"


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
