"""``--engine auto``: the search on every engine a team would launch today, ranked together."""

from __future__ import annotations

import json

import pytest

import planner
from planner.cli import main
from planner.engines import AUTO_ENGINES
from planner.search.space import SearchOptions

MODEL, JOB = planner.load_model("llama3.1-8b"), planner.Job(8192, 64)
CLUSTER = planner.make_cluster("h100-sxm5-80gb", 16)


def test_auto_ranks_the_engines_together_and_each_plan_is_its_engines_estimate():
    r = planner.plan(MODEL, CLUSTER, JOB, top_k=8, options=SearchOptions(engine="auto"))
    assert r.engine == "auto" and len(r.plans) == 8
    times = [p.estimate.step_time_s for p in r.plans]
    assert times == sorted(times)
    for p in r.plans:
        e = planner.estimate(MODEL, CLUSTER, JOB, p.parallel, p.estimate.engine)
        assert e.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-9)
    # the best of each engine's own search is what auto ranks
    best = {name: planner.plan(MODEL, CLUSTER, JOB, top_k=1, options=SearchOptions(engine=name)).plans[0].estimate.step_time_s
            for name in AUTO_ENGINES}
    assert r.plans[0].estimate.step_time_s == pytest.approx(min(best.values()), rel=1e-12)
    assert r.notes[0].startswith("engines searched: ")


def test_auto_plan_document_names_each_plans_engine_and_launch_follows_it(capsys, tmp_path):
    code = main(["plan", "--model", "llama3.1-8b", "--gpus", "16", "-b", "64", "--engine", "auto", "--top", "16", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["engine"] == "auto"
    engines = [p["engine"] for p in doc["plans"]]
    assert set(engines) <= set(AUTO_ENGINES) and len(set(engines)) >= 2
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    from planner.emit import emit_bundle

    for entry in doc["plans"]:
        target = {"megatron-core": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}[entry["engine"]]
        files, _ = emit_bundle(doc, target, entry["rank"])
        assert files


def test_auto_is_for_plan_only(capsys):
    code = main(["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--engine", "auto"])
    err = capsys.readouterr().err
    assert code == 2 and "--engine" in err and "auto: plan only" in err
