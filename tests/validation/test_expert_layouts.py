"""The planner's ranking against layouts NVIDIA's performance team tuned (NeMo
scripts/performance/recommended_model_configs/model_configs_h100.csv; benchmarks/nemo_recommended.py
runs all ten rows). The dense rows on more than one node are checked here: the tuned layout
fits in the memory model, and its predicted step time is within 10% of the planner's own best.
NeMo's FP8 runs reduce gradients in bf16, and so do these jobs. Nemotron-4 340B
fits with 0.3 GiB of 79.6 to spare: NVIDIA runs that layout, so a memory-model change that
rejects it errs, and this test says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cost.estimate import estimate
from planner.io.loaders import load_model, make_cluster
from planner.search.plan import plan
from planner.search.space import SearchOptions, candidates
from planner.specs import Job

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "nemo_h100_layouts.json"
# The dense rows on more than one node (the single-node 8B and the MoE rows are left to the benchmark).
ROWS = [(r["model"], r["gpus"], r["seq_len"], r["global_batch_size"], r["precision"], r["tuned"])
        for r in json.loads(DATA.read_text())["rows"] if r["gpus"] > 8 and "ep" not in r["tuned"]]


@pytest.mark.parametrize("name,gpus,seq,gbs,prec,tuned", ROWS, ids=[f"{r[0]}-{r[4]}-{r[1]}" for r in ROWS])
def test_tuned_h100_layout_fits_and_is_near_the_planners_best(name, gpus, seq, gbs, prec, tuned):
    job = Job(seq, gbs, prec, grad_reduce="bf16" if prec == "fp8" else "auto")
    model, cluster = load_model(name), make_cluster("h100-sxm5-80gb", gpus)
    fixed = {**tuned, "recompute": "none", "zero": 1}
    ests = [estimate(model, cluster, job, p) for p in candidates(model, cluster, job, SearchOptions(fixed=fixed))]
    fit = [e for e in ests if e.fits]
    assert fit, f"{name}: NVIDIA runs {tuned} without recompute; the memory model says it does not fit"
    best = plan(model, cluster, job, 1).plans[0].estimate.step_time_s
    tuned_s = min(e.step_time_s for e in fit)
    assert tuned_s >= best * (1 - 1e-9), "the search missed a fitting layout"
    assert tuned_s / best <= 1.10, (name, tuned_s, best)
