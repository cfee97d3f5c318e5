"""torchrun --nproc-per-node 8 --standalone on the CPU (gloo): the process groups built from
planner.emit.layout hold the ranks the plan says (tp=2, pp=2, dp=2, ep=2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emit_helpers import FIXTURES, load
from planner.emit.layout import layout_from_plan

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def test_torchrun_gloo_groups(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.run")
    launcher = [shutil.which("torchrun")] if shutil.which("torchrun") else [sys.executable, "-m", "torch.distributed.run"]
    plan = FIXTURES / "tiny_moe_8gpu.json"
    env = dict(os.environ, LAYOUT_OUT=str(tmp_path), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = launcher + ["--nproc-per-node", "8", "--standalone", str(HERE / "layout_worker.py"), str(plan), "1"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    layout = layout_from_plan(load("tiny_moe_8gpu"), 1)
    assert (layout.tp, layout.pp, layout.dp, layout.ep) == (2, 2, 2, 2)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(8)]
    for rep in reports:
        r = rep["rank"]
        assert rep["groups"]["tp"] == [r - r % 2, r - r % 2 + 1]  # TP pairs are consecutive ranks
        assert r in rep["groups"]["pp"] and len(rep["groups"]["pp"]) == 2
        assert rep["coord"] == layout.coords(r)._asdict()
    assert sorted({tuple(rep["groups"]["dp"]) for rep in reports}) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert sorted({tuple(rep["groups"]["pp"]) for rep in reports}) == [(0, 4), (1, 5), (2, 6), (3, 7)]
