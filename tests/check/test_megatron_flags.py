"""The Megatron-LM flag table: every flag of the snapshot's parser is in exactly one class
(cost, unmodelled, ignored, rejected), and the shipped arity table is the parser's (checked
against the live parser when the snapshot is beside the project)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.check.megatron_args import flag_table

from tests.conftest import SHARED_ENGINES

HERE = Path(__file__).resolve().parent


def test_every_flag_has_exactly_one_class():
    t = flag_table()
    bad = []
    for flag in t.arity:
        classes = [c for c in ("cost", "unmodelled", "rejected") if flag in getattr(t, c)]
        if not classes and t.role(flag)[0] == "ignored":
            classes.append("ignored")
        elif classes:
            ignored_too = any(__import__("fnmatch").fnmatchcase(flag, p) for _, p in t.ignored)
            if ignored_too:
                classes.append("ignored")
        if len(classes) != 1:
            bad.append((flag, classes))
    assert not bad, bad[:20]
    assert len(t.arity) > 800


def test_classified_flags_exist_in_the_parser():
    t = flag_table()
    for cls in ("cost", "unmodelled", "rejected"):
        missing = [f for f in getattr(t, cls) if f not in t.arity]
        assert not missing, (cls, missing)
    assert not [f for f in t.legacy if f in t.arity and f not in t.rejected]  # legacy = flags the parser lost (or refuses)


def test_cost_flags_are_the_ones_the_reader_maps():
    src = (Path(__file__).resolve().parents[2] / "planner" / "check" / "megatron.py").read_text()
    src += (Path(__file__).resolve().parents[2] / "planner" / "check" / "megatron_args.py").read_text()
    unmapped = [f for f in flag_table().cost if f'"{f}"' not in src]
    assert not unmapped, unmapped


@pytest.mark.skipif(not (SHARED_ENGINES / "megatron-lm" / "megatron" / "training" / "arguments.py").exists(),
                    reason="the Megatron-LM snapshot (../shared/engines/megatron-lm) is not beside the project")
def test_arity_table_is_the_live_parsers():
    env = dict(os.environ, PYTHONPATH=str(SHARED_ENGINES / "megatron-lm"))
    res = subprocess.run([sys.executable, "-W", "ignore", str(HERE / "megatron_parser_dump.py")], capture_output=True, text=True,
                         env=env, timeout=300, cwd="/tmp")
    if res.returncode != 0 and "ModuleNotFoundError" in res.stderr:
        pytest.skip("the snapshot's parser does not import here: " + res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr[-2000:]
    live = json.loads(res.stdout)
    shipped = {k: list(v) for k, v in flag_table().arity.items()}
    assert live == shipped
