"""The memory margin: plans leave that fraction of GPU memory free (default
Constants.MEMORY_MARGIN_FRACTION, SearchOptions.memory_margin, --memory-margin)."""

from __future__ import annotations

import json

import pytest

from planner.cli.app import app
from planner.cost.constants import DEFAULT_CONSTANTS as C
from planner.cost.estimate import estimate
from planner.errors import InputError
from planner.io.loaders import load_model, make_cluster
from planner.search.plan import plan
from planner.search.space import SearchOptions
from planner.specs import Job, ParallelConfig


def test_fits_uses_the_usable_capacity():
    m, c = load_model("llama3.1-8b"), make_cluster("h100-sxm5-80gb", 8)
    e = estimate(m, c, Job(8192, 64), ParallelConfig(tp=1, pp=1, recompute="full", zero=1))
    assert e.memory_margin == C.MEMORY_MARGIN_FRACTION == 0.05
    assert e.memory_usable_bytes == pytest.approx(c.gpu.memory_bytes * 0.95)
    assert e.fits == (e.memory_peak_bytes <= e.memory_usable_bytes)


@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_every_plan_leaves_the_margin_free(margin):
    m, c = load_model("llama3.1-8b"), make_cluster("h100-sxm5-80gb", 8)
    r = plan(m, c, Job(8192, 64), top_k=5, options=SearchOptions(memory_margin=margin))
    for p in r.plans:
        assert p.estimate.memory_peak_bytes <= c.gpu.memory_bytes * (1 - margin)


def test_cli_memory_margin():
    from typer.testing import CliRunner  # noqa: PLC0415

    out = CliRunner().invoke(app, ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--recompute", "full",
                                   "--memory-margin", "0.2", "--json"])
    doc = json.loads(out.stdout)
    assert doc["predicted"]["memory_margin"] == 0.2
    bad = CliRunner().invoke(app, ["plan", "--memory-margin", "2"])
    assert isinstance(bad.exception, InputError) and "--memory-margin" in str(bad.exception)  # exit 2 through planner's main
